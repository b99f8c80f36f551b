/* bench/bench.h — `graphswap bench <name>`: srv_cmd_bench (bench_decode.c) dispatches to each. */
#ifndef GS_BENCH_H
#define GS_BENCH_H

int srv_cmd_bench(int argc, char **argv);
/* bench_serve.c: `graphswap bench serve` (drives a running server over loopback) */
int srv_bench_serve(int argc, char **argv);
/* bench_update.c: `graphswap bench update` (weight-update throughput over loopback HTTP) */
int srv_bench_update(int argc, char **argv);
/* bench_prefill.c: `graphswap bench prefill` (prompt tokens/s against the FMA peak) */
int srv_bench_prefill(int argc, char **argv);
/* bench_blas.c: `graphswap bench blas` (the f32 matmul against BLAS libraries) */
int srv_bench_blas(int argc, char **argv);
/* bench_transfer.c: `graphswap bench transfer` (weight-update throughput in the process) */
int srv_bench_transfer(int argc, char **argv);
/* bench_gemv.c: `graphswap bench gemv` (decode-shaped matmuls by weight dtype: f32, bf16, FP8) */
int srv_bench_gemv(int argc, char **argv);

#endif
