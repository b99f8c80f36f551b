/* engine/backend/tape.h — an op tape: the ordered list of kern_op records a model emits for one step shape.
 * Built once per batch bucket into a fixed-capacity array (no allocation while emitting), then
 * either run eagerly or captured into a plan. */
#ifndef GS_ENG_TAPE_H
#define GS_ENG_TAPE_H

#include <stddef.h>

#include "kernels/kern.h"

typedef struct {
    kern_op *ops;
    size_t n, cap;
    int overflow; /* set when an emit did not fit: the tape is unusable (a sizing bug) */
} eng_tape;

int eng_tape_init(eng_tape *t, size_t cap);
void eng_tape_free(eng_tape *t);
static inline void eng_tape_reset(eng_tape *t)
{
    t->n = 0;
    t->overflow = 0;
}
/* Appends a copy of *op (asserts on overflow: tape capacity is sized from the model). */
void eng_tape_push(eng_tape *t, const kern_op *op);

#endif
