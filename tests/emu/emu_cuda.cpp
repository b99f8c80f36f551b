/* tests/emu/emu_cuda.cpp — the runtime of the CUDA emulation (tests/emu/emu_cuda.h): fibers, the
 * cooperative scheduler and the grid launcher.
 *
 * Each CUDA thread of a block is a fiber with its own stack (guard page below it); the scheduler runs
 * on the caller's stack. A fiber runs until it waits at a barrier (emu_wait) or returns from the
 * kernel, then switches back to the scheduler, which picks the next step from a seeded generator:
 *   - run one runnable thread (until its next barrier), or
 *   - release a warp whose 32 lanes all wait at the same warp collective / __syncwarp (for an
 *     emu_warp_compute collective, running its computation over the 32 lanes' data first), or
 *   - when neither is possible: release the block (every thread at the same __syncthreads), finish
 *     the block (every thread returned), or abort (divergent or deadlocked barrier use).
 * Seed even: uniform picks over runnable threads and releasable warps (warps progress roughly evenly).
 * Seed odd: "run ahead": warps get random priorities, the highest-priority warp that can move does,
 * and the priorities are redrawn at each block release and at random points, so one warp races past
 * the others up to the next __syncthreads (a missing __syncthreads between a shared-memory write and
 * other warps' reads shows up as a different result). Blocks run one after another, in random order.
 *
 * Context switches: a few instructions of assembly on x86-64 (swapcontext makes a system call per
 * switch for the signal mask, which made the first prototype spend most of its time in the kernel);
 * ucontext elsewhere, or with -DEMU_UCONTEXT. The switch keeps no CET shadow stack (built with
 * -fcf-protection=none, so the tests are never run with one).
 *
 * Limits (details in emu_cuda.h): no memory-model fidelity (threads interleave only at barriers),
 * blocks never run concurrently, lockstep warp execution without an explicit sync is not modelled,
 * no inline PTX (mma.sync: emu_mma.cpp, on emu_warp_compute), full-mask collectives only, at most
 * 1024 threads per block in whole warps, 256 KiB of stack per thread (a guard page below each: an
 * overflow faults). Not usable under ASan.
 */
#include "tests/emu/emu_cuda.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#if !defined(__x86_64__) && !defined(EMU_UCONTEXT)
#define EMU_UCONTEXT 1
#endif
#ifdef EMU_UCONTEXT
#include <ucontext.h>
#endif

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

namespace {

enum { ST_RUN = 0, ST_BLOCK = EMU_WAIT_BLOCK, ST_WARP = EMU_WAIT_WARP, ST_DONE = 3 };

struct site_t {
    const char *file, *func;
    unsigned line, col;
    uint64_t n; /* the thread's count of waits of this kind so far */
};

struct fiber {
    void *sp; /* saved stack pointer (assembly switch) */
#ifdef EMU_UCONTEXT
    ucontext_t uc;
#endif
    int state;
    int parity;   /* warp exchange buffer the next collective writes */
    uint64_t nwarp, nblock;
    site_t site; /* where it waits */
};

struct warp_state {
    uint64_t buf[2][32];
    /* emu_warp_compute: the lanes' data and results (same double buffering as buf), and the function
     * the release runs once (set by the lanes waiting at such a collective, cleared by the release) */
    alignas(16) unsigned char win[2][32][EMU_WARP_DATA_BYTES];
    alignas(16) unsigned char wout[2][32][EMU_WARP_DATA_BYTES];
    emu_warp_fn fn;
    int fn_parity;
    int run[32]; /* runnable lanes (thread ids) */
    int nrun;
    int arrived; /* lanes waiting at a warp barrier */
    int done;
    bool ready; /* all 32 lanes arrived: releasable */
};

constexpr size_t STACK_BYTES = 256 * 1024;
constexpr int MAX_THREADS = 1024;

struct emu_state {
    /* stacks: MAX_THREADS of STACK_BYTES, a PROT_NONE guard page below each */
    char *stacks = nullptr;
    size_t page = 0;
    fiber fib[MAX_THREADS];
    warp_state warps[MAX_THREADS / 32];
    int nthreads = 0, nwarps = 0;
    int cur = -1; /* running fiber, -1: the scheduler */
    void *sched_sp = nullptr;
#ifdef EMU_UCONTEXT
    ucontext_t sched_uc;
#endif
    void (*body)(void *) = nullptr;
    void *ctx = nullptr;
    uint64_t rng = 0;
};
emu_state g;

uint64_t next_rand()
{
    /* splitmix64 */
    uint64_t z = (g.rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
int rand_below(int n) { return (int)(next_rand() % (uint64_t)n); }

} // namespace

/* ---- context switch ---------------------------------------------------------------------------------- */
#ifndef EMU_UCONTEXT
/* emu_switch(save, to): saves the callee-saved registers on the current stack, stores the stack pointer
 * in *save, switches to the stack `to` (saved the same way, or prepared by fiber_prepare) and returns
 * there. The floating-point control state is shared by every fiber (kernels do not change it). */
extern "C" void emu_switch(void **save, void *to);
extern "C" void emu_fiber_start();
extern "C" [[noreturn]] void emu_fiber_main();
asm(R"(
    .text
    .p2align 4
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch

    .p2align 4
    .type emu_fiber_start, @function
emu_fiber_start:
    andq $-16, %rsp
    call emu_fiber_main
    ud2
    .size emu_fiber_start, .-emu_fiber_start
)");

static void fiber_prepare(fiber &f, char *top)
{
    /* 6 zero registers, then the return address emu_switch's ret takes */
    uint64_t *sp = (uint64_t *)((uintptr_t)top & ~(uintptr_t)15) - 8;
    for (int k = 0; k < 6; k++) sp[k] = 0;
    sp[6] = (uint64_t)(uintptr_t)&emu_fiber_start;
    sp[7] = 0;
    f.sp = sp;
}
static void to_fiber(int t) { emu_switch(&g.sched_sp, g.fib[t].sp); }
static void to_scheduler(fiber &f) { emu_switch(&f.sp, g.sched_sp); }
#else
extern "C" [[noreturn]] void emu_fiber_main();
static void fiber_prepare(fiber &f, char *top)
{
    if (getcontext(&f.uc) != 0) emu_fatal("getcontext failed");
    f.uc.uc_stack.ss_sp = top - STACK_BYTES;
    f.uc.uc_stack.ss_size = STACK_BYTES;
    f.uc.uc_link = nullptr;
    makecontext(&f.uc, (void (*)())emu_fiber_main, 0);
}
static void to_fiber(int t) { swapcontext(&g.sched_uc, &g.fib[t].uc); }
static void to_scheduler(fiber &f) { swapcontext(&f.uc, &g.sched_uc); }
#endif

extern "C" [[noreturn]] void emu_fiber_main()
{
    g.body(g.ctx);
    fiber &f = g.fib[g.cur];
    f.state = ST_DONE;
    to_scheduler(f);
    emu_fatal("a finished thread was resumed");
}

/* ---- diagnostics ------------------------------------------------------------------------------------- */
void emu_fatal(const char *fmt, ...)
{
    fflush(stdout);
    fprintf(stderr, "CUDA emulation: block (%u,%u,%u)", blockIdx.x, blockIdx.y, blockIdx.z);
    if (g.cur >= 0) fprintf(stderr, " thread (%u,%u,%u)", threadIdx.x, threadIdx.y, threadIdx.z);
    fprintf(stderr, ": ");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    abort();
}

static bool same_site(const site_t &a, const site_t &b)
{
    return a.line == b.line && a.col == b.col && a.n == b.n && (a.file == b.file || strcmp(a.file, b.file) == 0) &&
           (a.func == b.func || strcmp(a.func, b.func) == 0);
}

static void describe(int t, char *out, size_t len)
{
    const fiber &f = g.fib[t];
    static const char *const names[] = {"running", "at __syncthreads", "at a warp barrier", "exited"};
    if (f.state == ST_BLOCK || f.state == ST_WARP)
        snprintf(out, len, "thread %d %s %s:%u:%u in %s (its wait #%llu of that kind)", t, names[f.state], f.site.file,
                 f.site.line, f.site.col, f.site.func, (unsigned long long)f.site.n);
    else
        snprintf(out, len, "thread %d %s", t, names[f.state]);
}

[[noreturn]] static void divergent(const char *what, int a, int b)
{
    char da[512], db[512];
    describe(a, da, sizeof da);
    describe(b, db, sizeof db);
    g.cur = -1;
    emu_fatal("%s:\n  %s\n  %s", what, da, db);
}

/* ---- barriers and collectives (called on a fiber) ---------------------------------------------------- */
void emu_wait(int kind, const std::source_location &site)
{
    if (g.cur < 0) emu_fatal("%s:%u: a barrier outside an emulated launch", site.file_name(), (unsigned)site.line());
    fiber &f = g.fib[g.cur];
    f.state = kind;
    f.site = {site.file_name(), site.function_name(), (unsigned)site.line(), (unsigned)site.column(),
              kind == EMU_WAIT_BLOCK ? f.nblock++ : f.nwarp++};
    to_scheduler(f);
}

const uint64_t *emu_warp_exchange(uint64_t v, const std::source_location &site)
{
    if (g.cur < 0) emu_fatal("%s:%u: a warp collective outside an emulated launch", site.file_name(), (unsigned)site.line());
    fiber &f = g.fib[g.cur];
    warp_state &w = g.warps[g.cur >> 5];
    const int p = f.parity;
    /* Double buffered: a lane writes buffer p again only two collectives later, after a warp barrier
     * that every lane reached after reading this one. */
    w.buf[p][g.cur & 31] = v;
    f.parity ^= 1;
    emu_wait(EMU_WAIT_WARP, site);
    return w.buf[p];
}

const unsigned char *emu_warp_compute(const void *in, size_t bytes, emu_warp_fn fn, const std::source_location &site)
{
    if (g.cur < 0)
        emu_fatal("%s:%u: a warp collective outside an emulated launch", site.file_name(), (unsigned)site.line());
    if (bytes > EMU_WARP_DATA_BYTES)
        emu_fatal("%s:%u: %zu bytes per lane in a warp computation", site.file_name(), (unsigned)site.line(), bytes);
    fiber &f = g.fib[g.cur];
    warp_state &w = g.warps[g.cur >> 5];
    const int p = f.parity, lane = g.cur & 31;
    if (w.arrived > 0 && (w.fn != fn || w.fn_parity != p))
        emu_fatal("%s:%u: lanes of one warp at different warp computations", site.file_name(), (unsigned)site.line());
    std::memset(w.win[p][lane], 0, EMU_WARP_DATA_BYTES);
    std::memcpy(w.win[p][lane], in, bytes);
    w.fn = fn;
    w.fn_parity = p;
    f.parity ^= 1;
    emu_wait(EMU_WAIT_WARP, site);
    return w.wout[p][lane];
}

/* ---- the scheduler ------------------------------------------------------------------------------------ */
static void make_runnable(int t)
{
    warp_state &w = g.warps[t >> 5];
    g.fib[t].state = ST_RUN;
    w.run[w.nrun++] = t;
}

static void set_thread_index(int t)
{
    threadIdx.x = (unsigned)t % blockDim.x;
    threadIdx.y = ((unsigned)t / blockDim.x) % blockDim.y;
    threadIdx.z = (unsigned)t / (blockDim.x * blockDim.y);
}

/* Runs lane run[k] of warp wi until it waits or exits. */
static void step_thread(int wi, int k, int &block_arrived, int &done)
{
    warp_state &w = g.warps[wi];
    const int t = w.run[k];
    w.run[k] = w.run[--w.nrun];
    g.cur = t;
    set_thread_index(t);
    to_fiber(t);
    g.cur = -1;
    const fiber &f = g.fib[t];
    if (f.state == ST_DONE) {
        w.done++;
        done++;
    } else if (f.state == ST_BLOCK) {
        block_arrived++;
    } else if (f.state == ST_WARP) {
        if (++w.arrived == 32) {
            const int l0 = wi * 32;
            for (int l = 1; l < 32; l++)
                if (!same_site(g.fib[l0].site, g.fib[l0 + l].site))
                    divergent("lanes of one warp at different warp collectives / __syncwarp", l0, l0 + l);
            w.ready = true;
        }
    } else {
        emu_fatal("thread %d came back running", t);
    }
}

static void release_warp(int wi)
{
    warp_state &w = g.warps[wi];
    if (w.fn) { /* an emu_warp_compute collective: its computation, once, before any lane resumes */
        w.fn(w.win[w.fn_parity], w.wout[w.fn_parity]);
        w.fn = nullptr;
    }
    for (int l = 0; l < 32; l++) make_runnable(wi * 32 + l);
    w.arrived = 0;
    w.ready = false;
}

static void shuffle(int *a, int n)
{
    for (int k = n - 1; k > 0; k--) {
        const int j = rand_below(k + 1), x = a[k];
        a[k] = a[j];
        a[j] = x;
    }
}

static void run_block(bool run_ahead)
{
    const int nt = g.nthreads, nw = g.nwarps;
    int block_arrived = 0, done = 0;
    int order[MAX_THREADS / 32]; /* run ahead: warps by priority, highest first */
    for (int wi = 0; wi < nw; wi++) {
        warp_state &w = g.warps[wi];
        w.nrun = w.arrived = w.done = 0;
        w.ready = false;
        w.fn = nullptr;
        order[wi] = wi;
    }
    shuffle(order, nw);
    for (int t = 0; t < nt; t++) {
        fiber &f = g.fib[t];
        f.parity = 0;
        f.nwarp = f.nblock = 0;
        fiber_prepare(f, g.stacks + (size_t)(t + 1) * (STACK_BYTES + g.page));
        make_runnable(t);
    }
    for (;;) {
        int total = 0;
        for (int wi = 0; wi < nw; wi++) total += g.warps[wi].nrun + (g.warps[wi].ready ? 1 : 0);
        if (total > 0) {
            if (run_ahead) {
                if (rand_below(512) == 0) shuffle(order, nw); /* a change point */
                for (int k = 0; k < nw; k++) {
                    const int wi = order[k];
                    warp_state &w = g.warps[wi];
                    if (w.ready) {
                        release_warp(wi);
                        break;
                    }
                    if (w.nrun > 0) {
                        step_thread(wi, rand_below(w.nrun), block_arrived, done);
                        break;
                    }
                }
            } else {
                int r = rand_below(total);
                for (int wi = 0; wi < nw; wi++) {
                    warp_state &w = g.warps[wi];
                    if (r < w.nrun) {
                        step_thread(wi, r, block_arrived, done);
                        break;
                    }
                    r -= w.nrun;
                    if (w.ready) {
                        if (r == 0) {
                            release_warp(wi);
                            break;
                        }
                        r--;
                    }
                }
            }
            continue;
        }
        if (done == nt) return;
        if (block_arrived == nt) {
            for (int t = 1; t < nt; t++)
                if (!same_site(g.fib[0].site, g.fib[t].site))
                    divergent("threads of one block at different __syncthreads", 0, t);
            block_arrived = 0;
            for (int t = 0; t < nt; t++) make_runnable(t);
            if (run_ahead) shuffle(order, nw);
            continue;
        }
        /* stuck: name two threads that cannot meet */
        int a = -1, b = -1;
        for (int wi = 0; wi < nw && a < 0; wi++) {
            const warp_state &w = g.warps[wi];
            if (w.arrived > 0)
                for (int l = 0; l < 32; l++) {
                    const int t = wi * 32 + l;
                    if (g.fib[t].state == ST_WARP && a < 0) a = t;
                    if (g.fib[t].state != ST_WARP && b < 0) b = t;
                }
        }
        if (a >= 0)
            divergent("deadlock: a warp collective that not all 32 lanes of the warp reach (exited, or at "
                      "__syncthreads)",
                      a, b);
        for (int t = 0; t < nt; t++) {
            if (g.fib[t].state == ST_BLOCK && a < 0) a = t;
            if (g.fib[t].state == ST_DONE && b < 0) b = t;
        }
        divergent("deadlock: threads wait at __syncthreads while others of the block have exited", a, b);
    }
}

void emu_run_grid(dim3 grid, dim3 block, size_t smem, const emu_config &cfg, void (*body)(void *), void *ctx)
{
    if (g.cur >= 0) {
        const char *here = (const char *)__builtin_frame_address(0);
        if (g.stacks && here >= g.stacks && here < g.stacks + (size_t)MAX_THREADS * (STACK_BYTES + g.page))
            emu_fatal("a launch from inside a kernel (dynamic parallelism is not emulated)");
        g.cur = -1; /* the previous launch never finished (a test framework caught a signal in a thread) */
    }
    const size_t nt = (size_t)block.x * block.y * block.z;
    if (nt == 0 || nt > MAX_THREADS || nt % 32 != 0)
        emu_fatal("a block of %zu threads: the emulation takes whole warps, at most %d threads", nt, MAX_THREADS);
    if (smem > EMU_DYNAMIC_SHARED_BYTES)
        emu_fatal("%zu bytes of dynamic shared memory: EMU_DYNAMIC_SHARED holds %d", smem, EMU_DYNAMIC_SHARED_BYTES);
    const size_t nblocks = (size_t)grid.x * grid.y * grid.z;
    if (nblocks == 0) return;
    if (!g.stacks) {
        g.page = (size_t)sysconf(_SC_PAGESIZE);
        const size_t bytes = (size_t)MAX_THREADS * (STACK_BYTES + g.page);
        void *m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) emu_fatal("cannot map %zu bytes of fiber stacks", bytes);
        g.stacks = (char *)m;
        for (int t = 0; t < MAX_THREADS; t++) /* a guard page below each stack */
            if (mprotect(g.stacks + (size_t)t * (STACK_BYTES + g.page), g.page, PROT_NONE) != 0)
                emu_fatal("mprotect of a stack guard page failed");
    }
    g.nthreads = (int)nt;
    g.nwarps = (int)(nt / 32);
    g.body = body;
    g.ctx = ctx;
    g.rng = cfg.seed * 0xD1342543DE82EF95ull + 1;
    const bool run_ahead = cfg.seed & 1;
    blockDim = block;
    gridDim = grid;
    std::vector<size_t> blocks(nblocks);
    for (size_t b = 0; b < nblocks; b++) blocks[b] = b;
    for (size_t k = nblocks - 1; k > 0; k--) {
        const size_t j = (size_t)(next_rand() % (uint64_t)(k + 1)), x = blocks[k];
        blocks[k] = blocks[j];
        blocks[j] = x;
    }
    for (size_t k = 0; k < nblocks; k++) {
        const size_t b = blocks[k];
        blockIdx.x = (unsigned)(b % grid.x);
        blockIdx.y = (unsigned)((b / grid.x) % grid.y);
        blockIdx.z = (unsigned)(b / ((size_t)grid.x * grid.y));
        run_block(run_ahead);
    }
    g.body = nullptr;
    g.ctx = nullptr;
}
