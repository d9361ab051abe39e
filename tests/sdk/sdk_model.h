/* What the SDK test programs agree on, through rlorch.h alone: the tensors
 * (names, shapes, layers), the trainer's weights at each policy version, and
 * the made-up completions and rewards an inference program reports, so that
 * each side can check what the other one sent. */
#ifndef RLORCH_TESTS_SDK_MODEL_H
#define RLORCH_TESTS_SDK_MODEL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <rlorch/rlorch.h>

typedef struct sdk_model_tensor {
  const char *name;
  uint32_t layer;
  uint32_t ndim;
  uint64_t shape[2];
} sdk_model_tensor;

/* Three tensors over two layers, one of them with an odd element count. */
static const sdk_model_tensor SDK_MODEL[] = {
    {"embed.weight", 0, 2, {257, 16}},
    {"layers.0.mlp.weight", 0, 2, {64, 48}},
    {"layers.1.norm.weight", 1, 1, {1001, 0}},
};
#define SDK_MODEL_N (sizeof SDK_MODEL / sizeof SDK_MODEL[0])

static inline uint64_t sdk_model_elems(size_t k) {
  uint64_t e = 1;
  for (uint32_t d = 0; d < SDK_MODEL[k].ndim; d++) e *= SDK_MODEL[k].shape[d];
  return e;
}

/* Element i of tensor k at policy version v: every version changes every
 * element, and the values need all of bf16's rounding. */
static inline float sdk_model_value(uint64_t v, size_t k, uint64_t i) {
  return sinf((float)i * 0.37f + (float)k * 1.3f) * (1.0f + 0.25f * (float)v) +
         0.001f * (float)v;
}

/* fp32 -> bf16, rounding to nearest even (finite values). */
static inline uint16_t sdk_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* ---- completions: a function of (group id, index in the group, version) ---- */

#define SDK_MODEL_MAX_TOKENS 12

static inline size_t sdk_model_len(uint64_t group, uint32_t j) {
  return 3 + (size_t)((group * 5 + j) % 8);
}

static inline uint32_t sdk_model_token(uint64_t group, uint32_t j, size_t t) {
  return (uint32_t)((group * 31 + (uint64_t)j * 7 + t * 3) % 1000);
}

static inline float sdk_model_logprob(uint64_t group, uint32_t j, size_t t) {
  return -0.015625f * (float)(t + 1) - 0.0078125f * (float)j - 0.001f * (float)(group % 7);
}

/* Two rewards: one from the tokens, and the version that generated them. */
static inline double sdk_model_reward(uint64_t group, uint32_t j) {
  uint64_t s = 0;
  for (size_t t = 0; t < sdk_model_len(group, j); t++) s += sdk_model_token(group, j, t);
  return (double)(s % 100) / 100.0;
}

/* The rollout's metadata: which completion of which group, and who made it. */
static inline int sdk_model_meta(char *buf, size_t len, uint64_t group, uint32_t j,
                                 const char *worker) {
  return snprintf(buf, len, "g=%llu j=%u by=%s", (unsigned long long)group, j, worker);
}

/* rlorch_create and rlorch_start with o, then "started" on stdout (the test
 * script waits for that line); on failure the reason, and NULL. */
static inline rlorch_worker *sdk_model_start(const rlorch_options *o) {
  rlorch_worker *w = NULL;
  rlorch_error err;
  if (rlorch_create(o, &w, &err) || rlorch_start(w, &err)) {
    printf("FAIL start: %s: %s\n", rlorch_status_name(err.code), err.message);
    rlorch_free(w);
    return NULL;
  }
  printf("started\n");
  fflush(stdout);
  return w;
}

#endif
