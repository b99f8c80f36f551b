/* tests/emu/emu_optest.h — the one-op harness of the tests/emu tests that compare an emulated CUDA kernel
 * (tests/emu/emu_kernels.h) with the CPU kernel (kern_cpu_exec), modelled on tests/gpu/test_cuda_ops.c's.
 *
 * A case declares the op's buffers (inputs, outputs, views into another buffer); et_run builds one copy
 * of every buffer for the CPU and one per emulated thread schedule (uniform picks, warps running ahead),
 * runs the op on each, and checks: the two schedules bitwise equal on every output; every output element
 * the CPU left unwritten still holds the poison (rows past n, columns outside the op); live elements
 * bitwise equal to the CPU's (exact slots) or within rtol (gpu_cmp_f32: rtol * (max |cpu| + |cpu|)), NaN
 * never passing. Buffers are 64-byte aligned (a view's offset sets its own alignment), so the vectorized
 * paths are chosen as on the device; the emulated kernels' copies end (within 64 bytes) at an inaccessible
 * page, so a read or write past a buffer's end faults (cmocka reports the signal as the test's failure).
 * Static functions: include from one test file. */
#ifndef GS_TESTS_EMU_OPTEST_H
#define GS_TESTS_EMU_OPTEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <sys/mman.h>
#include <unistd.h>

#include "kernels/kern.h"
#include "tests/emu/emu_kernels.h"
#include "tests/gpu/gpu_test.h"

/* the two schedules of every op: even seed uniform, odd seed run ahead (emu_cuda.cpp) */
static const uint64_t ET_SEEDS[2] = {0x5eed0010ull, 0x5eed0011ull};

enum { ET_NONE = 0, ET_IN, ET_OUT_F32, ET_OUT_I32 };
/* Slots 0..KERN_MAX_BUFS-1 are the op's buffers; ET_EXTRA holds one the op only sees through views. */
#define ET_EXTRA KERN_MAX_BUFS
#define ET_SLOTS (KERN_MAX_BUFS + 1)

typedef struct {
    kern_op op; /* kind, p, f (buffers filled by et_run) */
    void *host[ET_SLOTS];
    size_t bytes[ET_SLOTS];
    int type[ET_SLOTS];
    int alias[ET_SLOTS]; /* slot whose buffer this one views, or -1 */
    size_t off[ET_SLOTS];
    int exact[ET_SLOTS];
    double rtol;
    emu_kc_config cfg;
} et_case;

static inline void *et_alloc(size_t n)
{
    void *p = aligned_alloc(64, (n + 63) / 64 * 64 + 64);
    assert_non_null(p);
    return p;
}
static inline float *et_poison(size_t n)
{
    float *p = et_alloc(n * 4);
    for (size_t i = 0; i < n; i++) p[i] = gpu_poison_f32();
    return p;
}
/* rows x cols: random in [-scale, scale) for rows < live, poison after */
static inline float *et_rows(gpu_rng *r, size_t rows, size_t cols, size_t live, float scale)
{
    float *p = et_poison(rows * cols);
    for (size_t i = 0; i < live * cols; i++) p[i] = gpu_unif(r) * scale;
    return p;
}
static inline float *et_rand(gpu_rng *r, size_t n, float scale) { return et_rows(r, n, 1, n, scale); }
static inline float *et_near1(gpu_rng *r, size_t n) /* norm weights */
{
    float *p = et_rand(r, n, 0.2f);
    for (size_t i = 0; i < n; i++) p[i] += 1.0f;
    return p;
}
static inline void *et_weights(gpu_rng *r, int bf, size_t n, float scale)
{
    if (!bf) return et_rand(r, n, scale);
    uint16_t *p = et_alloc(n * 2);
    for (size_t i = 0; i < n; i++) p[i] = kern_f32_to_bf16(gpu_unif(r) * scale);
    return p;
}
static inline int32_t *et_i32(size_t n, int32_t v)
{
    int32_t *p = et_alloc(n * 4);
    for (size_t i = 0; i < n; i++) p[i] = v;
    return p;
}

/* n bytes, 64-byte aligned, ending at most 63 bytes before a PROT_NONE page (et_gfree) */
static inline void *et_galloc(size_t n)
{
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE), body = (n + 63) / 64 * 64, map = (body + pg - 1) / pg * pg + pg;
    char *m = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    assert_int_equal(mprotect(m + map - pg, pg, PROT_NONE), 0);
    return m + map - pg - body;
}
static inline void et_gfree(void *p, size_t n)
{
    if (!p) return;
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE), body = (n + 63) / 64 * 64, map = (body + pg - 1) / pg * pg + pg;
    char *m = (char *)p + body + pg - map;
    assert_int_equal(munmap(m, map), 0);
}

static inline void et_init(et_case *t, kern_op_kind kind)
{
    memset(t, 0, sizeof *t);
    t->op.kind = kind;
    for (int i = 0; i < ET_SLOTS; i++) t->alias[i] = -1;
    t->rtol = 1e-5;
}
/* Takes ownership of host (et_alloc'd). */
static inline void et_buf(et_case *t, int slot, void *host, size_t bytes, int type)
{
    t->host[slot] = host;
    t->bytes[slot] = bytes;
    t->type[slot] = type;
}
static inline void et_view(et_case *t, int slot, int of, size_t off, size_t bytes)
{
    t->alias[slot] = of;
    t->off[slot] = off;
    t->bytes[slot] = bytes;
    t->type[slot] = ET_IN; /* compared through the slot it views */
}

/* Runs the case on the CPU and under both schedules; frees its buffers. Returns the failures. */
static inline int et_run(kern_pool *pool, et_case *t, emu_kc_fn fn, const char *name)
{
    kern_op cop = t->op, eop[2] = {t->op, t->op};
    void *cbuf[ET_SLOTS] = {0}, *ebuf[2][ET_SLOTS] = {{0}};
    for (int s = 0; s < ET_SLOTS; s++) {
        if (t->type[s] == ET_NONE || t->alias[s] >= 0) continue;
        cbuf[s] = et_alloc(t->bytes[s]);
        memcpy(cbuf[s], t->host[s], t->bytes[s]);
        for (int k = 0; k < 2; k++) {
            ebuf[k][s] = et_galloc(t->bytes[s]);
            memcpy(ebuf[k][s], t->host[s], t->bytes[s]);
        }
    }
    for (int s = 0; s < KERN_MAX_BUFS; s++) {
        if (t->alias[s] >= 0) {
            cbuf[s] = (char *)cbuf[t->alias[s]] + t->off[s];
            for (int k = 0; k < 2; k++) ebuf[k][s] = (char *)ebuf[k][t->alias[s]] + t->off[s];
        }
        cop.buf[s] = (kern_buf){cbuf[s], cbuf[s] ? t->bytes[s] : 0};
        for (int k = 0; k < 2; k++) eop[k].buf[s] = (kern_buf){ebuf[k][s], ebuf[k][s] ? t->bytes[s] : 0};
    }
    kern_cpu_exec(pool, &cop);
    for (int k = 0; k < 2; k++) {
        char msg[192];
        if (fn(&eop[k], &t->cfg, ET_SEEDS[k], msg, sizeof msg) != 0) fail_msg("%s: the kernel recorded %s", name, msg);
    }
    int bad = 0;
    for (int s = 0; s < ET_SLOTS; s++) {
        if (t->alias[s] >= 0 || (t->type[s] != ET_OUT_F32 && t->type[s] != ET_OUT_I32)) continue;
        char what[160];
        snprintf(what, sizeof what, "%.140s buf[%d]", name, s);
        if (memcmp(ebuf[0][s], ebuf[1][s], t->bytes[s]) != 0) {
            fprintf(stderr, "%s: the two thread schedules differ\n", what);
            bad++;
        }
        if (t->type[s] == ET_OUT_F32)
            bad += gpu_cmp_f32(what, cbuf[s], ebuf[0][s], t->host[s], t->bytes[s] / 4, t->rtol, t->exact[s]);
        else
            bad += gpu_cmp_i32(what, cbuf[s], ebuf[0][s], t->bytes[s] / 4);
    }
    for (int s = 0; s < ET_SLOTS; s++) {
        if (t->alias[s] >= 0 || t->type[s] == ET_NONE) continue;
        free(cbuf[s]);
        et_gfree(ebuf[0][s], t->bytes[s]);
        et_gfree(ebuf[1][s], t->bytes[s]);
        free(t->host[s]);
    }
    return bad;
}

/* A case whose data-dependent check must fail (the CPU aborts on it): runs it on the emulation alone and
 * checks that the kernel recorded `code` (its KC_ERR_* name). Frees the case's buffers; outputs of the
 * run are left in out_copy[slot] (et_alloc'd, caller frees) when out_copy is not NULL. */
static inline void et_expect_error(et_case *t, emu_kc_fn fn, const char *code, const char *name, void **out_copy)
{
    kern_op op = t->op;
    void *buf[ET_SLOTS] = {0};
    for (int s = 0; s < ET_SLOTS; s++)
        if (t->type[s] != ET_NONE && t->alias[s] < 0) buf[s] = t->host[s];
    for (int s = 0; s < KERN_MAX_BUFS; s++) {
        if (t->alias[s] >= 0) buf[s] = (char *)buf[t->alias[s]] + t->off[s];
        op.buf[s] = (kern_buf){buf[s], buf[s] ? t->bytes[s] : 0};
    }
    char msg[192] = "";
    if (fn(&op, &t->cfg, ET_SEEDS[1], msg, sizeof msg) != 1) fail_msg("%s: no failed check recorded", name);
    if (!strstr(msg, code)) fail_msg("%s: recorded '%s', expected %s", name, msg, code);
    for (int s = 0; s < ET_SLOTS; s++) {
        if (t->alias[s] >= 0 || t->type[s] == ET_NONE) continue;
        if (out_copy) out_copy[s] = t->host[s];
        else free(t->host[s]);
    }
}

#endif
