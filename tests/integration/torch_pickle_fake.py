"""torch's multiprocessing tensor pickles written without torch, for the tests of
/update_weights_from_tensor (server/rendezvous/torch_ipc.c).

The objects below reduce exactly as torch's own do (pytorch/pytorch 04087d40
torch/multiprocessing/reductions.py: reduce_tensor -> rebuild_tensor(cls, typed storage, (offset,
Size, stride, requires_grad)); reduce_typed_storage -> rebuild_typed_storage(untyped, dtype);
reduce_storage, "file_system" strategy -> rebuild_storage_filename(UntypedStorage, manager, shm
name, bytes); torch.Size -> (Size, (tuple,)); a dtype -> the global torch.<name>), under stand-in
modules of the same names, so pickle writes the same opcodes. Checked against torch 2.15.0 on Python
3.11: pickletools.dis of torch's ForkingPickler output and of these objects give the same opcode
sequence and arguments, the shm and manager names aside, for a (name, tensor) list and for a
flattened bucket (sglang's FlattenedTensorMetadata dataclass).

Storages live in real POSIX shared memory (/dev/shm/torch_<pid>_<k>_0) laid out as libshm's
refcounted mapping: a 64-byte header (the reference count) and then the bytes.
"""
import dataclasses
import io
import os
import pickle
import sys
import types

SHM_HEADER = 64
ESIZE = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8, "int64": 8, "int32": 4, "uint8": 1}
ST2TORCH = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64", "I64": "int64"}


def _module(name):
    if name not in sys.modules:
        sys.modules[name] = types.ModuleType(name)
    return sys.modules[name]


torch = _module("torch")
_module("torch.multiprocessing")
red = _module("torch.multiprocessing.reductions")
stor = _module("torch.storage")
_module("torch.nn")
par = _module("torch.nn.parameter")
for _m in ("sglang", "sglang.srt", "sglang.srt.weight_sync"):
    _module(_m)
tb = _module("sglang.srt.weight_sync.tensor_bucket")


def _fn(mod, name):
    def f(*a):
        raise RuntimeError("a stand-in is never called")
    f.__module__ = mod.__name__
    f.__qualname__ = f.__name__ = name
    setattr(mod, name, f)
    return f


def _cls(mod, name, base=object):
    c = type(name, (base,), {})
    c.__module__ = mod.__name__
    setattr(mod, name, c)
    return c


for _n in ("rebuild_tensor", "rebuild_typed_storage", "rebuild_storage_filename", "rebuild_storage_fd",
           "rebuild_storage_empty", "rebuild_cuda_tensor"):
    _fn(red, _n)
TensorCls = _cls(torch, "Tensor")
ParameterCls = _cls(par, "Parameter")
UntypedStorage = _cls(stor, "UntypedStorage")


class Size(tuple):
    def __reduce__(self):
        return (Size, (tuple(self),))


Size.__module__ = "torch"
Size.__qualname__ = Size.__name__ = "Size"
torch.Size = Size


class DType:
    def __init__(self, name):
        self.name = name

    def __reduce__(self):  # torch.dtype pickles by name: the global torch.<name>
        return self.name


# pickle finds a reduce-by-name object's module through __module__; torch's dtypes carry a "torch"
# string object of their own (pickle memoizes by identity, so torch writes the name again)
DType.__module__ = "".join(["tor", "ch"])
for _d in ESIZE:
    setattr(torch, _d, DType(_d))


@dataclasses.dataclass
class FlattenedTensorMetadata:
    name: str
    shape: Size
    dtype: DType
    start_idx: int
    end_idx: int
    numel: int


FlattenedTensorMetadata.__module__ = tb.__name__
tb.FlattenedTensorMetadata = FlattenedTensorMetadata


class Storage:
    """An untyped CPU storage in /dev/shm (file_system strategy)."""
    _k = 0

    def __init__(self, data, manager=b"/tmp/torch-shm-dir-test/manager.sock", extra_header=0):
        Storage._k += 1
        self.name = "/torch_%d_%d_0" % (os.getpid(), Storage._k)
        self.manager = manager
        self.nbytes = len(data)
        fd = os.open("/dev/shm" + self.name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(b"\x01\x00\x00\x00" + b"\x00" * (SHM_HEADER - 4 + extra_header) + data)

    def unlink(self):
        try:
            os.unlink("/dev/shm" + self.name)
        except FileNotFoundError:
            pass

    def __reduce__(self):
        # (torch hands out a new bytes object per reduction: never a memo hit)
        return (red.rebuild_storage_filename, (UntypedStorage, bytes(bytearray(self.manager)), self.name.encode(),
                                               self.nbytes))


class TypedStorage:
    def __init__(self, untyped, dtype):
        self.untyped, self.dtype = untyped, dtype

    def __reduce__(self):
        return (red.rebuild_typed_storage, (self.untyped, getattr(torch, self.dtype)))


class Tensor:
    def __init__(self, storage, dtype, shape, offset=0, stride=None, cls=None):
        self.storage, self.dtype, self.shape, self.offset = storage, dtype, tuple(shape), offset
        self.stride = stride if stride is not None else contiguous_strides(shape)
        self.cls = cls or TensorCls

    def __reduce__(self):
        return (red.rebuild_tensor, (self.cls, TypedStorage(self.storage, self.dtype),
                                     (self.offset, Size(self.shape), tuple(self.stride), False)))


class Raw:
    """Any reduce tuple, for the refused shapes."""

    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


def contiguous_strides(shape):
    st, acc = [], 1
    for d in reversed(shape):
        st.append(acc)
        acc *= d
    return list(reversed(st))


def dumps(obj):
    """As MultiprocessingSerializer.serialize: the pickler's default protocol (4 on 3.8-3.13)."""
    buf = io.BytesIO()
    pickle.Pickler(buf).dump(obj)
    return buf.getvalue()


def cuda_tensor(shape, dtype="bfloat16"):
    """What reduce_tensor writes for a CUDA tensor (15 arguments; a 64-byte cudaIpcMemHandle)."""
    return Raw(red.rebuild_cuda_tensor, (TensorCls, Size(shape), tuple(contiguous_strides(shape)), 0, UntypedStorage,
                                         getattr(torch, dtype), 0, b"\x00" * 64, 4096, 0, False, b"\x01" * 64, 0,
                                         b"\x02" * 64, True))
