/* A data connection of the host transport, with TLS 1.3 on it when the plan
 * asks for it (bcast_plan.tls).  OpenSSL's libssl does the protocol; this
 * file only fits it to the transport's non-blocking sockets.
 *
 * Keys: TLS runs after the transport's own handshake, which already proved
 * to both sides that the other holds the plan's secret.  Each connection's
 * TLS key is an external pre-shared key derived from that secret and the
 * handshake's two fresh nonces (bcast__tls_key), so no certificate is
 * needed, and no two connections share a key.  Only TLS 1.3 with
 * (EC)DHE on top of the PSK (psk_dhe_ke) is offered: forward secrecy, even
 * against a later leak of the plan's secret.  No session tickets are issued:
 * a connection lives for one plan.
 *
 * I/O goes through a BIO of our own that calls send(2) with MSG_NOSIGNAL, so
 * a dead peer is an EPIPE, never a SIGPIPE, as on plaintext connections. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "workers/bcast/bcast_internal.h"

#define TLS_PSK_IDENTITY "rlorch.bcast.plan"

/* The per-connection key, reachable from the PSK callbacks. */
typedef struct tls_state {
  uint8_t key[BCAST_SECRET_BYTES];
} tls_state;

static int tls_ex_index = -1;
static BIO_METHOD *sock_method;
static SSL_CTX *ctx_server, *ctx_client;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;

static int sock_write(BIO *b, const char *buf, int len) {
  BIO_clear_retry_flags(b);
  ssize_t r = send((int)(intptr_t)BIO_get_data(b), buf, (size_t)len, MSG_NOSIGNAL);
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) BIO_set_retry_write(b);
  return (int)r;
}

static int sock_read(BIO *b, char *buf, int len) {
  BIO_clear_retry_flags(b);
  ssize_t r = recv((int)(intptr_t)BIO_get_data(b), buf, (size_t)len, 0);
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) BIO_set_retry_read(b);
  return (int)r;
}

static long sock_ctrl(BIO *b, int cmd, long num, void *ptr) {
  (void)b, (void)num, (void)ptr;
  return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

static int sock_create(BIO *b) {
  BIO_set_init(b, 1);
  return 1;
}

/* A TLS 1.3 session holding the connection's key as its resumption secret:
 * how OpenSSL takes an external PSK. */
static SSL_SESSION *psk_session(SSL *ssl) {
  const tls_state *st = SSL_get_ex_data(ssl, tls_ex_index);
  static const unsigned char aes128gcm_sha256[] = {0x13, 0x01};
  const SSL_CIPHER *cipher = SSL_CIPHER_find(ssl, aes128gcm_sha256);
  SSL_SESSION *s = st && cipher ? SSL_SESSION_new() : NULL;
  if (s && (!SSL_SESSION_set1_master_key(s, st->key, sizeof st->key) ||
            !SSL_SESSION_set_cipher(s, cipher) ||
            !SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION))) {
    SSL_SESSION_free(s);
    s = NULL;
  }
  return s;
}

static int psk_use(SSL *ssl, const EVP_MD *md, const unsigned char **id, size_t *idlen,
                   SSL_SESSION **sess) {
  *sess = NULL;
  if (md && md != EVP_sha256()) return 1; /* our key is for SHA-256 suites only */
  *sess = psk_session(ssl);
  *id = (const unsigned char *)TLS_PSK_IDENTITY;
  *idlen = strlen(TLS_PSK_IDENTITY);
  return *sess != NULL;
}

static int psk_find(SSL *ssl, const unsigned char *id, size_t idlen, SSL_SESSION **sess) {
  *sess = NULL;
  if (idlen != strlen(TLS_PSK_IDENTITY) || memcmp(id, TLS_PSK_IDENTITY, idlen) != 0) return 1;
  *sess = psk_session(ssl);
  return *sess != NULL;
}

static SSL_CTX *ctx_new(int server) {
  SSL_CTX *c = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  if (!c) return NULL;
  if (!SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION) ||
      !SSL_CTX_set_ciphersuites(c, "TLS_AES_128_GCM_SHA256")) {
    SSL_CTX_free(c);
    return NULL;
  }
  SSL_CTX_set_mode(c, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  /* The transport's own framing says where the data ends; a peer that only
   * closes is an error there, not a truncation TLS must report. */
  SSL_CTX_set_options(c, SSL_OP_IGNORE_UNEXPECTED_EOF);
  /* Whole socket reads, not a header then a body per 16 KiB record: two
   * system calls a record would dominate a bucket's cost. */
  SSL_CTX_set_read_ahead(c, 1);
  SSL_CTX_set_default_read_buffer_len(c, 256 << 10);
  if (server) {
    SSL_CTX_set_num_tickets(c, 0);
    SSL_CTX_set_psk_find_session_callback(c, psk_find);
  } else {
    SSL_CTX_set_psk_use_session_callback(c, psk_use);
  }
  return c;
}

static void tls_init(void) {
  tls_ex_index = SSL_get_ex_new_index(0, NULL, NULL, NULL, NULL);
  sock_method = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "rlorch data socket");
  if (sock_method) {
    BIO_meth_set_write(sock_method, sock_write);
    BIO_meth_set_read(sock_method, sock_read);
    BIO_meth_set_ctrl(sock_method, sock_ctrl);
    BIO_meth_set_create(sock_method, sock_create);
  }
  ctx_server = ctx_new(1);
  ctx_client = ctx_new(0);
}

/* The first error libssl queued, in words (the queue is emptied). */
static void tls_why(char *why, size_t len) {
  unsigned long e = ERR_get_error();
  if (e) ERR_error_string_n(e, why, len);
  else snprintf(why, len, "%s", errno ? strerror(errno) : "connection closed");
  ERR_clear_error();
}

int bcast__conn_tls_start(bcast__conn *c, int server, const uint8_t key[BCAST_SECRET_BYTES], char *why,
                          size_t whylen) {
  pthread_once(&tls_once, tls_init);
  SSL_CTX *ctx = server ? ctx_server : ctx_client;
  if (tls_ex_index < 0 || !sock_method || !ctx) {
    tls_why(why, whylen);
    return -1;
  }
  tls_state *st = OPENSSL_zalloc(sizeof *st);
  SSL *ssl = st ? SSL_new(ctx) : NULL;
  BIO *bio = ssl ? BIO_new(sock_method) : NULL;
  if (!bio) {
    SSL_free(ssl);
    OPENSSL_free(st);
    snprintf(why, whylen, "no memory for a TLS connection");
    return -1;
  }
  memcpy(st->key, key, sizeof st->key);
  BIO_set_data(bio, (void *)(intptr_t)c->fd);
  SSL_set_bio(ssl, bio, bio);
  SSL_set_ex_data(ssl, tls_ex_index, st);
  if (server) SSL_set_accept_state(ssl);
  else SSL_set_connect_state(ssl);
  c->ssl = ssl;
  c->tls_key = st;
  return 0;
}

int bcast__conn_tls_step(bcast__conn *c, short *want, char *why, size_t whylen) {
  ERR_clear_error();
  errno = 0;
  int r = SSL_do_handshake(c->ssl);
  if (r == 1) {
    /* The key did its work: it leaves memory now. */
    tls_state *st = c->tls_key;
    SSL_set_ex_data(c->ssl, tls_ex_index, NULL);
    OPENSSL_clear_free(st, sizeof *st);
    c->tls_key = NULL;
    return 1;
  }
  int e = SSL_get_error(c->ssl, r);
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
    *want = e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
    return 0;
  }
  tls_why(why, whylen);
  return -1;
}

ssize_t bcast__conn_io(bcast__conn *c, void *buf, size_t n, int writing, short *want) {
  *want = writing ? POLLOUT : POLLIN;
  if (!c->ssl) return writing ? send(c->fd, buf, n, MSG_NOSIGNAL) : recv(c->fd, buf, n, 0);
  ERR_clear_error();
  errno = 0;
  size_t done = 0;
  int ok = writing ? SSL_write_ex(c->ssl, buf, n, &done) : SSL_read_ex(c->ssl, buf, n, &done);
  if (ok) return (ssize_t)done;
  switch (SSL_get_error(c->ssl, 0)) {
  case SSL_ERROR_WANT_READ: *want = POLLIN; errno = EAGAIN; return -1;
  case SSL_ERROR_WANT_WRITE: *want = POLLOUT; errno = EAGAIN; return -1;
  case SSL_ERROR_ZERO_RETURN: return 0;
  case SSL_ERROR_SYSCALL:
    ERR_clear_error();
    if (!errno) return 0; /* the peer closed */
    return -1;            /* errno from send or recv: EPIPE, ECONNRESET, ... */
  default:
    ERR_clear_error();
    errno = EPROTO; /* a record that does not decrypt or authenticate */
    return -1;
  }
}

void bcast__conn_close(bcast__conn *c) {
  if (c->ssl) {
    tls_state *st = c->tls_key;
    if (st) SSL_set_ex_data(c->ssl, tls_ex_index, NULL);
    SSL_free(c->ssl);
    OPENSSL_clear_free(st, sizeof *st);
  }
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  c->ssl = NULL;
  c->tls_key = NULL;
}
