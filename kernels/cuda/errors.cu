/* kernels/cuda/errors.cu — the CUDA and cuBLAS runtime errors of the kernels (CUDA_CHECK and
 * CUBLAS_CHECK in common.cuh): a failed call on the device is reported with the call and its place,
 * then the process aborts. */
#include "kernels/cuda/common.cuh"

void kc_die_cuda(cudaError_t e, const char *what, const char *file, int line)
{
    fprintf(stderr, "graphswap: CUDA error %s (%s) in %s (%s:%d)\n", cudaGetErrorName(e), cudaGetErrorString(e),
            what, file, line);
    abort();
}

void kc_die_cublas(cublasStatus_t s, const char *what, const char *file, int line)
{
    fprintf(stderr, "graphswap: cuBLAS error %d in %s (%s:%d)\n", (int)s, what, file, line);
    abort();
}
