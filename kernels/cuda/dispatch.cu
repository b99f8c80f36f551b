/* kernels/cuda/dispatch.cu — the context (everything allocated once), kern_cuda_exec (one switch over
 * the op kinds, after the host-side contract check) and the device error record (errors.cu: the runtime errors). */
#include "kernels/cuda/common.cuh"

extern "C" int kern_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear: no driver / no device is not an error here */
        return 0;
    }
    return n;
}

/* Kernels are loaded lazily on first launch; this is allowed inside stream capture on current
 * drivers (CUDA >= 12.3), so nothing is preloaded here. */
extern "C" kern_cuda_ctx *kern_cuda_ctx_create(const kern_cuda_config *cfg, char *err, size_t errlen)
{
    kern_cuda_ctx *c = (kern_cuda_ctx *)calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of host memory");
        return NULL;
    }
    c->device = cfg->device;
    /* cuBLASLt state and its GEMM scratch only with fast_gemm: c->lt != NULL is the matmul's switch
     * (kernels/cuda/matmul.cu); the default, batch-invariant matmul needs no scratch */
    const int fast = cfg->fast_gemm != 0;
    c->gx_bytes = !fast ? 0 : cfg->gemm_x_bytes ? cfg->gemm_x_bytes : (size_t)32 << 20;
    c->gout_bytes = !fast ? 0 : cfg->gemm_out_bytes ? cfg->gemm_out_bytes : (size_t)64 << 20;
    c->lt_ws_bytes = !fast ? 0 : cfg->gemm_ws_bytes ? cfg->gemm_ws_bytes : (size_t)32 << 20;
    /* split-attention partials: 128 MiB hold every split of 126 rows at 32 heads x head dim 128 x
     * 64 splits (the most, reached at max_blocks * block_size >= 4096) in one launch; more rows run
     * in chunks of rows */
    c->attn_bytes = cfg->attn_bytes ? cfg->attn_bytes : (size_t)128 << 20;
    c->keys_bytes = cfg->keys_bytes ? cfg->keys_bytes : (size_t)1 << 20;
    cudaError_t e;
    const char *what = "";
#define TRY(call)                                                                                  \
    do {                                                                                           \
        what = #call;                                                                              \
        if ((e = (call)) != cudaSuccess) goto fail;                                                \
    } while (0)
    TRY(cudaDeviceGetAttribute(&c->sms, cudaDevAttrMultiProcessorCount, c->device));
    if (fast) {
        TRY(cudaMalloc(&c->lt_ws, c->lt_ws_bytes));
        TRY(cudaMalloc((void **)&c->gx, c->gx_bytes));
        TRY(cudaMalloc((void **)&c->gout, c->gout_bytes));
    }
    TRY(cudaMalloc((void **)&c->attn, c->attn_bytes));
    TRY(cudaMalloc((void **)&c->keys, c->keys_bytes));
    TRY(cudaHostAlloc((void **)&c->err_host, sizeof(kc_err), cudaHostAllocMapped));
    TRY(cudaHostGetDevicePointer((void **)&c->err_dev, c->err_host, 0));
#undef TRY
    memset(c->err_host, 0, sizeof(kc_err));
    c->dev_bytes = c->lt_ws_bytes + c->gx_bytes + c->gout_bytes + c->attn_bytes + c->keys_bytes;
    if (fast) {
        cublasStatus_t s = cublasLtCreate(&c->lt);
        if (s != CUBLAS_STATUS_SUCCESS) {
            snprintf(err, errlen, "cublasLtCreate failed (status %d)", (int)s);
            c->lt = NULL;
            kern_cuda_ctx_destroy(c);
            return NULL;
        }
    }
    return c;
fail:
    snprintf(err, errlen, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
    (void)cudaGetLastError();
    kern_cuda_ctx_destroy(c);
    return NULL;
}

extern "C" void kern_cuda_ctx_destroy(kern_cuda_ctx *c)
{
    if (!c) return;
    kc_matmul_release(c);
    if (c->lt) cublasLtDestroy(c->lt);
    cudaFree(c->lt_ws);
    cudaFree(c->gx);
    cudaFree(c->gout);
    cudaFree(c->attn);
    cudaFree(c->keys);
    if (c->err_host) cudaFreeHost(c->err_host);
    free(c);
}

extern "C" size_t kern_cuda_ctx_bytes(const kern_cuda_ctx *c) { return c->dev_bytes; }

static const char *err_text(unsigned code)
{
    switch (code) {
    case KC_ERR_ROWS: return "row count outside [0, max_rows]";
    case KC_ERR_TOKEN: return "token id outside the vocabulary";
    case KC_ERR_SLOT: return "sequence slot outside the block table";
    case KC_ERR_POS: return "position outside the block table";
    case KC_ERR_BLOCK: return "KV block id outside the cache";
    case KC_ERR_KVLEN: return "kv_len outside the block table";
    case KC_ERR_INDEX: return "gather index outside the source rows";
    case KC_ERR_PREV: return "previous draft token outside the vocabulary";
    case KC_ERR_BANS: return "ban list outside the bans buffer";
    case KC_ERR_LOGPROBS: return "n_logprobs outside [0, KERN_SAMPLE_MAX_TOP]";
    case KC_ERR_NO_TOKEN: return "every token banned";
    case KC_ERR_PEN: return "penalty state or logit_bias out of range";
    case KC_ERR_EXPERT: return "expert id outside [0, E) or repeated in a row";
    default: return "unknown check";
    }
}

extern "C" int kern_cuda_take_error(kern_cuda_ctx *c, char *msg, size_t msglen)
{
    volatile kc_err *e = c->err_host;
    unsigned code = e->code;
    if (code == KC_ERR_NONE) return 0;
    snprintf(msg, msglen, "%s op: %s (value %d, bound %d)", kern_op_name((kern_op_kind)e->kind), err_text(code),
             e->a, e->b);
    e->kind = 0;
    e->a = e->b = 0;
    e->code = 0;
    return 1;
}

extern "C" void kern_cuda_exec(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s)
{
    char why[192];
    if (kern_validate(op, why, sizeof why) != 0) {
        fprintf(stderr, "graphswap: malformed %s op: check '%s' failed\n", op ? kern_op_name(op->kind) : "?", why);
        abort();
    }
    switch (op->kind) {
    case KOP_EMBED: kc_embed(c, op, s); break;
    case KOP_RMSNORM: kc_rmsnorm(c, op, s); break;
    case KOP_MATMUL: kc_matmul(c, op, s); break;
    case KOP_QK_NORM_ROPE: kc_qk_norm_rope(c, op, s); break;
    case KOP_KV_WRITE: kc_kv_write(c, op, s); break;
    case KOP_ATTENTION: kc_attention(c, op, s); break;
    case KOP_SILU_MUL: kc_silu_mul(c, op, s); break;
    case KOP_ADD: kc_add(c, op, s); break;
    case KOP_GATHER_ROWS: kc_gather_rows(c, op, s); break;
    case KOP_COPY_COLS: kc_copy_cols(c, op, s); break;
    case KOP_DRAFT_SELECT: kc_draft_select(c, op, s); break;
    case KOP_CONFIDENCE: kc_confidence(c, op, s); break;
    case KOP_SAMPLE: kc_sample(c, op, s); break;
    case KOP_MOE_ROUTE: kc_moe_route(c, op, s); break;
    case KOP_MOE_FFN: kc_moe_ffn(c, op, s); break;
    default:
        fprintf(stderr, "graphswap: unknown op kind %d\n", (int)op->kind);
        abort();
    }
}
