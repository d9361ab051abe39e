/* Raw host-transport peers for tests (bcast_peer.h). */
#include "tests/unit/bcast_peer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

void bp_put32(uint8_t *b, uint32_t v) {
  for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
}
void bp_put64(uint8_t *b, uint64_t v) {
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}
uint32_t bp_get32(const uint8_t *b) {
  return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static void bounded(int fd) {
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

int bp_dial(const char *addr) {
  const char *colon = strrchr(addr, ':');
  if (!colon) return -1;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
    close(fd);
    return -1;
  }
  bounded(fd);
  return fd;
}

int bp_read(int fd, void *buf, size_t n) {
  uint8_t *p = buf;
  while (n) {
    ssize_t r = recv(fd, p, n, 0);
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

size_t bp_read_to_end(int fd, uint8_t *buf, size_t cap) {
  size_t got = 0;
  for (;;) {
    uint8_t tmp[4096];
    ssize_t r = recv(fd, tmp, sizeof tmp, 0);
    if (r <= 0) return got;
    size_t take = (size_t)r < cap - got ? (size_t)r : cap - got;
    memcpy(buf + got, tmp, take);
    got += take;
  }
}

int bp_challenge(int fd, uint8_t nonce[BP_NONCE]) {
  uint8_t c[BP_CHALLENGE];
  if (bp_read(fd, c, sizeof c)) return -1;
  if (bp_get32(c) != 0x43424c52u || bp_get32(c + 4) != 2) return -1; /* "RLBC", version 2 */
  memcpy(nonce, c + 8, BP_NONCE);
  return 0;
}

/* HMAC-SHA256(secret, label || a || b || u32 rank || u64 hash || u32 idlen || id). */
static void mac(const uint8_t *secret, const char *label, const uint8_t *a, const uint8_t *b, uint32_t rank,
                uint64_t hash, const char *id, uint8_t out[BP_MAC]) {
  uint8_t msg[512];
  size_t n = 0, ll = strlen(label), idlen = strlen(id);
  memcpy(msg, label, ll);
  n += ll;
  memcpy(msg + n, a, BP_NONCE);
  n += BP_NONCE;
  memcpy(msg + n, b, BP_NONCE);
  n += BP_NONCE;
  bp_put32(msg + n, rank);
  bp_put64(msg + n + 4, hash);
  bp_put32(msg + n + 12, (uint32_t)idlen);
  n += 16;
  memcpy(msg + n, id, idlen);
  n += idlen;
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret, 32, msg, n, out, &len);
}

size_t bp_hello(uint8_t *out, const bcast_plan *p, uint32_t rank, const uint8_t *secret,
                const uint8_t nonce[BP_NONCE], uint8_t rx_nonce[BP_NONCE]) {
  size_t idlen = strlen(p->id);
  if (getrandom(rx_nonce, BP_NONCE, 0) != BP_NONCE) memset(rx_nonce, 7, BP_NONCE);
  bp_put32(out, 0x48424c52u); /* "RLBH" */
  bp_put32(out + 4, 2);
  bp_put32(out + 8, rank);
  bp_put32(out + 12, (uint32_t)idlen);
  bp_put64(out + 16, p->hash);
  memcpy(out + 24, rx_nonce, BP_NONCE);
  memcpy(out + 56, p->id, idlen);
  mac(secret, "rlorch.bcast.hello/2", nonce, rx_nonce, rank, p->hash, p->id, out + 56 + idlen);
  return 56 + idlen + BP_MAC;
}

int bp_handshake(int fd, const bcast_plan *p, uint32_t rank, uint8_t rx_nonce[BP_NONCE]) {
  uint8_t nonce[BP_NONCE], h[256];
  if (bp_challenge(fd, nonce)) return -1;
  size_t n = bp_hello(h, p, rank, p->secret, nonce, rx_nonce);
  if (send(fd, h, n, MSG_NOSIGNAL) != (ssize_t)n) return -1;
  return bp_reply(fd, p, rank, nonce, rx_nonce);
}

int bp_reply(int fd, const bcast_plan *p, uint32_t rank, const uint8_t nonce[BP_NONCE],
             const uint8_t rx_nonce[BP_NONCE]) {
  uint8_t r[12], body[512];
  if (bp_read(fd, r, sizeof r)) return 1;
  int32_t status = (int32_t)bp_get32(r + 4);
  uint32_t len = bp_get32(r + 8);
  if (len > sizeof body || bp_read(fd, body, len)) return 1;
  if (status) return status;
  uint8_t want[BP_MAC];
  mac(p->secret, "rlorch.bcast.reply/2", rx_nonce, nonce, rank, p->hash, p->id, want);
  return len == BP_MAC && memcmp(want, body, BP_MAC) == 0 ? 0 : 2;
}

int bp_root_challenge(int fd, const uint8_t nonce[BP_NONCE]) {
  bounded(fd);
  uint8_t c[BP_CHALLENGE];
  bp_put32(c, 0x43424c52u);
  bp_put32(c + 4, 2);
  memcpy(c + 8, nonce, BP_NONCE);
  return send(fd, c, sizeof c, MSG_NOSIGNAL) == (ssize_t)sizeof c ? 0 : -1;
}

int bp_root_read_hello(int fd, uint8_t *buf, size_t cap, size_t *len) {
  if (cap < 56 || bp_read(fd, buf, 56)) return -1;
  uint32_t idlen = bp_get32(buf + 12);
  if (56 + idlen + BP_MAC > cap || bp_read(fd, buf + 56, idlen + BP_MAC)) return -1;
  *len = 56 + idlen + BP_MAC;
  return 0;
}

int bp_root_accept(int fd, const bcast_plan *p, const uint8_t *secret, const uint8_t nonce[BP_NONCE],
                   const uint8_t *hello) {
  uint8_t r[12 + BP_MAC];
  bp_put32(r, 0x52424c52u); /* "RLBR" */
  bp_put32(r + 4, 0);
  bp_put32(r + 8, BP_MAC);
  mac(secret, "rlorch.bcast.reply/2", hello + 24, nonce, bp_get32(hello + 8), p->hash, p->id, r + 12);
  return send(fd, r, sizeof r, MSG_NOSIGNAL) == (ssize_t)sizeof r ? 0 : -1;
}

void *bp_reference(const bcast_tensor *t) {
  uint64_t n = bcast_tensor_elems(t);
  uint16_t *w = malloc(n * 2);
  for (uint64_t i = 0; w && i < n; i++) {
    if (t->storage_dtype != BCAST_DTYPE_FP32) {
      w[i] = ((const uint16_t *)t->data)[i];
      continue;
    }
    float x = ((const float *)t->data)[i];
    w[i] = t->wire_dtype == BCAST_DTYPE_BF16 ? bcast_f32_to_bf16(x) : bcast_f32_to_f16(x);
  }
  return w;
}

static uint32_t bp__rnd(uint32_t *x) {
  *x ^= *x << 13;
  *x ^= *x >> 17;
  *x ^= *x << 5;
  return *x;
}

void bp_random_tensor(bcast_tensor *t, const char *name, uint32_t layer, bcast_dtype st,
                      bcast_dtype wt, uint64_t d0, uint64_t d1, bcast_residency res,
                      int specials, uint32_t *rng) {
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->layer = layer;
  t->storage_dtype = st;
  t->wire_dtype = wt;
  t->ndim = 2;
  t->shape[0] = d0;
  t->shape[1] = d1;
  t->residency = res;
  uint64_t n = d0 * d1;
  t->data = malloc(n * bcast_dtype_size(st));
  for (uint64_t i = 0; t->data && i < n; i++) {
    uint32_t v = bp__rnd(rng);
    if (st != BCAST_DTYPE_FP32) {
      ((uint16_t *)t->data)[i] = (uint16_t)v;
      continue;
    }
    if (specials && i % 97 == 0) v = (i & 1) ? 0x7fc12345u : 0xff800001u; /* NaNs */
    else if (specials && i % 89 == 0) v = 0x00018000u;                  /* subnormal */
    else v = (v & 0x8fffffffu) | 0x30000000u; /* mostly finite, near fp16 range */
    ((uint32_t *)t->data)[i] = v;
  }
}
