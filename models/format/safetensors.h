/* models/format/safetensors.h — safetensors reading (validated), writing, and dtype conversion.
 *
 * Format: u64 little-endian header length N (<= MDL_ST_MAX_HEADER), N bytes of JSON
 * {name: {"dtype": D, "shape": [..], "data_offsets": [begin, end)}, "__metadata__": {str: str}}
 * (padded with spaces), then the data section. A valid file has: every tensor with a known dtype,
 * shape of non-negative dims (ndim <= MDL_ST_MAX_DIMS), end - begin == numel * width, offsets in
 * bounds, tensors covering the data section contiguously with no holes or overlaps, and
 * 8 + N + data size == total length. Anything else is refused with an error naming the source
 * ("what": a file path or "bucket 3") and, where one is involved, the tensor.
 *
 * The header is untrusted input (HTTP bodies, files on disk): the parser never reads out of bounds,
 * never overflows, and never crashes on any byte string. It is fuzzed.
 */
#ifndef GS_MDL_SAFETENSORS_H
#define GS_MDL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define MDL_ST_MAX_HEADER 100000000ull
#define MDL_ST_MAX_DIMS 8

typedef enum {
    MDL_DT_BOOL, MDL_DT_U8, MDL_DT_I8, MDL_DT_F8_E4M3, MDL_DT_F8_E5M2, MDL_DT_I16, MDL_DT_U16,
    MDL_DT_F16, MDL_DT_BF16, MDL_DT_I32, MDL_DT_U32, MDL_DT_F32, MDL_DT_F64, MDL_DT_I64,
    MDL_DT_U64, MDL_DT_COUNT
} mdl_dtype;

size_t mdl_dtype_size(mdl_dtype dt);          /* bytes per element */
const char *mdl_dtype_name(mdl_dtype dt);     /* "BF16" ... as in the safetensors header */
int mdl_dtype_parse(const char *s, mdl_dtype *out); /* 0 ok, -1 unknown */

typedef struct {
    char *name;                       /* owned, NUL-terminated */
    mdl_dtype dtype;
    int ndim;
    int64_t shape[MDL_ST_MAX_DIMS];
    uint64_t numel;
    const uint8_t *data;              /* points into the parsed buffer (not owned) */
    uint64_t nbytes;
} mdl_st_tensor;

typedef struct {
    mdl_st_tensor *tensors;           /* owned array, in header order */
    size_t n;
    char **meta_keys, **meta_vals;    /* "__metadata__" pairs, owned */
    size_t n_meta;
    /* set by mdl_st_open only: the mapping that backs tensors[].data */
    void *map;
    size_t map_len;
} mdl_st_file;

/* Parses and fully validates buf[0..len). On success fills *out (tensor data point into buf, which
 * must outlive *out) and returns 0. On failure returns -1, writes a message into err naming `what`
 * and the tensor concerned, and leaves *out empty (safe to mdl_st_close). */
int mdl_st_parse(const uint8_t *buf, size_t len, const char *what, mdl_st_file *out, char *err,
                 size_t errlen);

/* mmap()s path read-only and parses it (what = path). */
int mdl_st_open(const char *path, mdl_st_file *out, char *err, size_t errlen);

/* Frees what parse/open allocated (and unmaps); *f becomes empty. Safe on an empty struct. */
void mdl_st_close(mdl_st_file *f);

const mdl_st_tensor *mdl_st_find(const mdl_st_file *f, const char *name);

/* ---- writing ---------------------------------------------------------------------------------- */
typedef struct {
    const char *name;
    mdl_dtype dtype;
    int ndim;
    int64_t shape[MDL_ST_MAX_DIMS];
    const void *data;                 /* numel * width bytes */
} mdl_st_out;

/* Writes a valid safetensors file (tensors laid out in the given order; header padded with spaces
 * to a multiple of 8). meta: optional NULL-terminated key/value array {"format","pt",NULL}. */
int mdl_st_write(const char *path, const mdl_st_out *t, size_t n, const char *const *meta,
                 char *err, size_t errlen);
/* The start of the file mdl_st_write would write for t[0..n) and meta (the same checks; t[i].data is
 * not read): the 8-byte little-endian header length and the padded header JSON, malloc'd into *hdr
 * (*hdr_len bytes, a multiple of 8), and the size of the data section that must follow (tensor i at
 * the sum of the earlier tensors' sizes, in order). For files built in memory (an HTTP answer). 0,
 * or -1 with err naming `what`. */
int mdl_st_header(const mdl_st_out *t, size_t n, const char *const *meta, const char *what, uint8_t **hdr,
                  size_t *hdr_len, uint64_t *data_bytes, char *err, size_t errlen);

/* ---- dtype conversion -------------------------------------------------------------------------
 * Converts n elements between BF16, F16 and F32. Narrowing rounds to nearest even (f16
 * subnormals, overflow to inf, NaN kept); F16 -> F32 is exact. Returns 0, or -1 for an unsupported
 * pair. dst and src must not overlap. */
int mdl_convert(void *dst, mdl_dtype dst_dt, const void *src, mdl_dtype src_dt, size_t n);
int mdl_dtype_convertible(mdl_dtype src_dt); /* 1 for BF16, F16, F32 */
/* f32 -> float8_e4m3fn, round to nearest even, saturating at +-448 (NaN becomes +-448: callers
 * quantize finite weights) */
uint8_t mdl_fp8_encode(float v);
/* Block FP8 of w [rows, cols] (row-major f32) as checkpoints quantize it (DeepSeek / Qwen
 * fp8_cast_bf16 in reverse): per [b0, b1] block s = amax / 448 (1 for an all-zero block), rounded
 * to sdt (F32, or the BF16 / F16 compressed-tensors stores its scales in; the codes are taken
 * against the rounded scale), q = mdl_fp8_encode(w / s); q [rows, cols], s [ceil(rows / b0),
 * ceil(cols / b1)]. Dequantized, a weight is kern_fp8_to_f32(q) * s. Channel scales are b0 = 1,
 * b1 >= cols; a per-tensor scale b0 = rows, b1 >= cols. */
void mdl_fp8_quantize(const float *w, int64_t rows, int64_t cols, int b0, int b1, mdl_dtype sdt, uint8_t *q,
                      float *s);

#endif
