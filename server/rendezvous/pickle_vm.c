/* server/rendezvous/pickle_vm.c — the opcode reader of graphswap's strict unpicklers (see pickle_vm.h).
 * Opcodes as CPython's Lib/pickle.py defines them; each case says what it builds.
 */
#include "server/rendezvous/pickle_vm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/rendezvous/le.h"

int srv_pk_bad(srv_pk *u, size_t at, const char *fmt, const char *arg)
{
    char m[200];
    snprintf(m, sizeof m, fmt, arg ? arg : "");
    snprintf(u->err, u->errlen, "refusing %s pickle: %s (at byte %zu)", u->what, m, at);
    return -1;
}

/* Grows *arr (elements of size w, *cap of them) to hold need + 1; the bound is the input length. */
static int grow(srv_pk *u, void **arr, size_t *cap, size_t need, size_t w, size_t at)
{
    if (need < *cap) return 0;
    size_t nc = *cap ? *cap * 2 : 64;
    while (nc <= need) nc *= 2;
    if (nc > u->n + 64) nc = u->n + 64;
    if (need >= nc) return srv_pk_bad(u, at, "more objects than the input can hold%s", NULL);
    void *q = realloc(*arr, nc * w);
    if (!q) return srv_pk_bad(u, at, "out of memory%s", NULL);
    *arr = q;
    *cap = nc;
    return 0;
}

static int64_t new_node(srv_pk *u, uint32_t t, size_t at)
{
    if (grow(u, (void **)&u->nodes, &u->nodes_cap, u->nn, sizeof *u->nodes, at)) return -1;
    srv_pk_node *x = &u->nodes[u->nn];
    memset(x, 0, sizeof *x);
    x->t = t;
    x->a = x->b = SRV_PK_NIL;
    return (int64_t)u->nn++;
}

static int push(srv_pk *u, int64_t idx, size_t at)
{
    if (idx < 0) return -1;
    if (u->sp >= SRV_PK_MAX_STACK) return srv_pk_bad(u, at, "stack too deep%s", NULL);
    u->stack[u->sp++] = (uint32_t)idx;
    return 0;
}

/* The stack items above the innermost mark (or above *floor: the values an opcode may consume). */
static size_t floor_of(const srv_pk *u) { return u->nmarks ? u->marks[u->nmarks - 1] : 0; }

static int64_t pop(srv_pk *u, size_t at)
{
    if (u->sp <= floor_of(u)) return srv_pk_bad(u, at, "stack underflow%s", NULL), -1;
    return u->stack[--u->sp];
}

/* Appends node item to container x (a new cell). */
static int add_cell(srv_pk *u, uint32_t x, uint32_t item, size_t at)
{
    if (grow(u, (void **)&u->cells, &u->cells_cap, u->nc, sizeof *u->cells, at)) return -1;
    const uint32_t k = (uint32_t)u->nc++;
    u->cells[k].item = item;
    u->cells[k].next = SRV_PK_NIL;
    srv_pk_node *c = &u->nodes[x];
    if (c->a == SRV_PK_NIL) c->a = k;
    else u->cells[c->b].next = k;
    c->b = k;
    c->c++;
    return 0;
}

static int memo_put(srv_pk *u, uint64_t idx, size_t at)
{
    if (u->sp == 0) return srv_pk_bad(u, at, "memo write with an empty stack%s", NULL);
    if (idx > u->n) return srv_pk_bad(u, at, "memo index out of range%s", NULL);
    const size_t old = u->memo_cap;
    if (grow(u, (void **)&u->memo, &u->memo_cap, (size_t)idx, sizeof *u->memo, at)) return -1;
    for (size_t i = old; i < u->memo_cap; i++) u->memo[i] = SRV_PK_NIL;
    if (u->memo[idx] == SRV_PK_NIL) u->memo_len++;
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
void srv_pk_clip(char *out, size_t cap, const unsigned char *s, size_t n)
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

int srv_pk_eqs(const srv_pk *u, uint32_t off, uint32_t len, const char *s)
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

const char *srv_pk_torch_dtype_name(mdl_dtype dt)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].dt == dt) return dtypes[i].name;
    return NULL;
}

/* A tuple of the top k stack values (k < 0: those above the innermost mark, which is dropped). */
static int make_tuple(srv_pk *u, int k, size_t at)
{
    size_t from;
    if (k < 0) {
        if (!u->nmarks) return srv_pk_bad(u, at, "TUPLE without a MARK%s", NULL);
        from = u->marks[--u->nmarks];
    } else {
        if (u->sp - floor_of(u) < (size_t)k) return srv_pk_bad(u, at, "stack underflow%s", NULL);
        from = u->sp - (size_t)k;
    }
    int64_t x = new_node(u, SRV_PK_TUPLE, at);
    if (x < 0) return -1;
    for (size_t i = from; i < u->sp; i++)
        if (add_cell(u, (uint32_t)x, u->stack[i], at)) return -1;
    u->sp = from;
    return push(u, x, at);
}

/* APPEND / APPENDS / SETITEM / SETITEMS: the values from `from` into the container just below it. */
static int fill(srv_pk *u, size_t from, uint32_t want, size_t at)
{
    if (from == 0 || from > u->sp) return srv_pk_bad(u, at, "no container to add to%s", NULL);
    const uint32_t x = u->stack[from - 1];
    if (u->nodes[x].t != want)
        return srv_pk_bad(u, at, "%s", want == SRV_PK_LIST ? "APPEND(S) to a non-list" : "SETITEM(S) to a non-dict");
    if (want == SRV_PK_DICT && (u->sp - from) % 2) return srv_pk_bad(u, at, "SETITEMS with an odd number of values%s", NULL);
    for (size_t i = from; i < u->sp; i++)
        if (add_cell(u, x, u->stack[i], at)) return -1;
    u->sp = from;
    return 0;
}

/* Parses the opcodes into u; the final object's node in *root. */
static int parse(srv_pk *u, uint32_t *root)
{
    const unsigned char *p = u->p;
    const size_t n = u->n;
    if (n < 2 || p[0] != 0x80) return srv_pk_bad(u, 0, "no PROTO opcode first (not a pickle of protocol 2+)%s", NULL);
    const unsigned proto = p[1];
    if (proto < 2 || proto > 5) {
        char v[16];
        snprintf(v, sizeof v, "%u", proto);
        return srv_pk_bad(u, 1, "pickle protocol %s (2 to 5 expected)", v);
    }
    size_t i = 2, frame_end = 0;
    for (;;) {
        if (frame_end && i == frame_end) frame_end = 0;
        if (i >= n) return srv_pk_bad(u, i, "truncated (no STOP)%s", NULL);
        const size_t at = i;
        const unsigned op = p[i++];
        size_t len = 0, need = 0;
        int64_t x;
        /* the opcodes of protocol 4 only where the stream says 4+ */
        if ((op == 0x95 || op == 0x8c || op == 0x93 || op == 0x94) && proto < 4)
            return srv_pk_bad(u, at, "a protocol-4 opcode in a protocol 2/3 pickle%s", NULL);
        switch (op) {
        case 0x95: /* FRAME: 8-byte length of the frame that follows */
            if (frame_end) return srv_pk_bad(u, at, "FRAME inside a frame%s", NULL);
            if (n - i < 8) return srv_pk_bad(u, at, "truncated FRAME%s", NULL);
            len = (size_t)srv_le(p + i, 8) > n ? n : (size_t)srv_le(p + i, 8);
            i += 8;
            if (len > n - i) return srv_pk_bad(u, at, "FRAME longer than the data%s", NULL);
            frame_end = len ? i + len : 0;
            break;
        case 0x8c: /* SHORT_BINUNICODE: 1-byte length */
        case 'X':  /* BINUNICODE: 4-byte length */
            need = op == 0x8c ? 1 : 4;
            if (n - i < need) return srv_pk_bad(u, at, "truncated string length%s", NULL);
            len = (size_t)srv_le(p + i, (int)need);
            i += need;
            if (len > n - i) return srv_pk_bad(u, at, "string longer than the data%s", NULL);
            if (len > SRV_PK_MAX_STR) return srv_pk_bad(u, at, "string too long%s", NULL);
            if (!utf8_ok(p + i, len)) return srv_pk_bad(u, at, "a string that is not UTF-8%s", NULL);
            if ((x = new_node(u, SRV_PK_STR, at)) < 0) return -1;
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
                if (n - i < 1) return srv_pk_bad(u, at, "truncated LONG1%s", NULL);
                len = p[i++];
                if (len > 8) return srv_pk_bad(u, at, "an integer wider than 64 bits%s", NULL);
                if (n - i < len) return srv_pk_bad(u, at, "truncated LONG1%s", NULL);
                uint64_t w = srv_le(p + i, (int)len);
                if (len && len < 8 && (p[i + len - 1] & 0x80)) w |= ~UINT64_C(0) << (8 * len); /* sign */
                memcpy(&v, &w, sizeof v);
                i += len;
            } else {
                need = op == 'K' ? 1 : op == 'M' ? 2 : 4;
                if (n - i < need) return srv_pk_bad(u, at, "truncated integer%s", NULL);
                uint64_t w = srv_le(p + i, (int)need);
                v = op == 'J' ? (int64_t)(int32_t)(uint32_t)w : (int64_t)w;
                i += need;
            }
            if ((x = new_node(u, SRV_PK_INT, at)) < 0) return -1;
            u->nodes[x].v = v;
            if (push(u, x, at)) return -1;
            break;
        }
        case 'c': { /* GLOBAL: "module\nname\n" */
            const unsigned char *m = p + i, *nl = memchr(m, '\n', n - i);
            if (!nl || (size_t)(nl - m) > SRV_PK_MAX_STR) return srv_pk_bad(u, at, "bad GLOBAL module%s", NULL);
            const unsigned char *nm = nl + 1;
            const unsigned char *nl2 = memchr(nm, '\n', n - (size_t)(nm - p));
            if (!nl2 || (size_t)(nl2 - nm) > SRV_PK_MAX_STR) return srv_pk_bad(u, at, "bad GLOBAL name%s", NULL);
            if ((x = new_node(u, SRV_PK_GLOBAL, at)) < 0) return -1;
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
            if (u->nodes[nm].t != SRV_PK_STR || u->nodes[md].t != SRV_PK_STR)
                return srv_pk_bad(u, at, "STACK_GLOBAL over non-strings%s", NULL);
            if ((x = new_node(u, SRV_PK_GLOBAL, at)) < 0) return -1;
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
            if (n - i < need) return srv_pk_bad(u, at, "truncated memo index%s", NULL);
            if (memo_put(u, srv_le(p + i, (int)need), at)) return -1;
            i += need;
            break;
        case 'h': /* BINGET */
        case 'j': { /* LONG_BINGET */
            need = op == 'h' ? 1 : 4;
            if (n - i < need) return srv_pk_bad(u, at, "truncated memo index%s", NULL);
            const uint64_t k = srv_le(p + i, (int)need);
            i += need;
            if (k >= u->memo_cap || u->memo[k] == SRV_PK_NIL) return srv_pk_bad(u, at, "memo read of an unset index%s", NULL);
            if (push(u, u->memo[k], at)) return -1;
            break;
        }
        case '}': /* EMPTY_DICT */
        case ']': /* EMPTY_LIST */
            if ((x = new_node(u, op == '}' ? SRV_PK_DICT : SRV_PK_LIST, at)) < 0 || push(u, x, at)) return -1;
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
            if (u->nmarks >= SRV_PK_MAX_MARKS) return srv_pk_bad(u, at, "MARKs nested too deep%s", NULL);
            u->marks[u->nmarks++] = u->sp;
            break;
        case 'a': /* APPEND: list, value */
            if (u->sp - floor_of(u) < 2) return srv_pk_bad(u, at, "stack underflow%s", NULL);
            if (fill(u, u->sp - 1, SRV_PK_LIST, at)) return -1;
            break;
        case 's': /* SETITEM: dict, key, value */
            if (u->sp - floor_of(u) < 3) return srv_pk_bad(u, at, "stack underflow%s", NULL);
            if (fill(u, u->sp - 2, SRV_PK_DICT, at)) return -1;
            break;
        case 'e': /* APPENDS: list, MARK, values */
        case 'u': { /* SETITEMS: dict, MARK, key, value, ... */
            if (!u->nmarks) return srv_pk_bad(u, at, "APPENDS / SETITEMS without a MARK%s", NULL);
            const size_t from = u->marks[--u->nmarks];
            if (from <= floor_of(u)) return srv_pk_bad(u, at, "no container below the MARK%s", NULL);
            if (fill(u, from, op == 'e' ? SRV_PK_LIST : SRV_PK_DICT, at)) return -1;
            break;
        }
        case 'R': { /* REDUCE: callable, args -> callable(*args), kept as a node */
            int64_t args = pop(u, at), fn = args < 0 ? -1 : pop(u, at);
            if (args < 0 || fn < 0) return -1;
            if ((x = new_node(u, SRV_PK_REDUCE, at)) < 0) return -1;
            u->nodes[x].a = (uint32_t)fn;
            u->nodes[x].b = (uint32_t)args;
            if (push(u, x, at)) return -1;
            break;
        }
        case '.': /* STOP */
            if (u->nmarks) return srv_pk_bad(u, at, "STOP with a MARK open%s", NULL);
            if (u->sp != 1) return srv_pk_bad(u, at, "STOP with other than one object on the stack%s", NULL);
            if (i != n) return srv_pk_bad(u, i, "trailing data after STOP%s", NULL);
            if (frame_end && frame_end != i) return srv_pk_bad(u, at, "STOP before the end of its FRAME%s", NULL);
            *root = u->stack[0];
            return 0;
        /* ---- SRV_PK_TORCH only: torch's multiprocessing pickles (torch_ipc.c) ---- */
        case 'N':  /* NONE */
        case 0x88: /* NEWTRUE */
        case 0x89: /* NEWFALSE */
            if (!(u->flags & SRV_PK_TORCH)) goto refused;
            if ((x = new_node(u, op == 'N' ? SRV_PK_NONE : SRV_PK_BOOL, at)) < 0) return -1;
            u->nodes[x].v = op == 0x88;
            if (push(u, x, at)) return -1;
            break;
        case 'C': /* SHORT_BINBYTES: 1-byte length */
        case 'B': /* BINBYTES: 4-byte length */
            if (!(u->flags & SRV_PK_TORCH)) goto refused;
            need = op == 'C' ? 1 : 4;
            if (n - i < need) return srv_pk_bad(u, at, "truncated bytes length%s", NULL);
            len = (size_t)srv_le(p + i, (int)need);
            i += need;
            if (len > n - i) return srv_pk_bad(u, at, "bytes longer than the data%s", NULL);
            if (len > SRV_PK_MAX_STR) return srv_pk_bad(u, at, "bytes too long%s", NULL);
            if ((x = new_node(u, SRV_PK_BYTES, at)) < 0) return -1;
            u->nodes[x].a = (uint32_t)i;
            u->nodes[x].b = (uint32_t)len;
            i += len;
            if (push(u, x, at)) return -1;
            break;
        case 0x81: { /* NEWOBJ: class, args -> cls.__new__(cls, *args), kept as a node */
            if (!(u->flags & SRV_PK_TORCH)) goto refused;
            int64_t args = pop(u, at), cls = args < 0 ? -1 : pop(u, at);
            if (args < 0 || cls < 0) return -1;
            if (u->nodes[cls].t != SRV_PK_GLOBAL || u->nodes[args].t != SRV_PK_TUPLE)
                return srv_pk_bad(u, at, "NEWOBJ of other than a global class and a tuple%s", NULL);
            if ((x = new_node(u, SRV_PK_OBJ, at)) < 0) return -1;
            u->nodes[x].a = (uint32_t)cls;
            u->nodes[x].b = (uint32_t)args;
            u->nodes[x].c = SRV_PK_NIL;
            if (push(u, x, at)) return -1;
            break;
        }
        case 'b': { /* BUILD: object, state -> the object with its state (once) */
            if (!(u->flags & SRV_PK_TORCH)) goto refused;
            int64_t st = pop(u, at);
            if (st < 0) return -1;
            if (u->sp <= floor_of(u)) return srv_pk_bad(u, at, "stack underflow%s", NULL);
            srv_pk_node *o = &u->nodes[u->stack[u->sp - 1]];
            if (o->t != SRV_PK_OBJ || o->c != SRV_PK_NIL)
                return srv_pk_bad(u, at, "BUILD of other than a new object%s", NULL);
            o->c = (uint32_t)st;
            break;
        }
        default:
        refused: {
            char m[8];
            snprintf(m, sizeof m, "0x%02x", op);
            char w[160];
            snprintf(w, sizeof w, "opcode %s is not part of %s", m, u->what);
            return srv_pk_bad(u, at, "%s", w);
        }
        }
        if (frame_end && i > frame_end) return srv_pk_bad(u, at, "an opcode crosses the end of its FRAME%s", NULL);
    }
}


int srv_pk_is_global(const srv_pk *u, const srv_pk_node *x, const char *module, const char *name)
{
    return x->t == SRV_PK_GLOBAL && srv_pk_eqs(u, x->a, x->b, module) && srv_pk_eqs(u, x->c, x->d, name);
}

int srv_pk_torch_dtype(const srv_pk *u, const srv_pk_node *g, mdl_dtype *dt)
{
    if (g->t != SRV_PK_GLOBAL || !srv_pk_eqs(u, g->a, g->b, "torch")) return -1;
    for (size_t j = 0; j < sizeof dtypes / sizeof dtypes[0]; j++)
        if (srv_pk_eqs(u, g->c, g->d, dtypes[j].name)) {
            *dt = dtypes[j].dt;
            return 0;
        }
    return -1;
}

/* torch.Size pickles through its __reduce__: (torch.Size, (tuple(self),)) */
int srv_pk_torch_size(srv_pk *u, const srv_pk_node *sz, const char *where, uint64_t max_numel, int64_t *dims,
                      int *ndim, uint64_t *numel)
{
    const srv_pk_node *fn = sz->t == SRV_PK_REDUCE ? &u->nodes[sz->a] : NULL;
    const srv_pk_node *args = sz->t == SRV_PK_REDUCE ? &u->nodes[sz->b] : NULL;
    if (!fn || !srv_pk_is_global(u, fn, "torch", "Size"))
        return srv_pk_bad(u, u->n, "the shape of %s is not a torch.Size", where);
    if (args->t != SRV_PK_TUPLE || args->c != 1 || srv_pk_item(u, args->a)->t != SRV_PK_TUPLE)
        return srv_pk_bad(u, u->n, "the torch.Size of %s is not built from one tuple", where);
    const srv_pk_node *dn = srv_pk_item(u, args->a);
    if (dn->c > MDL_ST_MAX_DIMS) return srv_pk_bad(u, u->n, "%s has more than 8 dimensions", where);
    uint64_t ne = 1;
    int d = 0;
    for (uint32_t ci = dn->a; ci != SRV_PK_NIL; ci = u->cells[ci].next, d++) {
        const srv_pk_node *v = srv_pk_item(u, ci);
        if (v->t != SRV_PK_INT || v->v < 0) return srv_pk_bad(u, u->n, "a dimension of %s is not a non-negative int", where);
        if (v->v && ne > max_numel / (uint64_t)v->v) return srv_pk_bad(u, u->n, "%s is too large (too many elements)", where);
        ne *= (uint64_t)v->v;
        dims[d] = v->v;
    }
    *ndim = d;
    *numel = ne;
    return 0;
}

int srv_pk_parse(srv_pk *u, const unsigned char *p, size_t n, const char *what, unsigned flags, char *err,
                 size_t errlen, uint32_t *root)
{
    memset(u, 0, sizeof *u);
    u->p = p;
    u->n = n;
    u->what = what;
    u->flags = flags;
    u->err = err;
    u->errlen = errlen;
    if (!p) return srv_pk_bad(u, 0, "no data%s", NULL);
    return parse(u, root);
}

void srv_pk_free(srv_pk *u)
{
    free(u->nodes);
    free(u->cells);
    free(u->memo);
    u->nodes = NULL;
    u->cells = NULL;
    u->memo = NULL;
}
