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
#include "server/rendezvous/primerl_meta.h"
#include "server/rendezvous/pickle_vm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NONE SRV_PK_NIL

static const srv_pk_node *item(const srv_pk *u, uint32_t cell_idx) { return srv_pk_item(u, cell_idx); }

const char *srv_primerl_torch_dtype_name(mdl_dtype dt) { return srv_pk_torch_dtype_name(dt); }

/* One entry (name, torch.Size, numel) into t. */
static int entry(srv_pk *u, const srv_pk_node *e, mdl_dtype dt, mdl_st_tensor *t, size_t k)
{
    char where[48];
    snprintf(where, sizeof where, "entry %zu", k);
    if (e->t != SRV_PK_TUPLE || e->c != 3) return srv_pk_bad(u, u->n, "%s is not a (name, torch.Size, numel) tuple", where);
    const uint32_t c0 = e->a, c1 = u->cells[c0].next, c2 = u->cells[c1].next;
    const srv_pk_node *nm = item(u, c0), *sz = item(u, c1), *ne = item(u, c2);
    if (nm->t != SRV_PK_STR || nm->b == 0 || nm->b > SRV_PRIMERL_META_MAX_NAME || memchr(u->p + nm->a, 0, nm->b))
        return srv_pk_bad(u, u->n, "%s: the name is not a string of 1..512 bytes without NUL", where);
    if (!(t->name = malloc(nm->b + 1))) return srv_pk_bad(u, u->n, "out of memory%s", NULL);
    memcpy(t->name, u->p + nm->a, nm->b);
    t->name[nm->b] = 0;
    srv_pk_clip(where, 41, u->p + nm->a, nm->b);
    uint64_t numel = 0;
    if (srv_pk_torch_size(u, sz, where, SRV_PRIMERL_META_MAX_NUMEL, t->shape, &t->ndim, &numel)) return -1;
    if (ne->t != SRV_PK_INT || ne->v < 0 || (uint64_t)ne->v != numel)
        return srv_pk_bad(u, u->n, "the numel of %s is not the product of its shape", where);
    t->dtype = dt;
    t->numel = numel;
    t->nbytes = numel * mdl_dtype_size(dt);
    t->data = NULL;
    return 0;
}

/* The final object against prime-rl's shape (see the top of the file). */
static int check(srv_pk *u, uint32_t root, srv_primerl_meta *out)
{
    const srv_pk_node *d = &u->nodes[root];
    if (d->t != SRV_PK_DICT) return srv_pk_bad(u, u->n, "the object is not a dict%s", NULL);
    /* the entries first: out->t in one allocation */
    size_t total = 0;
    for (uint32_t ci = d->a; ci != NONE; ci = u->cells[u->cells[ci].next].next) {
        const srv_pk_node *l = item(u, u->cells[ci].next);
        if (l->t != SRV_PK_LIST) return srv_pk_bad(u, u->n, "a value of the dict is not a list%s", NULL);
        total += l->c;
        if (total > SRV_PRIMERL_META_MAX_TENSORS) return srv_pk_bad(u, u->n, "more than 16384 tensors%s", NULL);
    }
    if (d->c / 2 > SRV_PRIMERL_META_MAX_GROUPS) return srv_pk_bad(u, u->n, "more than 16 dtype keys%s", NULL);
    if (total && !(out->t = calloc(total, sizeof *out->t))) return srv_pk_bad(u, u->n, "out of memory%s", NULL);
    for (uint32_t ci = d->a; ci != NONE; ci = u->cells[u->cells[ci].next].next) {
        const srv_pk_node *k = item(u, ci), *l = item(u, u->cells[ci].next);
        if (k->t != SRV_PK_GLOBAL || !srv_pk_eqs(u, k->a, k->b, "torch"))
            return srv_pk_bad(u, u->n, "a key of the dict is not a torch dtype (a global torch.<name>)%s", NULL);
        char dn[40];
        srv_pk_clip(dn, 33, u->p + k->c, k->d);
        mdl_dtype gdt;
        if (srv_pk_torch_dtype(u, k, &gdt) != 0)
            return srv_pk_bad(u, u->n, "torch.%s is not a dtype graphswap can receive", dn);
        for (size_t g = 0; g < out->ngroups; g++)
            if (out->group_dtype[g] == gdt) return srv_pk_bad(u, u->n, "torch.%s is a key twice", dn);
        if (l->c == 0) return srv_pk_bad(u, u->n, "torch.%s has no tensors", dn);
        uint64_t bytes = 0;
        for (uint32_t li = l->a; li != NONE; li = u->cells[li].next) {
            if (entry(u, item(u, li), gdt, &out->t[out->n], out->n)) {
                out->n++; /* (its name, when set, is freed with the rest) */
                return -1;
            }
            bytes += out->t[out->n].nbytes;
            out->n++;
            if (bytes > SRV_PRIMERL_META_MAX_GROUP_BYTES)
                return srv_pk_bad(u, u->n, "the torch.%s tensors are too large (more than 2^50 bytes)", dn);
        }
        out->group_dtype[out->ngroups] = gdt;
        out->group_end[out->ngroups++] = out->n;
    }
    return 0;
}

int srv_primerl_meta_unpickle(const unsigned char *p, size_t n, srv_primerl_meta *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    srv_pk *u = calloc(1, sizeof *u);
    if (!u) return snprintf(err, errlen, "refusing prime-rl's metadata pickle: out of memory"), -1;
    uint32_t root = 0;
    int rc = -1;
    if (n > SRV_PRIMERL_META_MAX_BYTES) {
        u->what = "prime-rl's metadata";
        u->err = err;
        u->errlen = errlen;
        srv_pk_bad(u, 0, "longer than 1 MiB%s", NULL);
    } else if (srv_pk_parse(u, p, n, "prime-rl's metadata", 0, err, errlen, &root) == 0) {
        rc = check(u, root, out);
    }
    srv_pk_free(u);
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
