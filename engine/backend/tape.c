#include "engine/backend/tape.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>

int eng_tape_init(eng_tape *t, size_t cap)
{
    t->ops = calloc(cap, sizeof *t->ops);
    t->n = 0;
    t->cap = t->ops ? cap : 0;
    t->overflow = 0;
    return t->ops ? 0 : -1;
}

void eng_tape_free(eng_tape *t)
{
    free(t->ops);
    t->ops = NULL;
    t->n = t->cap = 0;
}

void eng_tape_push(eng_tape *t, const kern_op *op)
{
    if (t->n >= t->cap) {
        fprintf(stderr, "graphswap: bug: tape capacity %zu exceeded\n", t->cap);
        abort();
    }
    t->ops[t->n++] = *op;
}
