/* The weights checksum equals the segmented XXH3-64 (agent_weights.h) of an
 * independently cast copy. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/agent/agent_weights.h"
#include "workers/bcast/bcast_preset.h"

/* Round to nearest even, written out here rather than taken from the engine. */
static uint16_t ref_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* The definition, computed here from plain buffers: per tensor, segments of
 * AGENT_WEIGHTS_SEGMENT_ELEMS wire elements hashed one by one, then XXH3-64
 * over the digests. */
static uint64_t ref_checksum(const uint16_t *const *wire, const uint64_t *elems, size_t n) {
  uint64_t digests[4096];
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    for (uint64_t off = 0; off < elems[i]; off += AGENT_WEIGHTS_SEGMENT_ELEMS) {
      uint64_t len = elems[i] - off < AGENT_WEIGHTS_SEGMENT_ELEMS ? elems[i] - off
                                                                  : AGENT_WEIGHTS_SEGMENT_ELEMS;
      digests[k++] = bcast_checksum64(wire[i] + off, len * 2);
    }
  return bcast_checksum64(digests, k * sizeof digests[0]);
}

static bcast_tensor host_tensor(const char *name, uint64_t rows, uint64_t cols, float *data) {
  bcast_tensor t;
  memset(&t, 0, sizeof t);
  snprintf(t.name, sizeof t.name, "%s", name);
  t.storage_dtype = BCAST_DTYPE_FP32;
  t.wire_dtype = BCAST_DTYPE_BF16;
  t.ndim = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.residency = BCAST_RES_HOST_PAGEABLE;
  t.data = data;
  t.device = -1;
  return t;
}

Test(agent_weights, equals_checksum_of_cast_copy) {
  /* The second tensor spans several segments (4 Mi elements) and chunks. */
  uint64_t n0 = 3 * 7, n1 = 3000 * 3000, n2 = 5;
  float *a = malloc(n0 * 4), *b = malloc(n1 * 4), *c = malloc(n2 * 4);
  for (uint64_t i = 0; i < n0; i++) a[i] = (float)i * 0.37f - 3.0f;
  for (uint64_t i = 0; i < n1; i++) b[i] = (float)((i * 2654435761u) % 100003) * 1e-5f - 0.5f;
  for (uint64_t i = 0; i < n2; i++) c[i] = 1.0f + (float)i * 0x1p-9f; /* ties to even */
  bcast_tensor t[3] = {host_tensor("a", 3, 7, a), host_tensor("b", 3000, 3000, b),
                       host_tensor("c", 1, 5, c)};
  uint16_t *copy = malloc((n0 + n1 + n2) * 2);
  uint64_t k = 0;
  for (uint64_t i = 0; i < n0; i++) copy[k++] = ref_bf16(a[i]);
  for (uint64_t i = 0; i < n1; i++) copy[k++] = ref_bf16(b[i]);
  for (uint64_t i = 0; i < n2; i++) copy[k++] = ref_bf16(c[i]);
  const uint16_t *parts[3] = {copy, copy + n0, copy + n0 + n1};
  const uint64_t lens[3] = {n0, n1, n2};
  uint64_t want = ref_checksum(parts, lens, 3), got = 0;
  cr_assert_neq(want, bcast_checksum64(copy, k * 2), "segmented, not one flat hash");
  char err[256];
  cr_assert_eq(agent_weights_checksum(t, 3, AGENT_WEIGHTS_STORAGE, &got, err, sizeof err), 0, "%s",
               err);
  cr_assert_eq(got, want, "%016llx != %016llx", (unsigned long long)got, (unsigned long long)want);

  /* A receiver holding the wire bytes gets the same checksum. */
  bcast_tensor w[3] = {t[0], t[1], t[2]};
  w[0].data = copy;
  w[1].data = copy + n0;
  w[2].data = copy + n0 + n1;
  uint64_t got_wire = 0;
  cr_assert_eq(agent_weights_checksum(w, 3, AGENT_WEIGHTS_WIRE, &got_wire, err, sizeof err), 0);
  cr_assert_eq(got_wire, want);

  /* Order matters, and so does one changed element. */
  bcast_tensor swapped[3] = {t[1], t[0], t[2]};
  uint64_t other = 0;
  cr_assert_eq(agent_weights_checksum(swapped, 3, AGENT_WEIGHTS_STORAGE, &other, err, sizeof err), 0);
  cr_assert_neq(other, want);
  b[n1 - 1] += 0.25f;
  cr_assert_eq(agent_weights_checksum(t, 3, AGENT_WEIGHTS_STORAGE, &other, err, sizeof err), 0);
  cr_assert_neq(other, want);
  free(a);
  free(b);
  free(c);
  free(copy);
}

Test(agent_weights, preset_storage_checksum) {
  bcast_preset_opts po = {.residency = BCAST_RES_HOST_PAGEABLE, .max_layers = 1};
  bcast_tensor *t = NULL;
  size_t n = 0;
  bcast_err e;
  cr_assert_eq(bcast_preset_manifest("100m", &po, &t, &n, &e), 0, "%s", e.msg);
  bcast_storage *st = NULL;
  cr_assert_eq(bcast_storage_alloc(t, n, BCAST_FILL_SENDER, 3, &st, &e), 0, "%s", e.msg);
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) total += bcast_tensor_elems(&t[i]);
  uint16_t *copy = malloc(total * 2);
  uint64_t k = 0;
  for (size_t i = 0; i < n; i++) {
    const float *f = t[i].data;
    for (uint64_t j = 0; j < bcast_tensor_elems(&t[i]); j++) copy[k++] = ref_bf16(f[j]);
  }
  uint64_t got = 0;
  char err[256];
  cr_assert_eq(agent_weights_checksum(t, n, AGENT_WEIGHTS_STORAGE, &got, err, sizeof err), 0, "%s", err);
  const uint16_t **parts = malloc(n * sizeof *parts);
  uint64_t *lens = malloc(n * sizeof *lens);
  for (size_t i = 0, off = 0; i < n; off += lens[i], i++) {
    lens[i] = bcast_tensor_elems(&t[i]);
    parts[i] = copy + off;
  }
  cr_assert_eq(got, ref_checksum(parts, lens, n));
  free(parts);
  free(lens);
  free(copy);
  bcast_storage_free(st);
  free(t);
}

Test(agent_weights, errors_name_the_tensor) {
  float x[4] = {0};
  bcast_tensor t = host_tensor("layers.0.q", 2, 2, x);
  uint64_t out;
  char err[256];
  t.data = NULL;
  cr_assert_eq(agent_weights_checksum(&t, 1, AGENT_WEIGHTS_STORAGE, &out, err, sizeof err), -1);
  cr_assert(strstr(err, "layers.0.q"), "%s", err);
  t.data = x;
  t.storage_dtype = BCAST_DTYPE_U16;
  cr_assert_eq(agent_weights_checksum(&t, 1, AGENT_WEIGHTS_STORAGE, &out, err, sizeof err), -1);
  cr_assert(strstr(err, "layers.0.q"), "%s", err);
#ifndef RLORCH_HAVE_CUDA
  t.storage_dtype = BCAST_DTYPE_FP32;
  t.residency = BCAST_RES_GPU;
  cr_assert_eq(agent_weights_checksum(&t, 1, AGENT_WEIGHTS_STORAGE, &out, err, sizeof err), -1);
  cr_assert(strstr(err, "layers.0.q"), "%s", err);
#endif
  cr_assert_eq(agent_weights_checksum(NULL, 0, AGENT_WEIGHTS_STORAGE, &out, err, sizeof err), 0);
}
