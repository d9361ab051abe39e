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

/* agent__bf16_bits lane by lane, in two parts so that the common case pays
 * only for the rounding. agent__vec_bf16_round: the rounding of a vector
 * without NaN lanes, left in 32-bit lanes as the bf16 bits sign-extended (an
 * arithmetic shift by 16 keeps every lane in the int16 range, so a saturating
 * pack, SSE2 packssdw, narrows two vectors exactly). agent__vec_bf16_quiet:
 * NaN lanes replaced by sign | 0x7FC00000, whose rounding is the engine's NaN
 * (sign | 0x7FC0); run only when a lane is NaN, which a model's weights never
 * are until training has diverged. */
static inline agent__veci agent__vec_bf16_round(agent__vecf f) {
  agent__veci x = (agent__veci)f;
  return (x + 0x7fff + (agent__veci)(((agent__vecu)x >> 16) & 1U)) >> 16;
}

static inline agent__vecf agent__vec_bf16_quiet(agent__vecf f) {
  const agent__veci sign = (agent__veci){0} + INT32_MIN, qnan = (agent__veci){0} + 0x7fc00000;
  agent__veci x = (agent__veci)f;
  agent__veci is_nan = f != f; /* a lane compare: all ones or zero */
  return (agent__vecf)(x ^ ((x ^ ((x & sign) | qnan)) & is_nan));
}

static inline int agent__vec_any_nan(agent__vecf a, agent__vecf b) {
#if AGENT__VW == 4 && defined(__SSE2__)
  return _mm_movemask_ps(_mm_or_ps(_mm_cmpunord_ps((__m128)a, (__m128)a),
                                   _mm_cmpunord_ps((__m128)b, (__m128)b))) != 0;
#else
  agent__veci m = (a != a) | (b != b);
  int any = 0;
  for (int k = 0; k < AGENT__VW; k++) any |= m[k];
  return any != 0;
#endif
}

/* Stores the bf16 of 2 * AGENT__VW lanes at dst: one 16-byte store with SSE2.
 * (Non-temporal stores, which skip reading the line before writing it, were
 * measured no faster: the step is bound by its arithmetic, not memory.) */
static inline void agent__vec_bf16_store2(uint16_t *dst, agent__vecf a, agent__vecf b) {
  if (__builtin_expect(agent__vec_any_nan(a, b), 0)) {
    a = agent__vec_bf16_quiet(a);
    b = agent__vec_bf16_quiet(b);
  }
#if AGENT__VW == 4 && defined(__SSE2__)
  _mm_storeu_si128((__m128i *)(void *)dst, _mm_packs_epi32((__m128i)agent__vec_bf16_round(a),
                                                            (__m128i)agent__vec_bf16_round(b)));
#else
  agent__vech ha = __builtin_convertvector(agent__vec_bf16_round(a), agent__vech);
  agent__vech hb = __builtin_convertvector(agent__vec_bf16_round(b), agent__vech);
  memcpy(dst, &ha, sizeof ha);
  memcpy(dst + AGENT__VW, &hb, sizeof hb);
#endif
}

/* The lanes left after the pairs: one vector, branch-free. */
static inline void agent__vec_bf16_store1(uint16_t *dst, agent__vecf a) {
  agent__vech h =
      __builtin_convertvector(agent__vec_bf16_round(agent__vec_bf16_quiet(a)), agent__vech);
  memcpy(dst, &h, sizeof h);
}

/* The per-step scalars, broadcast once per block. */
typedef struct agent__k {
  float b1, b2, omb1, omb2, step, bc2s, eps, decay;
  uint32_t key, lo0;
} agent__k;

/* Lanes [i, i + AGENT__VW) of the step; returns the new weights. */
static inline __attribute__((always_inline)) agent__vecf
agent__vec_step(const agent__k *k, float *restrict p, float *restrict m, float *restrict v,
                size_t i) {
#if AGENT__VW == 8
  const agent__vecu lane = {0, 1, 2, 3, 4, 5, 6, 7};
#else
  const agent__vecu lane = {0, 1, 2, 3};
#endif
  agent__vecf pv, mv, vv;
  memcpy(&pv, p + i, sizeof pv);
  memcpy(&mv, m + i, sizeof mv);
  memcpy(&vv, v + i, sizeof vv);
  agent__vecu h = agent__vec_mix32((k->lo0 + (uint32_t)i + lane) ^ k->key);
  agent__veci s = (agent__veci)(h >> 8) - 8388608;
  agent__vecf g = __builtin_convertvector(s, agent__vecf) * (1.0f / 1073741824.0f);
  mv = k->b1 * mv + k->omb1 * g;
  vv = k->b2 * vv + k->omb2 * (g * g);
  agent__vecf denom = agent__vec_sqrt(vv) / k->bc2s + k->eps;
  pv = pv * k->decay - k->step * (mv / denom);
  memcpy(p + i, &pv, sizeof pv);
  memcpy(m + i, &mv, sizeof mv);
  memcpy(v + i, &vv, sizeof vv);
  return pv;
}

/* One block of the step; sh is NULL or the block's shadow. Inlined into two
 * callers, one passing NULL, so the loop without a shadow has no trace of it,
 * and the one with it casts the updated lanes while they are in registers:
 * no second pass over p. */
static inline __attribute__((always_inline)) void
agent__adamw_block_sh(const agent_adamw_coef *c, uint32_t key, uint32_t lo0, float *restrict p,
                      float *restrict m, float *restrict v, uint16_t *restrict sh, size_t n) {
  const agent__k k = {c->beta1, c->beta2, c->one_minus_beta1, c->one_minus_beta2,
                      c->step_size, c->bc2_sqrt, c->eps, c->decay, key, lo0};
  /* Two vectors per iteration: the shadow of both is one 16-byte store. */
  size_t i = 0;
  for (; i + 2 * AGENT__VW <= n; i += 2 * AGENT__VW) {
    agent__vecf a = agent__vec_step(&k, p, m, v, i);
    agent__vecf b = agent__vec_step(&k, p, m, v, i + AGENT__VW);
    if (sh) agent__vec_bf16_store2(sh + i, a, b);
  }
  for (; i + AGENT__VW <= n; i += AGENT__VW) {
    agent__vecf a = agent__vec_step(&k, p, m, v, i);
    if (sh) agent__vec_bf16_store1(sh + i, a);
  }
  for (; i < n; i++) {
    float g = agent__grad(key, lo0 + (uint32_t)i);
    float mi = k.b1 * m[i] + k.omb1 * g;
    float vi = k.b2 * v[i] + k.omb2 * (g * g);
    float denom = sqrtf(vi) / k.bc2s + k.eps;
    float pi = p[i] * k.decay - k.step * (mi / denom);
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
  for (; i + 2 * AGENT__VW <= n; i += 2 * AGENT__VW) {
    agent__vecf a, b;
    memcpy(&a, src + i, sizeof a);
    memcpy(&b, src + i + AGENT__VW, sizeof b);
    agent__vec_bf16_store2(dst + i, a, b);
  }
  for (; i + AGENT__VW <= n; i += AGENT__VW) {
    agent__vecf a;
    memcpy(&a, src + i, sizeof a);
    agent__vec_bf16_store1(dst + i, a);
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
