/* The data channel's authentication: randomness from the kernel, HMAC-SHA256
 * and a constant-time compare from OpenSSL's libcrypto (what gRPC links
 * already), never a home-made primitive.  Only the host transport's
 * handshake (bcast_host.c) uses them; the framing of what is MACed is here so
 * both sides compute it from one definition. */
#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "workers/bcast/bcast_internal.h"

int bcast__random(void *buf, size_t n) {
  uint8_t *p = buf;
  while (n > 0) {
    ssize_t r = getrandom(p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

static void put32(uint8_t *b, uint32_t v) {
  for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *b, uint64_t v) {
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}

/* label || nonce_a || nonce_b || u32 rank || u64 hash || u32 idlen || id.  The
 * label keeps a receiver's proof from ever serving as the root's (and the
 * reverse); the lengths are fixed but for the id, which goes last with its
 * length, so no two inputs serialise alike. */
static int mac(const uint8_t secret[BCAST_SECRET_BYTES], const char *label, const uint8_t *na,
               const uint8_t *nb, uint32_t rank, uint64_t hash, const char *id,
               uint8_t out[BCAST_MAC_BYTES]) {
  uint8_t msg[32 + 2 * BCAST_NONCE_BYTES + 16 + 128];
  size_t ll = strlen(label), idlen = strnlen(id, 127), n = 0;
  memcpy(msg + n, label, ll);
  n += ll;
  memcpy(msg + n, na, BCAST_NONCE_BYTES);
  n += BCAST_NONCE_BYTES;
  memcpy(msg + n, nb, BCAST_NONCE_BYTES);
  n += BCAST_NONCE_BYTES;
  put32(msg + n, rank);
  put64(msg + n + 4, hash);
  put32(msg + n + 12, (uint32_t)idlen);
  n += 16;
  memcpy(msg + n, id, idlen);
  n += idlen;
  unsigned int len = 0;
  int ok = HMAC(EVP_sha256(), secret, BCAST_SECRET_BYTES, msg, n, out, &len) != NULL &&
           len == BCAST_MAC_BYTES;
  OPENSSL_cleanse(msg, sizeof msg);
  if (!ok) memset(out, 0, BCAST_MAC_BYTES);
  return ok ? 0 : -1;
}

int bcast__hello_mac(const uint8_t secret[BCAST_SECRET_BYTES], const uint8_t root_nonce[BCAST_NONCE_BYTES],
                     const uint8_t rx_nonce[BCAST_NONCE_BYTES], uint32_t rank, uint64_t hash, const char *id,
                     uint8_t out[BCAST_MAC_BYTES]) {
  return mac(secret, "rlorch.bcast.hello/2", root_nonce, rx_nonce, rank, hash, id, out);
}

int bcast__reply_mac(const uint8_t secret[BCAST_SECRET_BYTES], const uint8_t root_nonce[BCAST_NONCE_BYTES],
                     const uint8_t rx_nonce[BCAST_NONCE_BYTES], uint32_t rank, uint64_t hash, const char *id,
                     uint8_t out[BCAST_MAC_BYTES]) {
  return mac(secret, "rlorch.bcast.reply/2", rx_nonce, root_nonce, rank, hash, id, out);
}

int bcast__tls_key(const uint8_t secret[BCAST_SECRET_BYTES], const uint8_t root_nonce[BCAST_NONCE_BYTES],
                   const uint8_t rx_nonce[BCAST_NONCE_BYTES], uint32_t rank, uint64_t hash, const char *id,
                   uint8_t out[BCAST_SECRET_BYTES]) {
  return mac(secret, "rlorch.bcast.tls/2", root_nonce, rx_nonce, rank, hash, id, out);
}

int bcast__mac_equal(const uint8_t a[BCAST_MAC_BYTES], const uint8_t b[BCAST_MAC_BYTES]) {
  return CRYPTO_memcmp(a, b, BCAST_MAC_BYTES) == 0;
}

void bcast__wipe(void *p, size_t n) { OPENSSL_cleanse(p, n); }
