/* Declarations shared between the CUDA sources (*.cu) and the C side of the
 * GPU backend (bcast_gpu*.c, bcast_preset.c). Plain C: includable from both. */
#ifndef RLORCH_BCAST_GPU_CUH
#define RLORCH_BCAST_GPU_CUH

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define BCAST__HD __host__ __device__
#else
#define BCAST__HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* One element of a preset's deterministic fill: a hash of (seed, tensor, i)
 * mapped to a multiple of 2^-27 in [-1/16, 1/16), exact in fp32 on CPU and GPU. */
BCAST__HD static inline uint64_t bcast__mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
BCAST__HD static inline float bcast__fill_value(uint64_t seed, uint32_t index, uint64_t i) {
  uint64_t h = bcast__mix64(seed ^ bcast__mix64(((uint64_t)index << 40) ^ i));
  int32_t v = (int32_t)(h >> 40) - 8388608; /* 24 bits, signed */
  return (float)v * (1.0f / 134217728.0f);  /* 2^-27: exact */
}

/* Stream handles travel as void* so C files need no CUDA headers. The kernels
 * take element counts and dtypes as the bcast_dtype values (1 fp32, 2 bf16,
 * 3 fp16, 4 u16). Each returns 0 or a cudaError_t value. */
int bcast__cuda_cast(void *dst, int dst_dtype, const void *src, int src_dtype, uint64_t n,
                     void *stream);
int bcast__cuda_fill(void *dst, int dtype, uint64_t n, uint64_t seed, uint32_t index,
                     void *stream);
/* 1 when the GPU kernel handles this pair. */
int bcast__cuda_cast_supported(int src_dtype, int dst_dtype);

#ifdef __cplusplus
}
#endif
#endif
