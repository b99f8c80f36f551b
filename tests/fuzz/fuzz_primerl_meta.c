/* tests/fuzz/fuzz_primerl_meta.c — libFuzzer harness for srv_primerl_meta_unpickle, the strict
 * unpickler of prime-rl's per-state-dict NCCL metadata (built with the other targets: -DGS_FUZZ=ON;
 * seeds in tests/fuzz/corpus/fuzz_primerl_meta/: pickles real torch 2.15 wrote, protocols 2-5).
 * Beyond "no crash": a failure must explain itself and leave the result empty; a success must be
 * the shape the engine relies on: groups that partition the tensors in order, one dtype each, no
 * two alike, none empty; every name 1..512 bytes without NUL; numel the product of the shape;
 * nbytes numel times the dtype's size; at most 8 dims; and the stream must end in STOP.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/rendezvous/primerl_meta.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    srv_primerl_meta m;
    char err[256];
    err[0] = '\0';
    if (srv_primerl_meta_unpickle(data, size, &m, err, sizeof err) != 0) {
        if (err[0] == '\0' || m.n || m.t || m.ngroups) abort();
        return 0;
    }
    if (size < 2 || data[size - 1] != '.' || m.ngroups > SRV_PRIMERL_META_MAX_GROUPS) abort();
    size_t a = 0;
    for (size_t g = 0; g < m.ngroups; g++) {
        if (m.group_end[g] <= a || m.group_end[g] > m.n) abort();
        for (size_t h = 0; h < g; h++)
            if (m.group_dtype[h] == m.group_dtype[g]) abort();
        for (size_t i = a; i < m.group_end[g]; i++) {
            const mdl_st_tensor *t = &m.t[i];
            size_t len = t->name ? strlen(t->name) : 0;
            if (!len || len > SRV_PRIMERL_META_MAX_NAME || t->dtype != m.group_dtype[g] || t->ndim < 0 ||
                t->ndim > MDL_ST_MAX_DIMS || t->data)
                abort();
            uint64_t numel = 1;
            for (int d = 0; d < t->ndim; d++) {
                if (t->shape[d] < 0) abort();
                numel *= (uint64_t)t->shape[d];
            }
            if (numel != t->numel || t->nbytes != numel * mdl_dtype_size(t->dtype)) abort();
        }
        a = m.group_end[g];
    }
    if (a != m.n) abort();
    srv_primerl_meta_free(&m);
    return 0;
}
