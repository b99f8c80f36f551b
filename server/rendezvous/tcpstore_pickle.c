/* server/rendezvous/tcpstore_pickle.c — a strict unpickler for exactly one object: vLLM's pickled ncclUniqueId.
 *
 * vLLM's rank 0 broadcasts the id with StatelessProcessGroup.broadcast_obj, i.e.
 * pickle.dumps(unique_id) (vllm-project/vllm@5a6541db9bfa77756459722f69e8c89a0b47a14d
 * vllm/distributed/utils.py), where unique_id is a
 * vllm.distributed.device_communicators.pynccl_wrapper.ncclUniqueId, a ctypes.Structure with
 * _fields_ = [("internal", ctypes.c_byte * 128)]. A ctypes instance pickles through its __reduce__
 * (CPython Modules/_ctypes/_ctypes.c PyCData_reduce) as
 *     _ctypes._unpickle(cls, (instance.__dict__, bytes(instance)))
 * so the stream (pickle.DEFAULT_PROTOCOL: 4 for Python 3.8-3.13, 5 from 3.14; 3 also accepted) is
 *     PROTO n [FRAME len] <global _ctypes._unpickle> <global module.ncclUniqueId>
 *     EMPTY_DICT <bytes len 128> TUPLE2 TUPLE2 REDUCE STOP
 * with memo writes (MEMOIZE / BINPUT) after most items, and globals as STACK_GLOBAL over two
 * SHORT_BINUNICODE strings (protocol 4+) or as GLOBAL "module\nname\n" (protocol 3). Opcode values
 * and argument layouts are those of CPython's Lib/pickle.py. Nothing is executed or imported: the
 * stream is parsed into a handful of typed nodes and the final object's shape is compared with the
 * one above; any other opcode, type, name, size or trailing byte is refused.
 */
#include <stdio.h>
#include <string.h>

#include "server/rendezvous/le.h"
#include "server/rendezvous/tcpstore.h"

#define MAX_NODES 24
#define MAX_STACK 8
#define MAX_MEMO 24
#define MAX_STR 256

static const char want_mod[] = "vllm.distributed.device_communicators.pynccl_wrapper";
static const char want_cls[] = "ncclUniqueId";

typedef enum { N_STR, N_BYTES, N_DICT, N_GLOBAL, N_TUPLE, N_REDUCE } ntype;

typedef struct {
    ntype t;
    const unsigned char *p; /* N_STR / N_BYTES: the data in the input; N_GLOBAL: module */
    size_t n;
    const unsigned char *p2; /* N_GLOBAL: name */
    size_t n2;
    int a, b; /* N_TUPLE: items (count in n); N_REDUCE: callable, args */
} node;

typedef struct {
    node nodes[MAX_NODES];
    int nn;
    int stack[MAX_STACK];
    int sp;
    int memo[MAX_MEMO];
    int nmemo; /* MEMOIZE's next index */
    char *err;
    size_t errlen;
} upk;

static int bad(upk *u, const char *msg, size_t at)
{
    snprintf(u->err, u->errlen, "refusing the pickle: %s (at byte %zu)", msg, at);
    return SRV_STORE_ERR;
}

static int new_node(upk *u, ntype t, size_t at)
{
    if (u->nn >= MAX_NODES) return bad(u, "too many objects", at), -1;
    node *x = &u->nodes[u->nn];
    memset(x, 0, sizeof *x);
    x->t = t;
    x->a = x->b = -1;
    return u->nn++;
}

static int push(upk *u, int idx, size_t at)
{
    if (idx < 0) return SRV_STORE_ERR;
    if (u->sp >= MAX_STACK) return bad(u, "stack too deep", at);
    u->stack[u->sp++] = idx;
    return 0;
}

static int pop(upk *u, size_t at)
{
    if (u->sp <= 0) return bad(u, "stack underflow", at), -1;
    return u->stack[--u->sp];
}

static int memo_put(upk *u, size_t idx, size_t at)
{
    if (u->sp <= 0) return bad(u, "memo write with an empty stack", at);
    if (idx >= MAX_MEMO) return bad(u, "memo index out of range", at);
    u->memo[idx] = u->stack[u->sp - 1];
    return 0;
}

static int eq(const unsigned char *p, size_t n, const char *s)
{
    return n == strlen(s) && memcmp(p, s, n) == 0;
}

int srv_store_unpickle_nccl_id(const unsigned char *p, size_t n, unsigned char id[SRV_STORE_ID_BYTES],
                               char *err, size_t errlen)
{
    upk u;
    memset(&u, 0, sizeof u);
    for (int i = 0; i < MAX_MEMO; i++) u.memo[i] = -1;
    u.err = err;
    u.errlen = errlen;
    size_t i = 0;
    if (!p || n < 2 || p[0] != 0x80) return bad(&u, "no PROTO opcode first (not a pickle of protocol 2+)", 0);
    if (p[1] < 3 || p[1] > 5) {
        char m[80];
        snprintf(m, sizeof m, "pickle protocol %u (3, 4 or 5 expected)", p[1]);
        return bad(&u, m, 1);
    }
    i = 2;
    int stopped = 0;
    while (i < n && !stopped) {
        size_t at = i;
        unsigned op = p[i++];
        size_t need = 0, len = 0;
        switch (op) {
        case 0x95: /* FRAME: 8-byte length of the frame that follows */
            if (n - i < 8) return bad(&u, "truncated FRAME", at);
            len = (size_t)srv_le(p + i, 8);
            i += 8;
            if (len > n - i) return bad(&u, "FRAME longer than the data", at);
            break;
        case 0x8c: /* SHORT_BINUNICODE: 1-byte length */
        case 'X':  /* BINUNICODE: 4-byte length */
        case 'C':  /* SHORT_BINBYTES: 1-byte length */
        case 'B': { /* BINBYTES: 4-byte length */
            need = (op == 0x8c || op == 'C') ? 1 : 4;
            if (n - i < need) return bad(&u, "truncated length", at);
            len = (size_t)srv_le(p + i, (int)need);
            i += need;
            if (len > n - i) return bad(&u, "string or bytes longer than the data", at);
            int is_str = op == 0x8c || op == 'X';
            if (is_str && len > MAX_STR) return bad(&u, "string too long", at);
            if (!is_str && len > SRV_STORE_ID_BYTES) return bad(&u, "bytes longer than an ncclUniqueId", at);
            int x = new_node(&u, is_str ? N_STR : N_BYTES, at);
            if (x < 0) return SRV_STORE_ERR;
            u.nodes[x].p = p + i;
            u.nodes[x].n = len;
            i += len;
            if (push(&u, x, at)) return SRV_STORE_ERR;
            break;
        }
        case 'c': { /* GLOBAL: "module\nname\n" */
            const unsigned char *m = p + i, *nl = memchr(m, '\n', n - i);
            if (!nl || (size_t)(nl - m) > MAX_STR) return bad(&u, "bad GLOBAL module", at);
            const unsigned char *nm = nl + 1;
            size_t rest = n - (size_t)(nm - p);
            const unsigned char *nl2 = memchr(nm, '\n', rest);
            if (!nl2 || (size_t)(nl2 - nm) > MAX_STR) return bad(&u, "bad GLOBAL name", at);
            int x = new_node(&u, N_GLOBAL, at);
            if (x < 0) return SRV_STORE_ERR;
            u.nodes[x].p = m;
            u.nodes[x].n = (size_t)(nl - m);
            u.nodes[x].p2 = nm;
            u.nodes[x].n2 = (size_t)(nl2 - nm);
            i = (size_t)(nl2 - p) + 1;
            if (push(&u, x, at)) return SRV_STORE_ERR;
            break;
        }
        case 0x93: { /* STACK_GLOBAL: module, name (strings) -> global */
            int nm = pop(&u, at), md = pop(&u, at);
            if (nm < 0 || md < 0) return SRV_STORE_ERR;
            if (u.nodes[nm].t != N_STR || u.nodes[md].t != N_STR) return bad(&u, "STACK_GLOBAL over non-strings", at);
            int x = new_node(&u, N_GLOBAL, at);
            if (x < 0) return SRV_STORE_ERR;
            u.nodes[x].p = u.nodes[md].p;
            u.nodes[x].n = u.nodes[md].n;
            u.nodes[x].p2 = u.nodes[nm].p;
            u.nodes[x].n2 = u.nodes[nm].n;
            if (push(&u, x, at)) return SRV_STORE_ERR;
            break;
        }
        case 0x94: /* MEMOIZE */
            if (memo_put(&u, (size_t)u.nmemo, at)) return SRV_STORE_ERR;
            u.nmemo++;
            break;
        case 'q': /* BINPUT: 1-byte index */
        case 'r': /* LONG_BINPUT: 4-byte index */
            need = op == 'q' ? 1 : 4;
            if (n - i < need) return bad(&u, "truncated memo index", at);
            if (memo_put(&u, (size_t)srv_le(p + i, (int)need), at)) return SRV_STORE_ERR;
            i += need;
            break;
        case 'h': /* BINGET */
        case 'j': { /* LONG_BINGET */
            need = op == 'h' ? 1 : 4;
            if (n - i < need) return bad(&u, "truncated memo index", at);
            uint64_t k = srv_le(p + i, (int)need);
            i += need;
            if (k >= MAX_MEMO || u.memo[k] < 0) return bad(&u, "memo read of an unset index", at);
            if (push(&u, u.memo[k], at)) return SRV_STORE_ERR;
            break;
        }
        case '}': { /* EMPTY_DICT */
            int x = new_node(&u, N_DICT, at);
            if (x < 0 || push(&u, x, at)) return SRV_STORE_ERR;
            break;
        }
        case 0x85: /* TUPLE1 */
        case 0x86: { /* TUPLE2 */
            int x = new_node(&u, N_TUPLE, at);
            if (x < 0) return SRV_STORE_ERR;
            if (op == 0x86) {
                int b = pop(&u, at), a = pop(&u, at);
                if (a < 0 || b < 0) return SRV_STORE_ERR;
                u.nodes[x].a = a;
                u.nodes[x].b = b;
                u.nodes[x].n = 2;
            } else {
                int a = pop(&u, at);
                if (a < 0) return SRV_STORE_ERR;
                u.nodes[x].a = a;
                u.nodes[x].n = 1;
            }
            if (push(&u, x, at)) return SRV_STORE_ERR;
            break;
        }
        case 'R': { /* REDUCE: callable, args -> callable(*args) */
            int args = pop(&u, at), fn = pop(&u, at);
            if (args < 0 || fn < 0) return SRV_STORE_ERR;
            int x = new_node(&u, N_REDUCE, at);
            if (x < 0) return SRV_STORE_ERR;
            u.nodes[x].a = fn;
            u.nodes[x].b = args;
            if (push(&u, x, at)) return SRV_STORE_ERR;
            break;
        }
        case '.': /* STOP */
            stopped = 1;
            break;
        default: {
            char m[64];
            snprintf(m, sizeof m, "opcode 0x%02x is not part of a pickled ncclUniqueId", op);
            return bad(&u, m, at);
        }
        }
    }
    if (!stopped) return bad(&u, "truncated (no STOP)", i);
    if (i != n) return bad(&u, "trailing data after STOP", i);
    if (u.sp != 1) return bad(&u, "more than one object left", i);

    /* the shape: REDUCE(GLOBAL _ctypes._unpickle, TUPLE2(GLOBAL mod.cls, TUPLE2(EMPTY_DICT, BYTES[128]))) */
    const node *r = &u.nodes[u.stack[0]];
    if (r->t != N_REDUCE) return bad(&u, "the object is not a reduction (not a pickled ctypes structure)", i);
    const node *fn = &u.nodes[r->a], *args = &u.nodes[r->b];
    if (fn->t != N_GLOBAL || !eq(fn->p, fn->n, "_ctypes") || !eq(fn->p2, fn->n2, "_unpickle"))
        return bad(&u, "the reduction is not _ctypes._unpickle (not a pickled ctypes structure)", i);
    if (args->t != N_TUPLE || args->n != 2) return bad(&u, "_ctypes._unpickle arguments are not (class, state)", i);
    const node *cls = &u.nodes[args->a], *state = &u.nodes[args->b];
    if (cls->t != N_GLOBAL || !eq(cls->p, cls->n, want_mod) || !eq(cls->p2, cls->n2, want_cls)) {
        char m[160];
        snprintf(m, sizeof m, "the class is not %s.%s", want_mod, want_cls);
        return bad(&u, m, i);
    }
    if (state->t != N_TUPLE || state->n != 2) return bad(&u, "the ctypes state is not (dict, bytes)", i);
    const node *d = &u.nodes[state->a], *raw = &u.nodes[state->b];
    if (d->t != N_DICT) return bad(&u, "the instance __dict__ is not an empty dict", i);
    if (raw->t != N_BYTES || raw->n != SRV_STORE_ID_BYTES) {
        char m[96];
        snprintf(m, sizeof m, "the structure's bytes are not %d long", SRV_STORE_ID_BYTES);
        return bad(&u, m, i);
    }
    memcpy(id, raw->p, SRV_STORE_ID_BYTES);
    return 0;
}
