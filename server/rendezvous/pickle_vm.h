/* server/rendezvous/pickle_vm.h — the opcode reader shared by graphswap's strict unpicklers
 * (primerl_meta.c: prime-rl's NCCL metadata; torch_ipc.c: torch's multiprocessing tensors).
 *
 * Nothing is executed or imported: the opcodes of a pickle (protocol 2..5, CPython Lib/pickle.py)
 * build a graph of typed nodes whose strings and globals point into the input; each reader then
 * checks the final object against the one shape it accepts. The opcode set is the intersection of
 * what those shapes need: strings, ints, globals, tuples, lists, dicts, REDUCE, the memo, MARK,
 * FRAME; SRV_PK_TORCH adds bytes, None, booleans and NEWOBJ + BUILD (a dataclass). Anything else
 * is refused with "opcode 0x.. is not part of <what>".
 *
 * Memory: the node, cell and memo arrays grow by doubling, and each is bounded by the input length
 * (an opcode makes at most one node and pushes at most one value; every cell consumes a pushed
 * value): at most ~40 bytes per input byte. srv_pk_free releases them.
 */
#ifndef GS_SRV_PICKLE_VM_H
#define GS_SRV_PICKLE_VM_H

#include <stddef.h>
#include <stdint.h>

#include "models/format/safetensors.h"

#define SRV_PK_MAX_STACK 4096 /* values on the stack: a 1000-item batch, plus nesting */
#define SRV_PK_MAX_MARKS 16
#define SRV_PK_MAX_STR 4096   /* any string or bytes of the pickle (readers bound names further) */
#define SRV_PK_NIL UINT32_MAX /* no node / no cell */

enum { SRV_PK_TORCH = 1 }; /* flags: the extra opcodes of torch's multiprocessing pickles */

typedef enum {
    SRV_PK_STR, SRV_PK_INT, SRV_PK_GLOBAL, SRV_PK_TUPLE, SRV_PK_LIST, SRV_PK_DICT, SRV_PK_REDUCE,
    SRV_PK_BYTES, SRV_PK_BOOL, SRV_PK_NONE, SRV_PK_OBJ
} srv_pk_type;

/* STR / BYTES: a = offset in the input, b = length. INT / BOOL: v. GLOBAL: a/b module, c/d name
 * (offsets / lengths in the input). TUPLE / LIST / DICT: a = first cell, b = last cell, c = items
 * (a dict's cells alternate key, value). REDUCE: a = callable, b = arguments (nodes). OBJ (NEWOBJ,
 * then at most one BUILD): a = class, b = arguments, c = state (SRV_PK_NIL before BUILD). */
typedef struct {
    uint32_t t, a, b, c, d;
    int64_t v;
} srv_pk_node;

typedef struct {
    uint32_t item, next;
} srv_pk_cell;

typedef struct {
    const unsigned char *p;
    size_t n;
    const char *what; /* for messages: "refusing <what> pickle: ..." */
    unsigned flags;
    srv_pk_node *nodes;
    size_t nn, nodes_cap;
    srv_pk_cell *cells;
    size_t nc, cells_cap;
    uint32_t *memo;
    size_t memo_cap, memo_len; /* memo_len: entries set (MEMOIZE writes at index memo_len) */
    uint32_t stack[SRV_PK_MAX_STACK];
    size_t sp;
    size_t marks[SRV_PK_MAX_MARKS];
    size_t nmarks;
    char *err;
    size_t errlen;
} srv_pk;

/* Parses p[0..n) into u (heap-allocate it: the stack array is 16 KiB); the final object's node in
 * *root. 0, or -1 with the message in err. srv_pk_free(u) afterwards either way. */
int srv_pk_parse(srv_pk *u, const unsigned char *p, size_t n, const char *what, unsigned flags, char *err,
                 size_t errlen, uint32_t *root);
void srv_pk_free(srv_pk *u);
/* Writes "refusing <what> pickle: <fmt with arg> (at byte at)" into err; returns -1. */
int srv_pk_bad(srv_pk *u, size_t at, const char *fmt, const char *arg);
/* The node a container cell holds. */
static inline const srv_pk_node *srv_pk_item(const srv_pk *u, uint32_t cell)
{
    return &u->nodes[u->cells[cell].item];
}
/* 1 when the input bytes [off, off + len) are the C string s. */
int srv_pk_eqs(const srv_pk *u, uint32_t off, uint32_t len, const char *s);
/* 1 when node x is the global module.name. */
int srv_pk_is_global(const srv_pk *u, const srv_pk_node *x, const char *module, const char *name);
/* At most cap - 1 bytes of s[0..n) for a message ('?' for control characters and bad UTF-8). */
void srv_pk_clip(char *out, size_t cap, const unsigned char *s, size_t n);
/* A global torch.<name> that is a dtype graphswap can size: 0 and *dt, else -1. */
int srv_pk_torch_dtype(const srv_pk *u, const srv_pk_node *g, mdl_dtype *dt);
/* The torch dtype name ("bfloat16") of an mdl_dtype; NULL for none. */
const char *srv_pk_torch_dtype_name(mdl_dtype dt);
/* A torch.Size node (REDUCE of the global torch.Size over a one-tuple of a tuple of at most
 * MDL_ST_MAX_DIMS non-negative ints): 0 with dims / *ndim / *numel (numel <= max_numel), else -1
 * with the message ("<where>: ..."). */
int srv_pk_torch_size(srv_pk *u, const srv_pk_node *sz, const char *where, uint64_t max_numel, int64_t *dims,
                      int *ndim, uint64_t *numel);

#endif
