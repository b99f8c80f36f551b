# Dockerfile — graphswap with the CUDA backend, for one NVIDIA GPU (Hopper by default).
#   docker build -t graphswap:cuda .            (--build-arg CUDA_ARCH=80 for A100, 89 for L4/L40S)
#   docker run --gpus all -p 8080:8080 -v /path/to/model:/models/target:ro graphswap:cuda
# Two stages: the nvidia/cuda devel image builds (nvcc, cuBLASLt headers, the Debian/Ubuntu -dev
# packages); the runtime image (CUDA runtime + cuBLAS/cuBLASLt libraries) runs the binary as a
# non-root user. Only Ubuntu packages and the project's own sources are used.
ARG CUDA_VERSION=13.0.0
ARG UBUNTU_VERSION=24.04

FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION} AS build
ARG CUDA_ARCH=90
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential cmake pkg-config libcivetweb-dev libcjson-dev libcmocka-dev libpcre2-dev python3 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B build -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH} \
 && cmake --build build -j"$(nproc)" --target graphswap \
 && strip build/graphswap build/libgraphswap_cuda.so

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libcivetweb1 libcjson1 libpcre2-8-0 curl ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --create-home --home-dir /home/graphswap graphswap
COPY --from=build /src/build/graphswap /src/build/libgraphswap_cuda.so /usr/local/bin/
USER graphswap
WORKDIR /home/graphswap
EXPOSE 8080
# model loading takes a while on large checkpoints: a generous start period
HEALTHCHECK --interval=15s --timeout=5s --start-period=300s --retries=3 \
  CMD curl -fsS http://127.0.0.1:8080/health >/dev/null || exit 1
ENTRYPOINT ["graphswap", "serve"]
CMD ["--model", "/models/target", "--backend", "cuda", "--host", "0.0.0.0", "--port", "8080"]
