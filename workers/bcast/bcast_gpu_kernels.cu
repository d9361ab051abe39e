/* CUDA kernels of the GPU backend: dtype casts into and out of buckets, and the
 * deterministic fill used by presets. The casts are bit-identical to the CPU
 * reference in bcast_cast: round to nearest even on the bit pattern (exact for
 * subnormals and infinities, no FTZ since no float arithmetic is involved);
 * NaN becomes a quiet NaN that keeps its sign (bf16: 0x7FC0 | sign; fp16: also
 * the top payload bits, as F16C). */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "workers/bcast/bcast_gpu.cuh"

namespace {

enum { FP32 = 1, BF16 = 2, FP16 = 3, U16 = 4 };

__device__ __forceinline__ uint16_t f32_to_bf16(uint32_t u) {
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)(((u >> 16) & 0x8000u) | 0x7FC0u);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ uint16_t f32_to_f16(uint32_t u) {
  /* NaN stays a quiet NaN with its sign and top payload bits (as F16C). */
  if ((u & 0x7FFFFFFFu) > 0x7F800000u)
    return (uint16_t)(((u >> 16) & 0x8000u) | 0x7E00u | ((u >> 13) & 0x3FFu));
  /* IEEE conversion with round to nearest even, subnormals included. */
  return __half_as_ushort(__float2half_rn(__uint_as_float(u)));
}

/* Element conversions on raw bits. Src/Dst are the storage types. */
struct cvt_f32_bf16 {
  typedef uint32_t S;
  typedef uint16_t D;
  __device__ static D op(S s) { return f32_to_bf16(s); }
};
struct cvt_f32_f16 {
  typedef uint32_t S;
  typedef uint16_t D;
  __device__ static D op(S s) { return f32_to_f16(s); }
};
struct cvt_bf16_f32 {
  typedef uint16_t S;
  typedef uint32_t D;
  __device__ static D op(S s) { return (uint32_t)s << 16; }
};

/* 8 elements per thread per step: 16-byte loads and stores when both pointers
 * are 16-byte aligned, so the kernel runs at memory bandwidth. */
template <class C>
__global__ void cast_vec8(typename C::D *__restrict__ dst, const typename C::S *__restrict__ src,
                          uint64_t nvec) {
  typedef typename C::S S;
  typedef typename C::D D;
  const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  for (uint64_t v = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; v < nvec; v += stride) {
    S in[8];
    D out[8];
    const uint4 *s4 = reinterpret_cast<const uint4 *>(src + v * 8);
#pragma unroll
    for (int k = 0; k < (int)(8 * sizeof(S) / 16); k++) reinterpret_cast<uint4 *>(in)[k] = s4[k];
#pragma unroll
    for (int k = 0; k < 8; k++) out[k] = C::op(in[k]);
    uint4 *d4 = reinterpret_cast<uint4 *>(dst + v * 8);
#pragma unroll
    for (int k = 0; k < (int)(8 * sizeof(D) / 16); k++) d4[k] = reinterpret_cast<uint4 *>(out)[k];
  }
}

template <class C>
__global__ void cast_scalar(typename C::D *__restrict__ dst, const typename C::S *__restrict__ src,
                            uint64_t n) {
  const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = C::op(src[i]);
}

const int kThreads = 256;

int grid_for(uint64_t work) {
  /* Enough blocks to fill every SM several times over; the loops stride. */
  uint64_t b = (work + kThreads - 1) / kThreads;
  const uint64_t cap = 132 * 16;
  if (b > cap) b = cap;
  return b ? (int)b : 1;
}

template <class C>
cudaError_t launch_cast(void *dst, const void *src, uint64_t n, cudaStream_t st) {
  typedef typename C::S S;
  typedef typename C::D D;
  D *d = static_cast<D *>(dst);
  const S *s = static_cast<const S *>(src);
  uint64_t head = 0;
  if (((uintptr_t)d % 16) == 0 && ((uintptr_t)s % 16) == 0) {
    uint64_t nvec = n / 8;
    if (nvec) cast_vec8<C><<<grid_for(nvec), kThreads, 0, st>>>(d, s, nvec);
    head = nvec * 8;
  }
  if (head < n) cast_scalar<C><<<grid_for(n - head), kThreads, 0, st>>>(d + head, s + head, n - head);
  return cudaGetLastError();
}

__device__ __forceinline__ uint16_t bf16_of(float f) { return f32_to_bf16(__float_as_uint(f)); }
__device__ __forceinline__ uint16_t f16_of(float f) { return f32_to_f16(__float_as_uint(f)); }

__global__ void fill_kernel(void *dst, int dtype, uint64_t n, uint64_t seed, uint32_t index) {
  const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float v = bcast__fill_value(seed, index, i);
    switch (dtype) {
    case FP32: static_cast<float *>(dst)[i] = v; break;
    case BF16: static_cast<uint16_t *>(dst)[i] = bf16_of(v); break;
    case FP16: static_cast<uint16_t *>(dst)[i] = f16_of(v); break;
    default: static_cast<uint16_t *>(dst)[i] = (uint16_t)(bcast__mix64(seed ^ i) & 0xFFFF); break;
    }
  }
}

} // namespace

extern "C" int bcast__cuda_cast_supported(int src, int dst) {
  if (src == dst) return src >= FP32 && src <= U16;
  return (src == FP32 && (dst == BF16 || dst == FP16)) || (src == BF16 && dst == FP32);
}

extern "C" int bcast__cuda_cast(void *dst, int dst_dtype, const void *src, int src_dtype,
                                uint64_t n, void *stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (n == 0) return 0;
  if (src_dtype == dst_dtype) {
    uint64_t bytes = n * (src_dtype == FP32 ? 4 : 2);
    return (int)cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, st);
  }
  if (src_dtype == FP32 && dst_dtype == BF16) return (int)launch_cast<cvt_f32_bf16>(dst, src, n, st);
  if (src_dtype == FP32 && dst_dtype == FP16) return (int)launch_cast<cvt_f32_f16>(dst, src, n, st);
  if (src_dtype == BF16 && dst_dtype == FP32) return (int)launch_cast<cvt_bf16_f32>(dst, src, n, st);
  return (int)cudaErrorInvalidValue;
}

extern "C" int bcast__cuda_fill(void *dst, int dtype, uint64_t n, uint64_t seed, uint32_t index,
                                void *stream) {
  if (n == 0) return 0;
  fill_kernel<<<grid_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(dst, dtype, n, seed,
                                                                              index);
  return (int)cudaGetLastError();
}
