/* models/format/safetensors.c — safetensors parsing (validated), writing, and dtype conversion.
 *
 * The parser is the untrusted-input boundary for checkpoints: every length, offset and shape read
 * from the header is range-checked before it is used in arithmetic or pointer math, so that any
 * byte string either parses into tensors whose data lie inside the buffer or is refused with a
 * message. Conversions assume a little-endian host (safetensors data are little-endian).
 */
#if !defined(_GNU_SOURCE) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* mmap, fstat, open flags when built outside CMake (fuzz harness) */
#endif

#include "models/format/safetensors.h"

#include "models/format/json_guard.h"
#include "kernels/kern.h"

#define ST_MAX_DEPTH 16 /* nesting of a header (see mdl_st_parse) */

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data and the conversions below assume a little-endian host"
#endif

/* Integers in the header are JSON numbers, which cJSON holds as doubles. Below 2^53 every integer
 * is exact, and any decimal text >= 2^53 rounds to a double >= 2^53, so this bound also refuses
 * integers that cJSON could only have approximated. */
#define ST_INT_LIMIT 9007199254740992.0 /* 2^53, exclusive */

/* ---- dtypes ----------------------------------------------------------------------------------- */

static const struct {
    const char *name;
    size_t size;
} k_dtypes[MDL_DT_COUNT] = {
    [MDL_DT_BOOL] = {"BOOL", 1},       [MDL_DT_U8] = {"U8", 1},     [MDL_DT_I8] = {"I8", 1},
    [MDL_DT_F8_E4M3] = {"F8_E4M3", 1}, [MDL_DT_F8_E5M2] = {"F8_E5M2", 1},
    [MDL_DT_I16] = {"I16", 2},         [MDL_DT_U16] = {"U16", 2},   [MDL_DT_F16] = {"F16", 2},
    [MDL_DT_BF16] = {"BF16", 2},       [MDL_DT_I32] = {"I32", 4},   [MDL_DT_U32] = {"U32", 4},
    [MDL_DT_F32] = {"F32", 4},         [MDL_DT_F64] = {"F64", 8},   [MDL_DT_I64] = {"I64", 8},
    [MDL_DT_U64] = {"U64", 8},
};

size_t mdl_dtype_size(mdl_dtype dt)
{
    return ((unsigned)dt < MDL_DT_COUNT) ? k_dtypes[dt].size : 0;
}

const char *mdl_dtype_name(mdl_dtype dt)
{
    return ((unsigned)dt < MDL_DT_COUNT) ? k_dtypes[dt].name : "?";
}

int mdl_dtype_parse(const char *s, mdl_dtype *out)
{
    if (!s)
        return -1;
    for (int i = 0; i < MDL_DT_COUNT; i++) {
        if (strcmp(s, k_dtypes[i].name) == 0) {
            if (out)
                *out = (mdl_dtype)i;
            return 0;
        }
    }
    return -1;
}

/* ---- helpers ---------------------------------------------------------------------------------- */

__attribute__((format(printf, 3, 4))) static void seterr(char *err, size_t errlen, const char *fmt,
                                                         ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static char *dupstr(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

static int cmp_strp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Sorts a copy of names[0..n) and returns the first name that occurs twice, NULL if all are
 * distinct. *oom is set when the scratch copy cannot be allocated. O(n log n): headers of large
 * checkpoints hold thousands of tensors. */
static const char *find_duplicate(char *const *names, size_t n, int *oom)
{
    *oom = 0;
    if (n < 2)
        return NULL;
    const char **s = malloc(n * sizeof *s);
    if (!s) {
        *oom = 1;
        return NULL;
    }
    memcpy(s, names, n * sizeof *s);
    qsort(s, n, sizeof *s, cmp_strp);
    const char *dup = NULL;
    for (size_t i = 1; i < n && !dup; i++)
        if (strcmp(s[i - 1], s[i]) == 0)
            dup = s[i];
    free(s);
    return dup;
}

/* "[4,4]" for messages. */
static void fmt_shape(char *buf, size_t cap, const int64_t *shape, int ndim)
{
    size_t o = 0;
    int w = snprintf(buf, cap, "[");
    o = (w > 0 && (size_t)w < cap) ? (size_t)w : cap - 1;
    for (int i = 0; i < ndim && o < cap - 1; i++) {
        w = snprintf(buf + o, cap - o, "%s%" PRId64, i ? "," : "", shape[i]);
        o = (w > 0 && (size_t)w < cap - o) ? o + (size_t)w : cap - 1;
    }
    if (o < cap - 1)
        snprintf(buf + o, cap - o, "]");
}

/* A JSON number that is an exact integer in [0, 2^53). NaN fails the first comparison. */
static int json_uint(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v))
        return -1;
    double d = v->valuedouble;
    if (!(d >= 0.0 && d < ST_INT_LIMIT))
        return -1;
    uint64_t u = (uint64_t)d;
    if ((double)u != d)
        return -1;
    *out = u;
    return 0;
}

/* ---- parsing ---------------------------------------------------------------------------------- */

typedef struct {
    uint64_t begin, end;
    size_t idx; /* into out->tensors */
} st_span;

static int cmp_span(const void *a, const void *b)
{
    const st_span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx); /* stable order keeps messages deterministic */
}

static int parse_metadata(const cJSON *m, const char *what, mdl_st_file *out, char *err,
                          size_t errlen)
{
    if (!cJSON_IsObject(m)) {
        seterr(err, errlen, "%s: __metadata__ is not a JSON object of strings", what);
        return -1;
    }
    size_t cnt = 0;
    for (const cJSON *c = m->child; c; c = c->next)
        cnt++;
    if (cnt == 0)
        return 0;
    out->meta_keys = calloc(cnt, sizeof *out->meta_keys);
    out->meta_vals = calloc(cnt, sizeof *out->meta_vals);
    if (!out->meta_keys || !out->meta_vals) {
        seterr(err, errlen, "%s: out of memory", what);
        return -1;
    }
    for (const cJSON *c = m->child; c; c = c->next) {
        if (!cJSON_IsString(c) || !c->valuestring) {
            seterr(err, errlen, "%s: __metadata__ value of key \"%s\" is not a string", what,
                   c->string);
            return -1;
        }
        size_t i = out->n_meta;
        out->meta_keys[i] = dupstr(c->string);
        out->meta_vals[i] = dupstr(c->valuestring);
        out->n_meta++; /* counted before the check so close() frees a half-filled pair */
        if (!out->meta_keys[i] || !out->meta_vals[i]) {
            seterr(err, errlen, "%s: out of memory", what);
            return -1;
        }
    }
    int oom;
    const char *dup = find_duplicate(out->meta_keys, out->n_meta, &oom);
    if (oom || dup) {
        if (oom)
            seterr(err, errlen, "%s: out of memory", what);
        else
            seterr(err, errlen, "%s: __metadata__ has duplicate key \"%s\"", what, dup);
        return -1;
    }
    return 0;
}

/* Validates one header entry and appends it to out->tensors; records its span for the coverage
 * check. Offsets are checked against data_len here, so every stored data pointer is in bounds even
 * before the global hole/overlap pass. */
static int parse_tensor(const cJSON *e, const char *what, const uint8_t *data, size_t data_len,
                        mdl_st_file *out, st_span *span, char *err, size_t errlen)
{
    mdl_st_tensor *t = &out->tensors[out->n];
    t->name = dupstr(e->string);
    if (!t->name) {
        seterr(err, errlen, "%s: out of memory", what);
        return -1;
    }
    out->n++;
    const char *nm = t->name;

    if (!cJSON_IsObject(e)) {
        seterr(err, errlen, "%s: tensor %s: entry is not a JSON object", what, nm);
        return -1;
    }
    /* Look fields up by iterating: cJSON keeps duplicate keys, and picking one silently would let
     * two readers of the same file disagree. Unknown fields are ignored, as other readers do. */
    const cJSON *jd = NULL, *js = NULL, *jo = NULL;
    for (const cJSON *f = e->child; f; f = f->next) {
        const cJSON **slot = strcmp(f->string, "dtype") == 0          ? &jd
                             : strcmp(f->string, "shape") == 0        ? &js
                             : strcmp(f->string, "data_offsets") == 0 ? &jo
                                                                      : NULL;
        if (!slot)
            continue;
        if (*slot) {
            seterr(err, errlen, "%s: tensor %s: duplicate field \"%s\"", what, nm, f->string);
            return -1;
        }
        *slot = f;
    }

    if (!jd) {
        seterr(err, errlen, "%s: tensor %s: missing \"dtype\"", what, nm);
        return -1;
    }
    if (!cJSON_IsString(jd) || !jd->valuestring) {
        seterr(err, errlen, "%s: tensor %s: \"dtype\" is not a string", what, nm);
        return -1;
    }
    if (mdl_dtype_parse(jd->valuestring, &t->dtype) != 0) {
        seterr(err, errlen, "%s: tensor %s: unknown dtype \"%s\"", what, nm, jd->valuestring);
        return -1;
    }

    if (!js) {
        seterr(err, errlen, "%s: tensor %s: missing \"shape\"", what, nm);
        return -1;
    }
    if (!cJSON_IsArray(js)) {
        seterr(err, errlen, "%s: tensor %s: \"shape\" is not an array", what, nm);
        return -1;
    }
    int ndim = cJSON_GetArraySize(js);
    if (ndim > MDL_ST_MAX_DIMS) {
        seterr(err, errlen, "%s: tensor %s: shape has %d dims, more than the maximum of %d", what,
               nm, ndim, MDL_ST_MAX_DIMS);
        return -1;
    }
    t->ndim = ndim;
    int i = 0, has_zero = 0;
    for (const cJSON *d = js->child; d; d = d->next, i++) {
        uint64_t v;
        if (json_uint(d, &v) != 0) {
            seterr(err, errlen, "%s: tensor %s: shape[%d] is not a non-negative integer below 2^53",
                   what, nm, i);
            return -1;
        }
        t->shape[i] = (int64_t)v;
        has_zero |= (v == 0);
    }

    /* numel and byte size must not wrap. A zero dim makes both 0 whatever the other dims are, so
     * it is handled first rather than letting an intermediate product overflow. */
    const size_t width = mdl_dtype_size(t->dtype);
    char shp[160];
    uint64_t numel = 1;
    if (has_zero) {
        numel = 0;
    } else {
        for (i = 0; i < ndim; i++) {
            uint64_t dim = (uint64_t)t->shape[i];
            if (numel > UINT64_MAX / dim) {
                numel = 0;
                goto overflow;
            }
            numel *= dim;
        }
        if (numel > UINT64_MAX / width)
            goto overflow;
    }
    t->numel = numel;
    t->nbytes = numel * width;

    if (!jo) {
        seterr(err, errlen, "%s: tensor %s: missing \"data_offsets\"", what, nm);
        return -1;
    }
    uint64_t b, en;
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2 || json_uint(jo->child, &b) != 0 ||
        json_uint(jo->child->next, &en) != 0) {
        seterr(err, errlen,
               "%s: tensor %s: \"data_offsets\" must be [begin, end], two non-negative integers "
               "below 2^53",
               what, nm);
        return -1;
    }
    if (b > en) {
        seterr(err, errlen, "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64 ") are reversed",
               what, nm, b, en);
        return -1;
    }
    if (en - b != t->nbytes) {
        fmt_shape(shp, sizeof shp, t->shape, ndim);
        seterr(err, errlen,
               "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64 ") hold %" PRIu64
               " bytes but shape %s of %s needs %" PRIu64,
               what, nm, b, en, en - b, shp, mdl_dtype_name(t->dtype), t->nbytes);
        return -1;
    }
    if (en > data_len) {
        seterr(err, errlen,
               "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64
               ") are out of bounds of the data section (%zu bytes)",
               what, nm, b, en, data_len);
        return -1;
    }
    t->data = data + b;
    span->begin = b;
    span->end = en;
    span->idx = out->n - 1;
    return 0;

overflow:
    fmt_shape(shp, sizeof shp, t->shape, ndim);
    seterr(err, errlen, "%s: tensor %s: shape %s of %s overflows a 64-bit byte size", what, nm, shp,
           mdl_dtype_name(t->dtype));
    return -1;
}

/* Tensors must tile [0, data_len) exactly. Sorting by (begin, end) puts zero-size tensors before a
 * tensor starting at the same offset, so they are accepted at any boundary but not inside a tensor. */
static int check_coverage(st_span *sp, size_t n, size_t data_len, const char *what,
                          const mdl_st_file *out, char *err, size_t errlen)
{
    qsort(sp, n, sizeof *sp, cmp_span);
    uint64_t expect = 0;
    for (size_t i = 0; i < n; i++) {
        const char *nm = out->tensors[sp[i].idx].name;
        if (sp[i].begin > expect) {
            seterr(err, errlen,
                   "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64 ") leave a hole of %" PRIu64
                   " bytes at [%" PRIu64 ", %" PRIu64 ") in the data section",
                   what, nm, sp[i].begin, sp[i].end, sp[i].begin - expect, expect, sp[i].begin);
            return -1;
        }
        if (sp[i].begin < expect) {
            /* sorted and gap-free so far: the previous span is the one that ends at `expect` */
            seterr(err, errlen,
                   "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64
                   ") overlap tensor %s at [%" PRIu64 ", %" PRIu64 ")",
                   what, nm, sp[i].begin, sp[i].end, out->tensors[sp[i - 1].idx].name,
                   sp[i - 1].begin, sp[i - 1].end);
            return -1;
        }
        expect = sp[i].end;
    }
    if (expect != data_len) {
        seterr(err, errlen,
               "%s: data section holds %zu bytes but the tensors cover only %" PRIu64
               " (%" PRIu64 " trailing bytes)",
               what, data_len, expect, (uint64_t)data_len - expect);
        return -1;
    }
    return 0;
}

int mdl_st_parse(const uint8_t *buf, size_t len, const char *what, mdl_st_file *out, char *err,
                 size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!what)
        what = "safetensors";
    if (!buf || len < 8) {
        seterr(err, errlen, "%s: %zu bytes is shorter than the 8-byte header length", what,
               buf ? len : 0);
        return -1;
    }
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)buf[i] << (8 * i);
    if (hlen > MDL_ST_MAX_HEADER) {
        seterr(err, errlen, "%s: header length %" PRIu64 " exceeds the maximum of %llu", what, hlen,
               MDL_ST_MAX_HEADER);
        return -1;
    }
    if (hlen > len - 8) {
        seterr(err, errlen,
               "%s: header length %" PRIu64 " exceeds the %zu bytes after the length prefix", what,
               hlen, len - 8);
        return -1;
    }
    const size_t hl = (size_t)hlen;
    const uint8_t *data = buf + 8 + hl;
    const size_t data_len = len - 8 - hl;

    int rc = -1;
    cJSON *root = NULL;
    st_span *spans = NULL;
    /* cJSON gets a NUL-terminated private copy: it is bounded by the length we pass, but the
     * terminator is defence in depth against any read past the end inside the (uninstrumented)
     * library, and the buffer may be a read-only mapping that ends exactly at the header. */
    char *text = malloc(hl + 1);
    if (!text) {
        seterr(err, errlen, "%s: out of memory for a %zu-byte header", what, hl);
        goto done;
    }
    memcpy(text, buf + 8, hl);
    text[hl] = '\0';
    /* cJSON recurses per nesting level and keeps names as C strings: a deep header overflowed a
     * civetweb worker's ~100 KiB stack on a bucket upload (found by fuzz_http), and a NUL would cut
     * a tensor name (two keys could alias one name). Both are refused before it runs. A valid
     * header nests 3 deep (header -> tensor -> shape); 16 leaves room for nested metadata. */
    /* one object; cJSON stops after the first value, and only the space padding may follow it */
    mdl_json_result jr;
    root = mdl_json_parse(text, hl, ST_MAX_DEPTH, MDL_JSON_REFUSE_NUL | MDL_JSON_WHOLE | MDL_JSON_OBJECT, &jr, NULL, 0);
    if (!root) {
        switch (jr.status) {
        case MDL_JSON_E_SYNTAX:
            seterr(err, errlen, "%s: header is not valid JSON (error at byte %zu of %zu)", what, jr.at, hl);
            break;
        case MDL_JSON_E_TRAILING:
            seterr(err, errlen, "%s: header is not valid JSON (trailing bytes at byte %zu of %zu)", what, jr.at, hl);
            break;
        case MDL_JSON_E_NOT_OBJECT:
            seterr(err, errlen, "%s: header is not a JSON object", what);
            break;
        default: /* depth or NUL: a NUL is named first when there are both */
            if (jr.scan.nul)
                seterr(err, errlen, "%s: header contains a NUL character (raw or \\u0000)", what);
            else
                seterr(err, errlen, "%s: header nests arrays / objects more than %d deep", what, ST_MAX_DEPTH);
            break;
        }
        goto done;
    }

    size_t cnt = 0;
    for (const cJSON *c = root->child; c; c = c->next)
        cnt++;
    out->tensors = calloc(cnt ? cnt : 1, sizeof *out->tensors);
    spans = malloc((cnt ? cnt : 1) * sizeof *spans);
    if (!out->tensors || !spans) {
        seterr(err, errlen, "%s: out of memory for %zu tensors", what, cnt);
        goto done;
    }
    int seen_meta = 0;
    for (const cJSON *c = root->child; c; c = c->next) {
        if (strcmp(c->string, "__metadata__") == 0) {
            if (seen_meta) {
                seterr(err, errlen, "%s: duplicate __metadata__", what);
                goto done;
            }
            seen_meta = 1;
            if (parse_metadata(c, what, out, err, errlen) != 0)
                goto done;
            continue;
        }
        if (parse_tensor(c, what, data, data_len, out, &spans[out->n], err, errlen) != 0)
            goto done;
    }

    char **names = malloc((out->n ? out->n : 1) * sizeof *names);
    if (!names) {
        seterr(err, errlen, "%s: out of memory", what);
        goto done;
    }
    for (size_t i = 0; i < out->n; i++)
        names[i] = out->tensors[i].name;
    int oom;
    const char *dup = find_duplicate(names, out->n, &oom);
    if (oom || dup) {
        if (oom)
            seterr(err, errlen, "%s: out of memory", what);
        else
            seterr(err, errlen, "%s: tensor %s: duplicate tensor name", what, dup);
        free(names);
        goto done;
    }
    free(names);

    if (check_coverage(spans, out->n, data_len, what, out, err, errlen) != 0)
        goto done;
    rc = 0;

done:
    cJSON_Delete(root);
    free(text);
    free(spans);
    if (rc != 0)
        mdl_st_close(out);
    return rc;
}

int mdl_st_open(const char *path, mdl_st_file *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        seterr(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        seterr(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        seterr(err, errlen, "%s: not a regular file", path);
        close(fd);
        return -1;
    }
    if (st.st_size <= 0 || (uint64_t)st.st_size > SIZE_MAX) {
        seterr(err, errlen, "%s: %s", path, st.st_size <= 0 ? "empty file" : "file too large");
        close(fd);
        return -1;
    }
    const size_t len = (size_t)st.st_size;
    /* The mapping outlives the fd. Files must not be truncated while mapped (SIGBUS); mdl_st_write
     * replaces files by rename, which leaves existing mappings on the old inode. */
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int mmap_errno = errno;
    close(fd);
    if (map == MAP_FAILED) {
        seterr(err, errlen, "%s: mmap of %zu bytes failed: %s", path, len, strerror(mmap_errno));
        return -1;
    }
    if (mdl_st_parse(map, len, path, out, err, errlen) != 0) {
        munmap(map, len);
        return -1;
    }
    out->map = map;
    out->map_len = len;
    return 0;
}

void mdl_st_close(mdl_st_file *f)
{
    if (!f)
        return;
    if (f->tensors)
        for (size_t i = 0; i < f->n; i++)
            free(f->tensors[i].name);
    free(f->tensors);
    for (size_t i = 0; i < f->n_meta; i++) {
        if (f->meta_keys)
            free(f->meta_keys[i]);
        if (f->meta_vals)
            free(f->meta_vals[i]);
    }
    free(f->meta_keys);
    free(f->meta_vals);
    if (f->map)
        munmap(f->map, f->map_len);
    memset(f, 0, sizeof *f);
}

/* Linear: loaders look up each parameter once, and headers hold at most a few thousand tensors. */
const mdl_st_tensor *mdl_st_find(const mdl_st_file *f, const char *name)
{
    if (!f || !name)
        return NULL;
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->tensors[i].name, name) == 0)
            return &f->tensors[i];
    return NULL;
}

/* ---- writing ---------------------------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(sbuf *b, const char *s)
{
    sb_put(b, s, strlen(s));
}

static void sb_u64(sbuf *b, uint64_t v)
{
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%" PRIu64, v);
    sb_put(b, tmp, (size_t)n);
}

/* JSON string literal. Bytes >= 0x80 pass through (names are UTF-8); controls are escaped. */
static void sb_jstr(sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        if (*p == '"' || *p == '\\') {
            esc[0] = '\\';
            esc[1] = (char)*p;
            sb_put(b, esc, 2);
        } else if (*p < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", *p);
            sb_put(b, esc, 6);
        } else {
            sb_put(b, (const char *)p, 1);
        }
    }
    sb_put(b, "\"", 1);
}

static int write_all(int fd, const void *p, size_t n)
{
    const uint8_t *q = p;
    while (n > 0) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : n;
        ssize_t w = write(fd, q, chunk);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (w == 0) { /* no progress and no error: treat as a short write */
            errno = EIO;
            return -1;
        }
        q += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Validates t[0..n) and meta (what names the output in messages) and builds the header JSON into
 * *h_out (padded with spaces so that 8 + its length is a multiple of 8), nbytes[i] each tensor's data
 * size (nbytes has room for n). need_data: a tensor with bytes must have data. 0, or -1 with err. */
static int build_header(const mdl_st_out *t, size_t n, const char *const *meta, const char *what, int need_data,
                        sbuf *h_out, uint64_t *nbytes, char *err, size_t errlen)
{
    int rc = -1;
    char **names = NULL, **mkeys = NULL;
    sbuf h = {0};
    if (n && !t) {
        seterr(err, errlen, "%s: no tensors array", what);
        return -1;
    }
    names = malloc((n ? n : 1) * sizeof *names);
    if (!names) {
        seterr(err, errlen, "%s: out of memory", what);
        goto done;
    }
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const char *nm = t[i].name;
        if (!nm || strcmp(nm, "__metadata__") == 0) {
            seterr(err, errlen, "%s: tensor %zu: invalid name %s", what, i, nm ? nm : "(null)");
            goto done;
        }
        if ((unsigned)t[i].dtype >= MDL_DT_COUNT) {
            seterr(err, errlen, "%s: tensor %s: invalid dtype %d", what, nm, (int)t[i].dtype);
            goto done;
        }
        if (t[i].ndim < 0 || t[i].ndim > MDL_ST_MAX_DIMS) {
            seterr(err, errlen, "%s: tensor %s: ndim %d out of range", what, nm, t[i].ndim);
            goto done;
        }
        uint64_t numel = 1;
        int zero = 0;
        for (int d = 0; d < t[i].ndim; d++) {
            if (t[i].shape[d] < 0 || (double)t[i].shape[d] >= ST_INT_LIMIT) {
                seterr(err, errlen, "%s: tensor %s: shape[%d] = %" PRId64 " out of range", what, nm,
                       d, t[i].shape[d]);
                goto done;
            }
            zero |= t[i].shape[d] == 0;
        }
        for (int d = 0; d < t[i].ndim && !zero; d++) {
            uint64_t dim = (uint64_t)t[i].shape[d];
            if (numel > UINT64_MAX / dim)
                goto too_big;
            numel *= dim;
        }
        if (zero)
            numel = 0;
        const uint64_t width = mdl_dtype_size(t[i].dtype);
        if (numel > UINT64_MAX / width)
            goto too_big;
        nbytes[i] = numel * width;
        /* offsets are read back through doubles: keep them below 2^53, and in size_t */
        if (nbytes[i] >= (uint64_t)ST_INT_LIMIT - total || nbytes[i] > SIZE_MAX)
            goto too_big;
        total += nbytes[i];
        if (need_data && nbytes[i] && !t[i].data) {
            seterr(err, errlen, "%s: tensor %s: no data", what, nm);
            goto done;
        }
        names[i] = (char *)nm;
        continue;
    too_big:
        seterr(err, errlen, "%s: tensor %s: too large to write", what, nm);
        goto done;
    }
    int oom;
    const char *dup = find_duplicate(names, n, &oom);
    if (oom || dup) {
        if (oom)
            seterr(err, errlen, "%s: out of memory", what);
        else
            seterr(err, errlen, "%s: tensor %s: duplicate tensor name", what, dup);
        goto done;
    }
    size_t n_meta = 0;
    if (meta) {
        while (meta[2 * n_meta]) {
            if (!meta[2 * n_meta + 1]) {
                seterr(err, errlen, "%s: __metadata__ key \"%s\" has no value", what,
                       meta[2 * n_meta]);
                goto done;
            }
            n_meta++;
        }
        mkeys = malloc((n_meta ? n_meta : 1) * sizeof *mkeys);
        if (!mkeys) {
            seterr(err, errlen, "%s: out of memory", what);
            goto done;
        }
        for (size_t i = 0; i < n_meta; i++)
            mkeys[i] = (char *)meta[2 * i];
        dup = find_duplicate(mkeys, n_meta, &oom);
        if (oom || dup) {
            if (oom)
                seterr(err, errlen, "%s: out of memory", what);
            else
                seterr(err, errlen, "%s: __metadata__ has duplicate key \"%s\"", what, dup);
            goto done;
        }
    }

    /* Header, hand-built rather than via cJSON so integers are always plain decimal (cJSON prints
     * large doubles with exponents, which strict u64 readers refuse). */
    sb_put(&h, "{", 1);
    if (n_meta) {
        sb_str(&h, "\"__metadata__\":{");
        for (size_t i = 0; i < n_meta; i++) {
            if (i)
                sb_put(&h, ",", 1);
            sb_jstr(&h, meta[2 * i]);
            sb_put(&h, ":", 1);
            sb_jstr(&h, meta[2 * i + 1]);
        }
        sb_put(&h, "}", 1);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        if (i || n_meta)
            sb_put(&h, ",", 1);
        sb_jstr(&h, t[i].name);
        sb_str(&h, ":{\"dtype\":\"");
        sb_str(&h, mdl_dtype_name(t[i].dtype));
        sb_str(&h, "\",\"shape\":[");
        for (int d = 0; d < t[i].ndim; d++) {
            if (d)
                sb_put(&h, ",", 1);
            sb_u64(&h, (uint64_t)t[i].shape[d]);
        }
        sb_str(&h, "],\"data_offsets\":[");
        sb_u64(&h, off);
        sb_put(&h, ",", 1);
        sb_u64(&h, off + nbytes[i]);
        sb_str(&h, "]}");
        off += nbytes[i];
    }
    sb_put(&h, "}", 1);
    /* pad with spaces so the data section starts 8-byte aligned in the file (and in an mmap) */
    while (!h.oom && (8 + h.len) % 8 != 0)
        sb_put(&h, " ", 1);
    if (h.oom) {
        seterr(err, errlen, "%s: out of memory building the header", what);
        goto done;
    }
    if (h.len > MDL_ST_MAX_HEADER) {
        seterr(err, errlen, "%s: header of %zu bytes exceeds the maximum of %llu", what, h.len,
               MDL_ST_MAX_HEADER);
        goto done;
    }

    *h_out = h;
    h.p = NULL;
    rc = 0;
done:
    free(h.p);
    free(names);
    free(mkeys);
    return rc;
}

int mdl_st_header(const mdl_st_out *t, size_t n, const char *const *meta, const char *what, uint8_t **hdr,
                  size_t *hdr_len, uint64_t *data_bytes, char *err, size_t errlen)
{
    *hdr = NULL;
    *hdr_len = 0;
    *data_bytes = 0;
    uint64_t *nbytes = malloc((n ? n : 1) * sizeof *nbytes);
    sbuf h = {0};
    if (!nbytes) {
        seterr(err, errlen, "%s: out of memory", what);
        return -1;
    }
    if (build_header(t, n, meta, what, 0, &h, nbytes, err, errlen) != 0) {
        free(nbytes);
        return -1;
    }
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += nbytes[i];
    free(nbytes);
    uint8_t *out = malloc(8 + h.len);
    if (!out) {
        free(h.p);
        seterr(err, errlen, "%s: out of memory", what);
        return -1;
    }
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
    memcpy(out + 8, h.p, h.len);
    free(h.p);
    *hdr = out;
    *hdr_len = 8 + h.len;
    *data_bytes = total;
    return 0;
}

int mdl_st_write(const char *path, const mdl_st_out *t, size_t n, const char *const *meta,
                 char *err, size_t errlen)
{
    if (!path) {
        seterr(err, errlen, "safetensors write: no path");
        return -1;
    }
    int rc = -1, fd = -1;
    char *tmp = NULL;
    uint64_t *nbytes = NULL;
    sbuf h = {0};

    /* Validate first so that nothing is written for input that would produce an invalid file. */
    nbytes = malloc((n ? n : 1) * sizeof *nbytes);
    if (!nbytes) {
        seterr(err, errlen, "%s: out of memory", path);
        goto done;
    }
    if (build_header(t, n, meta, path, 1, &h, nbytes, err, errlen) != 0)
        goto done;

    /* Write a sibling temp file and rename it over path, so readers never see a partial file and a
     * failed write leaves any previous file intact. No fsync: a file torn by a crash fails the
     * parser's coverage check instead of loading silently, and these files can be regenerated. */
    static atomic_uint seq;
    size_t tl = strlen(path) + 64;
    tmp = malloc(tl);
    if (!tmp) {
        seterr(err, errlen, "%s: out of memory", path);
        goto done;
    }
    snprintf(tmp, tl, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&seq, 1u));
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
        seterr(err, errlen, "%s: cannot create %s: %s", path, tmp, strerror(errno));
        goto done;
    }
    uint8_t pre[8];
    for (int i = 0; i < 8; i++)
        pre[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
    if (write_all(fd, pre, 8) != 0 || write_all(fd, h.p, h.len) != 0)
        goto write_failed;
    for (size_t i = 0; i < n; i++)
        if (nbytes[i] && write_all(fd, t[i].data, (size_t)nbytes[i]) != 0)
            goto write_failed;
    int cfd = fd;
    fd = -1;
    if (close(cfd) != 0)
        goto write_failed;
    if (rename(tmp, path) != 0) {
        seterr(err, errlen, "%s: cannot rename %s into place: %s", path, tmp, strerror(errno));
        goto done;
    }
    free(tmp);
    tmp = NULL; /* renamed: nothing to unlink */
    rc = 0;
    goto done;

write_failed:
    seterr(err, errlen, "%s: write failed: %s", path, strerror(errno));

done:
    if (fd >= 0)
        close(fd);
    if (tmp) {
        unlink(tmp);
        free(tmp);
    }
    free(h.p);
    free(nbytes);
    return rc;
}

/* ---- dtype conversion ------------------------------------------------------------------------- */
/* Element helpers are branch-free selects over integer bit patterns so the loops below vectorize,
 * and so the results do not depend on FTZ/DAZ modes that compute kernels may enable. Loads and
 * stores go through memcpy: tensor data in a safetensors file need not be aligned. */

/* f32 -> bf16, round to nearest even. Adding 0x7fff plus the lowest kept bit rounds ties to even;
 * carries ripple into the exponent, which also rounds values at or past FLT_MAX's halfway point to
 * inf as IEEE requires. NaNs would be corrupted by the add (payload only in the dropped half
 * becomes inf; 0x7fffffff wraps the sign), so they are truncated and forced quiet instead. */
static inline uint16_t f32_bits_to_bf16(uint32_t x)
{
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t qnan = (x >> 16) | 0x0040u;
    return (uint16_t)(((x & 0x7fffffffu) > 0x7f800000u) ? qnan : rounded);
}

/* f16 -> f32, exact. Normals: rebias the exponent (15 -> 127, i.e. + 112 << 23). Inf/NaN: all-ones
 * exponent, mantissa (and so NaN payload and quiet bit) shifted up unchanged. Subnormals m * 2^-24:
 * computed in float, exact because m < 2^10 and the result (>= 2^-24) is a normal f32. */
static inline uint32_t f16_bits_to_f32(uint16_t hbits)
{
    uint32_t sign = (uint32_t)(hbits & 0x8000u) << 16;
    uint32_t em = hbits & 0x7fffu;
    uint32_t normal = (em << 13) + 0x38000000u;
    uint32_t infnan = (em << 13) | 0x7f800000u;
    float sub = (float)(int32_t)em * 0x1p-24f;
    uint32_t subb;
    memcpy(&subb, &sub, 4);
    uint32_t mag = em >= 0x7c00u ? infnan : (em >= 0x0400u ? normal : subb);
    return sign | mag;
}

static void cvt_bf16_to_f32(uint8_t *restrict d, const uint8_t *restrict s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        uint32_t u = (uint32_t)h << 16;
        memcpy(d + 4 * i, &u, 4);
    }
}

static void cvt_f32_to_bf16(uint8_t *restrict d, const uint8_t *restrict s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, s + 4 * i, 4);
        uint16_t h = f32_bits_to_bf16(u);
        memcpy(d + 2 * i, &h, 2);
    }
}

static void cvt_f16_to_f32(uint8_t *restrict d, const uint8_t *restrict s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        uint32_t u = f16_bits_to_f32(h);
        memcpy(d + 4 * i, &u, 4);
    }
}

/* Every f16 is exact in f32, so rounding once from there is the correctly rounded bf16. */
static void cvt_f16_to_bf16(uint8_t *restrict d, const uint8_t *restrict s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        uint16_t b = f32_bits_to_bf16(f16_bits_to_f32(h));
        memcpy(d + 2 * i, &b, 2);
    }
}

/* f32 -> f16, round to nearest even: subnormals, overflow to inf, NaN kept quiet. Used to write
 * f16 checkpoints (mkmodel); loading never converts to f16. */
static inline uint16_t f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
    if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (x < 0x38800000u) {                                    /* below 2^-14: f16 subnormal */
        float a;
        memcpy(&a, &x, 4);
        return (uint16_t)(sign | (uint16_t)nearbyintf(a * 16777216.0f)); /* exact scale, RNE */
    }
    x += 0xfffu + ((x >> 13) & 1u);
    return (uint16_t)(sign | ((x - 0x38000000u) >> 13));
}

static void cvt_to_f16(uint8_t *restrict d, const uint8_t *restrict s, mdl_dtype src_dt, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float f;
        if (src_dt == MDL_DT_F32) {
            memcpy(&f, s + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            uint32_t u = src_dt == MDL_DT_BF16 ? (uint32_t)h << 16 : f16_bits_to_f32(h);
            memcpy(&f, &u, 4);
        }
        uint16_t o = f32_to_f16(f);
        memcpy(d + 2 * i, &o, 2);
    }
}

int mdl_dtype_convertible(mdl_dtype src_dt)
{
    return src_dt == MDL_DT_BF16 || src_dt == MDL_DT_F16 || src_dt == MDL_DT_F32;
}

/* the finite e4m3fn codes 0x00 .. 0x7e are increasing in value: a binary search for the nearest */
uint8_t mdl_fp8_encode(float v)
{
    const uint8_t sign = v < 0 ? 0x80 : 0;
    const float a = fabsf(v);
    if (!(a < 448.0f)) return sign | 0x7e;
    /* below 2^-6 the codes are the subnormals m * 2^-9 (m = 0..7; m = 8 is code 0x08, 2^-6): a * 2^9
     * is exact, and rounding it to the nearest integer (ties to even) is the code */
    if (a < 0x1p-6f) return sign | (uint8_t)lrintf(a * 0x1p9f);
    /* normal: rebias the exponent from 127 to 7 and keep 3 of 23 mantissa bits, rounding the 20
     * dropped bits to nearest even on the integer (a carry moves into the exponent: the codes are
     * ordered like the values); a < 448 never rounds past 0x7e */
    uint32_t u;
    memcpy(&u, &a, sizeof u);
    const uint32_t x = u - (120u << 23);
    return sign | (uint8_t)((x + 0x7ffffu + ((x >> 20) & 1u)) >> 20);
}

void mdl_fp8_quantize(const float *w, int64_t R, int64_t C, int b0, int b1, mdl_dtype sdt, uint8_t *q, float *s)
{
    const int64_t SC = (C + b1 - 1) / b1;
    for (int64_t br = 0; br * b0 < R; br++)
        for (int64_t bc = 0; bc < SC; bc++) {
            const int64_t r1 = (br + 1) * b0 < R ? (br + 1) * b0 : R, c1 = (bc + 1) * b1 < C ? (bc + 1) * b1 : C;
            float amax = 0.0f;
            for (int64_t r = br * b0; r < r1; r++)
                for (int64_t c = bc * b1; c < c1; c++) { /* finite weights (callers refuse others) */
                    const float t = fabsf(w[r * C + c]);
                    amax = t > amax ? t : amax;
                }
            float sc = amax > 0.0f ? amax / 448.0f : 1.0f;
            if (sdt != MDL_DT_F32) { /* the scale as its dtype stores it (nearest even) */
                uint16_t h;
                mdl_convert(&h, sdt, &sc, MDL_DT_F32, 1);
                mdl_convert(&sc, MDL_DT_F32, &h, sdt, 1);
            }
            s[br * SC + bc] = sc;
            for (int64_t r = br * b0; r < r1; r++)
                for (int64_t c = bc * b1; c < c1; c++) q[r * C + c] = mdl_fp8_encode(w[r * C + c] / sc);
        }
}

int mdl_convert(void *dst, mdl_dtype dst_dt, const void *src, mdl_dtype src_dt, size_t n)
{
    if (dst_dt == src_dt && src_dt == MDL_DT_F8_E4M3) { /* FP8 codes are copied, never converted */
        if (n && (!dst || !src)) return -1;
        if (n) memcpy(dst, src, n);
        return 0;
    }
    if (!mdl_dtype_convertible(src_dt) || !mdl_dtype_convertible(dst_dt))
        return -1;
    if (n == 0)
        return 0;
    if (!dst || !src)
        return -1;
    if (dst_dt == src_dt) {
        memcpy(dst, src, n * mdl_dtype_size(src_dt));
        return 0;
    }
    uint8_t *d = dst;
    const uint8_t *s = src;
    if (dst_dt == MDL_DT_F16) {
        cvt_to_f16(d, s, src_dt, n);
    } else if (dst_dt == MDL_DT_F32) {
        if (src_dt == MDL_DT_BF16)
            cvt_bf16_to_f32(d, s, n);
        else
            cvt_f16_to_f32(d, s, n);
    } else {
        if (src_dt == MDL_DT_F32)
            cvt_f32_to_bf16(d, s, n);
        else
            cvt_f16_to_bf16(d, s, n);
    }
    return 0;
}
