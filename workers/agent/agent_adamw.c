/* AdamW on the CPU: one thread per core, a loop the compiler vectorises, and
 * the bf16 shadow written from the updated lanes in the same loop. */
#include "workers/agent/agent_adamw.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "workers/agent/agent_adamw_math.h"

#if defined(__AVX__) || defined(__SSE__)
#include <immintrin.h>
#endif

/* Threads split the element range at multiples of this, so every thread's
 * share starts on a cache line and the split never depends on data. */
#define AGENT__ADAMW_ALIGN 64u

void agent_adamw_defaults(agent_adamw_hparams *hp) {
  hp->lr = 1e-5;
  hp->beta1 = 0.9;
  hp->beta2 = 0.999;
  hp->eps = 1e-8;
  hp->weight_decay = 0.01;
}

int agent_adamw_coef_for_step(const agent_adamw_hparams *hp, uint64_t t, uint64_t seed,
                              agent_adamw_coef *c) {
  if (t == 0 || !(hp->lr > 0) || !(hp->eps > 0) || !(hp->weight_decay >= 0) ||
      !(hp->beta1 >= 0 && hp->beta1 < 1) || !(hp->beta2 >= 0 && hp->beta2 < 1))
    return -1;
  double bc1 = 1.0 - pow(hp->beta1, (double)t);
  double bc2 = 1.0 - pow(hp->beta2, (double)t);
  c->beta1 = (float)hp->beta1;
  c->beta2 = (float)hp->beta2;
  c->one_minus_beta1 = (float)(1.0 - hp->beta1);
  c->one_minus_beta2 = (float)(1.0 - hp->beta2);
  c->step_size = (float)(hp->lr / bc1);
  c->bc2_sqrt = (float)sqrt(bc2);
  c->eps = (float)hp->eps;
  c->decay = (float)(1.0 - hp->lr * hp->weight_decay);
  c->seed = seed;
  return 0;
}

float agent_adamw_grad(uint64_t seed, uint64_t index) {
  return agent__grad(agent__grad_key(seed, (uint32_t)(index >> 32)), (uint32_t)index);
}

/* The hot loop. sqrtf may set errno, which keeps the compiler from
 * vectorising a plain loop, so the body is written with vector extensions,
 * 4 or 8 lanes at a time, and the square root taken with the vector unit's
 * instruction (correctly rounded like sqrtf: lanes and tail agree bit for bit). */
#if defined(__AVX__)
#define AGENT__VW 8 /* lanes */
#else
#define AGENT__VW 4
#endif
typedef float agent__vecf __attribute__((vector_size(AGENT__VW * 4)));
typedef uint32_t agent__vecu __attribute__((vector_size(AGENT__VW * 4)));
typedef int32_t agent__veci __attribute__((vector_size(AGENT__VW * 4)));
typedef uint16_t agent__vech __attribute__((vector_size(AGENT__VW * 2)));

static inline agent__vecf agent__vec_sqrt(agent__vecf x) {
#if defined(__AVX__)
  return (agent__vecf)_mm256_sqrt_ps((__m256)x);
#elif defined(__SSE__)
  return (agent__vecf)_mm_sqrt_ps((__m128)x);
#else
  for (int k = 0; k < AGENT__VW; k++) x[k] = sqrtf(x[k]);
  return x;
#endif
}

static inline agent__vecu agent__vec_mix32(agent__vecu x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

/* agent__bf16_bits lane by lane, branch-free: the NaN lanes are picked by a
 * mask (a lane compare gives all ones or zero). */
static inline agent__vech agent__vec_bf16(agent__vecf f) {
  const agent__vecu absm = (agent__vecu){0} + 0x7fffffffU;
  const agent__veci inf = (agent__veci){0} + 0x7f800000;
  agent__vecu x = (agent__vecu)f;
  agent__vecu hi = x >> 16;
  agent__vecu r = (x + 0x7fffU + (hi & 1U)) >> 16;
  agent__vecu is_nan = (agent__vecu)((agent__veci)(x & absm) > inf);
  agent__vecu q = (hi & 0x8000U) | 0x7fc0U;
  return __builtin_convertvector((r & ~is_nan) | (q & is_nan), agent__vech);
}

/* One block of the step; sh is NULL or the block's shadow. Inlined into two
 * callers, one passing NULL, so the loop without a shadow is the loop it was
 * and the one with it does the cast on the updated lanes before storing them:
 * no second pass over p. */
static inline __attribute__((always_inline)) void
agent__adamw_block_sh(const agent_adamw_coef *c, uint32_t key, uint32_t lo0, float *restrict p,
                      float *restrict m, float *restrict v, uint16_t *restrict sh, size_t n) {
  const float b1 = c->beta1, b2 = c->beta2, omb1 = c->one_minus_beta1, omb2 = c->one_minus_beta2;
  const float step = c->step_size, bc2s = c->bc2_sqrt, eps = c->eps, decay = c->decay;
#if AGENT__VW == 8
  const agent__vecu lane = {0, 1, 2, 3, 4, 5, 6, 7};
#else
  const agent__vecu lane = {0, 1, 2, 3};
#endif
  size_t i = 0;
  for (; i + AGENT__VW <= n; i += AGENT__VW) {
    agent__vecf pv, mv, vv;
    memcpy(&pv, p + i, sizeof pv);
    memcpy(&mv, m + i, sizeof mv);
    memcpy(&vv, v + i, sizeof vv);
    agent__vecu h = agent__vec_mix32((lo0 + (uint32_t)i + lane) ^ key);
    agent__veci s = (agent__veci)(h >> 8) - 8388608;
    agent__vecf g = __builtin_convertvector(s, agent__vecf) * (1.0f / 1073741824.0f);
    mv = b1 * mv + omb1 * g;
    vv = b2 * vv + omb2 * (g * g);
    agent__vecf denom = agent__vec_sqrt(vv) / bc2s + eps;
    pv = pv * decay - step * (mv / denom);
    memcpy(p + i, &pv, sizeof pv);
    memcpy(m + i, &mv, sizeof mv);
    memcpy(v + i, &vv, sizeof vv);
    if (sh) {
      agent__vech b = agent__vec_bf16(pv);
      memcpy(sh + i, &b, sizeof b);
    }
  }
  for (; i < n; i++) {
    float g = agent__grad(key, lo0 + (uint32_t)i);
    float mi = b1 * m[i] + omb1 * g;
    float vi = b2 * v[i] + omb2 * (g * g);
    float denom = sqrtf(vi) / bc2s + eps;
    float pi = p[i] * decay - step * (mi / denom);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (sh) {
      uint32_t u;
      memcpy(&u, &pi, sizeof u);
      sh[i] = agent__bf16_bits(u);
    }
  }
}

static void agent__adamw_block(const agent_adamw_coef *c, uint32_t key, uint32_t lo0,
                               float *restrict p, float *restrict m, float *restrict v,
                               uint16_t *restrict sh, size_t n) {
  if (sh)
    agent__adamw_block_sh(c, key, lo0, p, m, v, sh, n);
  else
    agent__adamw_block_sh(c, key, lo0, p, m, v, NULL, n);
}

void agent_adamw_bf16(uint16_t *restrict dst, const float *restrict src, size_t n) {
  size_t i = 0;
  for (; i + AGENT__VW <= n; i += AGENT__VW) {
    agent__vecf f;
    memcpy(&f, src + i, sizeof f);
    agent__vech b = agent__vec_bf16(f);
    memcpy(dst + i, &b, sizeof b);
  }
  for (; i < n; i++) {
    uint32_t u;
    memcpy(&u, src + i, sizeof u);
    dst[i] = agent__bf16_bits(u);
  }
}

/* Elements [first, first + n) of one span; blocks never cross a 2^32 boundary
 * of the global index, where the gradient key changes. Without coefficients
 * (c NULL) only the shadow is written from p. */
static void agent__adamw_run(const agent_adamw_coef *c, const agent_adamw_span *s, uint64_t off,
                             uint64_t n) {
  if (!c) {
    if (s->shadow) agent_adamw_bf16(s->shadow + off, s->p + off, (size_t)n);
    return;
  }
  while (n > 0) {
    uint64_t idx = s->first_index + off;
    uint64_t room = (UINT64_C(1) << 32) - (uint32_t)idx;
    uint64_t k = n < room ? n : room;
    agent__adamw_block(c, agent__grad_key(c->seed, (uint32_t)(idx >> 32)), (uint32_t)idx,
                       s->p + off, s->m + off, s->v + off, s->shadow ? s->shadow + off : NULL,
                       (size_t)k);
    off += k;
    n -= k;
  }
}

typedef struct agent__adamw_job {
  const agent_adamw_coef *c;
  const agent_adamw_span *spans;
  size_t nspans;
  uint64_t begin, end; /* positions in the concatenation of the spans */
} agent__adamw_job;

static void agent__adamw_job_run(const agent__adamw_job *j) {
  uint64_t base = 0;
  for (size_t i = 0; i < j->nspans && base < j->end; i++) {
    const agent_adamw_span *s = &j->spans[i];
    uint64_t lo = j->begin > base ? j->begin - base : 0;
    uint64_t hi = j->end - base < s->n ? j->end - base : s->n;
    if (lo < hi) agent__adamw_run(j->c, s, lo, hi - lo);
    base += s->n;
  }
}

static void *agent__adamw_thread(void *arg) {
  agent__adamw_job_run(arg);
  return NULL;
}

static int agent__adamw_threads(const agent_adamw_coef *c, const agent_adamw_span *spans,
                                size_t nspans, int threads) {
  uint64_t total = 0;
  for (size_t i = 0; i < nspans; i++) total += spans[i].n;
  if (threads <= 0) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    threads = online > 0 ? (int)online : 1;
  }
  uint64_t units = (total + AGENT__ADAMW_ALIGN - 1) / AGENT__ADAMW_ALIGN;
  if ((uint64_t)threads > units) threads = units > 0 ? (int)units : 1;
  if (threads > 1024) threads = 1024;

  agent__adamw_job *jobs = calloc((size_t)threads, sizeof *jobs);
  pthread_t *tids = calloc((size_t)threads, sizeof *tids);
  int *started = calloc((size_t)threads, sizeof *started);
  if (!jobs || !tids || !started) {
    agent__adamw_job one = {c, spans, nspans, 0, total};
    agent__adamw_job_run(&one);
    free(jobs);
    free(tids);
    free(started);
    return -1;
  }
  uint64_t per = units / (uint64_t)threads, extra = units % (uint64_t)threads, at = 0;
  for (int t = 0; t < threads; t++) {
    uint64_t u = per + ((uint64_t)t < extra ? 1 : 0);
    uint64_t end = at + u * AGENT__ADAMW_ALIGN;
    jobs[t] = (agent__adamw_job){c, spans, nspans, at, end < total ? end : total};
    at = jobs[t].end;
  }
  int rc = 0;
  for (int t = 1; t < threads; t++) {
    started[t] = pthread_create(&tids[t], NULL, agent__adamw_thread, &jobs[t]) == 0;
    if (!started[t]) rc = -1;
  }
  agent__adamw_job_run(&jobs[0]);
  for (int t = 1; t < threads; t++) {
    if (started[t])
      pthread_join(tids[t], NULL);
    else
      agent__adamw_job_run(&jobs[t]); /* the share of a thread that never started */
  }
  free(jobs);
  free(tids);
  free(started);
  return rc;
}

int agent_adamw_cpu(const agent_adamw_coef *c, const agent_adamw_span *spans, size_t nspans,
                    int threads) {
  return agent__adamw_threads(c, spans, nspans, threads);
}

int agent_adamw_shadow_cpu(const agent_adamw_span *spans, size_t nspans, int threads) {
  return agent__adamw_threads(NULL, spans, nspans, threads);
}

#ifndef RLORCH_HAVE_CUDA
#include <stdio.h>
int agent_adamw_gpu(const agent_adamw_coef *c, const agent_adamw_span *spans, size_t nspans,
                    char *err, size_t errlen) {
  (void)c, (void)spans, (void)nspans;
  snprintf(err, errlen, "AdamW on GPU: this build has no CUDA");
  return -1;
}
#endif
