/* AdamW of the trainer agent: against a double-precision reference, thread
 * count independence, gradient determinism; the bf16 shadow against the
 * broadcast engine's cast, and the update with a shadow against the one
 * without. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/agent/agent_adamw.h"
#include "workers/bcast/bcast.h"

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

/* ---- the bf16 shadow ------------------------------------------------------------ */

static float bits_f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Inputs the cast treats specially, each kept by the step as what it is:
 * NaNs (quiet, signalling, both signs, payloads), infinities, zeros,
 * subnormals (some that round up into the normals), the largest finite
 * values (which round to inf), and ties (even and odd kept bit). */
static const uint32_t specials[] = {
    0x7fc00000u, 0xffc00001u, 0x7f800001u, 0xff812345u, 0x7fffffffu, 0xffffffffu,
    0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu,
    0x00400000u, 0x00008000u, 0x00018000u, 0x007fffffu, 0x7f7fffffu, 0xff7fffffu,
    0x7f7f7fffu, 0x3f808000u, 0x3f818000u, 0xbf808000u, 0x3f80ffffu, 0x00ff8000u,
};
#define NSPECIALS (sizeof specials / sizeof specials[0])

/* A model whose every third weight is a special value, in varying lanes. */
static model model_special(size_t n, uint64_t init_seed) {
  model md = model_new(n, init_seed);
  for (size_t i = 0; i < n; i += 3) md.p[i] = bits_f(specials[(i / 3) % NSPECIALS]);
  return md;
}

/* The engine's cast of p, compared with the shadow bit for bit. */
static void assert_shadow_is_cast(const float *p, const uint16_t *sh, size_t n, const char *what) {
  uint16_t *want = malloc((n ? n : 1) * 2);
  cr_assert(want);
  cr_assert_eq(bcast_cast_cpu(want, BCAST_DTYPE_BF16, p, BCAST_DTYPE_FP32, n), BCAST_OK);
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &p[i], 4);
    cr_assert_eq(sh[i], want[i], "%s: element %zu (fp32 %08x): shadow %04x, engine %04x", what, i,
                 u, sh[i], want[i]);
  }
  free(want);
}

/* Lengths around the vector widths (4 and 8 lanes), the 64-element thread
 * split and the copy sizes; the last is many threads' worth. */
static const size_t shadow_sizes[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127,
                                      129, 1000, 4097, 100003};
#define NSIZES (sizeof shadow_sizes / sizeof shadow_sizes[0])

/* Steps with and without a shadow, several thread counts: the shadow is the
 * engine's cast of the fp32 result, and p, m and v are the bits they are
 * without a shadow. Two sets of hyperparameters: the defaults, and an lr of
 * 1e-40 without weight decay, whose step keeps subnormal weights subnormal
 * (the cast's subnormal path on updated values). */
static void shadow_vs_plain(const agent_adamw_hparams *hp, uint64_t base, const char *what) {
  for (size_t k = 0; k < NSIZES; k++) {
    size_t n = shadow_sizes[k];
    model a = model_special(n, 17), b = model_special(n, 17);
    if (hp->lr < 1e-30)
      for (size_t i = 1; i < n; i += 3) a.p[i] = b.p[i] = bits_f(0x00001234u + (uint32_t)i);
    uint16_t *sh = malloc(n * 2);
    cr_assert(sh);
    memset(sh, 0xa5, n * 2);
    agent_adamw_span sa[128], sb[128];
    size_t na = spans_of(&a, base, sa, 128), nb = spans_of(&b, base, sb, 128);
    for (size_t i = 0, off = 0; i < nb; off += sb[i].n, i++) sb[i].shadow = sh + off;
    int counts[] = {1, 3, 16};
    for (uint64_t t = 1; t <= 3; t++) {
      agent_adamw_coef c;
      cr_assert_eq(agent_adamw_coef_for_step(hp, t, 500 + t, &c), 0);
      cr_assert_eq(agent_adamw_cpu(&c, sa, na, counts[t - 1]), 0);
      cr_assert_eq(agent_adamw_cpu(&c, sb, nb, counts[3 - t]), 0);
      char label[96];
      snprintf(label, sizeof label, "%s, %zu elements, step %llu", what, n, (unsigned long long)t);
      cr_assert(memcmp(a.p, b.p, n * 4) == 0, "%s: weights differ with the shadow", label);
      cr_assert(memcmp(a.m, b.m, n * 4) == 0, "%s: first moments differ", label);
      cr_assert(memcmp(a.v, b.v, n * 4) == 0, "%s: second moments differ", label);
      assert_shadow_is_cast(b.p, sh, n, label);
    }
    free(sh);
    model_free(&a);
    model_free(&b);
  }
}

Test(agent_adamw, shadow_is_the_engine_cast_and_the_update_is_unchanged) {
  agent_adamw_hparams hp;
  agent_adamw_defaults(&hp);
  /* Global indices from 0 and from just below 2^32: a span then crosses a
   * gradient-key boundary, where the CPU path cuts a block in two. */
  shadow_vs_plain(&hp, 0, "defaults");
  shadow_vs_plain(&hp, (UINT64_C(1) << 32) - 40000, "defaults near 2^32");
  hp.lr = 1e-40;
  hp.weight_decay = 0;
  shadow_vs_plain(&hp, 7, "subnormal steps");
}

Test(agent_adamw, step_keeps_the_special_values_the_shadow_is_tested_on) {
  /* The comparison above means something only if specials reach the cast:
   * NaN stays NaN, inf stays inf, and the tiny-lr step keeps subnormals. */
  agent_adamw_hparams hp;
  agent_adamw_defaults(&hp);
  model md = model_special(300, 2);
  uint16_t sh[300];
  agent_adamw_span sp = {md.p, md.m, md.v, md.n, 0, sh};
  agent_adamw_coef c;
  cr_assert_eq(agent_adamw_coef_for_step(&hp, 1, 3, &c), 0);
  cr_assert_eq(agent_adamw_cpu(&c, &sp, 1, 2), 0);
  size_t nans = 0, infs = 0;
  for (size_t i = 0; i < 300; i++) nans += isnan(md.p[i]) != 0, infs += isinf(md.p[i]) != 0;
  cr_assert_geq(nans, 6 * 300 / 3 / NSPECIALS, "NaNs kept: %zu", nans);
  cr_assert_geq(infs, 2 * 300 / 3 / NSPECIALS, "infinities kept: %zu", infs);
  for (size_t i = 0; i < 300; i++)
    if (isnan(md.p[i])) cr_assert_eq(sh[i] & 0x7fffu, 0x7fc0u, "element %zu: NaN shadow", i);
  model_free(&md);

  hp.lr = 1e-40;
  hp.weight_decay = 0;
  model tiny = model_new(64, 4);
  for (size_t i = 0; i < 64; i++) tiny.p[i] = bits_f(0x00001234u + (uint32_t)i);
  agent_adamw_span st = {tiny.p, tiny.m, tiny.v, tiny.n, 0, sh};
  cr_assert_eq(agent_adamw_coef_for_step(&hp, 1, 3, &c), 0);
  cr_assert_eq(agent_adamw_cpu(&c, &st, 1, 1), 0);
  size_t sub = 0;
  for (size_t i = 0; i < 64; i++) sub += fpclassify(tiny.p[i]) == FP_SUBNORMAL;
  cr_assert_eq(sub, 64, "subnormal weights after the step: %zu of 64", sub);
  assert_shadow_is_cast(tiny.p, sh, 64, "subnormal");
  model_free(&tiny);
}

Test(agent_adamw, shadow_cast_matches_engine_on_bit_patterns) {
  /* Every sign, exponent and top mantissa (the 65536 high halves) with low
   * halves at and around the rounding tie, in and out of the vector lanes:
   * the instructions the step uses against bcast_cast_cpu. */
  static const uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff, 0x4321};
  const size_t nl = sizeof lows / sizeof lows[0], n = 65536 * nl;
  float *src = malloc(n * 4);
  uint16_t *got = malloc((n + 8) * 2), *want = malloc(n * 2);
  cr_assert(src && got && want);
  for (size_t h = 0; h < 65536; h++)
    for (size_t l = 0; l < nl; l++) src[h * nl + l] = bits_f(((uint32_t)h << 16) | lows[l]);
  cr_assert_eq(bcast_cast_cpu(want, BCAST_DTYPE_BF16, src, BCAST_DTYPE_FP32, n), BCAST_OK);
  /* Start offsets and lengths that are not multiples of the lane count. */
  for (size_t off = 0; off < 4; off++) {
    size_t len = n - off - (off * 5) % 7;
    memset(got, 0, (n + 8) * 2);
    agent_adamw_bf16(got + off, src + off, len);
    for (size_t i = off; i < off + len; i++) {
      uint32_t u;
      memcpy(&u, &src[i], 4);
      cr_assert_eq(got[i], want[i], "fp32 %08x: %04x, engine %04x", u, got[i], want[i]);
    }
    cr_assert_eq(got[off + len], 0, "wrote past the end (offset %zu)", off);
  }
  free(src);
  free(got);
  free(want);
}

Test(agent_adamw, shadow_cpu_writes_shadows_from_weights_only) {
  model md = model_special(5000, 8);
  float *p0 = malloc(5000 * 4);
  uint16_t *sh = malloc(5000 * 2);
  cr_assert(p0 && sh);
  memcpy(p0, md.p, 5000 * 4);
  memset(sh, 0xa5, 5000 * 2);
  for (size_t i = 0; i < 5000; i++) md.m[i] = md.v[i] = 0.5f;
  agent_adamw_span sp[64];
  size_t ns = spans_of(&md, 0, sp, 64);
  /* Every other span has a shadow; the ones without are left alone. */
  for (size_t i = 0, off = 0; i < ns; off += sp[i].n, i++)
    if (i % 2 == 0) sp[i].shadow = sh + off;
  cr_assert_eq(agent_adamw_shadow_cpu(sp, ns, 3), 0);
  cr_assert(memcmp(p0, md.p, 5000 * 4) == 0, "weights changed");
  for (size_t i = 0; i < 5000; i++) cr_assert(md.m[i] == 0.5f && md.v[i] == 0.5f);
  for (size_t i = 0, off = 0; i < ns; off += sp[i].n, i++) {
    if (i % 2 == 0) {
      assert_shadow_is_cast(md.p + off, sh + off, sp[i].n, "shadow_cpu");
    } else {
      for (size_t k = 0; k < sp[i].n; k++)
        cr_assert_eq(sh[off + k], 0xa5a5u, "span %zu without a shadow written", i);
    }
  }
  free(p0);
  free(sh);
  model_free(&md);
}

Test(agent_adamw, gpu_step_refuses_a_shadow) {
  float p = 0, m = 0, v = 0;
  uint16_t sh = 0;
  agent_adamw_span sp = {&p, &m, &v, 1, 0, &sh};
  agent_adamw_hparams hp;
  agent_adamw_coef c;
  agent_adamw_defaults(&hp);
  cr_assert_eq(agent_adamw_coef_for_step(&hp, 1, 1, &c), 0);
  char err[256] = "";
  cr_assert_eq(agent_adamw_gpu(&c, &sp, 1, err, sizeof err), -1);
#ifdef RLORCH_HAVE_CUDA
  cr_assert(strstr(err, "shadow"), "the refusal names the shadow: %s", err);
#endif
  cr_assert(p == 0 && sh == 0, "nothing was written");
}
