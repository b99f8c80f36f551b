/* tests/fuzz/fuzz_weights_parse.c — libFuzzer harness for the JSON bodies of the weight routes
 * (server/weights/weights_api.c): begin / load options, vLLM and SGLang NCCL init, the NCCL bucket metadata
 * (vLLM /update_weights, SGLang /update_weights_from_distributed), CUDA-IPC open and bucket, the
 * checker and update_weight_version bodies, through the parsers the routes share
 * (server/weights/weights_api.h). Runs on a civetweb-sized stack.
 *
 * Input: byte 0 picks the body kind (mod 8); the rest is the JSON body.
 * Properties beyond "no crash":
 *   tensor metadata: one entry per name, names non-empty and unique, numel = product of the shape,
 *   nbytes = numel x dtype size, every tensor inside `total`; NCCL packing: tensor 0 at 0, each
 *   offset 256-aligned and past the previous tensor, total = end of the last; vLLM's framing
 *   (packed chunks): broadcasts cover the tensors in order, and the staging layout of all of them
 *   (srv_gpu_meta_layout) puts each broadcast's tensors back to back from a 256-aligned start, every
 *   tensor's final place aligned to its dtype, inside the bytes used, no two final places (nor a
 *   final place and another tensor's landing bytes) overlapping, and the largest broadcast's need
 *   (srv_gpu_meta_frame_need) covering a layout of it alone; IPC: offsets are
 *   multiples of the dtype size and tensors do not overlap. A refusal leaves the metadata empty.
 *   NCCL init: 1 <= rank < world, a 128-byte unique id. IPC open: a 64-byte handle, a 256-aligned
 *   offset. Every refusal is a 4xx/5xx with a message.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/backend/transport_cuda.h"
#include "server/weights/weights_api.h"

#define GPU_ALIGN 256 /* the NCCL packing alignment (weights_gpu.c) */

#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
    int kind;
    const char *body;
    size_t len;
} job;

static void check_err(const srv_err *e)
{
    FZ_CHECK(e->status >= 400 && e->status <= 599 && e->msg[0] != '\0');
}

static void check_meta(const cJSON *obj, const char *names_key, int ipc, const srv_gpu_meta *m)
{
    FZ_CHECK(m->n == (size_t)cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(obj, names_key)) && m->n >= 1);
    uint64_t end_prev = 0;
    for (size_t i = 0; i < m->n; i++) {
        const mdl_st_tensor *t = &m->t[i];
        FZ_CHECK(t->name && t->name[0] && (unsigned)t->dtype < MDL_DT_COUNT);
        FZ_CHECK(t->ndim >= 0 && t->ndim <= MDL_ST_MAX_DIMS);
        for (size_t j = 0; j < i; j++) FZ_CHECK(strcmp(m->t[j].name, t->name) != 0);
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            FZ_CHECK(t->shape[d] >= 0);
            numel *= (uint64_t)t->shape[d];
        }
        FZ_CHECK(numel == t->numel && t->nbytes == numel * mdl_dtype_size(t->dtype));
        FZ_CHECK(m->off[i] + t->nbytes <= m->total);
        if (ipc) {
            size_t w = mdl_dtype_size(t->dtype);
            FZ_CHECK(w == 0 || m->off[i] % w == 0);
            for (size_t j = 0; j < i; j++)
                FZ_CHECK(!t->nbytes || !m->t[j].nbytes || m->off[i] >= m->off[j] + m->t[j].nbytes ||
                         m->off[j] >= m->off[i] + t->nbytes);
        } else {
            FZ_CHECK(m->off[i] % GPU_ALIGN == 0 && m->off[i] >= end_prev && m->off[i] < end_prev + GPU_ALIGN);
            FZ_CHECK(i > 0 || m->off[0] == 0);
            end_prev = m->off[i] + t->nbytes;
        }
    }
    if (!ipc) FZ_CHECK(m->total == end_prev);
}

static int overlap(uint64_t a, uint64_t an, uint64_t b, uint64_t bn) { return an && bn && a < b + bn && b < a + an; }

/* vLLM's /update_weights framing (srv_gpu_meta_parse_vllm) and the engine's staging layout */
static void vllm_case(const cJSON *ui)
{
    srv_gpu_meta m;
    srv_err e;
    memset(&e, 0, sizeof e);
    if (srv_gpu_meta_parse_vllm(ui, "update_info.", &m, &e) != 0) {
        check_err(&e);
        FZ_CHECK(m.n == 0 && m.t == NULL && m.frame_end == NULL);
        return;
    }
    const size_t nf = srv_gpu_meta_frames(&m);
    FZ_CHECK(nf >= 1 && nf <= m.n && (m.nframes == 0 || m.frame_end[m.nframes - 1] == m.n));
    for (size_t k = 1; k < m.nframes; k++) FZ_CHECK(m.frame_end[k] > m.frame_end[k - 1]);
    const uint64_t need = srv_gpu_meta_frame_need(&m);
    for (size_t k = 0; k < nf; k++) FZ_CHECK(srv_gpu_meta_layout(&m, k, k + 1) <= need);
    const uint64_t used = srv_gpu_meta_layout(&m, 0, nf);
    for (size_t k = 0, a = 0; k < nf; k++) {
        const size_t b = m.nframes ? m.frame_end[k] : k + 1;
        FZ_CHECK(m.roff[a] % GPU_ALIGN == 0);
        for (size_t i = a + 1; i < b; i++) FZ_CHECK(m.roff[i] == m.roff[i - 1] + m.t[i - 1].nbytes);
        a = b;
    }
    for (size_t i = 0; i < m.n; i++) {
        const size_t w = mdl_dtype_size(m.t[i].dtype);
        FZ_CHECK(w && m.off[i] % w == 0 && m.off[i] + m.t[i].nbytes <= used && m.roff[i] + m.t[i].nbytes <= used);
        for (size_t j = 0; j < m.n; j++) {
            if (j == i) continue;
            FZ_CHECK(!overlap(m.off[i], m.t[i].nbytes, m.off[j], m.t[j].nbytes));
            FZ_CHECK(m.off[i] == m.roff[i] || !overlap(m.off[i], m.t[i].nbytes, m.roff[j], m.t[j].nbytes));
        }
    }
    srv_gpu_meta_free(&m);
}

static void meta_case(const cJSON *obj, const char *pfx, const char *names_key, const char *dtypes_key, int ipc)
{
    srv_gpu_meta m;
    srv_err e;
    memset(&e, 0, sizeof e);
    if (srv_gpu_meta_parse(obj, pfx, names_key, dtypes_key, ipc ? "offsets" : NULL, &m, &e) == 0) {
        check_meta(obj, names_key, ipc, &m);
        srv_gpu_meta_free(&m);
    } else {
        check_err(&e);
        FZ_CHECK(m.n == 0 && m.t == NULL && m.off == NULL);
    }
}

/* the NCCL init routes' parse (srv_nccl_init_parse: vLLM's init_info, SGLang's top level) */
static void nccl_case(const cJSON *b, srv_store_kind kind)
{
    srv_cmd *c = srv_cmd_new(SRV_CMD_NCCL_INIT);
    FZ_CHECK(c);
    srv_err e;
    memset(&e, 0, sizeof e);
    if (srv_nccl_init_parse(b, kind, c, &e) == 0) {
        FZ_CHECK(c->world >= 2 && c->rank >= 1 && c->rank < c->world && c->timeout >= 0);
        if (c->rendezvous) /* the id comes from the trainer's TCPStore */
            FZ_CHECK(c->blob_len == 0 && c->master_addr[0] && strlen(c->master_addr) < sizeof c->master_addr &&
                     c->master_port >= 1 && c->master_port <= 65535 && (kind != SRV_STORE_SGLANG || c->group[0]));
        else
            FZ_CHECK(c->blob_len == GS_NCCL_ID_BYTES);
        FZ_CHECK(c->warmup == srv_store_warmup_allreduce(kind));
    } else {
        check_err(&e);
    }
    free(c);
}

static void *run(void *arg)
{
    job *j = arg;
    srv_err e;
    memset(&e, 0, sizeof e);
    /* as srv_read_json_opt: the depth / NUL pre-check, then cJSON, one object */
    cJSON *b = srv_parse_json_object(j->body, j->len, &e);
    if (!b) {
        check_err(&e);
        return NULL;
    }
    srv_cmd *c = srv_cmd_new(SRV_CMD_BEGIN);
    FZ_CHECK(c);
    switch (j->kind) {
    case 0: /* /v1/weights/begin, /v1/weights/load, /update_weights_from_disk options */
        if (srv_parse_begin(b, c, (j->len & 1) ? ENG_WMODEL_DRAFT : ENG_WMODEL_TARGET, &e) == 0)
            FZ_CHECK(strlen(c->version) < sizeof c->version && (unsigned)c->pause <= ENG_PAUSE_RECOMPUTE);
        else
            check_err(&e);
        break;
    case 1: /* vLLM /init_weight_transfer_engine */
        nccl_case(b, SRV_STORE_VLLM);
        break;
    case 2: /* SGLang /init_weights_update_group */
        nccl_case(b, SRV_STORE_SGLANG);
        break;
    case 3: { /* vLLM /update_weights */
        const cJSON *ui = cJSON_GetObjectItemCaseSensitive(b, "update_info");
        if (cJSON_IsObject(ui)) meta_case(ui, "update_info.", "names", "dtype_names", 0);
        if (cJSON_IsObject(ui)) vllm_case(ui);
        break;
    }
    case 4: /* SGLang /update_weights_from_distributed */
        meta_case(b, "", "names", "dtypes", 0);
        break;
    case 5: { /* /v1/weights/ipc/open */
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(b, "handle_b64");
        long n = cJSON_IsString(h) ? srv_b64_decode(h->valuestring, c->blob, sizeof c->blob) : -1;
        FZ_CHECK(n >= -1 && n <= (long)sizeof c->blob);
        long long bytes = 0, off = 0;
        if (srv_json_int(b, "", "bytes", 1, 1, (long long)1 << 50, 0, &bytes, &e) == 0 &&
            srv_json_int(b, "", "offset", 0, 0, (long long)1 << 50, 0, &off, &e) == 0)
            FZ_CHECK(bytes >= 1 && bytes <= (long long)1 << 50 && off >= 0 && off <= (long long)1 << 50);
        else
            check_err(&e);
        break;
    }
    case 6: /* /v1/weights/ipc/bucket */
        meta_case(b, "", "names", "dtypes", 1);
        break;
    default: { /* /weight_checker, /update_weight_version */
        const char *action = NULL, *v = NULL;
        if (srv_opt_string(b, "action", &action, &e) == 0) FZ_CHECK(!action || strlen(action) < 128);
        else check_err(&e);
        if (srv_opt_string(b, "new_version", &v, &e) == 0) FZ_CHECK(!v || strlen(v) < 128);
        else check_err(&e);
        break;
    }
    }
    free(c);
    cJSON_Delete(b);
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    job j = {data[0] & 7, (const char *)data + 1, size - 1};
    fz_small_stack(run, &j);
    return 0;
}
