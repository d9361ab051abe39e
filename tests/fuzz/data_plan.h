/* The plan the data-channel harnesses move, and the bytes of its protocol
 * (protocol 2, workers/bcast/bcast_host.c), shared with the seed generator so
 * that the seeds carry this plan's id and hash.
 *
 * Two tensors in two layers, one cast fp32 -> bf16 and one sent as fp32: two
 * buckets, world size 2, the root at rank 0, the receiver at rank 1. The
 * plan's data-channel secret is fixed (DATA_SECRET), so that a harness can
 * play the participant the engine talks to; the handshake's proofs are
 * computed here from the protocol's description with OpenSSL's HMAC, not
 * with the engine's own code. */
#ifndef RLORCH_FUZZ_DATA_PLAN_H
#define RLORCH_FUZZ_DATA_PLAN_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "workers/bcast/bcast.h"

#define DATA_PLAN_ID "run-1/step-5"
#define DATA_STALE_ID "run-1/step-4" /* the id the root last cancelled */
#define DATA_NTENSORS 2

#define DATA_MAGIC_CHALLENGE 0x43424c52u /* "RLBC" */
#define DATA_MAGIC_HELLO 0x48424c52u  /* "RLBH" */
#define DATA_MAGIC_REPLY 0x52424c52u  /* "RLBR" */
#define DATA_MAGIC_BUCKET 0x4b424c52u /* "RLBK" */
#define DATA_MAGIC_ACK 0x41424c52u    /* "RLBA" */
#define DATA_VERSION 2u
#define DATA_NONCE 32
#define DATA_MAC 32
#define DATA_CHALLENGE (8 + DATA_NONCE)
/* HELLO: magic, version, rank, id length, hash, the receiver's nonce; then
 * the id and the proof. */
#define DATA_HELLO_FIXED (24 + DATA_NONCE)

/* The plan's data-channel secret (BCAST_SECRET_BYTES). */
static const uint8_t DATA_SECRET[BCAST_SECRET_BYTES] = "data channel secret of the fuzz";

/* The manifest, as the sender holds it (storage fp32; data left NULL). */
static inline void data_tensors(bcast_tensor t[DATA_NTENSORS]) {
  memset(t, 0, DATA_NTENSORS * sizeof *t);
  snprintf(t[0].name, sizeof t[0].name, "layers.0.w");
  t[0].layer = 0;
  t[0].storage_dtype = BCAST_DTYPE_FP32;
  t[0].wire_dtype = BCAST_DTYPE_BF16;
  t[0].ndim = 2;
  t[0].shape[0] = 4;
  t[0].shape[1] = 16;
  t[0].residency = BCAST_RES_HOST_PAGEABLE;
  snprintf(t[1].name, sizeof t[1].name, "layers.1.b");
  t[1].layer = 1;
  t[1].storage_dtype = BCAST_DTYPE_FP32;
  t[1].wire_dtype = BCAST_DTYPE_FP32;
  t[1].ndim = 1;
  t[1].shape[0] = 8;
  t[1].residency = BCAST_RES_HOST_PAGEABLE;
}

/* The plan; endpoint is where the root listens (the hash leaves it out). */
static inline int data_plan(const char *endpoint, bcast_checksum checksum, bcast_plan **out,
                            bcast_err *err) {
  bcast_tensor t[DATA_NTENSORS];
  data_tensors(t);
  bcast_plan_opts o = {.id = DATA_PLAN_ID, .mode = BCAST_MODE_HOST, .staging_budget = 4096,
                       .world_size = 2, .root_rank = 0, .policy_version = 5,
                       .host_endpoint = endpoint, .checksum = checksum, .secret = DATA_SECRET};
  return bcast_plan_build(t, DATA_NTENSORS, &o, out, err);
}

static inline void data_put32(uint8_t *b, uint32_t v) {
  for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static inline void data_put64(uint8_t *b, uint64_t v) {
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t data_get32(const uint8_t *b) {
  return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
static inline uint64_t data_get64(const uint8_t *b) {
  return (uint64_t)data_get32(b) | (uint64_t)data_get32(b + 4) << 32;
}

/* The handshake's proofs: HMAC-SHA256(secret, label || nonce_a || nonce_b ||
 * u32 rank || u64 hash || u32 idlen || id). The receiver's (label
 * "rlorch.bcast.hello/2") puts the root's nonce first, the root's
 * ("rlorch.bcast.reply/2") the receiver's. */
static inline void data_mac(const char *label, const uint8_t *na, const uint8_t *nb, uint32_t rank,
                            uint64_t hash, const char *id, uint8_t out[DATA_MAC]) {
  uint8_t m[32 + 2 * DATA_NONCE + 16 + 128];
  size_t n = strlen(label), idlen = strlen(id);
  memcpy(m, label, n);
  memcpy(m + n, na, DATA_NONCE);
  memcpy(m + n + DATA_NONCE, nb, DATA_NONCE);
  n += 2 * DATA_NONCE;
  data_put32(m + n, rank);
  data_put64(m + n + 4, hash);
  data_put32(m + n + 12, (uint32_t)idlen);
  memcpy(m + n + 16, id, idlen);
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), DATA_SECRET, sizeof DATA_SECRET, m, n + 16 + idlen, out, &len) ||
      len != DATA_MAC)
    memset(out, 0, DATA_MAC);
}

/* CHALLENGE: magic, version, the root's nonce. Returns its length. */
static inline size_t data_challenge(uint8_t *b, const uint8_t nonce[DATA_NONCE]) {
  data_put32(b, DATA_MAGIC_CHALLENGE);
  data_put32(b + 4, DATA_VERSION);
  memcpy(b + 8, nonce, DATA_NONCE);
  return DATA_CHALLENGE;
}

/* HELLO for rank, id and hash, with the receiver's nonce and a proof (NULL:
 * the right one for the root's nonce). Returns its length. */
static inline size_t data_hello(uint8_t *b, uint32_t rank, const char *id, uint64_t hash,
                                const uint8_t root_nonce[DATA_NONCE],
                                const uint8_t rx_nonce[DATA_NONCE], const uint8_t *mac) {
  size_t n = strlen(id);
  data_put32(b, DATA_MAGIC_HELLO);
  data_put32(b + 4, DATA_VERSION);
  data_put32(b + 8, rank);
  data_put32(b + 12, (uint32_t)n);
  data_put64(b + 16, hash);
  memcpy(b + 24, rx_nonce, DATA_NONCE);
  memcpy(b + DATA_HELLO_FIXED, id, n);
  if (mac) memcpy(b + DATA_HELLO_FIXED + n, mac, DATA_MAC);
  else data_mac("rlorch.bcast.hello/2", root_nonce, rx_nonce, rank, hash, id, b + DATA_HELLO_FIXED + n);
  return DATA_HELLO_FIXED + n + DATA_MAC;
}

/* The root's REPLY 0 to that HELLO: its own proof. Returns its length. */
static inline size_t data_reply_ok(uint8_t *b, uint32_t rank, const char *id, uint64_t hash,
                                   const uint8_t root_nonce[DATA_NONCE],
                                   const uint8_t rx_nonce[DATA_NONCE]) {
  data_put32(b, DATA_MAGIC_REPLY);
  data_put32(b + 4, 0);
  data_put32(b + 8, DATA_MAC);
  data_mac("rlorch.bcast.reply/2", rx_nonce, root_nonce, rank, hash, id, b + 12);
  return 12 + DATA_MAC;
}

/* REPLY and ACK: magic, status, message length, message. */
static inline size_t data_status(uint8_t *b, uint32_t magic, int32_t status, const char *msg) {
  size_t n = strlen(msg);
  data_put32(b, magic);
  data_put32(b + 4, (uint32_t)status);
  data_put32(b + 8, (uint32_t)n);
  memcpy(b + 12, msg, n);
  return 12 + n;
}

/* A bucket's header: magic, index, bytes, checksum. */
static inline size_t data_bucket_header(uint8_t *b, uint32_t index, uint64_t bytes,
                                        uint64_t sum) {
  data_put32(b, DATA_MAGIC_BUCKET);
  data_put32(b + 4, index);
  data_put64(b + 8, bytes);
  data_put64(b + 16, sum);
  return 24;
}

#endif
