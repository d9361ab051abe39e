/* CPU casts: exact against independent references, vector paths equal to scalar. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_internal.h"

static uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* bf16 reference: keep the high half, round on the low half by comparison. */
static uint16_t ref_bf16(uint32_t x) {
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16 & 0x8000u) | 0x7fc0u);
  uint32_t hi = x >> 16, lo = x & 0xffffu;
  if (lo > 0x8000u || (lo == 0x8000u && (hi & 1u))) hi++;
  return (uint16_t)hi;
}

/* binary16 reference in double arithmetic (nearbyint rounds to nearest even). */
static uint16_t ref_f16(uint32_t x) {
  uint16_t sign = (x >> 31) ? 0x8000 : 0;
  float f = u2f(x);
  if (isnan(f)) return sign | 0x7e00 | (uint16_t)((x >> 13) & 0x3ff);
  double a = fabs((double)f);
  if (isinf(f) || a >= 65520.0) return sign | 0x7c00;
  if (a < ldexp(1.0, -14)) return sign | (uint16_t)nearbyint(a * ldexp(1.0, 24)); /* subnormal grid */
  int e;
  frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) */
  e -= 1;       /* a = 1.x * 2^e */
  double q = nearbyint(a * ldexp(1.0, 10 - e)); /* 1024..2048 */
  if (q >= 2048.0) {
    q /= 2;
    e++;
  }
  return sign | (uint16_t)((e + 15) << 10) | (uint16_t)((uint32_t)q - 1024);
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) static uint16_t hw_f16(uint32_t x) {
  return (uint16_t)_cvtss_sh(u2f(x), _MM_FROUND_TO_NEAREST_INT);
}
__attribute__((target("f16c"))) static uint32_t hw_f16_to_f32(uint16_t h) { return f2u(_cvtsh_ss(h)); }
#endif

/* Whether the reference F16C path can run here (probed once per test). */
static int have_f16c(void) {
  bcast__cpu cpu;
  bcast__cpu_probe(&cpu);
  return cpu.f16c;
}

static const uint32_t specials[] = {
    0x00000000, 0x80000000, 0x7f800000, 0xff800000, /* zeros, infinities */
    0x7fc00000, 0xffc00000, 0x7f800001, 0xff800001, /* quiet and signalling NaNs */
    0x7fbfffff, 0x7fc12345, 0xffd0beef, 0x7fffffff, 0x7f802000, 0x7f801fff,
    0x00000001, 0x80000001, 0x007fffff, 0x807fffff, 0x00400000, 0x00018000, 0x00008000, /* fp32 subnormals */
    0x00010000, 0x00017fff, 0x00028000, 0x00000080, 0x00800000, 0x80800000,
    0x7f7fffff, 0xff7fffff, 0x7f7f8000, 0x7f7f7fff, 0x7f7f0000, /* max finite, bf16 overflow boundary */
    0x3f808000, 0x3f818000, 0x3f808001, 0x3f807fff, 0x3f800000, /* bf16 ties: even down, odd up */
    0x477fe000, 0x477fefff, 0x477ff000, 0x477ff001, 0x47800000, /* fp16: 65504, below/at 65520, 65536 */
    0xc77fe000, 0xc77ff000, 0x38800000, 0x387fffff, 0x387fe000, 0x387ff000, /* min normal */
    0x33800000, 0x33000000, 0x33000001, 0x32ffffff, 0x33c00000, 0x33400000, /* 2^-24, 2^-25 ties */
    0x3f801000, 0x3f803000, 0x3f800fff, 0x3f801001, /* fp16 ties at 1.0 */
    0x35000000, 0x35100000, 0x34a00000, 0x34e00000, /* mid subnormal ties */
    0x3f7fffff, 0x3dcccccd, 0xbf800000, 0x40490fdb,
};
#define NSPEC (sizeof specials / sizeof specials[0])

static uint32_t rng_state = 0x12345678u;
static uint32_t rnd(void) { /* xorshift32: deterministic */
  uint32_t x = rng_state;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  return rng_state = x;
}

Test(bcast_cast, specials_match_reference) {
  int f16c = have_f16c();
  for (size_t i = 0; i < NSPEC; i++) {
    uint32_t x = specials[i];
    cr_assert_eq(bcast_f32_to_bf16(u2f(x)), ref_bf16(x), "bf16 of %08x: %04x vs %04x", x,
                 bcast_f32_to_bf16(u2f(x)), ref_bf16(x));
    cr_assert_eq(bcast_f32_to_f16(u2f(x)), ref_f16(x), "fp16 of %08x: %04x vs %04x", x, bcast_f32_to_f16(u2f(x)),
                 ref_f16(x));
#if defined(__x86_64__)
    if (f16c) cr_assert_eq(bcast_f32_to_f16(u2f(x)), hw_f16(x), "fp16 of %08x vs F16C", x);
#endif
  }
  /* spot checks that pin the semantics, not just agreement */
  cr_assert_eq(bcast_f32_to_bf16(u2f(0xff800001)), 0xffc0); /* NaN keeps sign, quiet */
  cr_assert_eq(bcast_f32_to_bf16(u2f(0x7f7fffff)), 0x7f80); /* max finite rounds to inf */
  cr_assert_eq(bcast_f32_to_bf16(u2f(0x3f808000)), 0x3f80); /* tie to even (down) */
  cr_assert_eq(bcast_f32_to_bf16(u2f(0x3f818000)), 0x3f82); /* tie to even (up) */
  cr_assert_eq(bcast_f32_to_bf16(u2f(0x00018000)), 0x0002); /* subnormal top bits, RNE */
  cr_assert_eq(bcast_f32_to_f16(65504.0f), 0x7bff);
  cr_assert_eq(bcast_f32_to_f16(65519.99f), 0x7bff);
  cr_assert_eq(bcast_f32_to_f16(65520.0f), 0x7c00);
  cr_assert_eq(bcast_f32_to_f16(u2f(0x33000000)), 0x0000); /* 2^-25 ties to 0 */
  cr_assert_eq(bcast_f32_to_f16(u2f(0x33000001)), 0x0001);
  cr_assert_eq(bcast_f32_to_f16(u2f(0x7f800001)), 0x7e00); /* signalling NaN comes out quiet */
  cr_assert_eq(bcast_f32_to_f16(u2f(0xffc12345)) & 0xfe00, 0xfe00);
}

Test(bcast_cast, millions_of_random_inputs_match_reference) {
  int f16c = have_f16c();
  for (int i = 0; i < 4000000; i++) {
    uint32_t x = rnd();
    if (i & 1) x = (x & 0x8000ffffu) | (0x30000000u + (x & 0x0fff0000u)); /* near fp16 range */
    uint16_t b = bcast_f32_to_bf16(u2f(x)), h = bcast_f32_to_f16(u2f(x));
    if (b != ref_bf16(x)) cr_assert_fail("bf16 of %08x: %04x vs %04x", x, b, ref_bf16(x));
    if (h != ref_f16(x)) cr_assert_fail("fp16 of %08x: %04x vs %04x", x, h, ref_f16(x));
#if defined(__x86_64__)
    if ((i & 7) == 0 && f16c && h != hw_f16(x)) cr_assert_fail("fp16 of %08x vs F16C", x);
#endif
  }
}

Test(bcast_cast, all_16_bit_values_widen_exactly) {
  int f16c = have_f16c();
  for (uint32_t v = 0; v < 65536; v++) {
    uint16_t h = (uint16_t)v;
    cr_assert_eq(f2u(bcast_bf16_to_f32(h)), v << 16);
    float f = bcast_f16_to_f32(h);
    uint32_t e = (v >> 10) & 0x1f, m = v & 0x3ff, s = v >> 15;
    if (e == 0x1f && m) {
      cr_assert(isnan(f), "%04x", v);
      cr_assert_eq(f2u(f), (s << 31) | 0x7fc00000u | (m << 13), "%04x -> %08x", v, f2u(f));
    } else {
      double want = e ? ldexp(1.0 + m / 1024.0, (int)e - 15) : ldexp(m / 1024.0, -14);
      if (e == 0x1f) want = INFINITY;
      if (s) want = -want;
      cr_assert_eq((double)f, want, "%04x", v);
      cr_assert_eq(signbit(f) != 0, s != 0);
    }
#if defined(__x86_64__)
    if (f16c) cr_assert_eq(f2u(f), hw_f16_to_f32(h), "%04x vs F16C", v);
#endif
    /* narrowing a widened value returns it (NaNs: quiet form) */
    if (!(e == 0x1f && m)) {
      cr_assert_eq(bcast_f32_to_f16(f), h);
      cr_assert_eq(bcast_f32_to_bf16(bcast_bf16_to_f32(h)), h);
    }
  }
}

static void compare_levels(bcast_dtype dt, bcast_dtype st, const void *src, size_t n) {
  size_t ds = bcast_dtype_size(dt);
  char *want = malloc(n * ds + 1), *got = malloc(n * ds + 1);
  cr_assert_eq(bcast__cast_level(0, want, dt, src, st, n), BCAST_OK);
  int best = bcast__cast_best_level();
  for (int lv = 1; lv <= best; lv++) {
    memset(got, 0x5a, n * ds);
    cr_assert_eq(bcast__cast_level(lv, got, dt, src, st, n), BCAST_OK);
    for (size_t i = 0; i < n * ds; i++)
      if (want[i] != got[i])
        cr_assert_fail("%s->%s level %d differs at element %zu (n=%zu)", bcast_dtype_name(st), bcast_dtype_name(dt),
                       lv, i / ds, n);
  }
  memset(got, 0x5a, n * ds);
  cr_assert_eq(bcast__cast_parallel(got, dt, src, st, n, 4), BCAST_OK);
  cr_assert_eq(memcmp(want, got, n * ds), 0, "parallel cast differs");
  free(want);
  free(got);
}

Test(bcast_cast, vector_paths_equal_scalar) {
  cr_log_info("best cast level on this CPU: %d", bcast__cast_best_level());
  size_t n = (1u << 22) + 13; /* odd tail exercises the scalar remainder */
  uint32_t *src = malloc(n * 4);
  for (size_t i = 0; i < n; i++) src[i] = i < NSPEC * 16 ? specials[i % NSPEC] : rnd();
  compare_levels(BCAST_DTYPE_BF16, BCAST_DTYPE_FP32, src, n);
  compare_levels(BCAST_DTYPE_FP16, BCAST_DTYPE_FP32, src, n);
  compare_levels(BCAST_DTYPE_FP32, BCAST_DTYPE_BF16, src, n); /* src reinterpreted as 16-bit */
  compare_levels(BCAST_DTYPE_FP32, BCAST_DTYPE_FP16, src, n);
  compare_levels(BCAST_DTYPE_U16, BCAST_DTYPE_U16, src, n);
  for (size_t k = 0; k < 40; k++) compare_levels(BCAST_DTYPE_BF16, BCAST_DTYPE_FP32, src + k, k);
  for (size_t k = 0; k < 40; k++) compare_levels(BCAST_DTYPE_FP16, BCAST_DTYPE_FP32, src + k, k);
  free(src);
}

Test(bcast_cast, unsupported_pairs_and_checksum) {
  uint16_t a[4] = {1, 2, 3, 4};
  float f[4];
  cr_assert_eq(bcast_cast_cpu(f, BCAST_DTYPE_FP32, a, BCAST_DTYPE_U16, 4), BCAST_ENOTSUP);
  cr_assert_eq(bcast_cast_cpu(a, BCAST_DTYPE_FP16, a, BCAST_DTYPE_BF16, 4), BCAST_ENOTSUP);
  cr_assert_eq(bcast_cast_cpu(f, (bcast_dtype)0, a, BCAST_DTYPE_U16, 4), BCAST_ENOTSUP);
  cr_assert(bcast_cast_supported(BCAST_DTYPE_FP32, BCAST_DTYPE_BF16));
  cr_assert(bcast_cast_supported(BCAST_DTYPE_U16, BCAST_DTYPE_U16));
  cr_assert_not(bcast_cast_supported(BCAST_DTYPE_U16, BCAST_DTYPE_FP16));
  cr_assert_not(bcast_cast_supported(BCAST_DTYPE_BF16, BCAST_DTYPE_FP32));
  uint64_t c = bcast_checksum64(a, sizeof a);
  cr_assert_eq(c, bcast_checksum64(a, sizeof a));
  a[2] ^= 1;
  cr_assert_neq(c, bcast_checksum64(a, sizeof a));
  cr_assert_neq(bcast_checksum64("", 0), bcast_checksum64("a", 1));
}

/* The probe against the kernel's own reading of the CPU (/proc/cpuinfo lists
 * a vector feature only when the OS also enables its register state). */
static int cpuinfo_has(const char *flags, const char *name) {
  size_t n = strlen(name);
  for (const char *p = flags; (p = strstr(p, name)) != NULL; p += n)
    if ((p == flags || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\n' || p[n] == '\0')) return 1;
  return 0;
}

Test(bcast_cast, cpu_probe_agrees_with_proc_cpuinfo) {
#if !defined(__x86_64__) || !defined(__linux__)
  cr_skip_test("x86-64 Linux only");
#else
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) cr_skip_test("no /proc/cpuinfo");
  static char line[1 << 14];
  int found = 0;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "flags", 5)) {
      found = 1;
      break;
    }
  fclose(f);
  if (!found) cr_skip_test("no flags line in /proc/cpuinfo");
  const char *flags = strchr(line, ':');
  cr_assert_not_null(flags);
  bcast__cpu cpu;
  bcast__cpu_probe(&cpu);
  cr_assert_eq(cpu.f16c, cpuinfo_has(flags, "f16c"), "f16c");
  cr_assert_eq(cpu.avx2, cpuinfo_has(flags, "avx2"), "avx2");
  cr_assert_eq(cpu.avx512f, cpuinfo_has(flags, "avx512f"), "avx512f");
  cr_assert_eq(cpu.avx512bw, cpuinfo_has(flags, "avx512bw"), "avx512bw");
  cr_assert_eq(bcast__cast_best_level(), cpu.avx512f ? 2 : (cpu.avx2 && cpu.f16c) ? 1 : 0);
#endif
}
