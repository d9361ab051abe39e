/* agent_adamw: one AdamW step on fp32 master weights, with a synthetic
 * gradient derived from (seed, global element index) by a counter-based hash.
 *
 * The update follows torch.optim.AdamW: decoupled weight decay, then the Adam
 * step with bias correction by the number of steps taken. The gradient and the
 * update are the same code on CPU and GPU (agent_adamw_math.h); the CPU path
 * splits the element range over threads at fixed 64-element boundaries, so the
 * result does not depend on the thread count.
 *
 * The bf16 shadow: a span may carry a second buffer that the CPU step fills
 * with the bf16 copy of each weight it has just updated, in the same pass (the
 * weight is still in a register), rounded to nearest even exactly as the
 * broadcast engine's fp32 -> bf16 cast (bcast_cast_cpu): a sender that hands
 * the engine the shadow as its storage sends, and checksums, the very bytes
 * the engine would have made from the fp32 weights, with half the bytes to
 * move and no cast left to do. */
#ifndef RLORCH_AGENT_ADAMW_H
#define RLORCH_AGENT_ADAMW_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct agent_adamw_hparams {
  double lr, beta1, beta2, eps, weight_decay;
} agent_adamw_hparams;

/* lr 1e-5, betas 0.9 / 0.999, eps 1e-8, weight decay 0.01. */
void agent_adamw_defaults(agent_adamw_hparams *hp);

/* The per-step scalars every element uses, in fp32 (computed in double). */
typedef struct agent_adamw_coef {
  float beta1, beta2;          /* moment decay */
  float one_minus_beta1, one_minus_beta2;
  float step_size;             /* lr / (1 - beta1^t) */
  float bc2_sqrt;              /* sqrt(1 - beta2^t) */
  float eps;
  float decay;                 /* 1 - lr * weight_decay */
  uint64_t seed;               /* gradient seed */
} agent_adamw_coef;

/* t: number of this step, from 1. Returns -1 when t is 0 or a hyperparameter
 * is out of range (betas in [0,1), lr, eps > 0, weight decay >= 0). */
int agent_adamw_coef_for_step(const agent_adamw_hparams *hp, uint64_t t, uint64_t seed,
                              agent_adamw_coef *c);

/* The synthetic gradient of global element `index` for `seed`: a multiple of
 * 2^-30 in [-2^-7, 2^-7), exact in fp32. */
float agent_adamw_grad(uint64_t seed, uint64_t index);

/* One contiguous run of parameters with its optimizer state. first_index is the
 * global index of p[0] (the gradient's counter); m, v start at zero. shadow:
 * NULL, or n bf16 values the CPU step writes (see above); it must not overlap
 * p, m or v. */
typedef struct agent_adamw_span {
  float *p, *m, *v;
  uint64_t n;
  uint64_t first_index;
  uint16_t *shadow;
} agent_adamw_span;

/* CPU step over every span with `threads` threads (<= 0: one per online CPU).
 * Returns 0, or -1 when a thread could not be started (nothing is then
 * half-updated: the calling thread finishes the work itself). */
int agent_adamw_cpu(const agent_adamw_coef *c, const agent_adamw_span *spans, size_t nspans,
                    int threads);

/* Writes every span's shadow from its p without a step (spans without one
 * are skipped): the first shadow, before any step, or after p was changed
 * by other means. Threads as agent_adamw_cpu. */
int agent_adamw_shadow_cpu(const agent_adamw_span *spans, size_t nspans, int threads);

/* The shadow's cast itself, on one thread: dst[i] = bf16 of src[i], the
 * instructions the step runs (so tests can hold them to bcast_cast_cpu on any
 * bit pattern). dst and src must not overlap. */
void agent_adamw_bf16(uint16_t *dst, const float *src, size_t n);

/* GPU step: the spans' pointers are device memory of the current device.
 * A span with a shadow is refused: the engine casts GPU weights itself.
 * Returns 0, or -1 with a message in err (always -1 without CUDA). */
int agent_adamw_gpu(const agent_adamw_coef *c, const agent_adamw_span *spans, size_t nspans,
                    char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
