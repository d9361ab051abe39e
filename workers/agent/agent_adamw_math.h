/* The element-wise math of agent_adamw, shared by the C and CUDA sources so the
 * gradient and the update are the same expressions on both. Internal. */
#ifndef RLORCH_AGENT_ADAMW_MATH_H
#define RLORCH_AGENT_ADAMW_MATH_H

#include <stdint.h>

#ifdef __CUDACC__
#define AGENT__HD __host__ __device__ __forceinline__
#else
#define AGENT__HD static inline
#endif

/* 32-bit integer mixer (a bijection): 32-bit products vectorise on every x86
 * vector unit, 64-bit ones do not before AVX-512. */
AGENT__HD uint32_t agent__mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

/* Key of the block of 2^32 elements whose indices share the high word. */
AGENT__HD uint32_t agent__grad_key(uint64_t seed, uint32_t hi) {
  uint32_t k = agent__mix32(hi + 0x9e3779b9U);
  k = agent__mix32((uint32_t)(seed >> 32) ^ k);
  return agent__mix32((uint32_t)seed ^ k);
}

/* 24 signed bits times 2^-30: exact in fp32. */
AGENT__HD float agent__grad(uint32_t key, uint32_t lo) {
  uint32_t h = agent__mix32(lo ^ key);
  int32_t s = (int32_t)(h >> 8) - 8388608;
  return (float)s * (1.0f / 1073741824.0f);
}

/* fp32 bits -> bf16 bits, the broadcast engine's rule (bcast_cast.c): round
 * to nearest even on the top 16 bits (finite values past the largest bf16
 * become inf), NaN -> 0x7FC0 with its sign. The vector form in agent_adamw.c
 * is the same expression lane by lane. */
AGENT__HD uint16_t agent__bf16_bits(uint32_t x) {
  if ((x & 0x7fffffffU) > 0x7f800000U) return (uint16_t)(((x >> 16) & 0x8000U) | 0x7fc0U);
  return (uint16_t)((x + 0x7fffU + ((x >> 16) & 1U)) >> 16);
}

#endif
