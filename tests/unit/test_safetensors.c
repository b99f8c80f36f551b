/* tests/unit/test_safetensors.c — models/format/safetensors.c: dtype table, write/open round trip, a table
 * of malformed headers (each must fail with a message naming the tensor / the problem), a
 * deterministic mutation fuzz of mdl_st_parse, and dtype conversion against naive references.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "models/format/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers ---------------------------------------------------------------------------------- */

static char g_dir[4096];

static void mkdir_p(const char *path)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            mkdir(tmp, 0777);
            *p = '/';
        }
    }
    mkdir(tmp, 0777);
}

static const char *tmp_path(const char *name)
{
    static char buf[8][4608];
    static int k;
    if (!g_dir[0]) {
        const char *base = getenv("GS_TEST_TMP");
        snprintf(g_dir, sizeof g_dir, "%s/safetensors.%ld", base && *base ? base : "/tmp",
                 (long)getpid());
        mkdir_p(g_dir);
    }
    char *b = buf[k++ & 7];
    snprintf(b, sizeof buf[0], "%s/%s", g_dir, name);
    return b;
}

static void put_u64le(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* 8-byte length prefix (hlen, or strlen(json) when use_hlen is 0) + json + data_len bytes of
 * patterned data. Returned buffer is malloc'd with exactly *len bytes so ASan sees over-reads. */
static uint8_t *build(const char *json, size_t data_len, int use_hlen, uint64_t hlen, size_t *len)
{
    size_t jl = strlen(json);
    *len = 8 + jl + data_len;
    uint8_t *b = malloc(*len ? *len : 1);
    assert_non_null(b);
    put_u64le(b, use_hlen ? hlen : jl);
    memcpy(b + 8, json, jl);
    for (size_t i = 0; i < data_len; i++)
        b[8 + jl + i] = (uint8_t)(i * 37 + 11);
    return b;
}

static int file_is_empty(const mdl_st_file *f)
{
    return f->tensors == NULL && f->n == 0 && f->meta_keys == NULL && f->meta_vals == NULL &&
           f->n_meta == 0 && f->map == NULL && f->map_len == 0;
}

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* xorshift64*: fixed-seed, so the fuzz test is reproducible. */
static uint64_t g_rng;
static uint64_t rnd(void)
{
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 0x2545F4914F6CDD1Dull;
}
static size_t rndn(size_t n)
{
    return n ? (size_t)(rnd() % n) : 0;
}

/* ---- dtypes ----------------------------------------------------------------------------------- */

static void test_dtype_table(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        size_t size;
    } want[MDL_DT_COUNT] = {
        {"BOOL", 1}, {"U8", 1},  {"I8", 1},   {"F8_E4M3", 1}, {"F8_E5M2", 1},
        {"I16", 2},  {"U16", 2}, {"F16", 2},  {"BF16", 2},    {"I32", 4},
        {"U32", 4},  {"F32", 4}, {"F64", 8},  {"I64", 8},     {"U64", 8},
    };
    for (int i = 0; i < MDL_DT_COUNT; i++) {
        assert_string_equal(mdl_dtype_name((mdl_dtype)i), want[i].name);
        assert_int_equal(mdl_dtype_size((mdl_dtype)i), want[i].size);
        mdl_dtype dt = MDL_DT_COUNT;
        assert_int_equal(mdl_dtype_parse(want[i].name, &dt), 0);
        assert_int_equal(dt, i);
        assert_int_equal(mdl_dtype_convertible((mdl_dtype)i),
                         i == MDL_DT_BF16 || i == MDL_DT_F16 || i == MDL_DT_F32);
    }
    mdl_dtype dt = MDL_DT_U8;
    assert_int_equal(mdl_dtype_parse("bf16", &dt), -1);
    assert_int_equal(mdl_dtype_parse("", &dt), -1);
    assert_int_equal(mdl_dtype_parse("F32 ", &dt), -1);
    assert_int_equal(mdl_dtype_parse(NULL, &dt), -1);
    assert_int_equal(dt, MDL_DT_U8);
    assert_int_equal(mdl_dtype_size(MDL_DT_COUNT), 0);
    assert_non_null(mdl_dtype_name(MDL_DT_COUNT));
}

/* ---- round trip ------------------------------------------------------------------------------- */

static void test_round_trip(void **state)
{
    (void)state;
    uint16_t bf[6] = {0x3f80, 0xbf80, 0x7f80, 0x0001, 0x4049, 0xffff};
    float f32[2][3] = {{1.5f, -2.25f, 3.0f}, {1e-30f, 65504.0f, -0.0f}};
    uint8_t u8[5] = {1, 2, 3, 4, 5}; /* odd size: later offsets are unaligned */
    int64_t i64[1] = {-1234567890123ll};
    int32_t scalar = 42;
    const char *odd_name = "weird \"name\"\\with\tctrl\x01 and ünïcode";
    mdl_st_out t[] = {
        {.name = "model.embed.weight", .dtype = MDL_DT_BF16, .ndim = 2, .shape = {2, 3}, .data = bf},
        {.name = "bytes", .dtype = MDL_DT_U8, .ndim = 1, .shape = {5}, .data = u8},
        {.name = "empty", .dtype = MDL_DT_F32, .ndim = 3, .shape = {0, 7, 2}, .data = NULL},
        {.name = "mat", .dtype = MDL_DT_F32, .ndim = 2, .shape = {2, 3}, .data = f32},
        {.name = "scalar", .dtype = MDL_DT_I32, .ndim = 0, .shape = {0}, .data = &scalar},
        {.name = odd_name, .dtype = MDL_DT_I64, .ndim = 1, .shape = {1}, .data = i64},
    };
    const size_t n = sizeof t / sizeof t[0];
    const char *meta[] = {"format", "pt", "note", "quote\" back\\slash", NULL};
    const char *path = tmp_path("round.safetensors");
    char err[512] = "";
    assert_int_equal(mdl_st_write(path, t, n, meta, err, sizeof err), 0);

    mdl_st_file f;
    int rc = mdl_st_open(path, &f, err, sizeof err);
    if (rc != 0)
        fail_msg("open: %s", err);
    assert_int_equal(f.n, n);
    assert_non_null(f.map);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)((const uint8_t *)f.map)[i] << (8 * i);
    assert_int_equal((8 + hlen) % 8, 0);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const mdl_st_tensor *g = &f.tensors[i];
        assert_string_equal(g->name, t[i].name); /* header order preserved */
        assert_int_equal(g->dtype, t[i].dtype);
        assert_int_equal(g->ndim, t[i].ndim);
        uint64_t numel = 1;
        for (int d = 0; d < g->ndim; d++) {
            assert_int_equal(g->shape[d], t[i].shape[d]);
            numel *= (uint64_t)t[i].shape[d];
        }
        assert_int_equal(g->numel, numel);
        assert_int_equal(g->nbytes, numel * mdl_dtype_size(t[i].dtype));
        /* contiguous in the given order, starting right after the header */
        assert_ptr_equal(g->data, (const uint8_t *)f.map + 8 + hlen + total);
        if (g->nbytes)
            assert_memory_equal(g->data, t[i].data, g->nbytes);
        total += g->nbytes;
        assert_ptr_equal(mdl_st_find(&f, t[i].name), g);
    }
    assert_int_equal(f.map_len, 8 + hlen + total);
    assert_null(mdl_st_find(&f, "nope"));
    assert_null(mdl_st_find(&f, "__metadata__"));
    assert_int_equal(f.n_meta, 2);
    assert_string_equal(f.meta_keys[0], "format");
    assert_string_equal(f.meta_vals[0], "pt");
    assert_string_equal(f.meta_keys[1], "note");
    assert_string_equal(f.meta_vals[1], "quote\" back\\slash");
    mdl_st_close(&f);
    assert_true(file_is_empty(&f));
    mdl_st_close(&f); /* idempotent */
    mdl_st_file z;
    memset(&z, 0, sizeof z);
    mdl_st_close(&z); /* safe on a zeroed struct */
    mdl_st_close(NULL);

    /* no tensors, no metadata: "{}" padded, 0 tensors */
    const char *p2 = tmp_path("empty.safetensors");
    assert_int_equal(mdl_st_write(p2, NULL, 0, NULL, err, sizeof err), 0);
    assert_int_equal(mdl_st_open(p2, &f, err, sizeof err), 0);
    assert_int_equal(f.n, 0);
    assert_int_equal(f.n_meta, 0);
    assert_int_equal(f.map_len, 16); /* 8 + "{}" padded to 8 */
    mdl_st_close(&f);

    /* overwrite an existing file */
    assert_int_equal(mdl_st_write(p2, t, 1, NULL, err, sizeof err), 0);
    assert_int_equal(mdl_st_open(p2, &f, err, sizeof err), 0);
    assert_int_equal(f.n, 1);
    mdl_st_close(&f);
    unlink(p2);
    unlink(path);

    /* many tensors with long names: header well past any initial buffer, order kept */
    enum { MANY = 3000 };
    mdl_st_out *many = calloc(MANY, sizeof *many);
    char(*names)[96] = calloc(MANY, sizeof *names);
    uint16_t *vals = calloc(MANY, sizeof *vals);
    assert_non_null(many);
    assert_non_null(names);
    assert_non_null(vals);
    for (int i = 0; i < MANY; i++) {
        snprintf(names[i], sizeof names[i], "model.layers.%d.self_attn.some_long_projection.weight",
                 MANY - i);
        vals[i] = (uint16_t)(i * 7);
        many[i] = (mdl_st_out){.name = names[i], .dtype = MDL_DT_BF16, .ndim = 1, .shape = {1},
                               .data = &vals[i]};
    }
    const char *p3 = tmp_path("many.safetensors");
    assert_int_equal(mdl_st_write(p3, many, MANY, NULL, err, sizeof err), 0);
    assert_int_equal(mdl_st_open(p3, &f, err, sizeof err), 0);
    assert_int_equal(f.n, MANY);
    for (int i = 0; i < MANY; i++) {
        assert_string_equal(f.tensors[i].name, names[i]);
        assert_memory_equal(f.tensors[i].data, &vals[i], 2);
    }
    mdl_st_close(&f);
    unlink(p3);
    free(many);
    free(names);
    free(vals);
}

/* ---- valid edge cases via parse --------------------------------------------------------------- */

static void test_parse_valid_edges(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        size_t data_len;
        size_t n;
    } ok[] = {
        {"{}", 0, 0},
        {"{}      ", 0, 0},
        {" \n{ }\t\r ", 0, 0},
        {"{\"__metadata__\":{}}", 0, 0},
        /* header order differs from offset order */
        {"{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
         16, 2},
        /* zero-size tensors at the start, between, and at the end */
        {"{\"z0\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[0,0]},"
         "\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
         "\"z1\":{\"dtype\":\"F64\",\"shape\":[5,0],\"data_offsets\":[3,3]},"
         "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[3,4]},"
         "\"z2\":{\"dtype\":\"I64\",\"shape\":[0,9007199254740991],\"data_offsets\":[4,4]}}",
         4, 5},
        /* only a zero-size tensor, no data */
        {"{\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, 1},
        /* scalar; unknown fields ignored; metadata anywhere */
        {"{\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8],\"extra\":[1,{}]},"
         "\"__metadata__\":{\"k\":\"v\"}}",
         8, 1},
        /* integers written as exact doubles */
        {"{\"x\":{\"dtype\":\"U16\",\"shape\":[2.0],\"data_offsets\":[0,4e0]}}", 4, 1},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        size_t len;
        uint8_t *b = build(ok[i].json, ok[i].data_len, 0, 0, &len);
        mdl_st_file f;
        char err[512] = "";
        int rc = mdl_st_parse(b, len, "ok.safetensors", &f, err, sizeof err);
        if (rc != 0)
            fail_msg("valid case %zu refused: %s", i, err);
        assert_int_equal(f.n, ok[i].n);
        assert_null(f.map);
        mdl_st_close(&f);
        free(b);
    }

    /* header order kept, data pointers by offset */
    size_t len;
    uint8_t *b = build(ok[4].json, 16, 0, 0, &len);
    mdl_st_file f;
    assert_int_equal(mdl_st_parse(b, len, "x", &f, NULL, 0), 0);
    assert_string_equal(f.tensors[0].name, "b");
    assert_string_equal(f.tensors[1].name, "a");
    size_t hl = strlen(ok[4].json);
    assert_ptr_equal(f.tensors[0].data, b + 8 + hl + 8);
    assert_ptr_equal(f.tensors[1].data, b + 8 + hl);
    mdl_st_close(&f);
    free(b);
}

/* ---- malformed inputs ------------------------------------------------------------------------- */

#define T1(name, dt, shape, off) "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" off "}"

typedef struct {
    const char *label;
    const char *json;   /* header text (NULL: only the first `total` zero bytes) */
    size_t data_len;    /* data bytes after the header */
    int use_hlen;       /* write hlen instead of strlen(json) into the prefix */
    uint64_t hlen;
    size_t total;       /* for json == NULL: buffer length */
    const char *expect[3]; /* substrings the error must contain (besides "bad.safetensors") */
} bad_case;

static const bad_case k_bad[] = {
    {"empty buffer", NULL, 0, 0, 0, 0, {"shorter than the 8-byte"}},
    {"truncated below 8 bytes", NULL, 0, 0, 0, 7, {"7 bytes", "shorter than the 8-byte"}},
    {"header length 2^64-1", "{}", 0, 1, UINT64_MAX, 0,
     {"header length 18446744073709551615", "exceeds the maximum"}},
    {"header length over max", "{}", 0, 1, MDL_ST_MAX_HEADER + 1, 0, {"exceeds the maximum"}},
    {"header length > file", "{}", 4, 1, 100, 0, {"header length 100", "after the length prefix"}},
    {"header length 0", "", 0, 0, 0, 0, {"not valid JSON"}},
    {"invalid JSON", "{\"a\":", 0, 0, 0, 0, {"not valid JSON"}},
    {"trailing garbage", "{} x", 0, 0, 0, 0, {"trailing bytes"}},
    {"two JSON values", "{}{}", 0, 0, 0, 0, {"trailing bytes"}},
    {"header is array", "[]", 0, 0, 0, 0, {"not a JSON object"}},
    {"header is string", "\"x\"", 0, 0, 0, 0, {"not a JSON object"}},
    {"escaped NUL in name", "{" T1("a\\u0000b", "U8", "[1]", "[0,1]") "}", 1, 0, 0, 0, {"NUL"}},
    {"entry not object", "{\"w\":[1,2]}", 0, 0, 0, 0, {"tensor w:", "not a JSON object"}},
    {"missing dtype", "{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0, 0, 0,
     {"tensor w:", "missing \"dtype\""}},
    {"dtype not string", "{" T1("w", "F32", "[2]", "[0,8]") "}" /* patched below */, 8, 0, 0, 0,
     {"tensor w:"}},
    {"unknown dtype", "{" T1("blk.0.w", "F17", "[2]", "[0,8]") "}", 8, 0, 0, 0,
     {"tensor blk.0.w:", "unknown dtype \"F17\""}},
    {"lowercase dtype", "{" T1("w", "bf16", "[2]", "[0,4]") "}", 4, 0, 0, 0,
     {"tensor w:", "unknown dtype \"bf16\""}},
    {"duplicate dtype field",
     "{\"w\":{\"dtype\":\"U8\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, 0, 0, 0,
     {"tensor w:", "duplicate field \"dtype\""}},
    {"missing shape", "{\"w\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, 0, 0, 0,
     {"tensor w:", "missing \"shape\""}},
    {"shape not array", "{" T1("w", "U8", "4", "[0,4]") "}", 4, 0, 0, 0,
     {"tensor w:", "\"shape\" is not an array"}},
    {"shape negative dim", "{" T1("w", "U8", "[2,-1]", "[0,0]") "}", 0, 0, 0, 0,
     {"tensor w:", "shape[1]", "non-negative integer"}},
    {"shape float dim", "{" T1("w", "U8", "[2.5]", "[0,2]") "}", 2, 0, 0, 0,
     {"tensor w:", "shape[0]"}},
    {"shape string dim", "{" T1("w", "U8", "[\"2\"]", "[0,2]") "}", 2, 0, 0, 0,
     {"tensor w:", "shape[0]"}},
    {"shape dim 2^53", "{" T1("w", "U8", "[9007199254740992]", "[0,0]") "}", 0, 0, 0, 0,
     {"tensor w:", "shape[0]"}},
    {"shape dim 1e999", "{" T1("w", "U8", "[1e999]", "[0,0]") "}", 0, 0, 0, 0,
     {"tensor w:", "shape[0]"}},
    {"too many dims", "{" T1("w", "U8", "[1,1,1,1,1,1,1,1,1]", "[0,1]") "}", 1, 0, 0, 0,
     {"tensor w:", "9 dims"}},
    {"numel overflow", "{" T1("w", "U8", "[4294967296,4294967296,2]", "[0,0]") "}", 0, 0, 0, 0,
     {"tensor w:", "overflows"}},
    {"numel*width overflow", "{" T1("w", "I64", "[2147483648,2147483648,2]", "[0,0]") "}", 0, 0, 0,
     0, {"tensor w:", "shape [2147483648,2147483648,2] of I64 overflows"}},
    {"missing data_offsets", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, 0, 0, 0,
     {"tensor w:", "missing \"data_offsets\""}},
    {"data_offsets 3 entries", "{" T1("w", "U8", "[1]", "[0,1,1]") "}", 1, 0, 0, 0,
     {"tensor w:", "\"data_offsets\" must be"}},
    {"data_offsets 1 entry", "{" T1("w", "U8", "[1]", "[1]") "}", 1, 0, 0, 0,
     {"tensor w:", "\"data_offsets\" must be"}},
    {"data_offsets object", "{" T1("w", "U8", "[1]", "{\"a\":0,\"b\":1}") "}", 1, 0, 0, 0,
     {"tensor w:", "\"data_offsets\" must be"}},
    {"data_offsets negative", "{" T1("w", "U8", "[1]", "[-1,0]") "}", 1, 0, 0, 0,
     {"tensor w:", "\"data_offsets\" must be"}},
    {"data_offsets float", "{" T1("w", "U8", "[1]", "[0,0.5]") "}", 1, 0, 0, 0,
     {"tensor w:", "\"data_offsets\" must be"}},
    {"data_offsets beyond 2^53", "{" T1("w", "U8", "[1]", "[9007199254740993,9007199254740994]") "}",
     1, 0, 0, 0, {"tensor w:", "\"data_offsets\" must be"}},
    {"offsets reversed", "{" T1("w", "U8", "[0]", "[8,0]") "}", 8, 0, 0, 0,
     {"tensor w:", "[8, 0) are reversed"}},
    {"size mismatch", "{" T1("model.layers.3.mlp.up_proj.weight", "BF16", "[4,4]", "[0,10]") "}",
     10, 0, 0, 0,
     {"tensor model.layers.3.mlp.up_proj.weight:", "hold 10 bytes but shape [4,4] of BF16 needs 32"}},
    {"offsets out of bounds", "{" T1("w", "F32", "[2]", "[0,8]") "}", 4, 0, 0, 0,
     {"tensor w:", "out of bounds", "(4 bytes)"}},
    {"offsets far out of bounds",
     "{" T1("w", "F32", "[2]", "[9007199254740000,9007199254740008]") "}", 8, 0, 0, 0,
     {"tensor w:", "out of bounds"}},
    {"overlap", "{" T1("a", "F32", "[2]", "[0,8]") "," T1("b", "F32", "[2]", "[4,12]") "}", 12, 0, 0,
     0, {"tensor b:", "overlap tensor a", "[0, 8)"}},
    {"same offsets twice", "{" T1("a", "F32", "[2]", "[0,8]") "," T1("b", "F32", "[2]", "[0,8]") "}",
     8, 0, 0, 0, {"tensor b:", "overlap tensor a"}},
    {"zero-size inside a tensor",
     "{" T1("a", "F32", "[2]", "[0,8]") "," T1("z", "F32", "[0]", "[4,4]") "}", 8, 0, 0, 0,
     {"tensor z:", "overlap tensor a"}},
    {"hole", "{" T1("a", "F32", "[2]", "[0,8]") "," T1("b", "F32", "[2]", "[12,20]") "}", 20, 0, 0,
     0, {"tensor b:", "hole of 4 bytes at [8, 12)"}},
    {"hole at start", "{" T1("a", "F32", "[2]", "[4,12]") "}", 12, 0, 0, 0,
     {"tensor a:", "hole of 4 bytes at [0, 4)"}},
    {"trailing bytes after data", "{" T1("a", "F32", "[2]", "[0,8]") "}", 12, 0, 0, 0,
     {"data section holds 12 bytes", "4 trailing bytes"}},
    {"no tensors but data", "{}", 3, 0, 0, 0, {"data section holds 3 bytes", "3 trailing bytes"}},
    {"duplicate names", "{" T1("w", "F32", "[1]", "[0,4]") "," T1("w", "F32", "[1]", "[4,8]") "}", 8,
     0, 0, 0, {"tensor w:", "duplicate tensor name"}},
    {"metadata non-string", "{\"__metadata__\":{\"format\":\"pt\",\"step\":1}}", 0, 0, 0, 0,
     {"__metadata__", "\"step\" is not a string"}},
    {"metadata nested", "{\"__metadata__\":{\"a\":{\"b\":\"c\"}}}", 0, 0, 0, 0,
     {"__metadata__", "\"a\" is not a string"}},
    {"metadata not object", "{\"__metadata__\":\"pt\"}", 0, 0, 0, 0,
     {"__metadata__ is not a JSON object"}},
    {"metadata duplicate key", "{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}}", 0, 0, 0, 0,
     {"duplicate key \"a\""}},
    {"metadata twice", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, 0, 0, 0,
     {"duplicate __metadata__"}},
};

static void test_malformed_table(void **state)
{
    (void)state;
    assert_true(sizeof k_bad / sizeof k_bad[0] >= 20);
    for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
        const bad_case *c = &k_bad[i];
        size_t len;
        uint8_t *b;
        if (c->json) {
            b = build(c->json, c->data_len, c->use_hlen, c->hlen, &len);
            if (strcmp(c->label, "dtype not string") == 0) {
                /* "dtype":"F32" -> "dtype": 32 (same length keeps offsets valid) */
                char *p = strstr((char *)b + 8, "\"F32\"");
                assert_non_null(p);
                memcpy(p, "  32 ", 5);
            }
        } else {
            len = c->total;
            b = calloc(len ? len : 1, 1);
            assert_non_null(b);
        }
        mdl_st_file f;
        memset(&f, 0xAB, sizeof f); /* parse must reset *out even on early failure */
        char err[512] = "";
        int rc = mdl_st_parse(b, len, "bad.safetensors", &f, err, sizeof err);
        if (rc != -1)
            fail_msg("case '%s' was accepted", c->label);
        if (strstr(err, "bad.safetensors: ") != err)
            fail_msg("case '%s': message does not start with the source: %s", c->label, err);
        for (int k = 0; k < 3 && c->expect[k]; k++)
            if (!strstr(err, c->expect[k]))
                fail_msg("case '%s': message lacks \"%s\": %s", c->label, c->expect[k], err);
        if (strcmp(c->label, "dtype not string") == 0 && !strstr(err, "\"dtype\" is not a string"))
            fail_msg("case '%s': %s", c->label, err);
        assert_true(file_is_empty(&f));
        mdl_st_close(&f);
        /* small err buffers truncate safely; NULL err is allowed */
        char tiny[5];
        assert_int_equal(mdl_st_parse(b, len, "bad.safetensors", &f, tiny, sizeof tiny), -1);
        assert_int_equal(strlen(tiny), 4);
        assert_int_equal(mdl_st_parse(b, len, NULL, &f, NULL, 0), -1);
        free(b);
    }
}

/* The exact message format from the brief. */
static void test_error_message_exact(void **state)
{
    (void)state;
    size_t len;
    uint8_t *b =
        build("{" T1("model.layers.3.mlp.up_proj.weight", "BF16", "[4,4]", "[0,10]") "}", 10, 0, 0,
              &len);
    mdl_st_file f;
    char err[512];
    assert_int_equal(mdl_st_parse(b, len, "model-00001.safetensors", &f, err, sizeof err), -1);
    assert_string_equal(err, "model-00001.safetensors: tensor model.layers.3.mlp.up_proj.weight: "
                             "data_offsets [0, 10) hold 10 bytes but shape [4,4] of BF16 needs 32");
    free(b);

    /* a raw NUL inside a key would make the stored C name differ from the JSON key */
    static const char raw[] = "{\"a\0b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
    const size_t rl = sizeof raw - 1;
    len = 8 + rl + 1;
    b = malloc(len);
    assert_non_null(b);
    put_u64le(b, rl);
    memcpy(b + 8, raw, rl);
    b[8 + rl] = 7;
    assert_int_equal(mdl_st_parse(b, len, "nul", &f, err, sizeof err), -1);
    assert_non_null(strstr(err, "nul: header contains a NUL"));
    /* ...while an escaped backslash followed by "u0000" is an ordinary name */
    static const char esc[] = "{\"a\\\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
    free(b);
    b = build(esc, 1, 0, 0, &len);
    assert_int_equal(mdl_st_parse(b, len, "esc", &f, err, sizeof err), 0);
    assert_string_equal(f.tensors[0].name, "a\\u0000b");
    mdl_st_close(&f);
    free(b);
}

/* Nesting far beyond any real header must fail cleanly (cJSON's depth limit), not overflow the
 * stack; so must a huge flat header. */
static void test_deep_and_large_headers(void **state)
{
    (void)state;
    const size_t depth = 100000;
    char *j = malloc(2 * depth + 16);
    assert_non_null(j);
    size_t o = 0;
    o += (size_t)sprintf(j, "{\"w\":");
    for (size_t i = 0; i < depth; i++)
        j[o++] = '[';
    for (size_t i = 0; i < depth; i++)
        j[o++] = ']';
    j[o++] = '}';
    j[o] = '\0';
    size_t len;
    uint8_t *b = build(j, 0, 0, 0, &len);
    mdl_st_file f;
    char err[512] = "";
    assert_int_equal(mdl_st_parse(b, len, "deep", &f, err, sizeof err), -1);
    assert_non_null(strstr(err, "deep: "));
    free(b);
    free(j);

    /* 20000 valid one-byte tensors: exercises the sorted duplicate / coverage passes at scale */
    const size_t nt = 20000;
    char *h = malloc(nt * 80 + 16);
    assert_non_null(h);
    o = 0;
    h[o++] = '{';
    for (size_t i = 0; i < nt; i++)
        o += (size_t)sprintf(h + o, "%s\"t%zu\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[%zu,%zu]}",
                             i ? "," : "", nt - 1 - i, nt - 1 - i, nt - i);
    h[o++] = '}';
    h[o] = '\0';
    b = build(h, nt, 0, 0, &len);
    assert_int_equal(mdl_st_parse(b, len, "big", &f, err, sizeof err), 0);
    assert_int_equal(f.n, nt);
    assert_string_equal(f.tensors[0].name, "t19999");
    assert_ptr_equal(f.tensors[0].data, b + 8 + o + nt - 1);
    mdl_st_close(&f);
    free(b);
    free(h);
}

/* Buckets are parsed on civetweb worker threads (~100 KiB of stack): a header nested '['*900 deep
 * overflowed one inside cJSON (found by fuzz_http). Nesting beyond 16 is refused before cJSON
 * runs; on a 64 KiB thread the parse must return that error, not crash. Brackets inside strings
 * do not count. */
typedef struct {
    const uint8_t *b;
    size_t len;
    int rc;
    char err[512];
    mdl_st_file f;
} nest_job;

static void *nest_parse(void *arg)
{
    nest_job *j = arg;
    j->rc = mdl_st_parse(j->b, j->len, "nest", &j->f, j->err, sizeof j->err);
    return NULL;
}

static void nest_on_small_stack(const char *json, size_t data_len, nest_job *j)
{
    uint8_t *b = build(json, data_len, 0, 0, &j->len);
    j->b = b;
    pthread_attr_t a;
    pthread_t t;
    assert_int_equal(pthread_attr_init(&a), 0);
    assert_int_equal(pthread_attr_setstacksize(&a, 64 * 1024), 0);
    assert_int_equal(pthread_create(&t, &a, nest_parse, j), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    pthread_attr_destroy(&a);
    if (j->rc == 0)
        mdl_st_close(&j->f);
    free(b);
}

static void test_nesting_small_stack(void **state)
{
    (void)state;
    char *j = malloc(2 * 900 + 64);
    assert_non_null(j);
    static const int depths[] = {900, 17, 16};
    for (size_t k = 0; k < sizeof depths / sizeof depths[0]; k++) {
        const int depth = depths[k];
        size_t o = (size_t)sprintf(j, "{\"w\":");
        for (int i = 1; i < depth; i++) /* the root object is one level */
            j[o++] = '[';
        for (int i = 1; i < depth; i++)
            j[o++] = ']';
        j[o++] = '}';
        j[o] = '\0';
        nest_job r;
        memset(&r, 0, sizeof r);
        nest_on_small_stack(j, 0, &r);
        assert_int_equal(r.rc, -1);
        if (depth > 16)
            assert_non_null(strstr(r.err, "nest: header nests arrays / objects more than 16 deep"));
        else /* 16 levels pass the depth check: the header is refused for what it says */
            assert_null(strstr(r.err, "deep"));
    }
    free(j);
    /* a tensor name full of brackets is a valid header */
    nest_job r;
    memset(&r, 0, sizeof r);
    nest_on_small_stack("{\"[[[[[[[[[[[[[[[[[[[[{{{{\\\"[[[[\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, &r);
    assert_int_equal(r.rc, 0);
}

/* ---- mdl_st_open / mdl_st_write errors -------------------------------------------------------- */

static void write_raw(const char *path, const void *p, size_t n)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(p, 1, n, fp), n);
    assert_int_equal(fclose(fp), 0);
}

static void test_open_errors(void **state)
{
    (void)state;
    mdl_st_file f;
    char err[1024];
    const char *missing = tmp_path("does-not-exist.safetensors");
    unlink(missing);
    assert_int_equal(mdl_st_open(missing, &f, err, sizeof err), -1);
    assert_non_null(strstr(err, missing));
    assert_true(file_is_empty(&f));

    const char *empty = tmp_path("empty-file.safetensors");
    write_raw(empty, "", 0);
    assert_int_equal(mdl_st_open(empty, &f, err, sizeof err), -1);
    assert_non_null(strstr(err, empty));
    assert_non_null(strstr(err, "empty"));

    assert_int_equal(mdl_st_open(g_dir, &f, err, sizeof err), -1); /* a directory */
    assert_non_null(strstr(err, g_dir));

    const char *bad = tmp_path("bad-file.safetensors");
    size_t len;
    uint8_t *b = build("{" T1("blk.7.w", "F32", "[3]", "[0,8]") "}", 8, 0, 0, &len);
    write_raw(bad, b, len);
    free(b);
    assert_int_equal(mdl_st_open(bad, &f, err, sizeof err), -1);
    assert_non_null(strstr(err, bad));
    assert_non_null(strstr(err, "tensor blk.7.w:"));
    assert_true(file_is_empty(&f));
    unlink(empty);
    unlink(bad);
}

static void test_write_errors(void **state)
{
    (void)state;
    char err[1024];
    float x[4] = {0};
    const char *path = tmp_path("w-err.safetensors");
    unlink(path);
    struct {
        mdl_st_out t[2];
        size_t n;
        const char *expect;
    } cases[] = {
        {{{.name = "a", .dtype = MDL_DT_COUNT, .ndim = 1, .shape = {1}, .data = x}}, 1, "dtype"},
        {{{.name = "a", .dtype = MDL_DT_F32, .ndim = 9, .shape = {1}, .data = x}}, 1, "ndim"},
        {{{.name = "a", .dtype = MDL_DT_F32, .ndim = -1, .shape = {1}, .data = x}}, 1, "ndim"},
        {{{.name = "a", .dtype = MDL_DT_F32, .ndim = 1, .shape = {-2}, .data = x}}, 1, "shape[0]"},
        {{{.name = "a", .dtype = MDL_DT_F32, .ndim = 1, .shape = {4}, .data = NULL}}, 1, "no data"},
        {{{.name = NULL, .dtype = MDL_DT_F32, .ndim = 1, .shape = {4}, .data = x}}, 1, "name"},
        {{{.name = "__metadata__", .dtype = MDL_DT_F32, .ndim = 1, .shape = {4}, .data = x}}, 1,
         "name"},
        {{{.name = "a", .dtype = MDL_DT_F32, .ndim = 2, .shape = {1ll << 40, 1ll << 40}, .data = x}},
         1, "too large"},
        {{{.name = "a", .dtype = MDL_DT_F32, .ndim = 1, .shape = {1}, .data = x},
          {.name = "a", .dtype = MDL_DT_F32, .ndim = 1, .shape = {1}, .data = x}},
         2, "duplicate"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        err[0] = '\0';
        assert_int_equal(mdl_st_write(path, cases[i].t, cases[i].n, NULL, err, sizeof err), -1);
        if (!strstr(err, cases[i].expect) || !strstr(err, path))
            fail_msg("write case %zu: %s", i, err);
        assert_int_equal(access(path, F_OK), -1); /* nothing created */
    }
    mdl_st_out ok = {.name = "a", .dtype = MDL_DT_F32, .ndim = 1, .shape = {4}, .data = x};
    const char *dupmeta[] = {"k", "1", "k", "2", NULL};
    assert_int_equal(mdl_st_write(path, &ok, 1, dupmeta, err, sizeof err), -1);
    assert_non_null(strstr(err, "duplicate key"));
    const char *nometa[] = {"k", NULL};
    assert_int_equal(mdl_st_write(path, &ok, 1, nometa, err, sizeof err), -1);
    assert_non_null(strstr(err, "no value"));

    const char *nodir = tmp_path("no/such/dir/x.safetensors");
    assert_int_equal(mdl_st_write(nodir, &ok, 1, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, nodir));
}

/* A short write (here: the file size limit) must fail, remove the temp file, and leave the
 * previous file at path untouched. */
static void test_write_short(void **state)
{
    (void)state;
    char err[1024];
    const char *path = tmp_path("short.safetensors");
    uint8_t small[4] = {1, 2, 3, 4};
    mdl_st_out t0 = {.name = "old", .dtype = MDL_DT_U8, .ndim = 1, .shape = {4}, .data = small};
    assert_int_equal(mdl_st_write(path, &t0, 1, NULL, err, sizeof err), 0);

    const size_t big_n = 1 << 20;
    uint8_t *big = calloc(big_n, 1);
    assert_non_null(big);
    mdl_st_out t1 = {.name = "new", .dtype = MDL_DT_U8, .ndim = 1, .shape = {(int64_t)big_n},
                     .data = big};
    struct rlimit old;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    if (old.rlim_max != RLIM_INFINITY && old.rlim_max < 65536) {
        free(big);
        skip();
    }
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {.rlim_cur = 65536, .rlim_max = old.rlim_max};
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int rc = mdl_st_write(path, &t1, 1, NULL, err, sizeof err);
    int saved = errno;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, prev);
    (void)saved;
    free(big);
    assert_int_equal(rc, -1);
    assert_non_null(strstr(err, "write failed"));
    assert_non_null(strstr(err, path));

    mdl_st_file f;
    assert_int_equal(mdl_st_open(path, &f, err, sizeof err), 0);
    assert_int_equal(f.n, 1);
    assert_string_equal(f.tensors[0].name, "old");
    mdl_st_close(&f);
    unlink(path);
    /* no temp files left behind */
    DIR *dir = opendir(g_dir);
    assert_non_null(dir);
    for (struct dirent *de; (de = readdir(dir)) != NULL;)
        if (strstr(de->d_name, ".tmp."))
            fail_msg("temp file left behind: %s", de->d_name);
    closedir(dir);
}

/* ---- mutation fuzz ---------------------------------------------------------------------------- */

/* A successful parse must describe tensors that lie in the data section, agree with their shapes,
 * and tile it. The data bytes are read so ASan flags any span outside the (exact-size) buffer. */
static void check_structure(const uint8_t *buf, size_t len, const mdl_st_file *f)
{
    assert_true(len >= 8);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)buf[i] << (8 * i);
    assert_true(hlen <= len - 8);
    const uint8_t *lo = buf + 8 + hlen, *hi = buf + len;
    uint64_t covered = 0;
    volatile unsigned sink = 0;
    for (size_t i = 0; i < f->n; i++) {
        const mdl_st_tensor *t = &f->tensors[i];
        assert_non_null(t->name);
        assert_true((unsigned)t->dtype < MDL_DT_COUNT);
        assert_true(t->ndim >= 0 && t->ndim <= MDL_ST_MAX_DIMS);
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            assert_true(t->shape[d] >= 0);
            numel *= (uint64_t)t->shape[d];
        }
        assert_int_equal(t->numel, numel);
        assert_int_equal(t->nbytes, numel * mdl_dtype_size(t->dtype));
        assert_true(t->data >= lo && t->data <= hi);
        assert_true(t->nbytes <= (uint64_t)(hi - t->data));
        for (uint64_t k = 0; k < t->nbytes; k++)
            sink += t->data[k];
        for (size_t j = 0; j < i; j++) { /* pairwise disjoint (n is small here) */
            const mdl_st_tensor *u = &f->tensors[j];
            if (t->nbytes && u->nbytes)
                assert_true(t->data + t->nbytes <= u->data || u->data + u->nbytes <= t->data);
        }
        covered += t->nbytes;
    }
    assert_int_equal(covered, (uint64_t)(hi - lo));
    (void)sink;
}

static const char *const k_tokens[] = {
    "-1", "1e999", "0.5", "18446744073709551616", "9007199254740993", "\"__metadata__\"", "[]",
    "{}", "null", "\"F32\"", "\"BF16\"", "\\u0000", ",", ":", "\"", "[0,0]", "[", "]", "{", "}",
    "0", "4294967296", "\"shape\"", "\"data_offsets\"", "\"dtype\"", "-0", "1e2", "true",
};

static uint64_t read_hlen(const uint8_t *b, size_t len)
{
    if (len < 8)
        return 0;
    uint64_t h = 0;
    for (int i = 0; i < 8; i++)
        h |= (uint64_t)b[i] << (8 * i);
    return h;
}

/* Applies one random mutation to buf[0..*len) (capacity cap), keeping *len <= cap. */
static void mutate(uint8_t *buf, size_t *len, size_t cap)
{
    size_t n = *len;
    uint64_t hl = read_hlen(buf, n);
    /* bias edits into the header: that is where the parser's decisions are */
    size_t hdr_end = (n >= 8 && hl <= n - 8) ? 8 + (size_t)hl : n;
    size_t pos = (n && rndn(4)) ? (hdr_end > 8 ? 8 + rndn(hdr_end - 8) : rndn(n)) : rndn(n + 1);
    int fix = rndn(2); /* after an insert/delete inside the header, keep the length prefix right */
    switch (rndn(8)) {
    case 0: /* bit flip */
        if (n)
            buf[pos < n ? pos : n - 1] ^= (uint8_t)(1u << rndn(8));
        break;
    case 1: { /* byte set to a random or syntax-significant value */
        static const char sig[] = "{}[]\",:-.0123456789eE \\u";
        if (n)
            buf[pos < n ? pos : n - 1] = rndn(2) ? (uint8_t)rnd() : (uint8_t)sig[rndn(sizeof sig - 1)];
        break;
    }
    case 2: /* truncation */
        *len = rndn(n + 1);
        return;
    case 3: { /* header length edits */
        if (n < 8)
            return;
        static const uint64_t vals[] = {0, 1, 7, 8, UINT64_MAX, MDL_ST_MAX_HEADER,
                                        MDL_ST_MAX_HEADER + 1, 1ull << 32, 1ull << 63};
        uint64_t v;
        switch (rndn(3)) {
        case 0: v = vals[rndn(sizeof vals / sizeof vals[0])]; break;
        case 1: v = hl + rndn(17) - 8; break;
        default: v = rndn(n + 8); break;
        }
        put_u64le(buf, v);
        return;
    }
    case 4:
    case 5: { /* splice: insert a chunk of the buffer itself or a token at pos */
        uint8_t chunk[64];
        size_t cl;
        if (rndn(2) || n == 0) {
            const char *tok = k_tokens[rndn(sizeof k_tokens / sizeof k_tokens[0])];
            cl = strlen(tok);
            memcpy(chunk, tok, cl);
        } else {
            size_t from = rndn(n);
            cl = 1 + rndn(n - from < sizeof chunk ? n - from : sizeof chunk);
            memcpy(chunk, buf + from, cl);
        }
        if (n + cl > cap)
            return;
        if (pos > n)
            pos = n;
        memmove(buf + pos + cl, buf + pos, n - pos);
        memcpy(buf + pos, chunk, cl);
        *len = n + cl;
        if (fix && pos >= 8 && pos <= hdr_end && n >= 8)
            put_u64le(buf, hl + cl);
        return;
    }
    case 6: { /* delete a range */
        if (pos >= n)
            return;
        size_t dl = 1 + rndn(n - pos < 16 ? n - pos : 16);
        memmove(buf + pos, buf + pos + dl, n - pos - dl);
        *len = n - dl;
        if (fix && pos >= 8 && pos + dl <= hdr_end)
            put_u64le(buf, hl - dl);
        return;
    }
    default: { /* overwrite with a copy of another region (no length change) */
        if (n < 2)
            return;
        size_t from = rndn(n), to = rndn(n);
        size_t cl = 1 + rndn(16);
        if (from + cl > n)
            cl = n - from;
        if (to + cl > n)
            cl = n - to;
        memmove(buf + to, buf + from, cl);
        return;
    }
    }
}

static void test_mutation_fuzz(void **state)
{
    (void)state;
    /* a valid 3-tensor file with metadata and a zero-size tensor */
    const char *json =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        T1("model.embed_tokens.weight", "BF16", "[2,3]", "[0,12]") ","
        T1("model.norm.weight", "F32", "[3]", "[12,24]") ","
        T1("lm_head.bias", "F16", "[0,3]", "[24,24]") "}";
    size_t base_len;
    uint8_t *base = build(json, 24, 0, 0, &base_len);
    mdl_st_file f;
    char err[512];
    assert_int_equal(mdl_st_parse(base, base_len, "seed", &f, err, sizeof err), 0);
    assert_int_equal(f.n, 3);
    mdl_st_close(&f);

    const size_t cap = 4096;
    uint8_t *work = malloc(cap);
    assert_non_null(work);
    memcpy(work, base, base_len);
    size_t wlen = base_len;
    g_rng = 0x9E3779B97F4A7C15ull;
    int ok = 0, bad = 0;
    for (int it = 0; it < 20000; it++) {
        /* usually restart from the seed; sometimes keep stacking mutations for depth */
        if (rndn(4) != 0) {
            memcpy(work, base, base_len);
            wlen = base_len;
        }
        int k = 1 + (int)rndn(3);
        for (int m = 0; m < k; m++)
            mutate(work, &wlen, cap);
        uint8_t *exact = malloc(wlen ? wlen : 1); /* exact size: ASan catches any over-read */
        assert_non_null(exact);
        memcpy(exact, work, wlen);
        err[0] = '\0';
        if (mdl_st_parse(exact, wlen, "fuzz", &f, err, sizeof err) == 0) {
            check_structure(exact, wlen, &f);
            ok++;
        } else {
            assert_true(strncmp(err, "fuzz: ", 6) == 0);
            assert_true(file_is_empty(&f));
            bad++;
        }
        mdl_st_close(&f);
        free(exact);
    }
    print_message("mutation fuzz: %d accepted, %d refused\n", ok, bad);
    /* both outcomes must actually be exercised */
    assert_true(ok > 100);
    assert_true(bad > 1000);
    free(work);
    free(base);
}

/* ---- conversion ------------------------------------------------------------------------------- */

/* This target does not link libm, so the references use these (exact: scaling by 2 is exact
 * within the range used here). */
static double ref_ldexp(double m, int e)
{
    for (; e > 0; e--)
        m *= 2.0;
    for (; e < 0; e++)
        m *= 0.5;
    return m;
}

static double ref_fabs(double x)
{
    return x < 0 ? -x : x;
}

/* Reference f32 -> bf16 by comparing distances to the two neighbours in double (exact there);
 * overflow is rounded as if the exponent were unbounded (the upper neighbour of FLT_MAX's bf16 is
 * 2^128), as IEEE specifies. */
static uint16_t ref_bf16(uint32_t x)
{
    float f = u2f(x);
    if (isnan(f))
        return 0; /* callers check NaN separately */
    if (isinf(f))
        return (uint16_t)(x >> 16);
    uint32_t lo = x & 0xffff0000u;
    uint32_t hi = lo + 0x10000u;
    double dx = ref_fabs((double)f), dlo = ref_fabs((double)u2f(lo));
    double dhi =
        ((hi & 0x7f800000u) == 0x7f800000u) ? ref_ldexp(1.0, 128) : ref_fabs((double)u2f(hi));
    double a = dx - dlo, b = dhi - dx;
    if (a < b)
        return (uint16_t)(lo >> 16);
    if (b < a)
        return (uint16_t)(hi >> 16);
    return ((lo >> 16) & 1) ? (uint16_t)(hi >> 16) : (uint16_t)(lo >> 16);
}

/* Reference f16 -> value via (ref_)ldexp, from the IEEE binary16 definition. */
static float ref_f16(uint16_t h)
{
    int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0)
        v = ref_ldexp((double)m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ref_ldexp((double)(1024 + m), e - 25);
    return (float)(sign ? -v : v);
}

static uint16_t cvt1_bf16(uint32_t x)
{
    uint16_t out;
    assert_int_equal(mdl_convert(&out, MDL_DT_BF16, &x, MDL_DT_F32, 1), 0);
    return out;
}

static int bf16_is_nan(uint16_t b)
{
    return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0;
}

static void test_bf16_rounding(void **state)
{
    (void)state;
    static const struct {
        uint32_t in;
        uint16_t out;
    } cases[] = {
        {0x3f800000, 0x3f80}, /* 1.0 exact */
        {0x3f808000, 0x3f80}, /* tie, even below */
        {0x3f818000, 0x3f82}, /* tie, odd below -> up */
        {0x3f808001, 0x3f81}, /* just above tie */
        {0x3f807fff, 0x3f80}, /* just below tie */
        {0xbf808000, 0xbf80}, /* negative tie */
        {0xbf818000, 0xbf82},
        {0x3fff8000, 0x4000}, /* carry into exponent */
        {0x7f800000, 0x7f80}, /* +inf */
        {0xff800000, 0xff80}, /* -inf */
        {0x7f7fffff, 0x7f80}, /* FLT_MAX rounds to inf */
        {0x7f7f8000, 0x7f80}, /* tie at the top, odd below -> inf */
        {0x7f7f7fff, 0x7f7f}, /* stays finite */
        {0xff7fffff, 0xff80}, /* -FLT_MAX -> -inf */
        {0x00000000, 0x0000},
        {0x80000000, 0x8000}, /* -0 */
        {0x00008000, 0x0000}, /* subnormal tie to even 0 */
        {0x00018000, 0x0002}, /* subnormal tie, odd -> up */
        {0x00000001, 0x0000},
        {0x007fffff, 0x0080}, /* largest subnormal rounds up to smallest normal */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t got = cvt1_bf16(cases[i].in);
        if (got != cases[i].out)
            fail_msg("f32 %08x -> bf16 %04x, want %04x", cases[i].in, got, cases[i].out);
        assert_int_equal(got, ref_bf16(cases[i].in));
    }
    /* NaNs stay NaN (a naive rounding add turns 0x7f800001 into inf and 0x7fffffff into -0),
     * keep their sign, and come out quiet */
    static const uint32_t nans[] = {0x7fc00000, 0x7f800001, 0x7f80ffff, 0x7fffffff, 0xffffffff,
                                    0xff800001, 0x7fbfffff, 0x7f810000};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t got = cvt1_bf16(nans[i]);
        assert_true(bf16_is_nan(got));
        assert_int_equal(got & 0x8000, (nans[i] >> 16) & 0x8000);
        assert_true(got & 0x0040);
    }
    /* every bf16 neighbourhood: the value itself, the tie, and +-1 ulp around the tie, for all
     * 65536 upper halves, plus 1M random patterns; all against the reference */
    for (uint32_t hi = 0; hi < 65536; hi++) {
        const uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};
        for (size_t k = 0; k < 6; k++) {
            uint32_t x = (hi << 16) | lows[k];
            uint16_t got = cvt1_bf16(x);
            if (isnan(u2f(x))) {
                assert_true(bf16_is_nan(got));
            } else if (got != ref_bf16(x)) {
                fail_msg("f32 %08x -> %04x, reference %04x", x, got, ref_bf16(x));
            }
        }
    }
    /* bulk conversion (vectorised loop path) agrees with element-wise */
    const size_t n = 1 << 20;
    uint32_t *src = malloc(n * 4);
    uint16_t *dst = malloc(n * 2);
    assert_non_null(src);
    assert_non_null(dst);
    g_rng = 12345;
    for (size_t i = 0; i < n; i++)
        src[i] = (uint32_t)rnd();
    assert_int_equal(mdl_convert(dst, MDL_DT_BF16, src, MDL_DT_F32, n), 0);
    for (size_t i = 0; i < n; i++) {
        if (isnan(u2f(src[i])))
            assert_true(bf16_is_nan(dst[i]));
        else if (dst[i] != ref_bf16(src[i]))
            fail_msg("f32 %08x -> %04x, reference %04x", src[i], dst[i], ref_bf16(src[i]));
    }
    free(src);
    free(dst);
}

static void test_f16_conversion(void **state)
{
    (void)state;
    /* exhaustive: all 65536 f16 patterns, unaligned source/destination to exercise memcpy loads */
    uint8_t *src = malloc(65536 * 2 + 1);
    uint8_t *d32 = malloc(65536 * 4 + 3);
    uint8_t *d16 = malloc(65536 * 2 + 1);
    assert_non_null(src);
    assert_non_null(d32);
    assert_non_null(d16);
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        memcpy(src + 1 + 2 * i, &h, 2);
    }
    assert_int_equal(mdl_convert(d32 + 3, MDL_DT_F32, src + 1, MDL_DT_F16, 65536), 0);
    assert_int_equal(mdl_convert(d16 + 1, MDL_DT_BF16, src + 1, MDL_DT_F16, 65536), 0);
    for (uint32_t i = 0; i < 65536; i++) {
        uint32_t got;
        uint16_t gotb;
        memcpy(&got, d32 + 3 + 4 * i, 4);
        memcpy(&gotb, d16 + 1 + 2 * i, 2);
        float want = ref_f16((uint16_t)i);
        if (isnan(want)) {
            /* NaN: bit-exact widening, payload and quiet bit kept */
            uint32_t wb = ((i & 0x8000u) << 16) | 0x7f800000u | ((i & 0x3ffu) << 13);
            assert_int_equal(got, wb);
            assert_true(bf16_is_nan(gotb));
            assert_int_equal(gotb & 0x8000, i & 0x8000);
        } else {
            if (got != f2u(want))
                fail_msg("f16 %04x -> f32 %08x, want %08x (%g)", i, got, f2u(want), (double)want);
            uint16_t wantb = ref_bf16(f2u(want));
            if (gotb != wantb)
                fail_msg("f16 %04x -> bf16 %04x, want %04x", i, gotb, wantb);
        }
    }
    /* spot checks of the named cases */
    static const struct {
        uint16_t h;
        uint32_t f;
    } spot[] = {
        {0x0001, 0x33800000}, /* smallest subnormal 2^-24 */
        {0x03ff, 0x387fc000}, /* largest subnormal */
        {0x0400, 0x38800000}, /* smallest normal 2^-14 */
        {0x7bff, 0x477fe000}, /* 65504 */
        {0x7c00, 0x7f800000}, /* inf */
        {0xfc00, 0xff800000}, /* -inf */
        {0x8000, 0x80000000}, /* -0 */
        {0x3c00, 0x3f800000}, /* 1 */
        {0x7e00, 0x7fc00000}, /* qNaN */
        {0x7c01, 0x7f802000}, /* sNaN payload kept */
    };
    for (size_t i = 0; i < sizeof spot / sizeof spot[0]; i++) {
        uint32_t got;
        assert_int_equal(mdl_convert(&got, MDL_DT_F32, &spot[i].h, MDL_DT_F16, 1), 0);
        assert_int_equal(got, spot[i].f);
    }
    /* f16 -> bf16 rounding: 1 + 2^-8 (0x3c04) is a tie in bf16 -> even (1.0); 1 + 3*2^-8 -> up */
    uint16_t h2[2] = {0x3c04, 0x3c0c}, b2[2];
    assert_int_equal(mdl_convert(b2, MDL_DT_BF16, h2, MDL_DT_F16, 2), 0);
    assert_int_equal(b2[0], 0x3f80);
    assert_int_equal(b2[1], 0x3f82);
    free(src);
    free(d32);
    free(d16);
}

static void test_convert_round_trips(void **state)
{
    (void)state;
    /* bf16 -> f32 is exact widening; f32 -> bf16 gives it back (NaNs come back quiet) */
    uint16_t *b = malloc(65536 * 2), *b2 = malloc(65536 * 2);
    float *f = malloc(65536 * 4), *f2 = malloc(65536 * 4);
    assert_non_null(b);
    assert_non_null(b2);
    assert_non_null(f);
    assert_non_null(f2);
    for (uint32_t i = 0; i < 65536; i++)
        b[i] = (uint16_t)i;
    assert_int_equal(mdl_convert(f, MDL_DT_F32, b, MDL_DT_BF16, 65536), 0);
    assert_int_equal(mdl_convert(b2, MDL_DT_BF16, f, MDL_DT_F32, 65536), 0);
    for (uint32_t i = 0; i < 65536; i++) {
        assert_int_equal(f2u(f[i]), i << 16);
        if (bf16_is_nan((uint16_t)i))
            assert_int_equal(b2[i], i | 0x40);
        else
            assert_int_equal(b2[i], i);
    }
    /* same-dtype pairs are copies */
    assert_int_equal(mdl_convert(b2, MDL_DT_BF16, b, MDL_DT_BF16, 65536), 0);
    assert_memory_equal(b2, b, 65536 * 2);
    assert_int_equal(mdl_convert(f2, MDL_DT_F32, f, MDL_DT_F32, 65536), 0);
    assert_memory_equal(f2, f, 65536 * 4);
    /* f16 -> f32 -> bf16 equals f16 -> bf16 directly */
    uint16_t *h = b;
    assert_int_equal(mdl_convert(f, MDL_DT_F32, h, MDL_DT_F16, 65536), 0);
    assert_int_equal(mdl_convert(b2, MDL_DT_BF16, f, MDL_DT_F32, 65536), 0);
    uint16_t *b3 = malloc(65536 * 2);
    assert_non_null(b3);
    assert_int_equal(mdl_convert(b3, MDL_DT_BF16, h, MDL_DT_F16, 65536), 0);
    assert_memory_equal(b2, b3, 65536 * 2);
    /* f16 -> f32 -> f16 is the identity for every non-NaN f16 (NaN stays NaN) */
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    assert_int_equal(mdl_convert(f, MDL_DT_F32, h, MDL_DT_F16, 65536), 0);
    assert_int_equal(mdl_convert(b3, MDL_DT_F16, f, MDL_DT_F32, 65536), 0);
    for (uint32_t i = 0; i < 65536; i++) {
        int nan = (i & 0x7c00u) == 0x7c00u && (i & 0x3ffu);
        if (nan)
            assert_true((b3[i] & 0x7c00u) == 0x7c00u && (b3[i] & 0x3ffu));
        else
            assert_int_equal(b3[i], i);
    }
    /* f32 -> f16 rounding: ties to even, overflow to inf, subnormal ties, underflow to zero */
    {
        const float in[] = {1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 65519.0f, 65520.0f, 1e9f,
                            5.9604644775390625e-08f /* 2^-24 */, 2.98023223876953125e-08f /* 2^-25 */,
                            8.940696716308594e-08f /* 1.5 * 2^-24 */, -0.0f};
        const uint16_t want[] = {0x3c00, 0x3c02, 0x7bff, 0x7c00, 0x7c00, 0x0001, 0x0000, 0x0002, 0x8000};
        uint16_t got[9];
        assert_int_equal(mdl_convert(got, MDL_DT_F16, in, MDL_DT_F32, 9), 0);
        for (int i = 0; i < 9; i++)
            assert_int_equal(got[i], want[i]);
    }
    /* unsupported pairs and n == 0 */
    for (int d = 0; d < MDL_DT_COUNT; d++) {
        for (int s = 0; s < MDL_DT_COUNT; s++) {
            int want = ((d == MDL_DT_BF16 || d == MDL_DT_F16 || d == MDL_DT_F32) &&
                        (s == (int)MDL_DT_BF16 || s == (int)MDL_DT_F16 || s == (int)MDL_DT_F32)) ||
                       (d == MDL_DT_F8_E4M3 && s == MDL_DT_F8_E4M3); /* FP8 codes: copied as they are */
            assert_int_equal(mdl_convert(f2, (mdl_dtype)d, f, (mdl_dtype)s, 4), want ? 0 : -1);
        }
    }
    assert_int_equal(mdl_convert(NULL, MDL_DT_F32, NULL, MDL_DT_BF16, 0), 0);
    free(b);
    free(b2);
    free(b3);
    free(f);
    free(f2);
}

/* mdl_fp8_encode (the online quantizer and mkmodel --fp8): round to nearest, ties to the even code,
 * saturating at 448, checked against the nearest code found by search over every finite code's value
 * computed here from the OCP FP8 e4m3 layout (bias 7, 3 mantissa bits, subnormals m * 2^-9) in
 * double: at every code, just below and above it, at every midpoint between neighbours (the ties) and
 * a step either side, at random magnitudes from 2^-20 to 448, at f32 denormals, and past 448. */
static double e4m3_value(int c) /* c = 0 .. 0x7e */
{
    const int e = c >> 3, m = c & 7;
    return e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m, -9);
}

static uint8_t e4m3_nearest(float v)
{
    const double a = fabs((double)v);
    int best = 0;
    for (int c = 1; c <= 0x7e; c++) {
        const double d = fabs(e4m3_value(c) - a), db = fabs(e4m3_value(best) - a);
        if (d < db || (d == db && (c & 1) == 0)) best = c;
    }
    return (uint8_t)((v < 0 ? 0x80 : 0) | best);
}

static void check_encode(float v)
{
    const uint8_t got = mdl_fp8_encode(v), want = e4m3_nearest(v);
    if (got != want) fail_msg("mdl_fp8_encode(%.9g = %a): 0x%02x, the nearest code is 0x%02x", (double)v, (double)v, got, want);
}

static void test_fp8_encode(void **state)
{
    (void)state;
    for (int c = 0; c <= 0x7e; c++) {
        const float x = (float)e4m3_value(c);
        for (int sgn = 0; sgn < 2; sgn++) {
            const float y = sgn ? -x : x;
            check_encode(y);
            check_encode(nextafterf(y, 0.0f));
            check_encode(nextafterf(y, sgn ? -INFINITY : INFINITY));
            if (c < 0x7e) { /* the tie with the next code, and a step either side */
                const float mid = (float)((e4m3_value(c) + e4m3_value(c + 1)) / 2), ym = sgn ? -mid : mid;
                check_encode(ym);
                check_encode(nextafterf(ym, 0.0f));
                check_encode(nextafterf(ym, sgn ? -INFINITY : INFINITY));
            }
        }
    }
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 200000; i++) {
        r ^= r >> 12, r ^= r << 25, r ^= r >> 27;
        const uint64_t z = r * 0x2545F4914F6CDD1Dull;
        const float mag = ldexpf((float)(z >> 40) / (float)(1u << 24), (int)((z >> 8) % 30) - 20); /* 2^-21 .. 2^9 */
        check_encode((z & 1) ? -mag : mag);
    }
    check_encode(0x1p-149f);
    check_encode(-0x1p-130f);
    check_encode(0.0f);
    assert_int_equal(mdl_fp8_encode(-0.0f), 0x00);
    assert_int_equal(mdl_fp8_encode(448.0f), 0x7e);
    assert_int_equal(mdl_fp8_encode(1e6f), 0x7e);
    assert_int_equal(mdl_fp8_encode(-1e6f), 0xfe);
    assert_int_equal(mdl_fp8_encode(INFINITY), 0x7e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_encode),
        cmocka_unit_test(test_dtype_table),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_parse_valid_edges),
        cmocka_unit_test(test_malformed_table),
        cmocka_unit_test(test_error_message_exact),
        cmocka_unit_test(test_deep_and_large_headers),
        cmocka_unit_test(test_nesting_small_stack),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_write_errors),
        cmocka_unit_test(test_write_short),
        cmocka_unit_test(test_mutation_fuzz),
        cmocka_unit_test(test_bf16_rounding),
        cmocka_unit_test(test_f16_conversion),
        cmocka_unit_test(test_convert_round_trips),
    };
    int rc = cmocka_run_group_tests_name("safetensors", tests, NULL, NULL);
    if (g_dir[0])
        rmdir(g_dir);
    return rc;
}
