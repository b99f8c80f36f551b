/* tests/fuzz/fuzz_store_pickle.c — libFuzzer harness for srv_store_unpickle_nccl_id, the strict
 * unpickler of vLLM's pickled ncclUniqueId (built with the other targets: -DGS_FUZZ=ON; seeds in
 * tests/fuzz/corpus/fuzz_store_pickle/: the stream vLLM's rank 0 writes, pickle protocols 3-5).
 * Beyond "no crash": a failure must explain itself, and a success must have come from a stream that
 * ends in STOP and names vLLM's class (the only shape accepted).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/rendezvous/tcpstore.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    unsigned char id[SRV_STORE_ID_BYTES];
    char err[256];
    err[0] = '\0';
    if (srv_store_unpickle_nccl_id(data, size, id, err, sizeof err) != 0) {
        if (err[0] == '\0') abort();
        return 0;
    }
    if (size < 2 || data[size - 1] != '.' || !memmem(data, size, "ncclUniqueId", 12)) abort();
    return 0;
}
