/* AdamW on the GPU: one grid-stride kernel per span, the same element math as
 * the CPU path (agent_adamw_math.h). */
#include <cuda_runtime.h>
#include <stdio.h>

#include "workers/agent/agent_adamw.h"
#include "workers/agent/agent_adamw_math.h"

/* Elements [0, n) of a span whose global indices start at first and do not
 * cross a 2^32 boundary (the caller splits there). */
__global__ void agent__adamw_kernel(agent_adamw_coef c, uint32_t key, uint32_t lo0,
                                    float *__restrict__ p, float *__restrict__ m,
                                    float *__restrict__ v, uint64_t n) {
  uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float g = agent__grad(key, lo0 + (uint32_t)i);
    float mi = c.beta1 * m[i] + c.one_minus_beta1 * g;
    float vi = c.beta2 * v[i] + c.one_minus_beta2 * (g * g);
    float denom = sqrtf(vi) / c.bc2_sqrt + c.eps;
    p[i] = p[i] * c.decay - c.step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
  }
}

extern "C" int agent_adamw_gpu(const agent_adamw_coef *c, const agent_adamw_span *spans,
                               size_t nspans, char *err, size_t errlen) {
  const unsigned threads = 256;
  for (size_t s = 0; s < nspans; s++)
    if (spans[s].shadow) {
      snprintf(err, errlen, "AdamW on GPU: span %zu has a bf16 shadow, which only the CPU step "
               "writes (the engine casts GPU weights itself)", s);
      return -1;
    }
  for (size_t s = 0; s < nspans; s++) {
    uint64_t off = 0, n = spans[s].n;
    while (off < n) {
      uint64_t idx = spans[s].first_index + off;
      uint64_t room = (1ull << 32) - (uint32_t)idx;
      uint64_t k = n - off < room ? n - off : room;
      uint64_t blocks = (k + threads - 1) / threads;
      if (blocks > 65535u * 16u) blocks = 65535u * 16u;
      agent__adamw_kernel<<<(unsigned)blocks, threads>>>(
          *c, agent__grad_key(c->seed, (uint32_t)(idx >> 32)), (uint32_t)idx,
          spans[s].p + off, spans[s].m + off, spans[s].v + off, k);
      cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) {
        snprintf(err, errlen, "AdamW kernel launch (span %zu): %s", s, cudaGetErrorString(e));
        return -1;
      }
      off += k;
    }
  }
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    snprintf(err, errlen, "AdamW kernel: %s", cudaGetErrorString(e));
    return -1;
  }
  return 0;
}
