/* server/rendezvous/torch_ipc.h — a strict unpickler for the tensors SGLang's
 * /update_weights_from_tensor carries: torch's multiprocessing pickles (ForkingPickler with
 * torch/multiprocessing/reductions.py), as MultiprocessingSerializer.serialize writes them
 * (sglang/srt/utils/common.py). Network- and engine-free: the route (dialects/sglang_tensor.c) maps
 * the storages, unit tests and the fuzz harness call it directly. The byte shapes are in torch_ipc.c.
 */
#ifndef GS_SRV_TORCH_IPC_H
#define GS_SRV_TORCH_IPC_H

#include <stddef.h>
#include <stdint.h>

#include "models/format/safetensors.h"

#define SRV_TORCH_MAX_BYTES (16u << 20) /* one pickle */
#define SRV_TORCH_MAX_TENSORS 16384
#define SRV_TORCH_MAX_NAME 512
#define SRV_TORCH_MAX_SHM 255          /* a POSIX shared-memory name ("/torch_<pid>_<n>_<k>") */
#define SRV_TORCH_MAX_NUMEL (UINT64_C(1) << 48)

/* Where a tensor's bytes are: a CPU storage shared with torch's "file_system" strategy (a POSIX
 * shared-memory object; its data starts after a 64-byte header: libshm's refcounted mapping, see
 * torch_ipc.c), or a zero-size storage. The other storages (CUDA IPC handles, the
 * "file_descriptor" strategy's fds) are refused by the unpickler with a 501. */
typedef enum { SRV_TORCH_SHM = 0, SRV_TORCH_EMPTY } srv_torch_where;

typedef struct {
    char *name;                    /* owned, NUL-terminated, no NUL inside */
    mdl_dtype dtype;               /* of the bytes (a flattened bucket: the flat tensor's) */
    int ndim;
    int64_t shape[MDL_ST_MAX_DIMS];
    uint64_t numel, nbytes;
    srv_torch_where where;
    char shm[SRV_TORCH_MAX_SHM + 1]; /* SHM: the object's name */
    uint64_t storage_bytes;        /* SHM: the storage's size (the object holds 64 + this) */
    uint64_t offset_bytes;         /* SHM: the tensor's first byte in the storage */
} srv_torch_tensor;

typedef struct {
    srv_torch_tensor *t;
    size_t n;
} srv_torch_named;

/* load_format: NULL (a list of (name, tensor) tuples) or "flattened_bucket" ({"flattened_tensor":
 * tensor, "metadata": [FlattenedTensorMetadata]}). 0, or -1 with a message in err ("refusing
 * torch's tensor pickle: ...") and *status 400 (malformed) or 501 (a storage graphswap cannot open:
 * CUDA IPC on this backend, the file_descriptor strategy); *out empty. Nothing is executed. */
int srv_torch_unpickle(const unsigned char *p, size_t n, const char *load_format, srv_torch_named *out, char *err,
                       size_t errlen, int *status);
void srv_torch_named_free(srv_torch_named *m);

#endif
