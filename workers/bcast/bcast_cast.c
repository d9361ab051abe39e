/* CPU casts between fp32, bf16 and fp16, bit-exact with the references:
 *   fp32 -> bf16: round to nearest even on the top 16 bits; NaN -> 0x7FC0 | sign
 *                 (PyTorch/Eigen); fp32 subnormals keep their top bits.
 *   fp32 -> fp16: IEEE binary16 round to nearest even, as x86 F16C
 *                 (_cvtps_ph with _MM_FROUND_TO_NEAREST_INT): NaN stays NaN,
 *                 quiet, sign and top payload bits kept; >= 65520 -> inf.
 *   bf16/fp16 -> fp32: exact widening (fp16 signalling NaNs are quieted, as
 *                 F16C's _cvtph_ps does).
 * The vector paths (AVX-512F, AVX2+F16C) are chosen at run time and compute
 * the same bits as the scalar path; tests compare them element by element.
 * They assume the default MXCSR (no FTZ/DAZ), as the reference does. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "workers/bcast/bcast_internal.h"

int bcast_cast_supported(bcast_dtype from, bcast_dtype to) {
  switch (from) {
  case BCAST_DTYPE_FP32: return to == BCAST_DTYPE_FP32 || to == BCAST_DTYPE_BF16 || to == BCAST_DTYPE_FP16;
  case BCAST_DTYPE_BF16:
  case BCAST_DTYPE_FP16:
  case BCAST_DTYPE_U16: return to == from;
  default: return 0;
  }
}

uint64_t bcast_checksum64(const void *buf, size_t n) { return XXH3_64bits(buf, n); }

/* ---- scalar --------------------------------------------------------------- */

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

static uint16_t bits_to_bf16(uint32_t x) {
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(((x >> 16) & 0x8000u) | 0x7fc0u);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static uint16_t bits_to_f16(uint32_t x) {
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((ax >> 13) & 0x3ffu);
  if (ax >= 0x477ff000u) return sign | 0x7c00u; /* 65520 and above round to inf */
  if (ax >= 0x38800000u) {                       /* normal binary16 */
    uint32_t v = ax - 0x38000000u;               /* rebias exponent 127 -> 15 */
    v += 0xfffu + ((v >> 13) & 1u);
    return sign | (uint16_t)(v >> 13);
  }
  if (ax <= 0x33000000u) return sign; /* at or below half the smallest subnormal */
  uint32_t e = ax >> 23, mant = (ax & 0x7fffffu) | 0x800000u, s = 126u - e;
  uint32_t q = mant >> s, rem = mant & ((1u << s) - 1u), half = 1u << (s - 1u);
  if (rem > half || (rem == half && (q & 1u))) q++;
  return sign | (uint16_t)q;
}

static uint32_t f16_to_bits(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return sign | 0x7f800000u | (m ? (m << 13) | 0x400000u : 0);
  if (e != 0) return sign | ((e + 112u) << 23) | (m << 13);
  if (m == 0) return sign;
  int sh = __builtin_clz(m) - 21; /* normalise the subnormal: leading 1 to bit 10 */
  m = (m << sh) & 0x3ffu;
  return sign | ((uint32_t)(113 - sh) << 23) | (m << 13);
}

uint16_t bcast_f32_to_bf16(float f) { return bits_to_bf16(f2u(f)); }
uint16_t bcast_f32_to_f16(float f) { return bits_to_f16(f2u(f)); }
float bcast_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }
float bcast_f16_to_f32(uint16_t h) { return u2f(f16_to_bits(h)); }

typedef enum { K_COPY, K_F32_BF16, K_F32_F16, K_BF16_F32, K_F16_F32, K_NONE } cast_kind;

static cast_kind kind_of(bcast_dtype to, bcast_dtype from) {
  if (from == to && bcast_dtype_size(from)) return K_COPY;
  if (from == BCAST_DTYPE_FP32 && to == BCAST_DTYPE_BF16) return K_F32_BF16;
  if (from == BCAST_DTYPE_FP32 && to == BCAST_DTYPE_FP16) return K_F32_F16;
  if (from == BCAST_DTYPE_BF16 && to == BCAST_DTYPE_FP32) return K_BF16_F32;
  if (from == BCAST_DTYPE_FP16 && to == BCAST_DTYPE_FP32) return K_F16_F32;
  return K_NONE;
}

static void cast_scalar(cast_kind k, void *dst, const void *src, size_t n) {
  const uint32_t *s32 = src;
  const uint16_t *s16 = src;
  uint16_t *d16 = dst;
  uint32_t *d32 = dst;
  switch (k) {
  case K_F32_BF16: for (size_t i = 0; i < n; i++) d16[i] = bits_to_bf16(s32[i]); break;
  case K_F32_F16: for (size_t i = 0; i < n; i++) d16[i] = bits_to_f16(s32[i]); break;
  case K_BF16_F32: for (size_t i = 0; i < n; i++) d32[i] = (uint32_t)s16[i] << 16; break;
  case K_F16_F32: for (size_t i = 0; i < n; i++) d32[i] = f16_to_bits(s16[i]); break;
  default: break;
  }
}

/* ---- AVX2 + F16C ------------------------------------------------------------ */
#if defined(__x86_64__)
__attribute__((target("avx2")))
static __m256i bf16_avx2(__m256i x) {
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
  __m256i r = _mm256_add_epi32(x, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(x, 16), one)));
  r = _mm256_srli_epi32(r, 16);
  __m256i ax = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
  __m256i nan = _mm256_cmpgt_epi32(ax, _mm256_set1_epi32(0x7f800000));
  __m256i q = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x8000)),
                              _mm256_set1_epi32(0x7fc0));
  return _mm256_blendv_epi8(r, q, nan);
}

__attribute__((target("avx2,f16c")))
static size_t cast_avx2(cast_kind k, void *dst, const void *src, size_t n) {
  size_t i = 0;
  const char *s = src;
  char *d = dst;
  switch (k) {
  case K_F32_BF16:
    for (; i + 16 <= n; i += 16) {
      __m256i a = bf16_avx2(_mm256_loadu_si256((const __m256i *)(s + 4 * i)));
      __m256i b = bf16_avx2(_mm256_loadu_si256((const __m256i *)(s + 4 * i + 32)));
      __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
      _mm256_storeu_si256((__m256i *)(d + 2 * i), p);
    }
    break;
  case K_F32_F16:
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128((__m128i *)(d + 2 * i),
                       _mm256_cvtps_ph(_mm256_loadu_ps((const float *)(s + 4 * i)),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    break;
  case K_BF16_F32:
    for (; i + 8 <= n; i += 8) {
      __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + 2 * i)));
      _mm256_storeu_si256((__m256i *)(d + 4 * i), _mm256_slli_epi32(w, 16));
    }
    break;
  case K_F16_F32:
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps((float *)(d + 4 * i), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 2 * i))));
    break;
  default: break;
  }
  return i;
}

/* ---- AVX-512F ----------------------------------------------------------------- */
__attribute__((target("avx512f")))
static size_t cast_avx512(cast_kind k, void *dst, const void *src, size_t n) {
  size_t i = 0;
  const char *s = src;
  char *d = dst;
  switch (k) {
  case K_F32_BF16: {
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
    const __m512i absm = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i sgn = _mm512_set1_epi32(0x8000), qn = _mm512_set1_epi32(0x7fc0);
    for (; i + 16 <= n; i += 16) {
      __m512i x = _mm512_loadu_si512((const void *)(s + 4 * i));
      __m512i hi = _mm512_srli_epi32(x, 16);
      __m512i r = _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(bias, _mm512_and_si512(hi, one))), 16);
      __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, absm), inf);
      r = _mm512_mask_blend_epi32(nan, r, _mm512_or_si512(_mm512_and_si512(hi, sgn), qn));
      _mm256_storeu_si256((__m256i *)(d + 2 * i), _mm512_cvtepi32_epi16(r));
    }
    break;
  }
  case K_F32_F16:
    for (; i + 16 <= n; i += 16)
      _mm256_storeu_si256((__m256i *)(d + 2 * i),
                          _mm512_cvtps_ph(_mm512_loadu_ps((const float *)(s + 4 * i)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    break;
  case K_BF16_F32:
    for (; i + 16 <= n; i += 16) {
      __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + 2 * i)));
      _mm512_storeu_si512((void *)(d + 4 * i), _mm512_slli_epi32(w, 16));
    }
    break;
  case K_F16_F32:
    for (; i + 16 <= n; i += 16)
      _mm512_storeu_ps((float *)(d + 4 * i), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + 2 * i))));
    break;
  default: break;
  }
  return i;
}
#endif

static int level_available(int level) {
  if (level == 0) return 1;
  bcast__cpu cpu;
  bcast__cpu_probe(&cpu);
  if (level == 2) return cpu.avx512f;
  if (level == 1) return cpu.avx2 && cpu.f16c;
  return 0;
}

int bcast__cast_best_level(void) { return level_available(2) ? 2 : level_available(1) ? 1 : 0; }

int bcast__cast_level(int level, void *dst, bcast_dtype dst_dtype, const void *src, bcast_dtype src_dtype,
                      size_t n) {
  cast_kind k = kind_of(dst_dtype, src_dtype);
  if (k == K_NONE) return BCAST_ENOTSUP;
  if (n && (!dst || !src)) return BCAST_EINVAL;
  if (!level_available(level)) return BCAST_ENOTSUP;
  if (k == K_COPY) {
    if (n) memcpy(dst, src, n * bcast_dtype_size(src_dtype));
    return BCAST_OK;
  }
  size_t done = 0;
#if defined(__x86_64__)
  if (level == 2) done = cast_avx512(k, dst, src, n);
  else if (level == 1) done = cast_avx2(k, dst, src, n);
#endif
  size_t ds = bcast_dtype_size(dst_dtype), ss = bcast_dtype_size(src_dtype);
  cast_scalar(k, (char *)dst + done * ds, (const char *)src + done * ss, n - done);
  return BCAST_OK;
}

int bcast_cast_cpu(void *dst, bcast_dtype dst_dtype, const void *src, bcast_dtype src_dtype, size_t n) {
  return bcast__cast_level(bcast__cast_best_level(), dst, dst_dtype, src, src_dtype, n);
}

/* ---- several threads for large casts -------------------------------------------- */

typedef struct cast_job {
  void *dst;
  const void *src;
  bcast_dtype dt, st;
  size_t n;
  int level;
} cast_job;

static void *cast_job_run(void *arg) {
  cast_job *j = arg;
  bcast__cast_level(j->level, j->dst, j->dt, j->src, j->st, j->n);
  return NULL;
}

#define CAST_MAX_THREADS 16
#define CAST_MIN_PER_THREAD (1u << 20) /* below ~1M elements a thread costs more than it saves */

int bcast__cast_parallel(void *dst, bcast_dtype dst_dtype, const void *src, bcast_dtype src_dtype, size_t n,
                         int threads) {
  if (kind_of(dst_dtype, src_dtype) == K_NONE) return BCAST_ENOTSUP;
  if (threads > CAST_MAX_THREADS) threads = CAST_MAX_THREADS;
  if (threads > 1 && n / (size_t)threads < CAST_MIN_PER_THREAD) threads = (int)(n / CAST_MIN_PER_THREAD);
  if (threads <= 1) return bcast_cast_cpu(dst, dst_dtype, src, src_dtype, n);
  int level = bcast__cast_best_level();
  size_t ds = bcast_dtype_size(dst_dtype), ss = bcast_dtype_size(src_dtype);
  size_t chunk = ((n / (size_t)threads) + 63) & ~(size_t)63;
  cast_job jobs[CAST_MAX_THREADS];
  pthread_t tid[CAST_MAX_THREADS];
  int started[CAST_MAX_THREADS] = {0};
  size_t off = 0;
  for (int t = 0; t < threads && off < n; t++) {
    size_t len = (t == threads - 1 || off + chunk > n) ? n - off : chunk;
    jobs[t] = (cast_job){(char *)dst + off * ds, (const char *)src + off * ss, dst_dtype, src_dtype, len, level};
    off += len;
    /* The last chunk runs on this thread; a failed spawn does its share inline. */
    if (off < n && pthread_create(&tid[t], NULL, cast_job_run, &jobs[t]) == 0) started[t] = 1;
    else cast_job_run(&jobs[t]);
  }
  for (int t = 0; t < threads; t++)
    if (started[t]) pthread_join(tid[t], NULL);
  return BCAST_OK;
}
