/* server/rendezvous/torch_ipc.c — the tensors of SGLang's /update_weights_from_tensor, read from torch's
 * multiprocessing pickles without executing them (see torch_ipc.h).
 *
 * What the trainer sends (sgl-project/sglang 05bed317: entrypoints/http_server.py
 * update_weights_from_tensor, managers/io_struct.py UpdateWeightsFromTensorReqInput, utils/common.py
 * MultiprocessingSerializer.serialize = ForkingPickler(buf).dump(obj), then base64): obj is
 *   load_format None:              [(name: str, tensor), ...]
 *   load_format "flattened_bucket": {"flattened_tensor": tensor, "metadata": [FlattenedTensorMetadata]}
 *     (weight_sync/tensor_bucket.py: a dataclass {name, shape: torch.Size, dtype, start_idx, end_idx,
 *     numel}; element range [start_idx, end_idx) of the flat tensor, reshaped to shape)
 * A CPU tensor pickles through reduce_tensor (pytorch/pytorch 04087d40 torch/multiprocessing/
 * reductions.py) as
 *   REDUCE(torch.multiprocessing.reductions.rebuild_tensor,
 *          (torch.Tensor | torch.nn.parameter.Parameter,
 *           REDUCE(rebuild_typed_storage, (<untyped storage>, torch.<dtype>)),
 *           (storage_offset: int, torch.Size, stride: tuple of ints, requires_grad: bool)))
 *   <untyped storage> = REDUCE(rebuild_storage_filename, (torch.storage.UntypedStorage,
 *                              manager socket: bytes, shm name: bytes, size in bytes: int))
 *                                               ("file_system" sharing strategy)
 *                     | REDUCE(rebuild_storage_empty, (torch.storage.UntypedStorage,))  (size 0)
 *                     | REDUCE(rebuild_storage_fd, ...)  ("file_descriptor", torch's default on
 *                                               Linux: the fd is passed over the trainer's
 *                                               resource-sharer socket, authenticated with its
 *                                               process's authkey: refused, 501)
 * and a CUDA tensor as REDUCE(rebuild_cuda_tensor, (15 arguments, a cudaIpcMemHandle among them))
 * (SGLang's monkey_patch_torch_reductions renames it sglang.srt.utils.patch_torch.
 * _rebuild_cuda_tensor_modified): refused, 501, on every backend for now.
 * Checked opcode for opcode against torch 2.15.0 on Python 3.11 (pickletools.dis of both shapes;
 * tests/integration/test_weights_from_tensor.py writes the same streams, tests/reference/
 * test_torch_tensor_ref.py sends real torch tensors when torch is installed).
 *
 * The shared-memory object of a "file_system" storage (libshm's THManagedMapAllocator over
 * at::RefcountedMapAllocator) holds a 64-byte header (its reference count) and then the storage's
 * bytes: 64 + size bytes in all, as measured on torch 2.15.0. The route maps it read-only for the
 * length of the request; the trainer keeps the tensors alive until the call returns, as SGLang's
 * own callers do, and no reference count is touched.
 *
 * Checks: every global is one of the names above; dtypes are those graphswap can size; a tensor
 * must be contiguous (row-major strides, dims of size 1 aside: what flatten() and parameters are)
 * and lie inside its storage; names are 1..512 bytes without NUL; shm names are
 * "/torch_<digits and _>" (at most 255 bytes); a flattened bucket's metadata ranges lie inside the
 * flat tensor and their numel is the product of their shape. Anything else is refused.
 */
#include "server/rendezvous/torch_ipc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/rendezvous/pickle_vm.h"

#define RED "torch.multiprocessing.reductions"

typedef struct {
    srv_pk *u;
    int *status;
} tctx;

static int refuse501(tctx *c, const char *msg)
{
    *c->status = 501;
    return srv_pk_bad(c->u, c->u->n, "%s", msg);
}

/* REDUCE(global fn, tuple args) with fn = module.name: its argument tuple, else NULL. */
static const srv_pk_node *call_of(const srv_pk *u, const srv_pk_node *x, const char *module, const char *name)
{
    if (x->t != SRV_PK_REDUCE) return NULL;
    const srv_pk_node *fn = &u->nodes[x->a], *args = &u->nodes[x->b];
    if (!srv_pk_is_global(u, fn, module, name) || args->t != SRV_PK_TUPLE) return NULL;
    return args;
}

/* The i-th item of a tuple / list node (i < its item count). */
static const srv_pk_node *nth(const srv_pk *u, const srv_pk_node *x, uint32_t i)
{
    uint32_t ci = x->a;
    while (i--) ci = u->cells[ci].next;
    return srv_pk_item(u, ci);
}

static int copy_str(srv_pk *u, const srv_pk_node *s, char **out, const char *what)
{
    if (s->t != SRV_PK_STR || s->b == 0 || s->b > SRV_TORCH_MAX_NAME || memchr(u->p + s->a, 0, s->b))
        return srv_pk_bad(u, u->n, "%s is not a string of 1..512 bytes without NUL", what);
    if (!(*out = malloc(s->b + 1))) return srv_pk_bad(u, u->n, "out of memory%s", NULL);
    memcpy(*out, u->p + s->a, s->b);
    (*out)[s->b] = 0;
    return 0;
}

/* The untyped storage of a tensor into t (where, shm, storage_bytes). */
static int storage(tctx *c, const srv_pk_node *x, const char *where, srv_torch_tensor *t)
{
    srv_pk *u = c->u;
    const srv_pk_node *a;
    if ((a = call_of(u, x, RED, "rebuild_storage_filename"))) {
        if (a->c != 4 && a->c != 5) return srv_pk_bad(u, u->n, "the storage of %s has other than 4 or 5 arguments", where);
        const srv_pk_node *cls = nth(u, a, 0), *h = nth(u, a, 2), *sz = nth(u, a, 3);
        if (!srv_pk_is_global(u, cls, "torch.storage", "UntypedStorage"))
            return srv_pk_bad(u, u->n, "the storage of %s is not a torch.storage.UntypedStorage", where);
        if (h->t != SRV_PK_BYTES || h->b < 2 || h->b > SRV_TORCH_MAX_SHM || memcmp(u->p + h->a, "/torch_", 7) != 0)
            return srv_pk_bad(u, u->n, "the shared-memory name of %s is not \"/torch_...\"", where);
        for (uint32_t k = 7; k < h->b; k++) {
            const unsigned char ch = u->p[h->a + k];
            if (!((ch >= '0' && ch <= '9') || ch == '_'))
                return srv_pk_bad(u, u->n, "the shared-memory name of %s has a character other than digits and _", where);
        }
        if (sz->t != SRV_PK_INT || sz->v < 0) return srv_pk_bad(u, u->n, "the storage size of %s is not an int", where);
        uint64_t bytes = (uint64_t)sz->v;
        if (a->c == 5) { /* a TypedStorage's own reduction: size in elements of its dtype */
            mdl_dtype sdt;
            if (srv_pk_torch_dtype(u, nth(u, a, 4), &sdt) != 0)
                return srv_pk_bad(u, u->n, "the storage dtype of %s is not a torch dtype", where);
            bytes *= mdl_dtype_size(sdt);
        }
        t->where = SRV_TORCH_SHM;
        memcpy(t->shm, u->p + h->a, h->b);
        t->shm[h->b] = 0;
        t->storage_bytes = bytes;
        return 0;
    }
    if ((a = call_of(u, x, RED, "rebuild_storage_empty"))) {
        t->where = SRV_TORCH_EMPTY;
        t->storage_bytes = 0;
        return 0;
    }
    if (call_of(u, x, RED, "rebuild_storage_fd"))
        return refuse501(c, "a CPU tensor shared with torch's \"file_descriptor\" strategy (its fd is passed to the "
                            "trainer's own processes only): call torch.multiprocessing.set_sharing_strategy("
                            "\"file_system\") in the trainer before serializing");
    return srv_pk_bad(u, u->n, "the storage of %s is not one torch's reductions make", where);
}

/* One tensor node into t (dtype, shape, storage, offset). */
static int tensor(tctx *c, const srv_pk_node *x, const char *where, srv_torch_tensor *t)
{
    srv_pk *u = c->u;
    if (call_of(u, x, RED, "rebuild_cuda_tensor") || call_of(u, x, "sglang.srt.utils.patch_torch", "_rebuild_cuda_tensor_modified"))
        return refuse501(c, "CUDA tensors (CUDA IPC handles) are not read by /update_weights_from_tensor yet; send CPU "
                            "tensors with the \"file_system\" sharing strategy, or use /update_weights_from_distributed");
    const srv_pk_node *a = call_of(u, x, RED, "rebuild_tensor");
    if (!a || a->c != 3) return srv_pk_bad(u, u->n, "%s is not a tensor of torch's reduce_tensor", where);
    const srv_pk_node *cls = nth(u, a, 0), *ts = nth(u, a, 1), *md = nth(u, a, 2);
    if (!srv_pk_is_global(u, cls, "torch", "Tensor") && !srv_pk_is_global(u, cls, "torch.nn.parameter", "Parameter"))
        return srv_pk_bad(u, u->n, "%s is not a torch.Tensor or a Parameter", where);
    const srv_pk_node *sa = call_of(u, ts, RED, "rebuild_typed_storage");
    if (!sa || sa->c != 2) return srv_pk_bad(u, u->n, "the storage of %s is not a typed storage", where);
    if (srv_pk_torch_dtype(u, nth(u, sa, 1), &t->dtype) != 0)
        return srv_pk_bad(u, u->n, "the dtype of %s is not one graphswap can receive", where);
    if (storage(c, nth(u, sa, 0), where, t)) return -1;
    if (md->t != SRV_PK_TUPLE || md->c != 4) return srv_pk_bad(u, u->n, "the metadata of %s is not a 4-tuple", where);
    const srv_pk_node *off = nth(u, md, 0), *st = nth(u, md, 2), *rg = nth(u, md, 3);
    if (off->t != SRV_PK_INT || off->v < 0) return srv_pk_bad(u, u->n, "the storage offset of %s is not an int", where);
    if (rg->t != SRV_PK_BOOL) return srv_pk_bad(u, u->n, "requires_grad of %s is not a bool", where);
    if (srv_pk_torch_size(u, nth(u, md, 1), where, SRV_TORCH_MAX_NUMEL, t->shape, &t->ndim, &t->numel)) return -1;
    if (st->t != SRV_PK_TUPLE || st->c != (uint32_t)t->ndim) return srv_pk_bad(u, u->n, "the strides of %s do not match its shape", where);
    int64_t expect = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        const srv_pk_node *sv = nth(u, st, (uint32_t)d);
        if (sv->t != SRV_PK_INT) return srv_pk_bad(u, u->n, "a stride of %s is not an int", where);
        if (t->shape[d] != 1 && sv->v != expect)
            return srv_pk_bad(u, u->n, "%s is not contiguous (send tensor.contiguous())", where);
        expect *= t->shape[d];
    }
    const uint64_t es = mdl_dtype_size(t->dtype);
    t->nbytes = t->numel * es;
    if ((uint64_t)off->v > SRV_TORCH_MAX_NUMEL) return srv_pk_bad(u, u->n, "the storage offset of %s is too large", where);
    t->offset_bytes = (uint64_t)off->v * es;
    if (t->offset_bytes > t->storage_bytes || t->nbytes > t->storage_bytes - t->offset_bytes)
        return srv_pk_bad(u, u->n, "%s lies outside its storage", where);
    return 0;
}

static int named_list(tctx *c, const srv_pk_node *l, srv_torch_named *out)
{
    srv_pk *u = c->u;
    if (l->t != SRV_PK_LIST) return srv_pk_bad(u, u->n, "the object is not a list of (name, tensor) tuples%s", NULL);
    if (l->c == 0 || l->c > SRV_TORCH_MAX_TENSORS) return srv_pk_bad(u, u->n, "the list holds no tensor or more than 16384%s", NULL);
    if (!(out->t = calloc(l->c, sizeof *out->t))) return srv_pk_bad(u, u->n, "out of memory%s", NULL);
    for (uint32_t ci = l->a; ci != SRV_PK_NIL; ci = u->cells[ci].next) {
        const srv_pk_node *e = srv_pk_item(u, ci);
        char where[64];
        snprintf(where, sizeof where, "entry %zu", out->n);
        srv_torch_tensor *t = &out->t[out->n++];
        if (e->t != SRV_PK_TUPLE || e->c != 2) return srv_pk_bad(u, u->n, "%s is not a (name, tensor) tuple", where);
        if (copy_str(u, nth(u, e, 0), &t->name, where)) return -1;
        srv_pk_clip(where, 48, (const unsigned char *)t->name, strlen(t->name));
        if (tensor(c, nth(u, e, 1), where, t)) return -1;
    }
    return 0;
}

/* The value of key in dict node d (string keys), or NULL. */
static const srv_pk_node *dict_get(const srv_pk *u, const srv_pk_node *d, const char *key)
{
    for (uint32_t ci = d->a; ci != SRV_PK_NIL; ci = u->cells[u->cells[ci].next].next) {
        const srv_pk_node *k = srv_pk_item(u, ci);
        if (k->t == SRV_PK_STR && srv_pk_eqs(u, k->a, k->b, key)) return srv_pk_item(u, u->cells[ci].next);
    }
    return NULL;
}

static int flattened(tctx *c, const srv_pk_node *d, srv_torch_named *out)
{
    srv_pk *u = c->u;
    if (d->t != SRV_PK_DICT || d->c != 4)
        return srv_pk_bad(u, u->n, "a flattened bucket is not a dict of flattened_tensor and metadata%s", NULL);
    const srv_pk_node *ft = dict_get(u, d, "flattened_tensor"), *md = dict_get(u, d, "metadata");
    if (!ft || !md) return srv_pk_bad(u, u->n, "a flattened bucket lacks flattened_tensor or metadata%s", NULL);
    srv_torch_tensor flat;
    memset(&flat, 0, sizeof flat);
    if (tensor(c, ft, "flattened_tensor", &flat)) return -1;
    if (flat.ndim != 1) return srv_pk_bad(u, u->n, "flattened_tensor is not one-dimensional%s", NULL);
    if (md->t != SRV_PK_LIST || md->c == 0 || md->c > SRV_TORCH_MAX_TENSORS)
        return srv_pk_bad(u, u->n, "metadata is not a list of 1..16384 FlattenedTensorMetadata%s", NULL);
    if (!(out->t = calloc(md->c, sizeof *out->t))) return srv_pk_bad(u, u->n, "out of memory%s", NULL);
    const uint64_t es = mdl_dtype_size(flat.dtype);
    for (uint32_t ci = md->a; ci != SRV_PK_NIL; ci = u->cells[ci].next) {
        const srv_pk_node *o = srv_pk_item(u, ci);
        char where[64];
        snprintf(where, sizeof where, "metadata %zu", out->n);
        srv_torch_tensor *t = &out->t[out->n++];
        if (o->t != SRV_PK_OBJ || !srv_pk_is_global(u, &u->nodes[o->a], "sglang.srt.weight_sync.tensor_bucket",
                                                     "FlattenedTensorMetadata") ||
            u->nodes[o->b].c != 0 || o->c == SRV_PK_NIL || u->nodes[o->c].t != SRV_PK_DICT)
            return srv_pk_bad(u, u->n, "%s is not a sglang FlattenedTensorMetadata", where);
        const srv_pk_node *st = &u->nodes[o->c];
        const srv_pk_node *nm = dict_get(u, st, "name"), *sh = dict_get(u, st, "shape"), *dt = dict_get(u, st, "dtype"),
                          *s0 = dict_get(u, st, "start_idx"), *s1 = dict_get(u, st, "end_idx"),
                          *ne = dict_get(u, st, "numel");
        if (st->c != 12 || !nm || !sh || !dt || !s0 || !s1 || !ne)
            return srv_pk_bad(u, u->n, "%s lacks one of name, shape, dtype, start_idx, end_idx, numel", where);
        if (copy_str(u, nm, &t->name, where)) return -1;
        srv_pk_clip(where, 48, (const unsigned char *)t->name, strlen(t->name));
        mdl_dtype mdt;
        if (srv_pk_torch_dtype(u, dt, &mdt) != 0) return srv_pk_bad(u, u->n, "the dtype of %s is not a torch dtype", where);
        if (srv_pk_torch_size(u, sh, where, SRV_TORCH_MAX_NUMEL, t->shape, &t->ndim, &t->numel)) return -1;
        if (s0->t != SRV_PK_INT || s1->t != SRV_PK_INT || ne->t != SRV_PK_INT || s0->v < 0 || s1->v < s0->v ||
            (uint64_t)(s1->v - s0->v) != t->numel || (uint64_t)ne->v != t->numel || (uint64_t)s1->v > flat.numel)
            return srv_pk_bad(u, u->n, "the range of %s does not fit its shape or the flat tensor", where);
        /* SGLang reshapes the range and casts it to the metadata's dtype; the engine converts the
         * flat tensor's values on write the same way (round to nearest even) */
        t->dtype = flat.dtype;
        t->nbytes = t->numel * es;
        t->where = flat.where;
        memcpy(t->shm, flat.shm, sizeof t->shm);
        t->storage_bytes = flat.storage_bytes;
        t->offset_bytes = flat.offset_bytes + (uint64_t)s0->v * es;
    }
    return 0;
}

int srv_torch_unpickle(const unsigned char *p, size_t n, const char *load_format, srv_torch_named *out, char *err,
                       size_t errlen, int *status)
{
    memset(out, 0, sizeof *out);
    *status = 400;
    srv_pk *u = calloc(1, sizeof *u);
    if (!u) return snprintf(err, errlen, "refusing torch's tensor pickle: out of memory"), *status = 500, -1;
    tctx c = {u, status};
    uint32_t root = 0;
    int rc = -1;
    if (n > SRV_TORCH_MAX_BYTES) {
        snprintf(err, errlen, "refusing torch's tensor pickle: longer than 16 MiB");
    } else if (srv_pk_parse(u, p, n, "torch's tensor", SRV_PK_TORCH, err, errlen, &root) == 0) {
        rc = load_format ? flattened(&c, &u->nodes[root], out) : named_list(&c, &u->nodes[root], out);
    }
    srv_pk_free(u);
    free(u);
    if (rc != 0) srv_torch_named_free(out);
    return rc;
}

void srv_torch_named_free(srv_torch_named *m)
{
    for (size_t i = 0; i < m->n; i++) free(m->t[i].name);
    free(m->t);
    memset(m, 0, sizeof *m);
}
