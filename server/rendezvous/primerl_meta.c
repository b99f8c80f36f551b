/* server/rendezvous/primerl_meta.c — a strict unpickler for exactly one object shape: the metadata prime-rl's
 * trainer pickles before each state dict it broadcasts over NCCL.
 *
 * PrimeIntellect-ai/prime-rl@559b44772e471d1538537b8805cc77f3824a5e64
 * src/prime_rl/transports/weights/nccl.py broadcast_state_dict():
 *     metadata = {dtype: [(key, value.shape, value.numel()) for key, value in items], ...}
 *     state = pickle.dumps(metadata)
 * a dict keyed by torch.dtype (the dtypes in the state dict's order of first appearance), each value
 * a list of (name: str, torch.Size, numel: int). pickle.dumps uses pickle.DEFAULT_PROTOCOL: 4 on
 * Python 3.8-3.13, 5 on 3.14 (the same opcodes here); 2 and 3 are accepted too. A torch.dtype
 * pickles by name (its __reduce__ returns "bfloat16": a global torch.bfloat16), a torch.Size through
 * its __reduce__ (torch.Size, (tuple(self),)). So the stream is (CPython Lib/pickle.py opcodes;
 * checked byte for byte against torch 2.15 on Python 3.11, see tests/unit/test_primerl_meta.c):
 *
 *   PROTO 4|5  FRAME len                                (protocol 4+; a new FRAME every ~64 KiB)
 *   EMPTY_DICT MEMOIZE MARK
 *     <dtype>  EMPTY_LIST MEMOIZE [MARK] <entry> ... (APPENDS | APPEND)   (batches of 1000 items)
 *     ...
 *   (SETITEMS | SETITEM) STOP
 *   <dtype> = SHORT_BINUNICODE "torch" MEMOIZE SHORT_BINUNICODE "bfloat16" MEMOIZE STACK_GLOBAL
 *             MEMOIZE   (later dtypes: BINGET of the memoized "torch")
 *   <entry> = SHORT_BINUNICODE name MEMOIZE <torch.Size> MEMOIZE (BININT1|BININT2|BININT|LONG1)
 *             numel TUPLE3 MEMOIZE
 *   <torch.Size> = <global torch.Size, first time; then BINGET> <dims> MEMOIZE TUPLE1 MEMOIZE REDUCE
 *   <dims> = EMPTY_TUPLE | ints TUPLE1 | ints TUPLE2 | ints TUPLE3 | MARK ints TUPLE (4+ dims)
 * Protocols 2 and 3: GLOBAL "torch\nbfloat16\n" instead of STACK_GLOBAL, BINUNICODE instead of
 * SHORT_BINUNICODE, BINPUT / LONG_BINPUT instead of MEMOIZE, no FRAME.
 *
 * Nothing is executed or imported: the opcodes build a graph of typed nodes (strings and globals
 * point into the input), then the final object is checked against the shape above: a dict whose
 * keys are globals torch.<dtype> with an mdl_dtype (every dtype graphswap can size, so that a
 * refused group can still be received and dropped; the engine refuses non-float ones), each value a
 * non-empty list of 3-tuples (str without NUL, 1..SRV_PRIMERL_META_MAX_NAME bytes; reduce of the
 * global torch.Size over a one-tuple of a tuple of at most MDL_ST_MAX_DIMS non-negative ints; an int
 * equal to the product of the dims). Any other opcode, global, type, duplicate dtype key, an opcode
 * crossing its FRAME's end, a string that is not UTF-8 (pickle.loads refuses those too), a bound
 * exceeded or a byte after STOP is refused with a message.
 *
 * Memory: the node, cell and memo arrays grow by doubling, and each is bounded by the input length
 * (an opcode makes at most one node and pushes at most one value; every cell consumes a pushed
 * value), itself bounded by SRV_PRIMERL_META_MAX_BYTES: at most ~40 bytes per input byte.
 */
#include "server/rendezvous/le.h"
#include "server/rendezvous/primerl_meta.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STACK 4096 /* values on the stack: a 1000-item batch of entries, plus nesting */
#define MAX_MARKS 16
#define MAX_STR 4096 /* any string of the pickle (names are bounded further) */
#define NONE UINT32_MAX

typedef enum { N_STR, N_INT, N_GLOBAL, N_TUPLE, N_LIST, N_DICT, N_REDUCE } ntype;

/* N_STR: a = offset in the input, b = length. N_INT: v. N_GLOBAL: a/b module, c/d name (offsets /
 * lengths in the input). N_TUPLE / N_LIST / N_DICT: a = first cell, b = last cell, c = items (a
 * dict's cells alternate key, value). N_REDUCE: a = callable, b = arguments (nodes). */
typedef struct {
    uint32_t t, a, b, c, d;
    int64_t v;
} node;

typedef struct {
    uint32_t item, next;
} cell;

typedef struct {
    const unsigned char *p;
    size_t n;
    node *nodes;
    size_t nn, nodes_cap;
    cell *cells;
    size_t nc, cells_cap;
    uint32_t *memo;
    size_t memo_cap, memo_len; /* memo_len: entries set (MEMOIZE writes at index memo_len) */
    uint32_t stack[MAX_STACK];
    size_t sp;
    size_t marks[MAX_MARKS];
    size_t nmarks;
    char *err;
    size_t errlen;
} upk;

static int bad(upk *u, size_t at, const char *fmt, const char *arg)
{
    char m[200];
    snprintf(m, sizeof m, fmt, arg ? arg : "");
    snprintf(u->err, u->errlen, "refusing prime-rl's metadata pickle: %s (at byte %zu)", m, at);
    return -1;
}

/* Grows *arr (elements of size w, *cap of them) to hold need + 1; the bound is the input length. */
static int grow(upk *u, void **arr, size_t *cap, size_t need, size_t w, size_t at)
{
    if (need < *cap) return 0;
    size_t nc = *cap ? *cap * 2 : 64;
    while (nc <= need) nc *= 2;
    if (nc > u->n + 64) nc = u->n + 64;
    if (need >= nc) return bad(u, at, "more objects than the input can hold%s", NULL);
    void *q = realloc(*arr, nc * w);
    if (!q) return bad(u, at, "out of memory%s", NULL);
    *arr = q;
    *cap = nc;
    return 0;
}

static int64_t new_node(upk *u, uint32_t t, size_t at)
{
    if (grow(u, (void **)&u->nodes, &u->nodes_cap, u->nn, sizeof *u->nodes, at)) return -1;
    node *x = &u->nodes[u->nn];
    memset(x, 0, sizeof *x);
    x->t = t;
    x->a = x->b = NONE;
    return (int64_t)u->nn++;
}

static int push(upk *u, int64_t idx, size_t at)
{
    if (idx < 0) return -1;
    if (u->sp >= MAX_STACK) return bad(u, at, "stack too deep%s", NULL);
    u->stack[u->sp++] = (uint32_t)idx;
    return 0;
}

/* The stack items above the innermost mark (or above *floor: the values an opcode may consume). */
static size_t floor_of(const upk *u) { return u->nmarks ? u->marks[u->nmarks - 1] : 0; }

static int64_t pop(upk *u, size_t at)
{
    if (u->sp <= floor_of(u)) return bad(u, at, "stack underflow%s", NULL), -1;
    return u->stack[--u->sp];
}

/* Appends node item to container x (a new cell). */
static int add_cell(upk *u, uint32_t x, uint32_t item, size_t at)
{
    if (grow(u, (void **)&u->cells, &u->cells_cap, u->nc, sizeof *u->cells, at)) return -1;
    const uint32_t k = (uint32_t)u->nc++;
    u->cells[k].item = item;
    u->cells[k].next = NONE;
    node *c = &u->nodes[x];
    if (c->a == NONE) c->a = k;
    else u->cells[c->b].next = k;
    c->b = k;
    c->c++;
    return 0;
}

static int memo_put(upk *u, uint64_t idx, size_t at)
{
    if (u->sp == 0) return bad(u, at, "memo write with an empty stack%s", NULL);
    if (idx > u->n) return bad(u, at, "memo index out of range%s", NULL);
    const size_t old = u->memo_cap;
    if (grow(u, (void **)&u->memo, &u->memo_cap, (size_t)idx, sizeof *u->memo, at)) return -1;
    for (size_t i = old; i < u->memo_cap; i++) u->memo[i] = NONE;
    if (u->memo[idx] == NONE) u->memo_len++;
    u->memo[idx] = u->stack[u->sp - 1];
    return 0;
}

/* The length of the UTF-8 sequence at s[0..n) (1..4; no overlong forms, surrogates or code points
 * past U+10FFFF), or 0 when it is not one. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    const unsigned c = s[0];
    size_t k;
    uint32_t cp;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) k = 2, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef) k = 3, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4) k = 4, cp = c & 0x07;
    else return 0;
    if (n < k) return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((k == 3 && cp < 0x800) || (k == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return k;
}

/* pickle's strings are UTF-8 (pickle.loads refuses anything else) */
static int utf8_ok(const unsigned char *s, size_t n)
{
    for (size_t i = 0, k; i < n; i += k)
        if (!(k = utf8_len(s + i, n - i))) return 0;
    return 1;
}

/* At most cap - 1 bytes of s[0..n) for a message: whole UTF-8 characters, '?' for a control
 * character or a byte that starts none (a GLOBAL's name is not checked as UTF-8). */
static void clip(char *out, size_t cap, const unsigned char *s, size_t n)
{
    size_t o = 0;
    for (size_t i = 0, k; i < n; i += k) {
        k = utf8_len(s + i, n - i);
        if (o + (k ? k : 1) >= cap) break;
        if (!k || s[i] < 0x20 || s[i] == 0x7f) {
            out[o++] = '?';
            k = k ? k : 1;
        } else {
            memcpy(out + o, s + i, k);
            o += k;
        }
    }
    out[o] = 0;
}

static int eqs(const upk *u, uint32_t off, uint32_t len, const char *s)
{
    return len == strlen(s) && memcmp(u->p + off, s, len) == 0;
}

/* torch's pickled dtype names (torch.dtype.__reduce__: the canonical name, so torch.half is
 * "float16" and torch.long "int64") that mdl_dtype can hold. */
static const struct {
    const char *name;
    mdl_dtype dt;
} dtypes[] = {
    {"bfloat16", MDL_DT_BF16}, {"float16", MDL_DT_F16},         {"float32", MDL_DT_F32},
    {"float64", MDL_DT_F64},   {"float8_e4m3fn", MDL_DT_F8_E4M3}, {"float8_e5m2", MDL_DT_F8_E5M2},
    {"bool", MDL_DT_BOOL},     {"uint8", MDL_DT_U8},            {"int8", MDL_DT_I8},
    {"int16", MDL_DT_I16},     {"uint16", MDL_DT_U16},          {"int32", MDL_DT_I32},
    {"uint32", MDL_DT_U32},    {"int64", MDL_DT_I64},           {"uint64", MDL_DT_U64},
};

const char *srv_primerl_torch_dtype_name(mdl_dtype dt)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].dt == dt) return dtypes[i].name;
    return NULL;
}

/* A tuple of the top k stack values (k < 0: those above the innermost mark, which is dropped). */
static int make_tuple(upk *u, int k, size_t at)
{
    size_t from;
    if (k < 0) {
        if (!u->nmarks) return bad(u, at, "TUPLE without a MARK%s", NULL);
        from = u->marks[--u->nmarks];
    } else {
        if (u->sp - floor_of(u) < (size_t)k) return bad(u, at, "stack underflow%s", NULL);
        from = u->sp - (size_t)k;
    }
    int64_t x = new_node(u, N_TUPLE, at);
    if (x < 0) return -1;
    for (size_t i = from; i < u->sp; i++)
        if (add_cell(u, (uint32_t)x, u->stack[i], at)) return -1;
    u->sp = from;
    return push(u, x, at);
}

/* APPEND / APPENDS / SETITEM / SETITEMS: the values from `from` into the container just below it. */
static int fill(upk *u, size_t from, uint32_t want, size_t at)
{
    if (from == 0 || from > u->sp) return bad(u, at, "no container to add to%s", NULL);
    const uint32_t x = u->stack[from - 1];
    if (u->nodes[x].t != want)
        return bad(u, at, "%s", want == N_LIST ? "APPEND(S) to a non-list" : "SETITEM(S) to a non-dict");
    if (want == N_DICT && (u->sp - from) % 2) return bad(u, at, "SETITEMS with an odd number of values%s", NULL);
    for (size_t i = from; i < u->sp; i++)
        if (add_cell(u, x, u->stack[i], at)) return -1;
    u->sp = from;
    return 0;
}

/* Parses the opcodes into u; the final object's node in *root. */
static int parse(upk *u, uint32_t *root)
{
    const unsigned char *p = u->p;
    const size_t n = u->n;
    if (n < 2 || p[0] != 0x80) return bad(u, 0, "no PROTO opcode first (not a pickle of protocol 2+)%s", NULL);
    const unsigned proto = p[1];
    if (proto < 2 || proto > 5) {
        char v[16];
        snprintf(v, sizeof v, "%u", proto);
        return bad(u, 1, "pickle protocol %s (2 to 5 expected)", v);
    }
    size_t i = 2, frame_end = 0;
    for (;;) {
        if (frame_end && i == frame_end) frame_end = 0;
        if (i >= n) return bad(u, i, "truncated (no STOP)%s", NULL);
        const size_t at = i;
        const unsigned op = p[i++];
        size_t len = 0, need = 0;
        int64_t x;
        /* the opcodes of protocol 4 only where the stream says 4+ */
        if ((op == 0x95 || op == 0x8c || op == 0x93 || op == 0x94) && proto < 4)
            return bad(u, at, "a protocol-4 opcode in a protocol 2/3 pickle%s", NULL);
        switch (op) {
        case 0x95: /* FRAME: 8-byte length of the frame that follows */
            if (frame_end) return bad(u, at, "FRAME inside a frame%s", NULL);
            if (n - i < 8) return bad(u, at, "truncated FRAME%s", NULL);
            len = (size_t)srv_le(p + i, 8) > n ? n : (size_t)srv_le(p + i, 8);
            i += 8;
            if (len > n - i) return bad(u, at, "FRAME longer than the data%s", NULL);
            frame_end = len ? i + len : 0;
            break;
        case 0x8c: /* SHORT_BINUNICODE: 1-byte length */
        case 'X':  /* BINUNICODE: 4-byte length */
            need = op == 0x8c ? 1 : 4;
            if (n - i < need) return bad(u, at, "truncated string length%s", NULL);
            len = (size_t)srv_le(p + i, (int)need);
            i += need;
            if (len > n - i) return bad(u, at, "string longer than the data%s", NULL);
            if (len > MAX_STR) return bad(u, at, "string too long%s", NULL);
            if (!utf8_ok(p + i, len)) return bad(u, at, "a string that is not UTF-8%s", NULL);
            if ((x = new_node(u, N_STR, at)) < 0) return -1;
            u->nodes[x].a = (uint32_t)i;
            u->nodes[x].b = (uint32_t)len;
            i += len;
            if (push(u, x, at)) return -1;
            break;
        case 'K': /* BININT1: unsigned byte */
        case 'M': /* BININT2: unsigned 16-bit */
        case 'J': /* BININT: signed 32-bit */
        case 0x8a: { /* LONG1: 1-byte length, then that many bytes of two's complement */
            int64_t v;
            if (op == 0x8a) {
                if (n - i < 1) return bad(u, at, "truncated LONG1%s", NULL);
                len = p[i++];
                if (len > 8) return bad(u, at, "an integer wider than 64 bits%s", NULL);
                if (n - i < len) return bad(u, at, "truncated LONG1%s", NULL);
                uint64_t w = srv_le(p + i, (int)len);
                if (len && len < 8 && (p[i + len - 1] & 0x80)) w |= ~UINT64_C(0) << (8 * len); /* sign */
                memcpy(&v, &w, sizeof v);
                i += len;
            } else {
                need = op == 'K' ? 1 : op == 'M' ? 2 : 4;
                if (n - i < need) return bad(u, at, "truncated integer%s", NULL);
                uint64_t w = srv_le(p + i, (int)need);
                v = op == 'J' ? (int64_t)(int32_t)(uint32_t)w : (int64_t)w;
                i += need;
            }
            if ((x = new_node(u, N_INT, at)) < 0) return -1;
            u->nodes[x].v = v;
            if (push(u, x, at)) return -1;
            break;
        }
        case 'c': { /* GLOBAL: "module\nname\n" */
            const unsigned char *m = p + i, *nl = memchr(m, '\n', n - i);
            if (!nl || (size_t)(nl - m) > MAX_STR) return bad(u, at, "bad GLOBAL module%s", NULL);
            const unsigned char *nm = nl + 1;
            const unsigned char *nl2 = memchr(nm, '\n', n - (size_t)(nm - p));
            if (!nl2 || (size_t)(nl2 - nm) > MAX_STR) return bad(u, at, "bad GLOBAL name%s", NULL);
            if ((x = new_node(u, N_GLOBAL, at)) < 0) return -1;
            u->nodes[x].a = (uint32_t)(m - p);
            u->nodes[x].b = (uint32_t)(nl - m);
            u->nodes[x].c = (uint32_t)(nm - p);
            u->nodes[x].d = (uint32_t)(nl2 - nm);
            i = (size_t)(nl2 - p) + 1;
            if (push(u, x, at)) return -1;
            break;
        }
        case 0x93: { /* STACK_GLOBAL: module, name (strings) -> global */
            int64_t nm = pop(u, at), md = nm < 0 ? -1 : pop(u, at);
            if (nm < 0 || md < 0) return -1;
            if (u->nodes[nm].t != N_STR || u->nodes[md].t != N_STR)
                return bad(u, at, "STACK_GLOBAL over non-strings%s", NULL);
            if ((x = new_node(u, N_GLOBAL, at)) < 0) return -1;
            u->nodes[x].a = u->nodes[md].a;
            u->nodes[x].b = u->nodes[md].b;
            u->nodes[x].c = u->nodes[nm].a;
            u->nodes[x].d = u->nodes[nm].b;
            if (push(u, x, at)) return -1;
            break;
        }
        case 0x94: /* MEMOIZE */
            if (memo_put(u, u->memo_len, at)) return -1;
            break;
        case 'q': /* BINPUT: 1-byte index */
        case 'r': /* LONG_BINPUT: 4-byte index */
            need = op == 'q' ? 1 : 4;
            if (n - i < need) return bad(u, at, "truncated memo index%s", NULL);
            if (memo_put(u, srv_le(p + i, (int)need), at)) return -1;
            i += need;
            break;
        case 'h': /* BINGET */
        case 'j': { /* LONG_BINGET */
            need = op == 'h' ? 1 : 4;
            if (n - i < need) return bad(u, at, "truncated memo index%s", NULL);
            const uint64_t k = srv_le(p + i, (int)need);
            i += need;
            if (k >= u->memo_cap || u->memo[k] == NONE) return bad(u, at, "memo read of an unset index%s", NULL);
            if (push(u, u->memo[k], at)) return -1;
            break;
        }
        case '}': /* EMPTY_DICT */
        case ']': /* EMPTY_LIST */
            if ((x = new_node(u, op == '}' ? N_DICT : N_LIST, at)) < 0 || push(u, x, at)) return -1;
            break;
        case ')': /* EMPTY_TUPLE */
            if (make_tuple(u, 0, at)) return -1;
            break;
        case 0x85: /* TUPLE1 */
        case 0x86: /* TUPLE2 */
        case 0x87: /* TUPLE3 */
            if (make_tuple(u, (int)(op - 0x84), at)) return -1;
            break;
        case 't': /* TUPLE: the values above the mark */
            if (make_tuple(u, -1, at)) return -1;
            break;
        case '(': /* MARK */
            if (u->nmarks >= MAX_MARKS) return bad(u, at, "MARKs nested too deep%s", NULL);
            u->marks[u->nmarks++] = u->sp;
            break;
        case 'a': /* APPEND: list, value */
            if (u->sp - floor_of(u) < 2) return bad(u, at, "stack underflow%s", NULL);
            if (fill(u, u->sp - 1, N_LIST, at)) return -1;
            break;
        case 's': /* SETITEM: dict, key, value */
            if (u->sp - floor_of(u) < 3) return bad(u, at, "stack underflow%s", NULL);
            if (fill(u, u->sp - 2, N_DICT, at)) return -1;
            break;
        case 'e': /* APPENDS: list, MARK, values */
        case 'u': { /* SETITEMS: dict, MARK, key, value, ... */
            if (!u->nmarks) return bad(u, at, "APPENDS / SETITEMS without a MARK%s", NULL);
            const size_t from = u->marks[--u->nmarks];
            if (from <= floor_of(u)) return bad(u, at, "no container below the MARK%s", NULL);
            if (fill(u, from, op == 'e' ? N_LIST : N_DICT, at)) return -1;
            break;
        }
        case 'R': { /* REDUCE: callable, args -> callable(*args), kept as a node */
            int64_t args = pop(u, at), fn = args < 0 ? -1 : pop(u, at);
            if (args < 0 || fn < 0) return -1;
            if ((x = new_node(u, N_REDUCE, at)) < 0) return -1;
            u->nodes[x].a = (uint32_t)fn;
            u->nodes[x].b = (uint32_t)args;
            if (push(u, x, at)) return -1;
            break;
        }
        case '.': /* STOP */
            if (u->nmarks) return bad(u, at, "STOP with a MARK open%s", NULL);
            if (u->sp != 1) return bad(u, at, "STOP with other than one object on the stack%s", NULL);
            if (i != n) return bad(u, i, "trailing data after STOP%s", NULL);
            if (frame_end && frame_end != i) return bad(u, at, "STOP before the end of its FRAME%s", NULL);
            *root = u->stack[0];
            return 0;
        default: {
            char m[8];
            snprintf(m, sizeof m, "0x%02x", op);
            return bad(u, at, "opcode %s is not part of prime-rl's metadata", m);
        }
        }
        if (frame_end && i > frame_end) return bad(u, at, "an opcode crosses the end of its FRAME%s", NULL);
    }
}

static const node *item(const upk *u, uint32_t cell_idx) { return &u->nodes[u->cells[cell_idx].item]; }

/* One entry (name, torch.Size, numel) into t. */
static int entry(upk *u, const node *e, mdl_dtype dt, mdl_st_tensor *t, size_t k)
{
    char where[48];
    snprintf(where, sizeof where, "entry %zu", k);
    if (e->t != N_TUPLE || e->c != 3) return bad(u, u->n, "%s is not a (name, torch.Size, numel) tuple", where);
    const uint32_t c0 = e->a, c1 = u->cells[c0].next, c2 = u->cells[c1].next;
    const node *nm = item(u, c0), *sz = item(u, c1), *ne = item(u, c2);
    if (nm->t != N_STR || nm->b == 0 || nm->b > SRV_PRIMERL_META_MAX_NAME || memchr(u->p + nm->a, 0, nm->b))
        return bad(u, u->n, "%s: the name is not a string of 1..512 bytes without NUL", where);
    if (!(t->name = malloc(nm->b + 1))) return bad(u, u->n, "out of memory%s", NULL);
    memcpy(t->name, u->p + nm->a, nm->b);
    t->name[nm->b] = 0;
    clip(where, 41, u->p + nm->a, nm->b);
    /* torch.Size: REDUCE(GLOBAL torch.Size, (dims,)) */
    const node *fn = sz->t == N_REDUCE ? &u->nodes[sz->a] : NULL, *args = sz->t == N_REDUCE ? &u->nodes[sz->b] : NULL;
    if (!fn || fn->t != N_GLOBAL || !eqs(u, fn->a, fn->b, "torch") || !eqs(u, fn->c, fn->d, "Size"))
        return bad(u, u->n, "the shape of %s is not a torch.Size", where);
    if (args->t != N_TUPLE || args->c != 1 || item(u, args->a)->t != N_TUPLE)
        return bad(u, u->n, "the torch.Size of %s is not built from one tuple", where);
    const node *dims = item(u, args->a);
    if (dims->c > MDL_ST_MAX_DIMS) return bad(u, u->n, "%s has more than 8 dimensions", where);
    uint64_t numel = 1;
    int d = 0;
    for (uint32_t ci = dims->a; ci != NONE; ci = u->cells[ci].next, d++) {
        const node *v = item(u, ci);
        if (v->t != N_INT || v->v < 0) return bad(u, u->n, "a dimension of %s is not a non-negative int", where);
        if (v->v && numel > SRV_PRIMERL_META_MAX_NUMEL / (uint64_t)v->v)
            return bad(u, u->n, "%s is too large (more than 2^48 elements)", where);
        numel *= (uint64_t)v->v;
        t->shape[d] = v->v;
    }
    t->ndim = d;
    if (ne->t != N_INT || ne->v < 0 || (uint64_t)ne->v != numel)
        return bad(u, u->n, "the numel of %s is not the product of its shape", where);
    t->dtype = dt;
    t->numel = numel;
    t->nbytes = numel * mdl_dtype_size(dt);
    t->data = NULL;
    return 0;
}

/* The final object against prime-rl's shape (see the top of the file). */
static int check(upk *u, uint32_t root, srv_primerl_meta *out)
{
    const node *d = &u->nodes[root];
    if (d->t != N_DICT) return bad(u, u->n, "the object is not a dict%s", NULL);
    /* the entries first: out->t in one allocation */
    size_t total = 0;
    for (uint32_t ci = d->a; ci != NONE; ci = u->cells[u->cells[ci].next].next) {
        const node *l = item(u, u->cells[ci].next);
        if (l->t != N_LIST) return bad(u, u->n, "a value of the dict is not a list%s", NULL);
        total += l->c;
        if (total > SRV_PRIMERL_META_MAX_TENSORS) return bad(u, u->n, "more than 16384 tensors%s", NULL);
    }
    if (d->c / 2 > SRV_PRIMERL_META_MAX_GROUPS) return bad(u, u->n, "more than 16 dtype keys%s", NULL);
    if (total && !(out->t = calloc(total, sizeof *out->t))) return bad(u, u->n, "out of memory%s", NULL);
    for (uint32_t ci = d->a; ci != NONE; ci = u->cells[u->cells[ci].next].next) {
        const node *k = item(u, ci), *l = item(u, u->cells[ci].next);
        if (k->t != N_GLOBAL || !eqs(u, k->a, k->b, "torch"))
            return bad(u, u->n, "a key of the dict is not a torch dtype (a global torch.<name>)%s", NULL);
        char dn[40];
        clip(dn, 33, u->p + k->c, k->d);
        size_t j = 0;
        while (j < sizeof dtypes / sizeof dtypes[0] && !eqs(u, k->c, k->d, dtypes[j].name)) j++;
        if (j == sizeof dtypes / sizeof dtypes[0])
            return bad(u, u->n, "torch.%s is not a dtype graphswap can receive", dn);
        for (size_t g = 0; g < out->ngroups; g++)
            if (out->group_dtype[g] == dtypes[j].dt) return bad(u, u->n, "torch.%s is a key twice", dn);
        if (l->c == 0) return bad(u, u->n, "torch.%s has no tensors", dn);
        uint64_t bytes = 0;
        for (uint32_t li = l->a; li != NONE; li = u->cells[li].next) {
            if (entry(u, item(u, li), dtypes[j].dt, &out->t[out->n], out->n)) {
                out->n++; /* (its name, when set, is freed with the rest) */
                return -1;
            }
            bytes += out->t[out->n].nbytes;
            out->n++;
            if (bytes > SRV_PRIMERL_META_MAX_GROUP_BYTES)
                return bad(u, u->n, "the torch.%s tensors are too large (more than 2^50 bytes)", dn);
        }
        out->group_dtype[out->ngroups] = dtypes[j].dt;
        out->group_end[out->ngroups++] = out->n;
    }
    return 0;
}

int srv_primerl_meta_unpickle(const unsigned char *p, size_t n, srv_primerl_meta *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    upk *u = calloc(1, sizeof *u);
    if (!u) return snprintf(err, errlen, "refusing prime-rl's metadata pickle: out of memory"), -1;
    u->p = p;
    u->n = n;
    u->err = err;
    u->errlen = errlen;
    uint32_t root = 0;
    int rc = -1;
    if (!p) bad(u, 0, "no data%s", NULL);
    else if (n > SRV_PRIMERL_META_MAX_BYTES) bad(u, 0, "longer than 1 MiB%s", NULL);
    else if (parse(u, &root) == 0) rc = check(u, root, out);
    free(u->nodes);
    free(u->cells);
    free(u->memo);
    free(u);
    if (rc != 0) srv_primerl_meta_free(out);
    return rc;
}

void srv_primerl_meta_free(srv_primerl_meta *m)
{
    for (size_t i = 0; i < m->n; i++) free(m->t[i].name);
    free(m->t);
    memset(m, 0, sizeof *m);
}
