/* engine/backend/stepio.h — the plan-visible buffers a forward pass reads besides its weights.
 *
 * Allocated once by the engine from the backend arena (I1) and written with upload() before each
 * launch. Shapes (R = max rows of the largest plan, S = max sequences, B = blocks per sequence):
 *   tok, pos, slot, kv_len   int32 [R]    per row: token id, absolute position, sequence slot
 *                                          (-1 masks a padding row), keys visible to the row
 *   n_rows                   int32 [1]    live rows this step
 *   logit_idx                int32 [S]    rows whose logits are needed (last row of a sequence)
 *   n_logits                 int32 [1]
 *   block_tables             int32 [S*B]  physical KV block of (slot, logical block)
 *   kcache[l], vcache[l]     f32 [num_blocks * block_size * n_kv_heads * head_dim] per layer
 *   samp, samp_out           [S] per logits row: KOP_SAMPLE parameters in, chosen token out
 *                            (the step's only read-back; NULL samp: the tape ends at the logits)
 *   bans                     int32 [n_bans] the rows' min_tokens bans and extra ids (ranges named in samp)
 *   pen_state                int32 [S*V]  per slot: bit 0 an id is in the prompt, bits 1..: its output
 *                                          count (penalties; written at admission, updated by the op)
 *   bias                     [S*max_bias] per slot: the request's logit_bias, ids ascending
 *   upd                      int32 [1 + 2*max_upd] the launch's pen_state updates (count, then pairs)
 */
#ifndef GS_ENG_STEPIO_H
#define GS_ENG_STEPIO_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kern.h"

typedef struct {
    int32_t *tok, *pos, *slot, *kv_len, *n_rows, *logit_idx, *n_logits, *block_tables;
    int max_rows, max_seqs, max_blocks, block_size, num_blocks;
    float **kcache, **vcache; /* host array of per-layer device pointers */
    size_t kv_layer_bytes;
    kern_sample_params *samp;
    kern_sample_out *samp_out;
    int32_t *bans;
    int n_bans;
    int32_t *pen_state; /* NULL: the sample op has no penalty buffers */
    kern_logit_bias *bias;
    int32_t *upd;
    int max_bias, max_upd;
} eng_step_io;

#endif
