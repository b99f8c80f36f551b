/* tests/fuzz/fuzz_torch_ipc.c — libFuzzer harness for srv_torch_unpickle, the strict unpickler of the
 * torch multiprocessing pickles SGLang's /update_weights_from_tensor carries (built with the other
 * targets: -DGS_FUZZ=ON; seeds in tests/fuzz/corpus/fuzz_torch_ipc/: streams real torch 2.15 wrote,
 * a (name, tensor) list and a flattened bucket). The first byte picks the load format.
 * Beyond "no crash": a failure must explain itself with a 400 / 501 and leave the result empty; a
 * success must hold 1..16384 tensors, each named 1..512 bytes without NUL, numel the product of the
 * shape, nbytes numel times the dtype's size, inside its storage, a shm name "/torch_..." or an
 * empty storage.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/rendezvous/torch_ipc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    srv_torch_named m;
    char err[256];
    err[0] = '\0';
    int st = 0;
    const char *fmt = data[0] & 1 ? "flattened_bucket" : NULL;
    if (srv_torch_unpickle(data + 1, size - 1, fmt, &m, err, sizeof err, &st) != 0) {
        if (err[0] == '\0' || m.n || m.t || (st != 400 && st != 501 && st != 500)) abort();
        return 0;
    }
    if (m.n == 0 || m.n > SRV_TORCH_MAX_TENSORS || data[size - 1] != '.') abort();
    for (size_t i = 0; i < m.n; i++) {
        const srv_torch_tensor *t = &m.t[i];
        size_t len = t->name ? strlen(t->name) : 0;
        if (!len || len > SRV_TORCH_MAX_NAME || t->ndim < 0 || t->ndim > MDL_ST_MAX_DIMS) abort();
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0) abort();
            numel *= (uint64_t)t->shape[d];
        }
        if (numel != t->numel || t->nbytes != numel * mdl_dtype_size(t->dtype)) abort();
        if (t->offset_bytes > t->storage_bytes || t->nbytes > t->storage_bytes - t->offset_bytes) abort();
        if (t->where == SRV_TORCH_SHM && strncmp(t->shm, "/torch_", 7) != 0) abort();
        if (t->where == SRV_TORCH_EMPTY && t->nbytes) abort();
    }
    srv_torch_named_free(&m);
    return 0;
}
