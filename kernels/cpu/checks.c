/* kernels/cpu/checks.c — what every CPU kernel file uses to check its op: the failure report (a
 * malformed op is a bug: abort, naming the op and the check) and the reader of a step-count buffer
 * (row counts and the like live in plan-visible buffers, so they are checked at run time). */
#include "kernels/cpu/kern_cpu.h"

#include <stdio.h>
#include <stdlib.h>

_Noreturn void kern_cpu_fail(const kern_op *op, const char *what, const char *file, int line)
{
    fprintf(stderr, "graphswap: malformed %s op: check '%s' failed (%s:%d)\n",
            op ? kern_op_name(op->kind) : "?", what, file, line);
    abort();
}

int32_t kern_cpu_count(const kern_op *op, int i, int32_t max)
{
    int32_t n = *(const int32_t *)op->buf[i].ptr;
    KERN_CHECK(op, n >= 0 && n <= max);
    return n;
}
