/* server/weights/weights_gpu.c — the GPU weight transports of the CUDA backend: NCCL (vLLM's
 * /update_weights, SGLang's /update_weights_from_distributed; the routes are in weights_vllm.c and
 * weights_sglang.c) and CUDA IPC (the native /v1/weights/ipc/... routes, here).
 *
 * Handler side: bodies are parsed and validated whole (base64 ids and handles, names / dtypes /
 * shapes / offsets into srv_gpu_meta). Engine side (srv_gpu_cmd_run, engine thread only): the
 * tensors are validated against the model before any byte moves, then received (one broadcast per
 * bucket) or copied out of the mapped IPC buffer into the model (engine/backend/transport_cuda.h: the CUDA
 * module's transport table; none on the CPU backend, where these commands answer 501).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "server/weights/weights_api.h"

#define GPU_ALIGN 256 /* NCCL packing (see the handler side below) */

/* ---- GPU transports, engine side ------------------------------------------------------------------ */

/* The CUDA module's transport table; NULL on the CPU backend. */
const gs_gpu_transport *srv_gpu_xport(const srv_state *s)
{
    if (!s->rt.be || strcmp(s->rt.be->ops->name, "cuda") != 0) return NULL;
    const gs_gpu_transport *(*get)(void);
    *(void **)&get = srv_cuda_symbol("gs_gpu_transport_table");
    const gs_gpu_transport *t = get ? get() : NULL;
    return t && t->abi == GS_GPU_TRANSPORT_ABI ? t : NULL;
}

double srv_nccl_timeout_s(const srv_state *s, double req)
{
    double t = req;
    if (!(t > 0) && s && s->nccl_timeout > 0) t = s->nccl_timeout;
    if (!(t > 0)) {
        const char *v = getenv("GRAPHSWAP_NCCL_TIMEOUT_S");
        t = v ? strtod(v, NULL) : 0;
    }
    if (!(t > 0)) t = 300;
    return t > 86400 ? 86400 : t;
}

static double gpu_timeout(const srv_state *s, const srv_cmd *c) { return srv_nccl_timeout_s(s, c->timeout); }

void srv_gpu_ipc_release(srv_state *s)
{
    const gs_gpu_transport *x = srv_gpu_xport(s);
    if (s->ipc_base && x) x->ipc_close(s->rt.be, s->ipc_base);
    s->ipc_base = NULL;
    s->ipc_bytes = s->ipc_offset = 0;
}

static void nccl_release(srv_state *s)
{
    const gs_gpu_transport *x = srv_gpu_xport(s);
    if (s->nccl && x) x->nccl_destroy(s->nccl);
    s->nccl = NULL;
    s->nccl_group[0] = 0;
    s->nccl_rank = s->nccl_world = s->nccl_root = 0;
}

void srv_gpu_nccl_release(srv_state *s) { nccl_release(s); }

/* The number of the next GPU-transport bucket in the open session, from 1 (engine thread). */
static uint64_t gpu_bucket_no(srv_state *s)
{
    eng_weights_info wi;
    eng_weights_get_info(s->rt.e, &wi);
    if (wi.session_id != s->gpu_session) {
        s->gpu_session = wi.session_id;
        s->n_gpu_buckets = 0;
    }
    return ++s->n_gpu_buckets;
}

/* Points every tensor of the metadata into the device buffer base. */
static void gpu_meta_bind(srv_gpu_meta *m, const uint8_t *base)
{
    for (size_t i = 0; i < m->n; i++) m->t[i].data = base + m->off[i];
}

/* ---- NCCL framing (srv_gpu_meta): the trainer's broadcasts and where they land in the staging ----
 * The engine receives the broadcasts of a bucket in order, as many at a time as the staging holds
 * (a group): each broadcast at a multiple of GPU_ALIGN, its tensors back to back as the trainer
 * packed them (roff). The conversion kernels read whole elements, so a tensor that lands at an
 * offset that is not a multiple of its dtype size (a bf16 tensor of odd length before an f32 one in
 * a packed chunk) is then moved (a device memcpy) to an aligned place after the group's broadcasts
 * (off); every other tensor is written from where it landed (off == roff). */
#define ALIGN_UP(x) (((x) + GPU_ALIGN - 1) / GPU_ALIGN * GPU_ALIGN)

size_t srv_gpu_meta_frames(const srv_gpu_meta *m) { return m->nframes ? m->nframes : m->n; }

static void frame_range(const srv_gpu_meta *m, size_t k, size_t *a, size_t *b)
{
    if (!m->nframes) {
        *a = k, *b = k + 1;
        return;
    }
    *a = k ? m->frame_end[k - 1] : 0;
    *b = m->frame_end[k];
}

/* Staging bytes of broadcast k: its bytes (rounded up to GPU_ALIGN) and the room its misaligned
 * tensors move to. */
static void frame_cost(const srv_gpu_meta *m, size_t k, uint64_t *recv, uint64_t *move)
{
    size_t a, b;
    frame_range(m, k, &a, &b);
    uint64_t at = 0, mv = 0;
    for (size_t i = a; i < b; i++) {
        const size_t w = mdl_dtype_size(m->t[i].dtype);
        if (w && at % w) mv += ALIGN_UP(m->t[i].nbytes);
        at += m->t[i].nbytes;
    }
    *recv = ALIGN_UP(at);
    *move = mv;
}

uint64_t srv_gpu_meta_frame_need(const srv_gpu_meta *m)
{
    uint64_t need = 0;
    for (size_t k = 0; k < srv_gpu_meta_frames(m); k++) {
        uint64_t r, mv;
        frame_cost(m, k, &r, &mv);
        if (r + mv > need) need = r + mv;
    }
    return need;
}

uint64_t srv_gpu_meta_layout(srv_gpu_meta *m, size_t k0, size_t k1)
{
    size_t a0, b, a, b1;
    frame_range(m, k0, &a0, &b);
    frame_range(m, k1 - 1, &a, &b1);
    uint64_t at = 0;
    for (size_t k = k0; k < k1; k++) {
        frame_range(m, k, &a, &b);
        at = ALIGN_UP(at);
        for (size_t i = a; i < b; i++) m->roff[i] = at, at += m->t[i].nbytes;
    }
    for (size_t i = a0; i < b1; i++) {
        const size_t w = mdl_dtype_size(m->t[i].dtype);
        if (w && m->roff[i] % w) {
            at = ALIGN_UP(at);
            m->off[i] = at;
            at += m->t[i].nbytes;
        } else {
            m->off[i] = m->roff[i];
        }
    }
    return at;
}

/* Receives every broadcast of c's bucket, a group at a time, from the group's root. write: hands
 * each group's tensors to the open session (eng_weights_bucket_device); else drops them (a refused
 * bucket's bytes are still received, so the trainer's broadcasts complete and both sides stay in
 * step). A failed write drains the rest. Every broadcast must fit the staging (checked by the
 * caller: srv_gpu_meta_frame_need). 0, or -1 with err / *st (502 and the communicator released
 * when a receive failed). */
static int nccl_frames(srv_state *s, const gs_gpu_transport *x, srv_cmd *c, int write, char *err, size_t el,
                       int *st)
{
    srv_gpu_meta *m = &c->meta;
    eng_backend *be = s->rt.be;
    uint8_t *base = s->nccl_staging;
    const size_t nf = srv_gpu_meta_frames(m);
    int failed = 0;
    for (size_t k0 = 0, k1; k0 < nf; k0 = k1) {
        uint64_t used = 0, r, mv;
        for (k1 = k0; k1 < nf; k1++) { /* the group: as many broadcasts as the staging holds */
            frame_cost(m, k1, &r, &mv);
            if (k1 > k0 && used + r + mv > s->nccl_staging_bytes) break;
            used += r + mv;
        }
        srv_gpu_meta_layout(m, k0, k1);
        size_t a0, b1, a, b;
        frame_range(m, k0, &a0, &b);
        frame_range(m, k1 - 1, &a, &b1);
        for (size_t k = k0; k < k1; k++) {
            frame_range(m, k, &a, &b);
            const uint64_t bytes = b > a ? m->roff[b - 1] + m->t[b - 1].nbytes - m->roff[a] : 0;
            /* (an empty broadcast moves nothing: NCCL returns at once for a count of 0 on every rank) */
            if (bytes && x->nccl_recv(s->nccl, base + m->roff[a], bytes, s->nccl_root, gpu_timeout(s, c), err, el)) {
                *st = 502; /* the communicator is aborted: destroy and init again */
                nccl_release(s);
                return -1;
            }
        }
        if (!write || failed) continue;
        for (size_t i = a0; i < b1; i++)
            if (m->off[i] != m->roff[i] && m->t[i].numel &&
                be->ops->device_convert(be, base + m->off[i], m->t[i].dtype, base + m->roff[i], m->t[i].dtype,
                                        m->t[i].numel) != 0) {
                snprintf(err, el, "%s: moving %s to an aligned offset failed", c->what, m->t[i].name);
                *st = 500;
                failed = 1;
            }
        for (size_t i = a0; i < b1; i++) m->t[i].data = base + m->off[i];
        if (!failed && eng_weights_bucket_device(s->rt.e, m->t + a0, b1 - a0, c->what, err, el, st) != 0) failed = 1;
    }
    return failed ? -1 : 0;
}

/* Receives and drops the bucket of a command the engine refused (see nccl_frames), when it can be
 * received at all. Appends to c->err on failure. */
static void nccl_drain(srv_state *s, const gs_gpu_transport *x, srv_cmd *c)
{
    if (!x || !s->nccl || srv_gpu_meta_frame_need(&c->meta) > s->nccl_staging_bytes) return;
    char e2[512];
    int st2;
    if (nccl_frames(s, x, c, 0, e2, sizeof e2, &st2) != 0) {
        size_t l = strlen(c->err);
        snprintf(c->err + l, sizeof c->err - l, "; receiving its bytes also failed: %s", e2);
    }
}

/* An NCCL bucket: validate against the model -> receive its broadcasts -> device writes. */
static int nccl_bucket(srv_state *s, srv_cmd *c, int *st)
{
    eng_engine *e = s->rt.e;
    const gs_gpu_transport *x = srv_gpu_xport(s);
    char *err = c->err;
    const size_t el = sizeof c->err;
    snprintf(c->what, sizeof c->what, "nccl bucket %llu", (unsigned long long)gpu_bucket_no(s));
    if (eng_weights_validate(e, c->meta.t, c->meta.n, c->what, err, el, st) != 0) {
        nccl_drain(s, x, c);
        return -1;
    }
    if (!x) return snprintf(err, el, "%s", SRV_GPU_NEEDS_CUDA), *st = 501, -1;
    if (!x->have_nccl)
        return snprintf(err, el, "this server's CUDA module was built without NCCL"), *st = 501, -1;
    if (!s->nccl)
        return snprintf(err, el, "no NCCL group: POST /init_weight_transfer_engine (vLLM) or "
                                 "/init_weights_update_group (SGLang) first"), *st = 409, -1;
    const uint64_t need = srv_gpu_meta_frame_need(&c->meta);
    if (need > s->nccl_staging_bytes)
        return snprintf(err, el, "%s: a broadcast needs %llu bytes of the NCCL staging buffer (%zu bytes): send "
                                 "smaller broadcasts (vLLM: packed_buffer_size_bytes), or give the init a larger "
                                 "staging_bytes (GRAPHSWAP_NCCL_STAGING_BYTES)", c->what, (unsigned long long)need,
                        s->nccl_staging_bytes), *st = 400, -1;
    if (nccl_frames(s, x, c, 1, err, el, st) != 0) return -1;
    *st = 200;
    return 0;
}

static int nccl_init_cmd(srv_state *s, srv_cmd *c, int *st)
{
    const gs_gpu_transport *x = srv_gpu_xport(s);
    char *err = c->err;
    const size_t el = sizeof c->err;
    if (!x) return snprintf(err, el, "%s", SRV_GPU_NEEDS_CUDA), *st = 501, -1;
    if (!x->have_nccl)
        return snprintf(err, el, "this server's CUDA module was built without NCCL"), *st = 501, -1;
    if (s->nccl)
        return snprintf(err, el, "an NCCL group (rank %d of %d) already exists: POST /destroy_weights_update_group "
                                 "first", s->nccl_rank, s->nccl_world), *st = 409, -1;
    size_t want = c->staging_req;
    if (!want) {
        const char *v = getenv("GRAPHSWAP_NCCL_STAGING_BYTES");
        want = v ? (size_t)strtoull(v, NULL, 10) : 0;
    }
    if (!want || want > s->max_bucket) want = s->max_bucket;
    if (want < GPU_ALIGN) want = GPU_ALIGN; /* (the warm-up all_reduce uses its first 4 bytes) */
    /* one device staging buffer for the life of the process: every bucket of every group reuses it
     * (arena memory is never handed out twice, so it is not freed with the group) */
    if (!s->nccl_staging) {
        s->nccl_staging = s->rt.be->ops->alloc(s->rt.be, want, "nccl.staging");
        if (!s->nccl_staging)
            return snprintf(err, el, "cannot allocate %zu bytes of NCCL staging from the GPU arena (give a smaller "
                                     "staging_bytes, or more --gpu-memory-mb)", want), *st = 507, -1;
        s->nccl_staging_bytes = want;
    }
    s->nccl = x->nccl_init(s->rt.be, c->blob, c->blob_len, c->rank, c->world, gpu_timeout(s, c), err, el);
    if (!s->nccl) return *st = 502, -1;
    /* the peers' warm-up collective (vLLM's PyNcclCommunicator), matched before any broadcast */
    if (c->warmup && x->nccl_warmup(s->nccl, s->nccl_staging, gpu_timeout(s, c), err, el) != 0) {
        nccl_release(s);
        return *st = 502, -1;
    }
    s->nccl_rank = c->rank;
    s->nccl_world = c->world;
    s->nccl_root = c->root;
    snprintf(s->nccl_group, sizeof s->nccl_group, "%s", c->group);
    if (c->timeout > 0) s->nccl_timeout = c->timeout;
    c->result = cJSON_CreateObject();
    cJSON_AddBoolToObject(c->result, "success", 1);
    cJSON_AddStringToObject(c->result, "message", "NCCL group initialized");
    cJSON_AddNumberToObject(c->result, "rank", c->rank);
    cJSON_AddNumberToObject(c->result, "world_size", c->world);
    cJSON_AddNumberToObject(c->result, "staging_bytes", (double)s->nccl_staging_bytes);
    cJSON_AddNumberToObject(c->result, "alignment", 256);
    cJSON_AddBoolToObject(c->result, "warmup_all_reduce", c->warmup);
    cJSON_AddStringToObject(c->result, "unique_id_from", c->rendezvous ? "tcpstore" : "nccl_unique_id_b64");
    *st = 200;
    return 0;
}

/* /update_weights_from_distributed: one partial session around one bucket. */
static int nccl_update(srv_state *s, srv_cmd *c, int *st)
{
    eng_engine *e = s->rt.e;
    char *err = c->err;
    const size_t el = sizeof c->err;
    const gs_gpu_transport *x = srv_gpu_xport(s);
    if (!x) return snprintf(err, el, "%s", SRV_GPU_NEEDS_CUDA), *st = 501, -1;
    if (!s->nccl)
        return snprintf(err, el, "no NCCL group: POST /init_weights_update_group first"), *st = 409, -1;
    if (eng_weights_begin(e, 0, ENG_WMODEL_TARGET, c->pause, c->version, &c->session, err, el, st) != 0) {
        nccl_drain(s, x, c);
        return -1;
    }
    if (nccl_bucket(s, c, st) != 0) {
        int st2;
        char e2[64];
        eng_weights_abort(e, e2, sizeof e2, &st2);
        return -1;
    }
    if (eng_weights_finish(e, c->version, err, el, st) != 0) return -1;
    *st = 200;
    return 0;
}

static int ipc_open_cmd(srv_state *s, srv_cmd *c, int *st)
{
    eng_weights_info wi;
    eng_weights_get_info(s->rt.e, &wi);
    char *err = c->err;
    const size_t el = sizeof c->err;
    const gs_gpu_transport *x = srv_gpu_xport(s);
    if (!wi.session_open)
        return snprintf(err, el, "ipc/open outside a session (state %s): POST /v1/weights/begin first",
                        eng_wstate_name(wi.state)), *st = 409, -1;
    if (!x) return snprintf(err, el, "%s", SRV_GPU_NEEDS_CUDA), *st = 501, -1;
    if (s->ipc_base && s->ipc_session == wi.session_id)
        return snprintf(err, el, "a CUDA IPC buffer is already open in this session (it is closed at finish / "
                                 "abort; send every bucket through it)"), *st = 409, -1;
    srv_gpu_ipc_release(s); /* a mapping left by an earlier session */
    uint8_t *p = x->ipc_open(s->rt.be, c->blob, c->blob_len, err, el);
    if (!p) return *st = 400, -1;
    s->ipc_base = p;
    s->ipc_offset = c->ipc_offset;
    s->ipc_bytes = c->ipc_bytes;
    s->ipc_session = wi.session_id;
    *st = 200;
    return 0;
}

static int ipc_bucket_cmd(srv_state *s, srv_cmd *c, int *st)
{
    eng_engine *e = s->rt.e;
    char *err = c->err;
    const size_t el = sizeof c->err;
    snprintf(c->what, sizeof c->what, "ipc bucket %llu", (unsigned long long)gpu_bucket_no(s));
    if (eng_weights_validate(e, c->meta.t, c->meta.n, c->what, err, el, st) != 0) return -1;
    if (!srv_gpu_xport(s)) return snprintf(err, el, "%s", SRV_GPU_NEEDS_CUDA), *st = 501, -1;
    eng_weights_info wi;
    eng_weights_get_info(e, &wi);
    if (!s->ipc_base || s->ipc_session != wi.session_id)
        return snprintf(err, el, "no CUDA IPC buffer is open in this session: POST /v1/weights/ipc/open first"),
               *st = 409, -1;
    if (c->meta.total > s->ipc_bytes)
        return snprintf(err, el, "%s: tensors reach byte %llu of an IPC buffer of %zu bytes", c->what,
                        (unsigned long long)c->meta.total, s->ipc_bytes), *st = 400, -1;
    gpu_meta_bind(&c->meta, s->ipc_base + s->ipc_offset);
    if (eng_weights_bucket_device(e, c->meta.t, c->meta.n, c->what, err, el, st) != 0) return -1;
    /* the trainer may overwrite its buffer as soon as this returns */
    s->rt.be->ops->synchronize(s->rt.be);
    *st = 200;
    return 0;
}

void srv_gpu_cmd_run(srv_state *s, srv_cmd *c, int *st)
{
    switch (c->kind) {
    case SRV_CMD_NCCL_INIT:
        nccl_init_cmd(s, c, st);
        break;
    case SRV_CMD_NCCL_BUCKET:
        nccl_bucket(s, c, st);
        break;
    case SRV_CMD_NCCL_UPDATE:
        nccl_update(s, c, st);
        break;
    case SRV_CMD_NCCL_DESTROY:
        if (!s->nccl) {
            snprintf(c->err, sizeof c->err, "no NCCL group to destroy");
            *st = 409;
        } else {
            nccl_release(s);
        }
        break;
    case SRV_CMD_IPC_OPEN:
        ipc_open_cmd(s, c, st);
        break;
    case SRV_CMD_IPC_BUCKET:
        ipc_bucket_cmd(s, c, st);
        break;
    default:
        snprintf(c->err, sizeof c->err, "not a GPU-transport command");
        *st = 500;
        break;
    }
}

/* ---- GPU transports, handler side ----------------------------------------------------------------------
 * Bodies are validated whole here (400 naming the field); the engine thread then validates the
 * tensors against the model before any byte moves, and only then receives / copies.
 *
 * NCCL framing, as each framework's trainer broadcasts (srv_gpu_meta): every tensor's bytes are
 * numel * dtype size, contiguous, little endian, in the order of the metadata; either one broadcast
 * per tensor (vLLM's /update_weights without packed, SGLang's /update_weights_from_distributed by
 * default, AReaL, TRL) or broadcasts of several tensors back to back without padding (vLLM packed
 * chunks: srv_gpu_meta_parse_vllm; SGLang's load_format "flattened_bucket"). */
static int b64_val(int ch)
{
    if (ch >= 'A' && ch <= 'Z') return ch - 'A';
    if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9') return ch - '0' + 52;
    if (ch == '+' || ch == '-') return 62;
    if (ch == '/' || ch == '_') return 63;
    return -1;
}

/* Standard or URL-safe base64 (padding optional). Returns the decoded length, or -1. */
long srv_b64_decode(const char *in, unsigned char *out, size_t cap)
{
    size_t n = 0;
    unsigned acc = 0;
    int bits = 0;
    for (; *in && *in != '='; in++) {
        int v = b64_val((unsigned char)*in);
        if (v < 0) return -1;
        acc = (acc << 6) | (unsigned)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (n >= cap) return -1;
            out[n++] = (unsigned char)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    while (*in == '=') in++;
    return *in ? -1 : (long)n;
}

/* "bfloat16", "torch.bfloat16", "BF16", "bf16", "float16", "half", "float32", "float" ... */
static int gpu_dtype_parse(const char *s, mdl_dtype *out)
{
    if (strncmp(s, "torch.", 6) == 0) s += 6;
    static const struct {
        const char *n;
        mdl_dtype dt;
    } tab[] = {{"bfloat16", MDL_DT_BF16}, {"bf16", MDL_DT_BF16}, {"float16", MDL_DT_F16}, {"half", MDL_DT_F16},
               {"f16", MDL_DT_F16},       {"float32", MDL_DT_F32}, {"float", MDL_DT_F32}, {"f32", MDL_DT_F32}};
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (strcasecmp(s, tab[i].n) == 0) return *out = tab[i].dt, 0;
    return mdl_dtype_parse(s, out); /* the safetensors names; the engine refuses non-float ones */
}

void srv_gpu_meta_free(srv_gpu_meta *m)
{
    for (size_t i = 0; i < m->n; i++) free(m->t[i].name);
    free(m->t);
    free(m->off);
    free(m->roff);
    free(m->frame_end);
    memset(m, 0, sizeof *m);
}

/* Parses names / dtypes / shapes (and, for IPC, offsets) of obj. pfx prefixes the field names in
 * messages ("update_info."). offsets_key NULL: NCCL, one broadcast per tensor, each at a multiple of
 * GPU_ALIGN (the engine lays the staging out again when it receives; see srv_gpu_meta_chunks). */
int srv_gpu_meta_parse(const cJSON *obj, const char *pfx, const char *names_key, const char *dtypes_key,
                          const char *offsets_key, srv_gpu_meta *m, srv_err *e)
{
    char f[4][96];
    snprintf(f[0], sizeof f[0], "%s%s", pfx, names_key);
    snprintf(f[1], sizeof f[1], "%s%s", pfx, dtypes_key);
    snprintf(f[2], sizeof f[2], "%sshapes", pfx);
    snprintf(f[3], sizeof f[3], "%s%s", pfx, offsets_key ? offsets_key : "offsets");
    const cJSON *names = cJSON_GetObjectItemCaseSensitive(obj, names_key);
    const cJSON *dts = cJSON_GetObjectItemCaseSensitive(obj, dtypes_key);
    const cJSON *shapes = cJSON_GetObjectItemCaseSensitive(obj, "shapes");
    const cJSON *offs = offsets_key ? cJSON_GetObjectItemCaseSensitive(obj, offsets_key) : NULL;
    memset(m, 0, sizeof *m);
    if (!cJSON_IsArray(names) || cJSON_GetArraySize(names) == 0)
        return srv_errf(e, 400, f[0], "%s must be a non-empty list of tensor names", f[0]), -1;
    int n = cJSON_GetArraySize(names);
    if (!cJSON_IsArray(dts) || cJSON_GetArraySize(dts) != n)
        return srv_errf(e, 400, f[1], "%s must be a list of %d dtype names (one per tensor)", f[1], n), -1;
    if (!cJSON_IsArray(shapes) || cJSON_GetArraySize(shapes) != n)
        return srv_errf(e, 400, f[2], "%s must be a list of %d shapes (one per tensor)", f[2], n), -1;
    if (offsets_key && (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != n))
        return srv_errf(e, 400, f[3], "%s must be a list of %d byte offsets (one per tensor)", f[3], n), -1;
    m->t = calloc((size_t)n, sizeof *m->t);
    m->off = calloc((size_t)n, sizeof *m->off);
    m->roff = calloc((size_t)n, sizeof *m->roff);
    if (!m->t || !m->off || !m->roff) {
        srv_gpu_meta_free(m);
        return srv_errf(e, 500, NULL, "out of memory"), -1;
    }
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        mdl_st_tensor *t = &m->t[i];
        const cJSON *nm = cJSON_GetArrayItem(names, i), *dt = cJSON_GetArrayItem(dts, i);
        const cJSON *sh = cJSON_GetArrayItem(shapes, i);
        if (!cJSON_IsString(nm) || !nm->valuestring[0] || strlen(nm->valuestring) > 512) {
            srv_errf(e, 400, f[0], "%s[%d] must be a tensor name", f[0], i);
            goto bad;
        }
        for (int j = 0; j < i; j++)
            if (strcmp(m->t[j].name, nm->valuestring) == 0) {
                srv_errf(e, 400, f[0], "%s: tensor %s appears twice", f[0], nm->valuestring);
                goto bad;
            }
        if (!cJSON_IsString(dt) || gpu_dtype_parse(dt->valuestring, &t->dtype) != 0) {
            srv_errf(e, 400, f[1], "%s[%d] (%s) must be a dtype name such as \"bfloat16\", \"float16\" or \"float32\"",
                     f[1], i, nm->valuestring);
            goto bad;
        }
        int nd = cJSON_IsArray(sh) ? cJSON_GetArraySize(sh) : -1;
        if (nd < 0 || nd > MDL_ST_MAX_DIMS) {
            srv_errf(e, 400, f[2], "%s[%d] (%s) must be a list of at most %d dimensions", f[2], i, nm->valuestring,
                     MDL_ST_MAX_DIMS);
            goto bad;
        }
        t->name = strdup(nm->valuestring);
        if (!t->name) {
            srv_errf(e, 500, NULL, "out of memory");
            goto bad;
        }
        m->n = (size_t)i + 1;
        t->ndim = nd;
        uint64_t numel = 1;
        for (int d = 0; d < nd; d++) {
            const cJSON *x = cJSON_GetArrayItem(sh, d);
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 9007199254740992.0 ||
                x->valuedouble != (double)(int64_t)x->valuedouble) {
                srv_errf(e, 400, f[2], "%s[%d] (%s): dimension %d must be a non-negative integer", f[2], i,
                         t->name, d);
                goto bad;
            }
            t->shape[d] = (int64_t)x->valuedouble;
            if (t->shape[d] && numel > (UINT64_C(1) << 48) / (uint64_t)t->shape[d]) {
                srv_errf(e, 400, f[2], "%s[%d] (%s) is too large", f[2], i, t->name);
                goto bad;
            }
            numel *= (uint64_t)t->shape[d];
        }
        t->numel = numel;
        t->nbytes = numel * mdl_dtype_size(t->dtype);
        uint64_t off;
        if (offsets_key) {
            const cJSON *o = cJSON_GetArrayItem(offs, i);
            size_t w = mdl_dtype_size(t->dtype);
            if (!cJSON_IsNumber(o) || o->valuedouble < 0 || o->valuedouble > 9007199254740992.0 ||
                o->valuedouble != (double)(uint64_t)o->valuedouble || ((uint64_t)o->valuedouble % (w ? w : 1))) {
                srv_errf(e, 400, f[3], "%s[%d] (%s) must be a non-negative byte offset, a multiple of %zu", f[3], i,
                         t->name, w);
                goto bad;
            }
            off = (uint64_t)o->valuedouble;
        } else {
            off = (at + GPU_ALIGN - 1) / GPU_ALIGN * GPU_ALIGN;
        }
        m->off[i] = off;
        at = off + t->nbytes;
        if (at > m->total) m->total = at;
    }
    if (offsets_key) { /* tensors of one bucket must not overlap */
        for (size_t i = 0; i < m->n; i++)
            for (size_t j = i + 1; j < m->n; j++)
                if (m->t[i].nbytes && m->t[j].nbytes && m->off[i] < m->off[j] + m->t[j].nbytes &&
                    m->off[j] < m->off[i] + m->t[i].nbytes) {
                    srv_errf(e, 400, f[3], "%s: tensors %s and %s overlap", f[3], m->t[i].name, m->t[j].name);
                    goto bad;
                }
    }
    return 0;
bad:
    srv_gpu_meta_free(m);
    return -1;
}

int srv_gpu_meta_chunks(srv_gpu_meta *m, uint64_t chunk_bytes, srv_err *e)
{
    free(m->frame_end);
    m->frame_end = NULL;
    m->nframes = 0;
    if (!m->n) return 0;
    m->frame_end = malloc(m->n * sizeof *m->frame_end);
    if (!m->frame_end) return srv_errf(e, 500, NULL, "out of memory"), -1;
    uint64_t total = 0;
    for (size_t i = 0; i < m->n; i++) { /* vLLM pack_tensors: append, then cut once past the size */
        total += m->t[i].nbytes;
        if (total > chunk_bytes || i + 1 == m->n) {
            m->frame_end[m->nframes++] = i + 1;
            total = 0;
        }
    }
    return 0;
}

/* vllm-project/vllm@04b06efe2a8eca78e3ce13cd80992f7f440c928a vllm/distributed/weight_transfer/
 * nccl_engine.py NCCLWeightTransferUpdateInfo and receive_weights: packed -> packed_tensor.py
 * packed_nccl_broadcast_consumer (@00a9ccfb4cefdaf0092392b0afba5721b33886e6: chunks cut past
 * packed_buffer_size_bytes, default 1 GiB; packed_num_buffers only sets how many are in flight),
 * else one broadcast per tensor. */
#define VLLM_PACKED_BUFFER_BYTES (UINT64_C(1) << 30)

int srv_gpu_meta_parse_vllm(const cJSON *ui, const char *pfx, srv_gpu_meta *m, srv_err *e)
{
    char f[96];
    const cJSON *pk = cJSON_GetObjectItemCaseSensitive(ui, "packed");
    long long buf, nbuf;
    memset(m, 0, sizeof *m);
    snprintf(f, sizeof f, "%spacked", pfx);
    if (pk && !cJSON_IsNull(pk) && !cJSON_IsBool(pk)) return srv_errf(e, 400, f, "%s must be a boolean", f), -1;
    if (srv_json_int(ui, pfx, "packed_buffer_size_bytes", 0, 1, (long long)1 << 50,
                     (long long)VLLM_PACKED_BUFFER_BYTES, &buf, e) ||
        srv_json_int(ui, pfx, "packed_num_buffers", 0, 1, 1024, 2, &nbuf, e) ||
        srv_gpu_meta_parse(ui, pfx, "names", "dtype_names", NULL, m, e) != 0)
        return -1;
    if (cJSON_IsTrue(pk) && srv_gpu_meta_chunks(m, (uint64_t)buf, e) != 0) {
        srv_gpu_meta_free(m);
        return -1;
    }
    return 0;
}

/* An integer field of o in [lo, hi]; required or (dflt when absent). */
int srv_json_int(const cJSON *o, const char *pfx, const char *key, int required, long long lo, long long hi,
                   long long dflt, long long *out, srv_err *e)
{
    char f[96];
    snprintf(f, sizeof f, "%s%s", pfx, key);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return srv_errf(e, 400, f, "%s is required", f), -1;
        *out = dflt;
        return 0;
    }
    double d = 0;
    char *end = NULL;
    if (cJSON_IsNumber(v)) d = v->valuedouble;
    else if (cJSON_IsString(v) && v->valuestring[0]) { /* "29500": ports are often strings */
        d = strtod(v->valuestring, &end);
        if (*end) d = -1e300;
    } else d = -1e300;
    /* the range first: casting a double outside long long (1e300, the -1e300 above, NaN) is undefined */
    if (!(d >= (double)lo && d <= (double)hi) || d != (double)(long long)d)
        return srv_errf(e, 400, f, "%s must be an integer in [%lld, %lld]", f, lo, hi), -1;
    *out = (long long)d;
    return 0;
}

/* The NCCL group of an init body (init_info of vLLM, the top level of SGLang) into c. */
int srv_parse_nccl_init(const cJSON *o, const char *pfx, srv_cmd *c, srv_err *e)
{
    long long rank, world, port, staging, timeout;
    char f[96];
    if (srv_json_int(o, pfx, "world_size", 1, 2, 1 << 20, 0, &world, e) ||
        srv_json_int(o, pfx, "rank_offset", 1, 1, 1 << 20, 0, &rank, e) ||
        srv_json_int(o, pfx, "master_port", 0, 0, 65535, 0, &port, e) ||
        srv_json_int(o, pfx, "staging_bytes", 0, 1, (long long)1 << 50, 0, &staging, e) ||
        srv_json_int(o, pfx, "timeout_s", 0, 1, 86400, 0, &timeout, e))
        return -1;
    if (rank >= world) {
        snprintf(f, sizeof f, "%srank_offset", pfx);
        return srv_errf(e, 400, f, "%s (%lld) must be below world_size (%lld): the trainer is rank 0 and this server "
                        "(one GPU) is rank rank_offset", f, rank, world), -1;
    }
    const cJSON *ma = cJSON_GetObjectItemCaseSensitive(o, "master_address");
    if (ma && !cJSON_IsNull(ma) && !cJSON_IsString(ma)) {
        snprintf(f, sizeof f, "%smaster_address", pfx);
        return srv_errf(e, 400, f, "%s must be a string", f), -1;
    }
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "nccl_unique_id_b64");
    if (id && !cJSON_IsNull(id)) { /* the id itself (a test path: no framework sends it) */
        snprintf(f, sizeof f, "%snccl_unique_id_b64", pfx);
        long n = cJSON_IsString(id) ? srv_b64_decode(id->valuestring, c->blob, sizeof c->blob) : -1;
        if (n != GS_NCCL_ID_BYTES)
            return srv_errf(e, 400, f, "%s must be the base64 of a %d-byte ncclUniqueId", f, GS_NCCL_ID_BYTES), -1;
        c->blob_len = (size_t)n;
    } else { /* the frameworks' way: the id from the trainer's TCPStore at master_address:master_port */
        snprintf(f, sizeof f, "%smaster_address", pfx);
        if (!cJSON_IsString(ma) || !ma->valuestring[0] || strlen(ma->valuestring) >= sizeof c->master_addr)
            return srv_errf(e, 400, f, "%s (the trainer's TCPStore host, 1..%zu bytes) is required without "
                            "nccl_unique_id_b64: graphswap fetches the trainer's ncclUniqueId from its TCPStore at "
                            "master_address:master_port", f, sizeof c->master_addr - 1), -1;
        const cJSON *mp = cJSON_GetObjectItemCaseSensitive(o, "master_port");
        snprintf(f, sizeof f, "%smaster_port", pfx);
        int p = 0;
        if (!mp || cJSON_IsNull(mp))
            return srv_errf(e, 400, f, "%s (the trainer's TCPStore port) is required without nccl_unique_id_b64",
                            f), -1;
        if ((cJSON_IsString(mp) && srv_store_parse_port(mp->valuestring, &p) != 0) || port < 1)
            return srv_errf(e, 400, f, "%s must be a port, 1..65535 (an integer or a string of digits)", f), -1;
        snprintf(c->master_addr, sizeof c->master_addr, "%s", ma->valuestring);
        c->master_port = (int)port;
        c->rendezvous = 1;
    }
    c->rank = (int)rank;
    c->world = (int)world;
    c->staging_req = (size_t)staging;
    c->timeout = (double)timeout;
    return 0;
}

int srv_nccl_init_parse(const cJSON *b, srv_store_kind kind, srv_cmd *c, srv_err *e)
{
    if (kind == SRV_STORE_VLLM) {
        const cJSON *ii = cJSON_GetObjectItemCaseSensitive(b, "init_info");
        if (!cJSON_IsObject(ii)) return srv_errf(e, 400, "init_info", "init_info must be an object"), -1;
        if (srv_parse_nccl_init(ii, "init_info.", c, e) != 0) return -1;
        snprintf(c->group, sizeof c->group, "vllm");
    } else if (kind == SRV_STORE_SGLANG) {
        const char *group = NULL, *backend = NULL;
        if (srv_opt_string(b, "group_name", &group, e) || srv_opt_string(b, "backend", &backend, e)) return -1;
        if (backend && strcmp(backend, "nccl") != 0)
            return srv_errf(e, 400, "backend", "backend must be \"nccl\""), -1;
        if (srv_parse_nccl_init(b, "", c, e) != 0) return -1;
        char key[SRV_STORE_MAX_KEY + 1];
        if (c->rendezvous && (!group || srv_store_key(key, sizeof key, SRV_STORE_SGLANG, group) != 0))
            return srv_errf(e, 400, "group_name", "group_name (printable ASCII) is required without "
                            "nccl_unique_id_b64: it names the keys of the trainer's TCPStore"), -1;
        snprintf(c->group, sizeof c->group, "%s", group ? group : "");
    } else {
        return srv_errf(e, 500, NULL, "srv_nccl_init_parse: %s has no NCCL init body here", srv_store_kind_name(kind)),
               -1;
    }
    c->warmup = srv_store_warmup_allreduce(kind);
    return 0;
}

/* ---- the TCPStore rendezvous of an init body (handler threads) ------------------------------------------ */

/* (handler threads: the group's timeout, s->nccl_timeout, is the engine thread's) */
static int store_timeout_ms(const srv_cmd *c) { return (int)(srv_nccl_timeout_s(NULL, c->timeout) * 1000); }

static void store_req(const srv_cmd *c, srv_store_kind kind, srv_store_req *r)
{
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->host = c->master_addr;
    r->port = c->master_port;
    r->rank_offset = c->rank;
    r->world_size = c->world;
    r->group_name = kind == SRV_STORE_SGLANG ? c->group : NULL;
    r->backend = "nccl";
    r->timeout_ms = store_timeout_ms(c);
}

static int store_fail(srv_err *e, int rc, const srv_cmd *c, const char *what, const char *msg)
{
    return srv_errf(e, rc == SRV_STORE_TIMEOUT ? 504 : 502, NULL, "%s the trainer's TCPStore at %s:%d: %s", what,
                    c->master_addr, c->master_port, msg), -1;
}

int srv_nccl_rendezvous(srv_cmd *c, srv_store_kind kind, srv_err *e)
{
    srv_store_req r;
    store_req(c, kind, &r);
    char err[512];
    int rank = 0;
    int rc = srv_store_rendezvous(&r, c->blob, &rank, err, sizeof err);
    if (rc != 0) return store_fail(e, rc, c, "NCCL rendezvous through", err);
    c->blob_len = GS_NCCL_ID_BYTES;
    c->rank = rank;
    return 0;
}

int srv_nccl_store_join(srv_cmd *c, srv_store_group **g, srv_err *e)
{
    srv_store_req r;
    store_req(c, SRV_STORE_SGLANG, &r);
    char err[512];
    int rank = 0;
    int rc = srv_store_join(&r, g, &rank, err, sizeof err);
    if (rc != 0) return store_fail(e, rc, c, "joining", err);
    c->rank = rank;
    return 0;
}

int srv_nccl_store_fetch(srv_store_group *g, srv_cmd *c, srv_err *e)
{
    char err[512];
    int rc = srv_store_fetch_id(g, c->blob, store_timeout_ms(c), err, sizeof err);
    if (rc != 0) return store_fail(e, rc, c, "fetching the NCCL unique id from", err);
    c->blob_len = GS_NCCL_ID_BYTES;
    return 0;
}

int srv_gpu_available(const srv_state *s) { return srv_gpu_xport(s) != NULL; }

int srv_gpu_nccl_init(srv_state *s, srv_cmd *c, int *st) { return nccl_init_cmd(s, c, st); }
int srv_gpu_nccl_bucket(srv_state *s, srv_cmd *c, int *st) { return nccl_bucket(s, c, st); }
void srv_gpu_nccl_drain(srv_state *s, srv_cmd *c) { nccl_drain(s, srv_gpu_xport(s), c); }

int srv_gpu_nccl_recv_host(srv_state *s, srv_cmd *c, void *host, size_t bytes, int *st)
{
    const gs_gpu_transport *x = srv_gpu_xport(s);
    if (!x || !s->nccl || bytes > s->nccl_staging_bytes) {
        snprintf(c->err, sizeof c->err, "no NCCL group to receive %zu bytes with", bytes);
        return *st = 500, -1;
    }
    if (x->nccl_recv(s->nccl, s->nccl_staging, bytes, s->nccl_root, gpu_timeout(s, c), c->err, sizeof c->err)) {
        nccl_release(s); /* aborted: destroy and init again */
        return *st = 502, -1;
    }
    s->rt.be->ops->download(s->rt.be, host, s->nccl_staging, bytes); /* (synchronous) */
    return 0;
}

srv_cmd *srv_nccl_init_request(srv_state *s, struct mg_connection *conn, srv_store_kind kind, srv_err *e)
{
    cJSON *b = srv_read_json(&s->http, conn, e);
    if (!b) return NULL;
    srv_cmd *c = srv_cmd_new(SRV_CMD_NCCL_INIT);
    int rc = c ? srv_nccl_init_parse(b, kind, c, e) : srv_errf(e, 500, NULL, "out of memory");
    cJSON_Delete(b);
    /* on the CPU backend: 501 before any network I/O */
    if (rc == 0 && !srv_gpu_available(s)) rc = srv_errf(e, 501, NULL, SRV_GPU_NEEDS_CUDA);
    if (rc != 0) {
        free(c);
        return NULL;
    }
    return c;
}

/* POST /v1/weights/ipc/open {"handle_b64", "bytes"[, "offset"]}: maps the trainer's reusable bucket
 * buffer (a cudaIpcMemHandle_t of its allocation; offset: where the buffer starts in it) once per
 * session; it is unmapped at finish / abort. */
static int route_ipc_open(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(&s->http, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    SRV_NEW_CMD(c, SRV_CMD_IPC_OPEN);
    long long bytes = 0, off = 0;
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(b, "handle_b64");
    long n = cJSON_IsString(h) ? srv_b64_decode(h->valuestring, c->blob, sizeof c->blob) : -1;
    int rc = 0;
    if (n != GS_IPC_HANDLE_BYTES)
        rc = (srv_errf(&e, 400, "handle_b64", "handle_b64 must be the base64 of a %d-byte cudaIpcMemHandle_t",
                      GS_IPC_HANDLE_BYTES), -1);
    if (rc == 0 && (srv_json_int(b, "", "bytes", 1, 1, (long long)1 << 50, 0, &bytes, &e) ||
                    srv_json_int(b, "", "offset", 0, 0, (long long)1 << 50, 0, &off, &e)))
        rc = -1;
    if (rc == 0 && off % GPU_ALIGN) rc = (srv_errf(&e, 400, "offset", "offset must be a multiple of %d", GPU_ALIGN), -1);
    cJSON_Delete(b);
    if (rc != 0) {
        free(c);
        return srv_send_err(conn, &e);
    }
    c->blob_len = (size_t)n;
    c->ipc_bytes = (size_t)bytes;
    c->ipc_offset = (size_t)off;
    srv_cmd_submit(s, c); /* (the engine checks the session first, then answers 501 on the CPU backend) */
    cJSON *o = NULL;
    if (c->status == 200) {
        o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "success", 1);
        cJSON_AddNumberToObject(o, "bytes", (double)c->ipc_bytes);
    }
    int st = srv_cmd_send_result(conn, c, o);
    free(c);
    return st;
}

/* POST /v1/weights/ipc/bucket {"names", "dtypes", "shapes", "offsets"}: tensors at byte offsets of
 * the open IPC buffer (each a multiple of its dtype size, inside the buffer, not overlapping). */
static int route_ipc_bucket(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(&s->http, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    SRV_NEW_CMD(c, SRV_CMD_IPC_BUCKET);
    int rc = srv_gpu_meta_parse(b, "", "names", "dtypes", "offsets", &c->meta, &e);
    cJSON_Delete(b);
    if (rc != 0) {
        free(c);
        return srv_send_err(conn, &e);
    }
    srv_cmd_submit(s, c);
    cJSON *o = NULL;
    if (c->status == 200) {
        o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "tensors", (double)c->meta.n);
        uint64_t sum = 0;
        for (size_t i = 0; i < c->meta.n; i++) sum += c->meta.t[i].nbytes;
        cJSON_AddNumberToObject(o, "bytes", (double)sum);
    }
    int st = srv_cmd_send_result(conn, c, o);
    srv_gpu_meta_free(&c->meta);
    free(c);
    return st;
}

void srv_weights_gpu_routes(srv_state *s)
{
    srv_route_add(&s->http, "POST", "/v1/weights/ipc/open", route_ipc_open, 2);
    srv_route_add(&s->http, "POST", "/v1/weights/ipc/bucket", route_ipc_bucket, 2);
}
