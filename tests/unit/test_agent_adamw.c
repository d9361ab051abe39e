/* AdamW of the trainer agent: against a double-precision reference, thread
 * count independence, gradient determinism. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "workers/agent/agent_adamw.h"

/* torch.optim.AdamW in double precision, one element at a time. */
static void ref_step(const agent_adamw_hparams *hp, uint64_t t, uint64_t seed, double *p,
                     double *m, double *v, uint64_t first, size_t n) {
  double bc1 = 1 - pow(hp->beta1, (double)t), bc2 = 1 - pow(hp->beta2, (double)t);
  for (size_t i = 0; i < n; i++) {
    double g = agent_adamw_grad(seed, first + i);
    p[i] *= 1 - hp->lr * hp->weight_decay;
    m[i] = hp->beta1 * m[i] + (1 - hp->beta1) * g;
    v[i] = hp->beta2 * v[i] + (1 - hp->beta2) * g * g;
    p[i] -= (hp->lr / bc1) * m[i] / (sqrt(v[i]) / sqrt(bc2) + hp->eps);
  }
}

typedef struct model {
  size_t n;
  float *p, *m, *v;
} model;

static model model_new(size_t n, uint64_t init_seed) {
  model md = {n, calloc(n, 4), calloc(n, 4), calloc(n, 4)};
  cr_assert(md.p && md.m && md.v);
  for (size_t i = 0; i < n; i++) md.p[i] = agent_adamw_grad(init_seed, i) * 8; /* +-1/16 */
  return md;
}

static void model_free(model *md) {
  free(md->p);
  free(md->m);
  free(md->v);
}

/* Splits the model into uneven spans (tensors) with global indices from `base`. */
static size_t spans_of(model *md, uint64_t base, agent_adamw_span *sp, size_t cap) {
  static const size_t sizes[] = {1, 63, 64, 65, 1000, 7, 4097};
  size_t off = 0, k = 0;
  while (off < md->n && k < cap) {
    size_t len = sizes[k % 7];
    if (k == cap - 1 || len > md->n - off) len = md->n - off;
    sp[k] = (agent_adamw_span){md->p + off, md->m + off, md->v + off, len, base + off};
    off += len;
    k++;
  }
  return k;
}

Test(agent_adamw, matches_double_reference) {
  agent_adamw_hparams hp;
  agent_adamw_defaults(&hp);
  hp.lr = 1e-3; /* larger than the default so the change is far above rounding */
  const size_t n = 20000;
  model md = model_new(n, 99);
  double *p = malloc(n * 8), *m = calloc(n, 8), *v = calloc(n, 8);
  for (size_t i = 0; i < n; i++) p[i] = md.p[i];
  agent_adamw_span sp[64];
  size_t ns = spans_of(&md, 0, sp, 64);
  for (uint64_t t = 1; t <= 5; t++) {
    agent_adamw_coef c;
    cr_assert_eq(agent_adamw_coef_for_step(&hp, t, 1000 + t, &c), 0);
    cr_assert_eq(agent_adamw_cpu(&c, sp, ns, 3), 0);
    ref_step(&hp, t, 1000 + t, p, m, v, 0, n);
  }
  /* fp32 weights near 1/16 have an ulp of 2^-28 (~4e-9); five steps of a few
   * roundings each stay well inside 1e-7, while each step moves a weight by
   * about lr = 1e-3. */
  double max_abs = 0, moved = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)md.p[i] - p[i]);
    if (d > max_abs) max_abs = d;
    moved += fabs(p[i] - (double)(agent_adamw_grad(99, i) * 8));
  }
  cr_assert_lt(max_abs, 1e-7, "largest absolute error %g", max_abs);
  cr_assert_gt(moved / (double)n, 1e-3, "the weights barely moved: %g", moved / (double)n);
  free(p);
  free(m);
  free(v);
  model_free(&md);
}

Test(agent_adamw, default_hparams_move_weights_by_about_lr) {
  agent_adamw_hparams hp;
  agent_adamw_defaults(&hp);
  cr_assert_float_eq(hp.lr, 1e-5, 1e-12);
  cr_assert_float_eq(hp.beta1, 0.9, 1e-12);
  cr_assert_float_eq(hp.beta2, 0.999, 1e-12);
  cr_assert_float_eq(hp.eps, 1e-8, 1e-15);
  cr_assert_float_eq(hp.weight_decay, 0.01, 1e-12);
  model md = model_new(4096, 5);
  float *before = malloc(4096 * 4);
  memcpy(before, md.p, 4096 * 4);
  agent_adamw_span sp = {md.p, md.m, md.v, md.n, 0};
  agent_adamw_coef c;
  cr_assert_eq(agent_adamw_coef_for_step(&hp, 1, 7, &c), 0);
  cr_assert_eq(agent_adamw_cpu(&c, &sp, 1, 2), 0);
  /* First Adam step: |update| = lr * |g| / (|g| + eps) ~ lr, sign opposite to g. */
  for (size_t i = 0; i < 4096; i++) {
    double g = agent_adamw_grad(7, i);
    if (g == 0) continue;
    double delta = (double)md.p[i] - before[i] * (1 - 1e-7);
    cr_assert(delta * g < 0, "element %zu moved with the gradient", i);
    cr_assert(fabs(fabs(delta) - 1e-5) < 2e-7, "element %zu moved by %g", i, delta);
  }
  free(before);
  model_free(&md);
}

Test(agent_adamw, threads_match_single_thread_bit_for_bit) {
  agent_adamw_hparams hp;
  agent_adamw_defaults(&hp);
  const size_t n = 100003;
  model a = model_new(n, 3), b = model_new(n, 3);
  agent_adamw_span sa[128], sb[128];
  /* Global indices around 2^32 so a block crosses a gradient-key boundary. */
  uint64_t base = (UINT64_C(1) << 32) - 50000;
  size_t na = spans_of(&a, base, sa, 128), nb = spans_of(&b, base, sb, 128);
  int counts[] = {2, 3, 7, 16};
  for (uint64_t t = 1; t <= 3; t++) {
    agent_adamw_coef c;
    cr_assert_eq(agent_adamw_coef_for_step(&hp, t, t * 77, &c), 0);
    cr_assert_eq(agent_adamw_cpu(&c, sa, na, 1), 0);
    cr_assert_eq(agent_adamw_cpu(&c, sb, nb, counts[t]), 0);
  }
  cr_assert(memcmp(a.p, b.p, n * 4) == 0, "weights differ");
  cr_assert(memcmp(a.m, b.m, n * 4) == 0, "first moments differ");
  cr_assert(memcmp(a.v, b.v, n * 4) == 0, "second moments differ");
  model_free(&a);
  model_free(&b);
}

Test(agent_adamw, vector_lanes_match_scalar_reference) {
  /* Spans of every length 1..40 exercise the vector body and the scalar tail. */
  agent_adamw_hparams hp;
  agent_adamw_defaults(&hp);
  agent_adamw_coef c;
  cr_assert_eq(agent_adamw_coef_for_step(&hp, 1, 11, &c), 0);
  for (size_t len = 1; len <= 40; len++) {
    model md = model_new(len, 1);
    agent_adamw_span sp = {md.p, md.m, md.v, len, 1000};
    cr_assert_eq(agent_adamw_cpu(&c, &sp, 1, 1), 0);
    for (size_t i = 0; i < len; i++) {
      float g = agent_adamw_grad(11, 1000 + i);
      float mi = c.one_minus_beta1 * g, vi = c.one_minus_beta2 * (g * g);
      float p0 = agent_adamw_grad(1, i) * 8;
      float want = p0 * c.decay - c.step_size * (mi / (sqrtf(vi) / c.bc2_sqrt + c.eps));
      cr_assert(md.p[i] == want, "len %zu element %zu: %a != %a", len, i, md.p[i], want);
    }
    model_free(&md);
  }
}

Test(agent_adamw, gradient_is_deterministic_and_seeded) {
  size_t differ_seed = 0, differ_index = 0, nonzero = 0;
  for (uint64_t i = 0; i < 10000; i++) {
    float g = agent_adamw_grad(42, i);
    cr_assert(g == agent_adamw_grad(42, i));
    cr_assert(g >= -0.0078125f && g < 0.0078125f, "gradient %g out of range", g);
    differ_seed += g != agent_adamw_grad(43, i);
    differ_index += g != agent_adamw_grad(42, i + 1);
    nonzero += g != 0;
  }
  cr_assert_gt(differ_seed, 9900);
  cr_assert_gt(differ_index, 9900);
  cr_assert_gt(nonzero, 9900);
  /* The high word of the index matters too. */
  cr_assert(agent_adamw_grad(42, 5) != agent_adamw_grad(42, (UINT64_C(1) << 32) + 5));
  /* Mean near zero: a symmetric distribution. */
  double sum = 0;
  for (uint64_t i = 0; i < 100000; i++) sum += agent_adamw_grad(9, i);
  cr_assert_lt(fabs(sum / 100000), 1e-4);
}

Test(agent_adamw, rejects_bad_hparams) {
  agent_adamw_hparams hp;
  agent_adamw_coef c;
  agent_adamw_defaults(&hp);
  cr_assert_eq(agent_adamw_coef_for_step(&hp, 0, 1, &c), -1, "step 0");
  hp.beta1 = 1.0;
  cr_assert_eq(agent_adamw_coef_for_step(&hp, 1, 1, &c), -1, "beta1 1");
  agent_adamw_defaults(&hp);
  hp.lr = NAN;
  cr_assert_eq(agent_adamw_coef_for_step(&hp, 1, 1, &c), -1, "lr NaN");
  agent_adamw_defaults(&hp);
  hp.eps = 0;
  cr_assert_eq(agent_adamw_coef_for_step(&hp, 1, 1, &c), -1, "eps 0");
}

Test(agent_adamw, empty_input_is_fine) {
  agent_adamw_hparams hp;
  agent_adamw_coef c;
  agent_adamw_defaults(&hp);
  cr_assert_eq(agent_adamw_coef_for_step(&hp, 1, 1, &c), 0);
  cr_assert_eq(agent_adamw_cpu(&c, NULL, 0, 4), 0);
}
