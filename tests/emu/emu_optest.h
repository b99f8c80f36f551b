/* tests/emu/emu_optest.h — the one-op harness of the tests/emu tests that compare an emulated CUDA kernel
 * (tests/emu/emu_kernels.h) with the CPU kernel (kern_cpu_exec), modelled on tests/gpu/test_cuda_ops.c's.
 *
 * A case declares the op's buffers (inputs, outputs, views into another buffer); et_run builds one copy
 * of every buffer for the CPU and one per emulated thread schedule (uniform picks, warps running ahead),
 * runs the op on each, and checks: the two schedules bitwise equal on every output; every output element
 * the CPU left unwritten still holds the poison (rows past n, columns outside the op); live elements
 * bitwise equal to the CPU's (exact slots) or within rtol (gpu_cmp_f32: rtol * (max |cpu| + |cpu|)), NaN
 * never passing, or by the case's own comparison (OC_OUT_CMP: oc_compare). Buffers are 64-byte aligned (a view's offset sets its own alignment), so the vectorized
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
#include "tests/opcases/opcases.h"

/* the two schedules of every op: even seed uniform, odd seed run ahead (emu_cuda.cpp) */
static const uint64_t ET_SEEDS[2] = {0x5eed0010ull, 0x5eed0011ull};

/* The case and its data helpers are tests/opcases/opcases.h's (the cases shared with tests/gpu). */
enum { ET_NONE = OC_NONE, ET_IN = OC_IN, ET_OUT_F32 = OC_OUT_F32, ET_OUT_I32 = OC_OUT_I32, ET_OUT_CMP = OC_OUT_CMP };
#define ET_EXTRA OC_EXTRA
#define ET_SLOTS OC_SLOTS
typedef oc_case et_case;

#define et_alloc oc_alloc
#define et_poison oc_poison
#define et_rows oc_rows
#define et_rand oc_rand
#define et_near1 oc_near1
#define et_weights oc_weights
#define et_i32 oc_i32
#define et_buf oc_buf
#define et_view oc_view
static inline void et_init(et_case *t, kern_op_kind kind) { oc_init(t, kind, 1e-5); }

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

/* Runs the case on the CPU and under both schedules; frees its buffers. Returns the failures. */
static inline int et_run(kern_pool *pool, et_case *t, emu_kc_fn fn, const char *name)
{
    kern_op cop = t->op, eop[2] = {t->op, t->op};
    const emu_kc_config cfg = {.attn_bytes = t->attn_bytes};
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
        if (fn(&eop[k], &cfg, ET_SEEDS[k], msg, sizeof msg) != 0) fail_msg("%s: the kernel recorded %s", name, msg);
    }
    int bad = 0;
    for (int s = 0; s < ET_SLOTS; s++) {
        if (t->alias[s] >= 0 || !oc_is_out(t->type[s])) continue;
        char what[160];
        snprintf(what, sizeof what, "%.140s buf[%d]", name, s);
        if (memcmp(ebuf[0][s], ebuf[1][s], t->bytes[s]) != 0) {
            fprintf(stderr, "%s: the two thread schedules differ\n", what);
            bad++;
        }
        bad += oc_compare(t, s, cbuf[s], ebuf[0][s], what);
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

/* The emulation as an opcases.h harness: runs one family of the shared cases (tests/opcases) through
 * et_run with the family's emulated kernel. */
typedef struct {
    kern_pool *pool;
    emu_kc_fn fn;
} et_harness_ctx;
static inline int et_harness_run(oc_harness *h, oc_case *t, const char *name)
{
    const et_harness_ctx *c = h->ctx;
    return et_run(c->pool, t, c->fn, name);
}
static inline void et_cases(kern_pool *pool, emu_kc_fn fn, void (*cases)(oc_harness *), const char *family)
{
    et_harness_ctx c = {pool, fn};
    oc_harness h = {.emu = 1, .run = et_harness_run, .ctx = &c};
    cases(&h);
    printf("%s: %d shared cases\n", family, h.n_run);
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
    const emu_kc_config cfg = {.attn_bytes = t->attn_bytes};
    if (fn(&op, &cfg, ET_SEEDS[1], msg, sizeof msg) != 1) fail_msg("%s: no failed check recorded", name);
    if (!strstr(msg, code)) fail_msg("%s: recorded '%s', expected %s", name, msg, code);
    for (int s = 0; s < ET_SLOTS; s++) {
        if (t->alias[s] >= 0 || t->type[s] == ET_NONE) continue;
        if (out_copy) out_copy[s] = t->host[s];
        else free(t->host[s]);
    }
}

#endif
