/* tests/fuzz/fuzz_safetensors.c — libFuzzer harness for mdl_st_parse (built with -DGS_FUZZ=ON; see
 * tests/fuzz/run.sh). The parse runs on a civetweb-sized stack (fz_small_stack): HTTP buckets are
 * parsed on the server's worker threads.
 *
 * Beyond "no crash", a successful parse must be structurally sound: every tensor's bytes lie in the
 * data section, sizes agree with shapes, and the tensors tile the data section exactly. Violations
 * abort so the fuzzer records the input. The data is read to let ASan see any out-of-bounds span.
 */
#include "models/format/safetensors.h"

#include <stdint.h>
#include <stdlib.h>

#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
    const uint8_t *data;
    size_t size;
} job;

static int check(const uint8_t *data, size_t size);

static void *run(void *arg)
{
    job *j = arg;
    check(j->data, j->size);
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    job j = {data, size};
    fz_small_stack(run, &j);
    return 0;
}

static int check(const uint8_t *data, size_t size)
{
    mdl_st_file f;
    char err[512];
    err[0] = '\0';
    if (mdl_st_parse(data, size, "fuzz", &f, err, sizeof err) != 0) {
        if (err[0] == '\0' || f.n != 0 || f.tensors != NULL || f.n_meta != 0)
            abort(); /* failures must explain themselves and leave *out empty */
        return 0;
    }
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)data[i] << (8 * i);
    const uint8_t *lo = data + 8 + hlen, *hi = data + size;
    uint64_t covered = 0;
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < f.n; i++) {
        const mdl_st_tensor *t = &f.tensors[i];
        if (!t->name || (unsigned)t->dtype >= MDL_DT_COUNT || t->ndim < 0 ||
            t->ndim > MDL_ST_MAX_DIMS)
            abort();
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++)
            numel *= (uint64_t)t->shape[d];
        if (numel != t->numel || t->nbytes != numel * mdl_dtype_size(t->dtype))
            abort();
        if (t->data < lo || t->data > hi || t->nbytes > (uint64_t)(hi - t->data))
            abort();
        for (uint64_t k = 0; k < t->nbytes; k++)
            sink ^= t->data[k];
        covered += t->nbytes;
    }
    if (covered != (uint64_t)(hi - lo))
        abort();
    (void)sink;
    mdl_st_close(&f);
    return 0;
}
