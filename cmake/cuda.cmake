# cmake/cuda.cmake — the optional CUDA backend (kernels/cuda/, engine/backend/backend_cuda.*), included by the
# top-level CMakeLists.txt when GS_CUDA is ON. Does nothing when no CUDA compiler is found, so the
# CPU-only build is unchanged on machines without nvcc.
#
# Defines: gs_cuda (static library: kernels + backend), GS_HAVE_CUDA (ON when built), and links the
# graphswap binary against gs_cuda with the compile definition GS_HAVE_CUDA=1.
# Options: -DCMAKE_CUDA_ARCHITECTURES=... (default 90: H100 / H200), -DGS_CUDA_WERROR=OFF to let
# nvcc warnings through.
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  message(STATUS "graphswap: no CUDA compiler found: building the CPU backend only")
  return()
endif()
if(GS_SANITIZE)
  # ASan's shadow memory and the CUDA driver's address-space reservations do not mix; sanitizer
  # builds test the CPU backend.
  message(STATUS "graphswap: CUDA backend not built under GS_SANITIZE")
  return()
endif()

if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90)
endif()
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_FLAGS_RELWITHDEBINFO "-O3 -g -lineinfo")
set(CMAKE_CUDA_FLAGS_RELEASE "-O3")
enable_language(CUDA)
find_package(CUDAToolkit)
if(NOT TARGET CUDA::cudart OR NOT TARGET CUDA::cublasLt)
  message(STATUS "graphswap: nvcc found but not the CUDA runtime / cuBLASLt libraries: CPU backend only")
  return()
endif()
option(GS_CUDA_WERROR "Treat nvcc warnings as errors" ON)
set(GS_HAVE_CUDA ON)
message(STATUS "graphswap: CUDA backend for sm_${CMAKE_CUDA_ARCHITECTURES} (nvcc ${CMAKE_CUDA_COMPILER_VERSION})")

file(GLOB GS_CUDA_SRC CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/cuda/*.cu ${CMAKE_SOURCE_DIR}/kernels/cuda/*.c)
# The GPU weight transports (engine/backend/transport_cuda.cu: NCCL broadcast, CUDA IPC) live in the same
# module. NCCL is optional: without nccl.h / libnccl at configure time they are built without it
# (IPC still works, the NCCL routes answer with a clear error). libnccl is dlopen'ed at the first
# NCCL init, never linked (GS_NCCL_LIB is found only for the GPU test's trainer side).
list(APPEND GS_CUDA_SRC ${CMAKE_SOURCE_DIR}/engine/backend/transport_cuda.cu)
find_path(GS_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include /usr/include)
find_library(GS_NCCL_LIB nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib
             /usr/local/cuda/lib /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu)
if(GS_NCCL_INCLUDE AND GS_NCCL_LIB)
  set(GS_HAVE_NCCL ON)
  message(STATUS "graphswap: NCCL weight transport (${GS_NCCL_LIB})")
else()
  set(GS_HAVE_NCCL OFF)
  message(STATUS "graphswap: no NCCL found: the NCCL weight transport is not built")
endif()
add_library(gs_cuda STATIC ${GS_CUDA_SRC} ${CMAKE_SOURCE_DIR}/engine/backend/backend_cuda.cu)
# The directory's options (-Wall -Werror ... from add_compile_options) are host-compiler flags that
# nvcc does not take directly: give each language its own.
set_property(TARGET gs_cuda PROPERTY COMPILE_OPTIONS "")
set(GS_CUDA_NVCC_FLAGS -Xcompiler=-Wall,-Wextra,-Werror --expt-relaxed-constexpr)
if(GS_CUDA_WERROR)
  list(APPEND GS_CUDA_NVCC_FLAGS -Werror=all-warnings)
endif()
target_compile_options(gs_cuda PRIVATE
  $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra -Werror -D_GNU_SOURCE -ffp-contract=off>
  $<$<COMPILE_LANGUAGE:CUDA>:${GS_CUDA_NVCC_FLAGS}>)
target_link_libraries(gs_cuda PUBLIC gs_core CUDA::cudart CUDA::cublasLt)
if(GS_HAVE_NCCL)
  # nccl.h only: engine/backend/transport_cuda.cu dlopens libnccl.so.2 on first use, so neither the module
  # nor the binary needs NCCL installed to load (only the NCCL routes do)
  target_include_directories(gs_cuda PRIVATE ${GS_NCCL_INCLUDE})
  target_compile_definitions(gs_cuda PRIVATE GS_HAVE_NCCL=1)
  target_link_libraries(gs_cuda PUBLIC ${CMAKE_DL_LIBS})
else()
  target_compile_definitions(gs_cuda PRIVATE GS_HAVE_NCCL=0)
endif()
# Executables linking gs_cuda are linked by the C compiler driver (the CUDA objects need only the
# CUDA runtime and libstdc++'s support symbols, not nvcc's device link: no separable compilation).
set_target_properties(gs_cuda PROPERTIES CUDA_SEPARABLE_COMPILATION OFF CUDA_RESOLVE_DEVICE_SYMBOLS OFF)
target_link_libraries(gs_cuda PUBLIC stdc++)

# The binary loads the CUDA backend as a module (libgraphswap_cuda.so, next to it) only for
# `--backend cuda`. Linking cuBLASLt into the binary itself would break the HTTP server: its static
# TLS (~94 KB) does not fit the small thread stacks civetweb asks for, so every handler thread fails
# to start. A dlopen'ed module's TLS is dynamic. The module resolves the few core symbols it uses
# (kern_op_name, mdl_dtype_size) from the executable, which exports them.
if(TARGET graphswap)
  add_library(gs_cuda_module MODULE ${GS_CUDA_SRC} ${CMAKE_SOURCE_DIR}/engine/backend/backend_cuda.cu)
  set_property(TARGET gs_cuda_module PROPERTY COMPILE_OPTIONS "")
  target_compile_options(gs_cuda_module PRIVATE
    $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra -Werror -D_GNU_SOURCE -ffp-contract=off>
    $<$<COMPILE_LANGUAGE:CUDA>:${GS_CUDA_NVCC_FLAGS}>)
  target_link_libraries(gs_cuda_module PRIVATE CUDA::cudart CUDA::cublasLt stdc++)
  if(GS_HAVE_NCCL)
    target_include_directories(gs_cuda_module PRIVATE ${GS_NCCL_INCLUDE})
    target_compile_definitions(gs_cuda_module PRIVATE GS_HAVE_NCCL=1)
    target_link_libraries(gs_cuda_module PRIVATE ${CMAKE_DL_LIBS})
  else()
    target_compile_definitions(gs_cuda_module PRIVATE GS_HAVE_NCCL=0)
  endif()
  set_target_properties(gs_cuda_module PROPERTIES OUTPUT_NAME graphswap_cuda PREFIX "lib"
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR} CUDA_SEPARABLE_COMPILATION OFF POSITION_INDEPENDENT_CODE ON)
  set_target_properties(graphswap PROPERTIES ENABLE_EXPORTS ON)
  target_link_libraries(graphswap PRIVATE ${CMAKE_DL_LIBS})
  target_compile_definitions(graphswap PRIVATE GS_HAVE_CUDA=1)
  add_dependencies(graphswap gs_cuda_module)
endif()
