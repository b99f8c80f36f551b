/* server/rendezvous/primerl_meta.h — a strict unpickler for the per-state-dict metadata prime-rl's trainer
 * broadcasts in NCCL mode (server/rendezvous/primerl_meta.c has the byte shapes; weights_primerl.c the protocol
 * around them). Network- and engine-free, so unit tests and the fuzz harness call it directly.
 */
#ifndef GS_SRV_PRIMERL_META_H
#define GS_SRV_PRIMERL_META_H

#include <stddef.h>
#include <stdint.h>

#include "models/format/safetensors.h"

/* Bounds of one pickle. prime-rl pickles one state dict (the non-layer tensors, or one decoder
 * layer): ~80 bytes per tensor, so a 512-expert MoE layer (1536 expert tensors) is ~125 KB. */
#define SRV_PRIMERL_META_MAX_BYTES (1u << 20)  /* the pickle's length L */
#define SRV_PRIMERL_META_MAX_TENSORS 16384     /* entries over all dtypes */
#define SRV_PRIMERL_META_MAX_GROUPS 16         /* dtype keys (mdl_dtype has 15) */
#define SRV_PRIMERL_META_MAX_NAME 512          /* a tensor name's bytes (srv_gpu_meta_parse's bound) */
#define SRV_PRIMERL_META_MAX_NUMEL (UINT64_C(1) << 48)
#define SRV_PRIMERL_META_MAX_GROUP_BYTES (UINT64_C(1) << 50) /* one dtype's concatenated broadcast */

/* The metadata of one state dict: tensors in the pickle's order (the dict's dtype order, each
 * dtype's list in order), i.e. the order of prime-rl's per-dtype concatenated broadcasts. Group g
 * (one dtype key) is t[g ? group_end[g-1] : 0 .. group_end[g]); every group has at least one
 * tensor. t[i]: name (owned, NUL-terminated, no NUL inside), dtype, ndim, shape, numel (= the
 * product of the shape, as the pickle's numel was checked to be), nbytes; data NULL. */
typedef struct {
    mdl_st_tensor *t;
    size_t n;
    size_t group_end[SRV_PRIMERL_META_MAX_GROUPS];
    mdl_dtype group_dtype[SRV_PRIMERL_META_MAX_GROUPS];
    size_t ngroups;
} srv_primerl_meta;

/* Parses p[0..n) (pickle protocol 2..5) into *out. 0, or -1 with a message in err ("refusing
 * prime-rl's metadata pickle: ...") and *out empty. Nothing is executed or imported. */
int srv_primerl_meta_unpickle(const unsigned char *p, size_t n, srv_primerl_meta *out, char *err, size_t errlen);
void srv_primerl_meta_free(srv_primerl_meta *m);
/* The torch dtype name ("bfloat16") of an mdl_dtype prime-rl can send; NULL for none. */
const char *srv_primerl_torch_dtype_name(mdl_dtype dt);

#endif
