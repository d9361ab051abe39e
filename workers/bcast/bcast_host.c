/* Host transport: the plan over TCP between processes, casts on the CPU.
 *
 * Protocol (all integers little endian), one TCP connection per receiver and plan:
 *   root -> receiver  CHALLENGE "RLBC" u32 version, nonce[32]            (at accept)
 *   receiver -> root  HELLO  "RLBH" u32 version, u32 rank, u32 idlen, u64 hash,
 *                     rx_nonce[32], id[idlen], mac[32]
 *                     mac = HMAC-SHA256(secret, "rlorch.bcast.hello/2" || nonce ||
 *                           rx_nonce || rank || hash || idlen || id)
 *   root -> receiver  REPLY  "RLBR" i32 status, u32 len, then len bytes: on 0 the
 *                     root's proof HMAC-SHA256(secret, "rlorch.bcast.reply/2" ||
 *                     rx_nonce || nonce || rank || hash || idlen || id), else a message
 *   root -> receiver  per bucket: HEADER "RLBK" u32 index, u64 bytes, u64 checksum,
 *                     then `bytes` payload bytes (slices at plan offsets, zero padding)
 *   receiver -> root  ACK    "RLBA" i32 status, u32 msglen, msg      (after the last
 *                     bucket, or at the first error)
 *   relay -> receiver ABORT  "RLBX" i32 status, u32 msglen, 12 zero bytes, msg  (in
 *                     place of a bucket header: the relay's upstream failed)
 * On a TLS plan (bcast_plan.tls) the two sides run TLS 1.3 after the REPLY,
 * the receiver as client (bcast_tls.c: an external PSK per connection,
 * HMAC-SHA256(secret, "rlorch.bcast.tls/2" || nonce || rx_nonce || rank ||
 * hash || idlen || id), with ECDHE), and the buckets and the ACK go through
 * it.
 * `secret` is the plan's (bcast_plan.secret): only its participants hold it.
 * The root's nonce is fresh for every connection, so a recorded hello is
 * worth nothing on another one; the receiver's nonce makes the root prove
 * itself too, so a receiver takes weights only from a holder of the plan.
 *
 * What a stranger gets: the challenge (random bytes), then the connection
 * closed, without a word.  A hello that does not verify (another plan, a
 * wrong proof, garbage), a connection silent for HANDSHAKE_S, or one evicted
 * because PENDING_MAX handshakes are open already are all closed that way and
 * counted (bcast_stats.refused_connections); the root keeps waiting for its
 * receivers, so they cost the plan nothing.  Handshakes run concurrently in
 * one poll loop, so silent connections delay nobody.  Replies that say why
 * go only to connections that proved they hold the secret.  Without TLS the
 * channel is authenticated, not encrypted: an on-path attacker can still read
 * the weights and, with TCP hijacking, alter them past the XXH3 checksums;
 * with TLS every record is encrypted and authenticated (AES-128-GCM), and a
 * participant that proved itself but does not speak TLS gets no byte of
 * weights: its connection ends when its TLS handshake fails or times out.
 *
 * The root's listening socket lives as long as its engine; receivers connect
 * anew for every plan, so a receiver that failed one step starts clean next.
 *
 * Several sources (bcast_plan.nsources > 1, a sharded trainer): every source
 * rank is a root of this protocol for its own buckets, on its own listener
 * (bcast_plan_source_endpoint), with the same handshake, TLS and bounds; a
 * HEADER carries the plan's bucket index, and a source sends its buckets in
 * plan order.  A receiver runs one connection per source at once and sends
 * each source its ACK only once every source's buckets arrived.
 *
 * Relays (bcast_plan.relay_from, one source): a receiver that relays is a
 * receiver of this protocol towards its upstream (the source or another
 * relay, at bcast_plan_upstream_endpoint) and a root of it towards its
 * downstreams, on its engine's listener, with the same handshake, TLS and
 * bounds; it forwards every bucket as received and verified (header and
 * checksum as the source sent them), and ACKs its upstream only after every
 * downstream ACKed it, or with the reason one failed.  A root reads an ACK
 * that arrives while it still sends: a receiver sends one early only to say
 * why it fails.
 *
 * The root casts bucket k+1 on a worker thread while bucket k is on the wire
 * (two buffers) and writes to all receivers at once with non-blocking sockets
 * and poll.  Every wait is bounded by the deadline and ends early when the
 * engine's cancel fd turns readable (the orchestrator aborted the plan: a peer
 * that will never connect, or that stopped reading, must not hold the others
 * until the deadline); a bucket must be through at the plan's throughput floor
 * (min_gbps) plus BUCKET_SLACK_S, else the slow receiver is named with the
 * rate observed against the one expected.  Writes use MSG_NOSIGNAL so a dead
 * receiver is an error code (EPIPE/ECONNRESET), never a signal. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "workers/bcast/bcast_internal.h"

#define MAGIC_CHALLENGE 0x43424c52u /* "RLBC" */
#define MAGIC_HELLO 0x48424c52u     /* "RLBH" */
#define MAGIC_REPLY 0x52424c52u     /* "RLBR" */
#define MAGIC_BUCKET 0x4b424c52u    /* "RLBK" */
#define MAGIC_ACK 0x41424c52u       /* "RLBA" */
#define MAGIC_ABORT 0x58424c52u     /* "RLBX" */
#define PROTO_VERSION 2u
#define HEADER_BYTES 24
#define CHALLENGE_BYTES (8 + BCAST_NONCE_BYTES)
/* A receiver answers the challenge within one round trip; a connection that
 * has not proved itself by then is not a peer worth waiting for. */
#define HANDSHAKE_S 2.0
/* Unauthenticated connections open at once; the oldest goes first when more
 * arrive, so a flood can neither grow memory nor lock a receiver out for
 * longer than it takes that receiver to answer. */
#define PENDING_MAX 32
/* What a bucket may take beyond its bytes at the plan's floor: the cast of
 * the next bucket, a scheduling hiccup. */
#define BUCKET_SLACK_S 2.0
/* A relay gives up on downstreams that do not connect this long before its
 * own deadline, so that its upstream, which waits as long as the relay
 * would, still hears why (the relay's ACK names them). */
#define RELAY_REPORT_S 1.0
#define SOCK_BUF (8 << 20)
#define SOCK_MIN_BUF (4 << 20)

/* ---- little-endian encoding ------------------------------------------------ */

static void put32(uint8_t *b, uint32_t v) {
  for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *b, uint64_t v) {
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *b) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = v << 8 | b[i];
  return v;
}
static uint64_t get64(const uint8_t *b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
  return v;
}

/* ---- sockets -------------------------------------------------------------------- */

static int poll_ms(double deadline) {
  double left = deadline - bcast__now();
  if (left <= 0) return 0;
  return left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1;
}

static long sysctl_long(const char *path) {
  FILE *f = fopen(path, "r");
  long v = -1;
  if (f) {
    if (fscanf(f, "%ld", &v) != 1) v = -1;
    fclose(f);
  }
  return v;
}

/* Setting SO_SNDBUF/SO_RCVBUF switches off the kernel's autotuning, so ask
 * only where the kernel lets the buffer be large (net.core.*mem_max). */
static void set_buf(int fd, int opt, const char *maxpath) {
  long max = sysctl_long(maxpath);
  if (max < SOCK_MIN_BUF) return;
  int buf = max < SOCK_BUF ? (int)max : SOCK_BUF;
  setsockopt(fd, SOL_SOCKET, opt, &buf, sizeof buf);
}

static void tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  set_buf(fd, SO_SNDBUF, "/proc/sys/net/core/wmem_max");
  set_buf(fd, SO_RCVBUF, "/proc/sys/net/core/rmem_max");
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* "host:port", "[v6]:port" or ":port" into host and port strings. */
static int split_addr(const char *addr, char *host, size_t hl, char *port, size_t pl) {
  const char *colon = strrchr(addr, ':');
  if (!colon || !colon[1]) return -1;
  const char *h = addr;
  size_t n = (size_t)(colon - addr);
  if (n >= 2 && h[0] == '[' && h[n - 1] == ']') {
    h++;
    n -= 2;
  }
  if (n >= hl || strlen(colon + 1) >= pl) return -1;
  memcpy(host, h, n);
  host[n] = 0;
  snprintf(port, pl, "%s", colon + 1);
  return 0;
}

static void name_of(const struct sockaddr_storage *ss, char *out, size_t len) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (ss->ss_family == AF_INET6) {
    const struct sockaddr_in6 *a = (const void *)ss;
    inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
    snprintf(out, len, "[%s]:%u", ip, ntohs(a->sin6_port));
  } else {
    const struct sockaddr_in *a = (const void *)ss;
    inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
    snprintf(out, len, "%s:%u", ip, ntohs(a->sin_port));
  }
}

int bcast__host_listen(const char *addr, int *fdp, char *bound, size_t boundlen, bcast_err *err) {
  char host[256], port[32];
  *fdp = -1;
  if (!addr || split_addr(addr, host, sizeof host, port, sizeof port))
    return bcast__fail(err, BCAST_EINVAL, "host_listen '%s': expected host:port", addr ? addr : "(null)");
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res;
  int g = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
  if (g) return bcast__fail(err, BCAST_EINVAL, "host_listen '%s': %s", addr, gai_strerror(g));
  int fd = -1, e = 0;
  for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 128)) {
      e = errno;
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) return bcast__fail(err, BCAST_EIO, "host_listen '%s': %s", addr, strerror(e ? e : EADDRNOTAVAIL));
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof ss); /* never read what the kernel did not write */
  socklen_t sl = sizeof ss;
  if (getsockname(fd, (struct sockaddr *)&ss, &sl)) { /* the bound port is the whole point */
    e = errno;
    close(fd);
    return bcast__fail(err, BCAST_EIO, "host_listen '%s': getsockname: %s", addr, strerror(e));
  }
  name_of(&ss, bound, boundlen);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  *fdp = fd;
  return BCAST_OK;
}

/* Waits until fd has `events`, the deadline passes or cancel_fd (-1: none)
 * turns readable. 1: ready; 0 with errno ETIMEDOUT or ECANCELED. */
static int wait_fd(int fd, short events, int cancel_fd, double deadline) {
  for (;;) {
    struct pollfd pf[2] = {{fd, events, 0}, {cancel_fd, POLLIN, 0}};
    int ms = poll_ms(deadline);
    if (ms == 0) break;
    int n = poll(pf, cancel_fd >= 0 ? 2 : 1, ms);
    if (n < 0 && errno != EINTR) return 1; /* let the caller's I/O report it */
    if (n > 0 && cancel_fd >= 0 && pf[1].revents) {
      errno = ECANCELED;
      return 0;
    }
    if (n > 0) return 1;
  }
  errno = ETIMEDOUT;
  return 0;
}

/* The BCAST_E* code for an errno left by the socket helpers. */
static int io_code(int e) {
  return e == ETIMEDOUT ? BCAST_ETIMEDOUT : e == ECANCELED ? BCAST_ECANCELED : BCAST_EPEER;
}

/* Reads or writes exactly n bytes on a non-blocking socket before the deadline.
 * Returns 0, or -1 with errno (ETIMEDOUT, ECANCELED, EPIPE for a clean close, ...). */
static int io_full_done(bcast__conn *c, void *buf, size_t n, int writing, int cancel_fd, double deadline,
                        size_t *done) {
  uint8_t *p = buf;
  while (n > 0) {
    short want;
    ssize_t r = bcast__conn_io(c, p, n, writing, &want);
    if (r > 0) {
      p += r;
      n -= (size_t)r;
      if (done) *done += (size_t)r;
      continue;
    }
    if (r == 0) {
      errno = EPIPE;
      return -1;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    if (!wait_fd(c->fd, want, cancel_fd, deadline)) return -1;
  }
  return 0;
}

static int io_full(bcast__conn *c, void *buf, size_t n, int writing, int cancel_fd, double deadline) {
  return io_full_done(c, buf, n, writing, cancel_fd, deadline, NULL);
}

/* TLS over an authenticated connection (server: the root), before the
 * deadline. 0, or -1 with errno (ETIMEDOUT, ECANCELED, EPROTO) and why. */
static int tls_handshake(bcast__conn *c, int server, const uint8_t key[BCAST_SECRET_BYTES], int cancel_fd,
                         double deadline, char *why, size_t whylen) {
  if (bcast__conn_tls_start(c, server, key, why, whylen)) {
    errno = EPROTO;
    return -1;
  }
  for (;;) {
    short want = 0;
    int r = bcast__conn_tls_step(c, &want, why, whylen);
    if (r == 1) return 0;
    if (r < 0) {
      errno = EPROTO;
      return -1;
    }
    if (!wait_fd(c->fd, want, cancel_fd, deadline)) {
      snprintf(why, whylen, "%s", strerror(errno));
      return -1;
    }
  }
}

/* REPLY and ACK share one shape: magic, status, message. */
static int send_status(bcast__conn *c, uint32_t magic, int status, const char *msg, int cancel_fd, double deadline) {
  uint8_t b[12 + 512];
  size_t len = strnlen(msg, 511);
  put32(b, magic);
  put32(b + 4, (uint32_t)status);
  put32(b + 8, (uint32_t)len);
  memcpy(b + 12, msg, len);
  return io_full(c, b, 12 + len, 1, cancel_fd, deadline);
}

static int recv_status(bcast__conn *c, uint32_t magic, int *status, char *msg, size_t msglen, int cancel_fd,
                       double deadline) {
  uint8_t b[12];
  char tmp[512];
  if (io_full(c, b, 12, 0, cancel_fd, deadline)) return -1;
  uint32_t len = get32(b + 8);
  if (get32(b) != magic || len > 511) {
    errno = EPROTO;
    return -1;
  }
  if (io_full(c, tmp, len, 0, cancel_fd, deadline)) return -1;
  tmp[len] = 0;
  *status = (int32_t)get32(b + 4);
  snprintf(msg, msglen, "%s", tmp);
  return 0;
}

/* bt: the nbt buckets this participant moved (a source: its own; a
 * receiver: all).  wire_alone_s: the time the wire ran alone; with several
 * sources a receiver's streams overlap, so that is the longest of the
 * streams' sums, not the sum over buckets (which wire_s still is). */
static void fill_stats(bcast_stats *st, const bcast_plan *p, double t0, bcast_bucket_timing *bt, size_t nbt,
                       uint64_t wire_bytes, double wire_alone_s) {
  st->mode = BCAST_MODE_HOST;
  st->transport = p->tls ? "host-tls" : "host-tcp";
  st->wire_bytes = wire_bytes;
  st->nbuckets = (uint32_t)nbt;
  st->buckets = bt;
  for (size_t b = 0; b < nbt; b++) {
    st->cast_s += bt[b].cast_s;
    st->wire_s += bt[b].wire_s;
  }
  st->total_s = bcast__now() - t0;
  /* The wire ran alone for wire_alone_s: what the total adds on top was not hidden. */
  st->wire_alone_s = wire_alone_s;
  st->exposed_measured = 1;
  st->exposed_s = bcast__exposed_s(st->total_s, st->wire_alone_s);
  st->gbps = st->total_s > 0 ? (double)st->wire_bytes / st->total_s / 1e9 : 0;
}

/* Every sender's link (a source's, a relay's) carries one copy per receiver
 * it serves; the plan's floor (min_gbps) holds for each link on its own, and
 * the busiest one sets the pace of the whole pipeline. */
static uint32_t fanout(const bcast_plan *p) { return bcast__plan_fanout(p); }

static uint64_t max_bucket(const bcast_plan *p) {
  uint64_t m = 0;
  for (size_t b = 0; b < p->nbuckets; b++)
    if (p->buckets[b].bytes > m) m = p->buckets[b].bytes;
  return m;
}

/* When bucket k must be through: its bytes to every receiver at the plan's
 * floor plus `slack`, or timeout_s when the plan has no floor; never past
 * the plan's deadline. */
static double bucket_deadline(const bcast_plan *p, size_t k, const bcast__host_io *io, double slack) {
  double t = io->timeout_s;
  if (p->min_gbps > 0) {
    uint32_t rx = fanout(p);
    double copies = rx > 1 ? (double)rx : 1.0;
    t = slack + (double)p->buckets[k].bytes * copies / (p->min_gbps * 1e9);
  }
  return bcast__deadline(t, p->deadline_unix_ms);
}

/* What a receiver is expected to take at least, for messages (GB/s). */
static double per_receiver_floor(const bcast_plan *p) {
  uint32_t rx = fanout(p);
  return rx > 1 ? p->min_gbps / (double)rx : p->min_gbps;
}

/* The longest any one source may take for all its buckets within the
 * per-bucket bounds (bucket_deadline), from now. */
static double others_bound_s(const bcast_plan *p, const bcast__host_io *io) {
  uint32_t ns = bcast__plan_nsources(p);
  double worst = 0;
  for (uint32_t s = 0; s < ns; s++) {
    double t = 0, now = bcast__now();
    for (size_t k = 0; k < p->nbuckets; k++)
      if (p->buckets[k].source_rank == s) t += bucket_deadline(p, k, io, BUCKET_SLACK_S) - now;
    if (t > worst) worst = t;
  }
  return worst;
}

/* ---- the hello, parsed --------------------------------------------------------------- */

int bcast__hello_parse(const uint8_t *b, size_t n, size_t *need, bcast__hello *h) {
  *need = BCAST_HELLO_FIXED;
  if (n >= 4 && get32(b) != MAGIC_HELLO) return -1;
  if (n >= 8 && get32(b + 4) != PROTO_VERSION) return -1;
  if (n >= 16 && (get32(b + 12) == 0 || get32(b + 12) > 127)) return -1;
  if (n < BCAST_HELLO_FIXED) return 1;
  uint32_t idlen = get32(b + 12);
  *need = BCAST_HELLO_FIXED + idlen + BCAST_MAC_BYTES;
  if (n < *need) return 1;
  if (n > *need) return -1; /* a receiver waits for the reply: nothing follows its hello */
  if (memchr(b + BCAST_HELLO_FIXED, 0, idlen)) return -1;
  h->rank = get32(b + 8);
  h->hash = get64(b + 16);
  memcpy(h->rx_nonce, b + 24, BCAST_NONCE_BYTES);
  memcpy(h->id, b + BCAST_HELLO_FIXED, idlen);
  h->id[idlen] = 0;
  memcpy(h->mac, b + BCAST_HELLO_FIXED + idlen, BCAST_MAC_BYTES);
  return 0;
}

/* ======================= root (sender) ======================================= */

typedef struct peer {
  bcast__conn c;
  uint32_t rank;
  uint32_t view; /* bcast_plan_rank_view of rank: what of each bucket it gets */
  uint64_t sent; /* bytes of the current bucket's header + payload written */
  short want;    /* what its connection waits for to write on (TLS may read) */
  /* The current bucket as this receiver gets it: the whole wire buffer, or
   * its view's bytes packed; len 0: nothing of this bucket, no header. */
  const uint8_t *buf;
  uint64_t len, sum;
} peer;

/* A connection accepted but not yet authenticated. */
typedef struct pending {
  int fd;
  double deadline;
  uint8_t nonce[BCAST_NONCE_BYTES];
  uint8_t buf[BCAST_HELLO_MAX];
  size_t got;
} pending;

typedef struct acceptor {
  const bcast_plan *p;
  const bcast__host_io *io;
  uint32_t rank; /* the root's (a source, or a relay) */
  peer *peers;
  size_t have, want;
  pending pend[PENDING_MAX];
  size_t npend;
  uint32_t refused;
} acceptor;

static void pending_drop(acceptor *ac, size_t i, int refused) {
  close(ac->pend[i].fd);
  ac->pend[i] = ac->pend[--ac->npend];
  if (refused) ac->refused++;
}

/* Accepts what the backlog holds and challenges each connection.  0, or <0
 * to fail the plan (no randomness: nothing can be authenticated). */
static int accept_new(acceptor *ac, int lfd, double plan_deadline, bcast_err *err) {
  for (int burst = 0; burst < PENDING_MAX; burst++) {
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) return 0; /* EAGAIN, or an error of that one connection only */
    tune(fd);
    if (ac->npend == PENDING_MAX) { /* evict the oldest: it had the most time to answer */
      size_t old = 0;
      for (size_t i = 1; i < ac->npend; i++)
        if (ac->pend[i].deadline < ac->pend[old].deadline) old = i;
      pending_drop(ac, old, 1);
    }
    pending *c = &ac->pend[ac->npend];
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->deadline = bcast__now() + HANDSHAKE_S;
    if (c->deadline > plan_deadline) c->deadline = plan_deadline;
    if (bcast__random(c->nonce, sizeof c->nonce)) {
      close(fd);
      return bcast__fail(err, BCAST_EIO, "plan '%s': no randomness for a handshake nonce: %s", ac->p->id,
                         strerror(errno));
    }
    uint8_t ch[CHALLENGE_BYTES];
    put32(ch, MAGIC_CHALLENGE);
    put32(ch + 4, PROTO_VERSION);
    memcpy(ch + 8, c->nonce, BCAST_NONCE_BYTES);
    /* A fresh socket's buffer is empty: 40 bytes go at once or the peer is gone. */
    if (send(fd, ch, sizeof ch, MSG_NOSIGNAL) != (ssize_t)sizeof ch) {
      close(fd);
      ac->refused++;
      continue;
    }
    ac->npend++;
  }
  return 0;
}

/* 1 when rank r takes its bytes from root `me`: every receiver from each
 * source, or those relay_from sends to `me`. */
static int serves(const bcast_plan *p, uint32_t me, uint32_t r) {
  uint32_t ns = bcast__plan_nsources(p);
  if (r >= p->world_size || r == me || r == p->root_rank || (ns > 1 && r < ns)) return 0;
  return bcast_plan_upstream(p, r) == me || ns > 1;
}

/* A connection that proved it holds the plan's secret: a receiver of this
 * plan, to answer with the root's own proof.  1 when admitted, 0 when it
 * went away before the answer (it may come again), <0 to fail the plan. */
static int admit(acceptor *ac, pending *c, const bcast__hello *h, bcast_err *err) {
  const bcast_plan *p = ac->p;
  char why[256] = "";
  int code = BCAST_OK;
  uint32_t ns = bcast__plan_nsources(p);
  if (!serves(p, ac->rank, h->rank)) {
    code = BCAST_EPEER;
    if (p->relay_from && h->rank < p->world_size && h->rank != p->root_rank)
      snprintf(why, sizeof why, "receiver claims rank %u: it takes its bytes from rank %u, not from rank %u",
               h->rank, bcast_plan_upstream(p, h->rank), ac->rank);
    else if (ns > 1)
      snprintf(why, sizeof why, "receiver claims rank %u: not a receiver rank of world size %u with sources "
               "0..%u", h->rank, p->world_size, ns - 1);
    else
      snprintf(why, sizeof why, "receiver claims rank %u: not a receiver rank of world size %u with root %u",
               h->rank, p->world_size, p->root_rank);
  }
  for (size_t i = 0; i < ac->have && !code; i++)
    if (ac->peers[i].rank == h->rank) {
      code = BCAST_EPEER;
      snprintf(why, sizeof why, "receiver rank %u connected twice", h->rank);
    }
  double hd = bcast__now() + 1.0;
  bcast__conn pc = {.fd = c->fd}; /* plaintext until the proofs are exchanged */
  if (code) { /* it holds the secret: a participant with a fault, told why */
    uint8_t b[12 + sizeof why];
    size_t len = strlen(why);
    put32(b, MAGIC_REPLY);
    put32(b + 4, (uint32_t)code);
    put32(b + 8, (uint32_t)len);
    memcpy(b + 12, why, len);
    io_full(&pc, b, 12 + len, 1, -1, hd);
    return bcast__fail(err, code, "plan '%s': %s", p->id, why);
  }
  uint8_t b[12 + BCAST_MAC_BYTES];
  put32(b, MAGIC_REPLY);
  put32(b + 4, 0);
  put32(b + 8, BCAST_MAC_BYTES);
  if (bcast__reply_mac(p->secret, c->nonce, h->rx_nonce, h->rank, p->hash, p->id, b + 12))
    return bcast__fail(err, BCAST_EIO, "plan '%s': HMAC-SHA256 failed in libcrypto", p->id);
  if (io_full(&pc, b, sizeof b, 1, ac->io->cancel_fd, hd)) {
    if (errno == ECANCELED) return bcast__fail(err, BCAST_ECANCELED, "plan '%s': cancelled", p->id);
    return 0;
  }
  if (p->tls) {
    /* It proved itself: a TLS failure now is a fault of a participant (or of
     * the path), which may connect again; the connection only goes. */
    uint8_t key[BCAST_SECRET_BYTES];
    char tw[256] = "";
    int rc = bcast__tls_key(p->secret, c->nonce, h->rx_nonce, h->rank, p->hash, p->id, key);
    if (!rc) rc = tls_handshake(&pc, 1, key, ac->io->cancel_fd, bcast__now() + HANDSHAKE_S, tw, sizeof tw);
    int e = errno;
    bcast__wipe(key, sizeof key);
    if (rc) {
      pc.fd = -1; /* the pending entry still owns the socket */
      bcast__conn_close(&pc);
      if (e == ECANCELED) return bcast__fail(err, BCAST_ECANCELED, "plan '%s': cancelled", p->id);
      return 0;
    }
  }
  ac->peers[ac->have++] = (peer){pc, h->rank, bcast_plan_rank_view(p, h->rank)};
  return 1;
}

/* Reads what pending connection i sent; checks a whole hello.  Everything
 * that is not a proof of the secret closes the connection without a word. */
static int pending_read(acceptor *ac, size_t i, bcast_err *err) {
  pending *c = &ac->pend[i];
  size_t need = 0;
  bcast__hello h;
  for (;;) {
    ssize_t r = recv(c->fd, c->buf + c->got, sizeof c->buf - c->got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (r <= 0) break; /* closed or reset before a whole hello */
    c->got += (size_t)r;
    int pr = bcast__hello_parse(c->buf, c->got, &need, &h);
    if (pr < 0) break;
    if (pr > 0) {
      if (c->got == sizeof c->buf) break;
      continue;
    }
    const bcast_plan *p = ac->p;
    uint8_t want[BCAST_MAC_BYTES] = {0};
    /* Only the plan's own id and hash can verify: the secret is this plan's. */
    int ok = p->has_secret && strcmp(h.id, p->id) == 0 && h.hash == p->hash &&
             bcast__hello_mac(p->secret, c->nonce, h.rx_nonce, h.rank, h.hash, h.id, want) == 0;
    ok = bcast__mac_equal(want, h.mac) && ok;
    bcast__wipe(want, sizeof want);
    if (!ok) {
      /* A leftover of the plan cancelled last (it connected before it
       * learnt of the abort) is no stranger; either way it gets nothing. */
      int leftover = ac->io->stale_id && ac->io->stale_id[0] && !strcmp(h.id, ac->io->stale_id);
      pending_drop(ac, i, !leftover);
      return 0;
    }
    int rc = admit(ac, c, &h, err);
    if (rc > 0) { /* the fd moved to the peers */
      ac->pend[i] = ac->pend[--ac->npend];
      return 0;
    }
    pending_drop(ac, i, 0);
    return rc;
  }
  pending_drop(ac, i, 1);
  return 0;
}

static int accept_fail_timeout(acceptor *ac, bcast_err *err) {
  const bcast_plan *p = ac->p;
  char missing[192] = "";
  size_t len = 0;
  for (uint32_t r = 0; r < p->world_size && len + 12 < sizeof missing; r++) {
    int found = !serves(p, ac->rank, r);
    for (size_t i = 0; i < ac->have; i++) found |= ac->peers[i].rank == r;
    if (!found) len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%u", len ? "," : "", r);
  }
  return bcast__fail(err, BCAST_ETIMEDOUT,
                     "plan '%s': %zu of %zu receivers connected before the deadline; missing rank(s) %s; "
                     "%u connection(s) refused (no proof of the plan's secret)",
                     p->id, ac->have, ac->want, missing, ac->refused);
}

/* Waits until every receiver proved itself, with every handshake in one poll
 * loop: a silent or hostile connection holds a slot for HANDSHAKE_S at most
 * and delays no one. */
static int accept_all(int lfd, acceptor *ac, double deadline, bcast_err *err) {
  const bcast_plan *p = ac->p;
  int rc = BCAST_OK;
  if (!p->has_secret)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': no data-channel secret: host mode cannot authenticate "
                       "its receivers", p->id);
  while (ac->have < ac->want && !rc) {
    double now = bcast__now();
    for (size_t i = ac->npend; i-- > 0;)
      if (ac->pend[i].deadline <= now) pending_drop(ac, i, 1);
    if (now >= deadline) return accept_fail_timeout(ac, err);
    struct pollfd pf[PENDING_MAX + 2];
    size_t n = 0;
    double until = deadline;
    for (size_t i = 0; i < ac->npend; i++) {
      pf[n++] = (struct pollfd){ac->pend[i].fd, POLLIN, 0};
      if (ac->pend[i].deadline < until) until = ac->pend[i].deadline;
    }
    size_t lfd_at = n, cancel_at = n + 1;
    pf[n++] = (struct pollfd){lfd, POLLIN, 0};
    if (ac->io->cancel_fd >= 0) pf[n++] = (struct pollfd){ac->io->cancel_fd, POLLIN, 0};
    int ms = poll_ms(until);
    int got = ms ? poll(pf, n, ms) : 0;
    if (got < 0 && errno != EINTR)
      return bcast__fail(err, BCAST_EIO, "plan '%s': poll: %s", p->id, strerror(errno));
    if (got <= 0) continue;
    if (ac->io->cancel_fd >= 0 && pf[cancel_at].revents)
      return bcast__fail(err, BCAST_ECANCELED, "plan '%s': cancelled with %zu of %zu receivers connected",
                         p->id, ac->have, ac->want);
    /* The pending list is reshuffled by drops: walk it from the end, by fd. */
    for (size_t k = lfd_at; k-- > 0 && !rc;) {
      if (!pf[k].revents) continue;
      for (size_t i = 0; i < ac->npend; i++)
        if (ac->pend[i].fd == pf[k].fd) {
          rc = pending_read(ac, i, err);
          break;
        }
    }
    if (!rc && pf[lfd_at].revents) rc = accept_new(ac, lfd, deadline, err);
  }
  return rc;
}

/* The cast worker fills slot j % 2 with this source's j-th bucket while the
 * main thread sends. */
typedef struct caster {
  const bcast_plan *p;
  const size_t *mine; /* this source's buckets, in plan order */
  size_t nmine;
  const bcast_tensor *local;
  const uint32_t *map;
  int threads;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint8_t *buf[2];
  int ready[2];   /* slot holds a cast bucket not yet sent */
  uint64_t sum[2];
  int stop;
  int failed;     /* cast error: bucket index + 1 */
  bcast_bucket_timing *bt;
} caster;

static void cast_bucket(caster *c, size_t k, uint8_t *buf) {
  const bcast_bucket *b = &c->p->buckets[k];
  size_t wsz = bcast_dtype_size(b->wire_dtype);
  uint64_t end = 0;
  for (size_t s = 0; s < b->nslices; s++) {
    const bcast_slice *sl = &b->slices[s];
    const bcast_tensor *t = &c->local[c->map[sl->tensor]];
    size_t ssz = bcast_dtype_size(t->storage_dtype);
    /* A shard's data starts at its first element (bind checked the range). */
    const uint8_t *src = (const uint8_t *)t->data + (sl->elem_offset - t->shard_offset) * ssz;
    if (sl->bucket_offset > end) memset(buf + end, 0, sl->bucket_offset - end); /* padding */
    if (bcast__cast_parallel(buf + sl->bucket_offset, b->wire_dtype, src,
                             t->storage_dtype, sl->elem_count, c->threads))
      c->failed = (int)k + 1;
    end = sl->bucket_offset + sl->elem_count * wsz;
  }
}

static void *caster_main(void *arg) {
  caster *c = arg;
  for (size_t j = 0; j < c->nmine; j++) {
    size_t k = c->mine[j];
    int s = (int)(j & 1);
    pthread_mutex_lock(&c->mu);
    while (c->ready[s] && !c->stop) pthread_cond_wait(&c->cv, &c->mu);
    int stop = c->stop;
    pthread_mutex_unlock(&c->mu);
    if (stop) break;
    double t0 = bcast__now();
    cast_bucket(c, k, c->buf[s]);
    uint64_t sum = c->p->checksum == BCAST_CHECKSUM_XXH3_64 ? bcast_checksum64(c->buf[s], c->p->buckets[k].bytes) : 0;
    c->bt[j].cast_s = bcast__now() - t0;
    pthread_mutex_lock(&c->mu);
    c->sum[s] = sum;
    c->ready[s] = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
  }
  return NULL;
}

/* Names the failure of one receiver while sending bucket k, reading its ACK
 * first when it left one (a checksum or scatter error on its side).  A stall
 * says what the receiver took against what the plan's floor expects. */
static int peer_failed(const bcast_plan *p, peer *pr, size_t k, int e, double elapsed, bcast_err *err) {
  int status = 0;
  char msg[512];
  if (e == ECANCELED) return bcast__fail(err, BCAST_ECANCELED, "plan '%s': cancelled at bucket %zu", p->id, k);
  if (e != ETIMEDOUT && recv_status(&pr->c, MAGIC_ACK, &status, msg, sizeof msg, -1, bcast__now() + 0.05) == 0 &&
      status)
    return bcast__fail(err, BCAST_EPEER, "receiver rank %u failed at bucket %zu (layer %u): %s", pr->rank, k,
                       p->buckets[k].layer, msg);
  if (e == ETIMEDOUT) {
    uint64_t took = pr->sent > HEADER_BYTES ? pr->sent - HEADER_BYTES : 0;
    double gbps = elapsed > 0 ? (double)took / elapsed / 1e9 : 0;
    char expect[128] = "no floor in the plan";
    if (p->min_gbps > 0)
      snprintf(expect, sizeof expect, "expected at least %.3g GB/s per receiver for host mode",
               per_receiver_floor(p));
    return bcast__fail(err, BCAST_ETIMEDOUT, "receiver rank %u stalled at bucket %zu (layer %u): observed %.3g GB/s "
                       "(%.1f of %.1f MB in %.2f s), %s", pr->rank, k, p->buckets[k].layer, gbps, (double)took / 1e6,
                       (double)p->buckets[k].bytes / 1e6, elapsed, expect);
  }
  return bcast__fail(err, BCAST_EPEER, "receiver rank %u closed the connection at bucket %zu (layer %u): %s", pr->rank,
                     k, p->buckets[k].layer, strerror(e));
}

/* Writes header + payload of bucket k to every receiver concurrently.  Every
 * wait polls the cancel fd too: a receiver that stopped reading (a stopped
 * process keeps its socket open) never holds the root past an abort. */
static int send_bucket(const bcast_plan *p, size_t k, peer *peers, size_t np, int cancel_fd, double deadline,
                       bcast_err *err) {
  double t0 = bcast__now();
  uint8_t (*hdr)[HEADER_BYTES] = malloc((np ? np : 1) * sizeof *hdr);
  if (!hdr) return bcast__fail(err, BCAST_ENOMEM, "out of memory for %zu bucket headers", np);
  for (size_t i = 0; i < np; i++) {
    put32(hdr[i], MAGIC_BUCKET);
    put32(hdr[i] + 4, (uint32_t)k);
    put64(hdr[i] + 8, peers[i].len);
    put64(hdr[i] + 16, peers[i].sum);
    peers[i].sent = 0;
  }
  int rc = BCAST_OK;
  struct pollfd pf[np + 1];
  size_t at[np + 1]; /* the peer of each pf entry */
  for (;;) {
    size_t waiting = 0;
    for (size_t i = 0; i < np; i++) {
      peer *pr = &peers[i];
      uint64_t total = pr->len ? HEADER_BYTES + pr->len : 0;
      while (pr->sent < total) {
        const uint8_t *src = pr->sent < HEADER_BYTES ? hdr[i] + pr->sent : pr->buf + (pr->sent - HEADER_BYTES);
        size_t len = pr->sent < HEADER_BYTES ? HEADER_BYTES - pr->sent : total - pr->sent;
        ssize_t r = bcast__conn_io(&pr->c, (void *)src, len, 1, &pr->want);
        if (r > 0) {
          pr->sent += (uint64_t)r;
          continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        rc = peer_failed(p, pr, k, r < 0 ? errno : EPIPE, 0, err);
        goto out;
      }
      /* POLLIN too: a receiver sends nothing before its last bucket but an
       * ACK that says why it fails (a relay whose downstream failed). */
      if (pr->sent < total) {
        at[waiting] = i;
        pf[waiting++] = (struct pollfd){pr->c.fd, (short)(pr->want | POLLIN), 0};
      }
    }
    if (!waiting) break;
    size_t npf = waiting;
    if (cancel_fd >= 0) pf[npf++] = (struct pollfd){cancel_fd, POLLIN, 0};
    int ms = poll_ms(deadline);
    int n = ms ? poll(pf, npf, ms) : 0;
    if (n > 0 && cancel_fd >= 0 && pf[waiting].revents) {
      rc = bcast__fail(err, BCAST_ECANCELED, "plan '%s': cancelled at bucket %zu", p->id, k);
      break;
    }
    for (size_t w = 0; n > 0 && w < waiting; w++)
      if ((pf[w].revents & POLLIN) && !(peers[at[w]].want & POLLIN)) {
        rc = peer_failed(p, &peers[at[w]], k, EPIPE, 0, err);
        goto out;
      }
    if (n <= 0 && bcast__now() >= deadline) {
      /* Name the receiver furthest behind: the one holding the others up. */
      peer *slow = NULL;
      for (size_t i = 0; i < np; i++)
        if (peers[i].len && peers[i].sent < HEADER_BYTES + peers[i].len && (!slow || peers[i].sent < slow->sent))
          slow = &peers[i];
      if (slow) {
        rc = peer_failed(p, slow, k, ETIMEDOUT, bcast__now() - t0, err);
        break;
      }
    }
  }
out:
  free(hdr);
  return rc;
}

/* Receiver views: bucket k as each view gets it, packed once per view (not
 * per receiver) from the bucket's wire buffer: every slice's runs of the
 * view's part, in slice and element order, no padding; a receiver scatters
 * the same runs back (scatter). `at` advances through the packed bytes:
 * packing writes them to dst from the slice at src, scattering reads them
 * from src into the dense part at dst. */
typedef struct run_copy {
  uint8_t *dst;
  const uint8_t *src;
  size_t wsz;
  uint64_t at;
} run_copy;

static int pack_run(void *ud, uint64_t off, uint64_t local, uint64_t n) {
  (void)local;
  run_copy *v = ud;
  memcpy(v->dst + v->at, v->src + off * v->wsz, n * v->wsz);
  v->at += n * v->wsz;
  return 0;
}

static void pack_view(const bcast_plan *p, size_t k, uint32_t view, const uint8_t *buf, uint8_t *out) {
  const bcast_bucket *b = &p->buckets[k];
  run_copy v = {.dst = out, .wsz = bcast_dtype_size(b->wire_dtype)};
  for (size_t s = 0; s < b->nslices; s++) {
    const bcast_slice *sl = &b->slices[s];
    v.src = buf + sl->bucket_offset;
    bcast__part_runs(&p->tensors[sl->tensor], bcast__view_part(p, view, sl->tensor), sl->elem_offset,
                     sl->elem_count, pack_run, &v);
  }
}

/* One view's packed copy of the bucket being sent, made once for all of its
 * receivers. */
typedef struct view_buf {
  uint8_t *buf;    /* NULL: no receiver of this source has the view */
  uint64_t len, sum;
  size_t bucket;   /* the bucket it holds now; SIZE_MAX: none yet */
} view_buf;

/* What each receiver gets of bucket k, cast into `buf` with checksum `sum`:
 * the whole buffer, or its view's packed copy (vb NULL: every receiver is
 * whole, as a relay's are: validation refuses views with relays). */
static void peers_bucket(const bcast_plan *p, size_t k, const uint8_t *buf, uint64_t sum, peer *peers, size_t np,
                         view_buf *vb) {
  for (size_t i = 0; i < np; i++) {
    peer *pr = &peers[i];
    if (pr->view == BCAST_VIEW_WHOLE || !vb) {
      pr->buf = buf;
      pr->len = p->buckets[k].bytes;
      pr->sum = sum;
      continue;
    }
    view_buf *v = &vb[pr->view];
    if (v->bucket != k) {
      pack_view(p, k, pr->view, buf, v->buf);
      v->len = bcast__view_bucket_bytes(p, pr->view, k);
      v->sum = p->checksum == BCAST_CHECKSUM_XXH3_64 ? bcast_checksum64(v->buf, v->len) : 0;
      v->bucket = k;
    }
    pr->buf = v->buf;
    pr->len = v->len;
    pr->sum = v->sum;
  }
}

/* Every receiver confirms the last bucket.  What it still has to take when
 * the root has written everything is what the socket buffers hold (both
 * ends) plus the last bucket it verifies: that, at the plan's floor, plus
 * slack bounds the wait, so a receiver stopped with the data in its buffers
 * is cut off like one that stalled mid-bucket. */
static int collect_acks(const bcast_plan *p, peer *peers, size_t np, const bcast__host_io *io, bcast_err *err) {
  double t0 = bcast__now(), dl = bcast__deadline(io->timeout_s, p->deadline_unix_ms);
  if (p->min_gbps > 0) {
    /* With relays each hop below holds as much again before the last
     * receiver confirms, and every relay waits for its own receivers. */
    double copies = np > 1 ? (double)np : 1.0, hops = bcast__plan_depth(p);
    double inflight = (double)max_bucket(p) + 2.0 * SOCK_BUF;
    dl = bcast__deadline(hops * (BUCKET_SLACK_S + inflight * copies / (p->min_gbps * 1e9)), p->deadline_unix_ms);
  }
  /* Several sources: receivers confirm once every source's buckets are in,
   * so this source also waits for the slowest other one, within the bounds
   * that source's buckets are held to. */
  if (bcast__plan_nsources(p) > 1) {
    double end = bcast__deadline(1e9, p->deadline_unix_ms);
    dl += others_bound_s(p, io);
    if (dl > end) dl = end; /* never past the plan's deadline */
  }
  for (size_t i = 0; i < np; i++) {
    int status = 0;
    char msg[512];
    if (recv_status(&peers[i].c, MAGIC_ACK, &status, msg, sizeof msg, io->cancel_fd, dl)) {
      int e = errno;
      if (e == ETIMEDOUT && p->min_gbps > 0)
        return bcast__fail(err, BCAST_ETIMEDOUT, "receiver rank %u did not confirm the last bucket: observed no "
                           "confirmation in %.2f s, expected within %.2f s at %.3g GB/s per receiver for host mode",
                           peers[i].rank, bcast__now() - t0, dl - t0, per_receiver_floor(p));
      return bcast__fail(err, io_code(e), "receiver rank %u did not confirm the last bucket: %s", peers[i].rank,
                         strerror(e));
    }
    if (status) return bcast__fail(err, BCAST_EPEER, "receiver rank %u failed: %s", peers[i].rank, msg);
  }
  return BCAST_OK;
}

static int send_all(caster *c, peer *peers, size_t np, view_buf *vbuf, const bcast__host_io *io,
                    bcast_err *err) {
  const bcast_plan *p = c->p;
  for (size_t j = 0; j < c->nmine; j++) {
    size_t k = c->mine[j];
    int s = (int)(j & 1);
    pthread_mutex_lock(&c->mu);
    while (!c->ready[s]) pthread_cond_wait(&c->cv, &c->mu);
    uint64_t sum = c->sum[s];
    int failed = c->failed;
    pthread_mutex_unlock(&c->mu);
    if (failed)
      return bcast__fail(err, BCAST_EINVAL, "bucket %d (layer %u): cast failed", failed - 1,
                         p->buckets[failed - 1].layer);
    double t0 = bcast__now();
    peers_bucket(p, k, c->buf[s], sum, peers, np, vbuf);
    int rc = send_bucket(p, k, peers, np, io->cancel_fd, bucket_deadline(p, k, io, BUCKET_SLACK_S), err);
    c->bt[j].wire_s = bcast__now() - t0;
    if (rc) return rc;
    pthread_mutex_lock(&c->mu);
    c->ready[s] = 0;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
  }
  return collect_acks(p, peers, np, io, err);
}

int bcast__host_send(int lfd, const bcast_plan *p, uint32_t rank, const bcast_tensor *local, const uint32_t *map,
                     const bcast__host_io *io, int cast_threads, bcast_stats *stats, bcast_err *err) {
  double t0 = bcast__now();
  size_t np = bcast_plan_downstreams(p, rank), nmine = 0;
  uint64_t mb = 0, bytes = 0;
  for (size_t b = 0; b < p->nbuckets; b++)
    if (p->buckets[b].source_rank == rank) {
      nmine++;
      bytes += p->buckets[b].bytes;
      if (p->buckets[b].bytes > mb) mb = p->buckets[b].bytes;
    }
  peer *peers = calloc(np ? np : 1, sizeof *peers);
  bcast_bucket_timing *bt = calloc(nmine ? nmine : 1, sizeof *bt);
  size_t *mine = malloc((nmine ? nmine : 1) * sizeof *mine);
  caster c = {.p = p, .mine = mine, .nmine = nmine, .local = local, .map = map, .threads = cast_threads, .bt = bt};
  uint32_t refused = 0;
  c.buf[0] = malloc(mb ? mb : 1);
  c.buf[1] = malloc(mb ? mb : 1);
  view_buf *vbuf = calloc(p->nviews ? p->nviews : 1, sizeof *vbuf);
  int rc = BCAST_OK;
  if (!peers || !bt || !mine || !c.buf[0] || !c.buf[1] || !vbuf) {
    rc = bcast__fail(err, BCAST_ENOMEM, "out of memory for two %llu-byte wire buffers", (unsigned long long)mb);
    goto out;
  }
  for (size_t b = 0, j = 0; b < p->nbuckets; b++)
    if (p->buckets[b].source_rank == rank) {
      bt[j].bucket = (uint32_t)b;
      mine[j++] = b;
    }
  acceptor ac = {.p = p, .io = io, .rank = rank, .peers = peers, .want = np};
  rc = accept_all(lfd, &ac, bcast__deadline(io->timeout_s, p->deadline_unix_ms), err);
  /* Whatever is still pending is not a receiver of this plan. */
  while (ac.npend) pending_drop(&ac, ac.npend - 1, 1);
  refused = ac.refused;
  if (rc) goto out;
  /* Receivers of a view get their parts, packed per view. */
  for (size_t i = 0; i < np; i++) {
    peers[i].view = bcast_plan_rank_view(p, peers[i].rank);
    view_buf *v = peers[i].view == BCAST_VIEW_WHOLE ? NULL : &vbuf[peers[i].view];
    if (v && !v->buf && (v->bucket = SIZE_MAX, !(v->buf = malloc(mb ? mb : 1)))) {
      rc = bcast__fail(err, BCAST_ENOMEM, "out of memory for a %llu-byte view buffer", (unsigned long long)mb);
      goto out;
    }
  }
  pthread_mutex_init(&c.mu, NULL);
  pthread_cond_init(&c.cv, NULL);
  pthread_t tid;
  if (pthread_create(&tid, NULL, caster_main, &c)) {
    rc = bcast__fail(err, BCAST_ENOMEM, "cannot start the cast thread");
  } else {
    rc = send_all(&c, peers, np, vbuf, io, err);
    pthread_mutex_lock(&c.mu);
    c.stop = 1;
    pthread_cond_broadcast(&c.cv);
    pthread_mutex_unlock(&c.mu);
    pthread_join(tid, NULL);
  }
  pthread_cond_destroy(&c.cv);
  pthread_mutex_destroy(&c.mu);
out:
  for (size_t i = 0; peers && i < np; i++)
    if (peers[i].c.fd > 0) bcast__conn_close(&peers[i].c);
  free(peers);
  free(mine);
  free(c.buf[0]);
  free(c.buf[1]);
  for (uint32_t v = 0; vbuf && v < p->nviews; v++) free(vbuf[v].buf);
  free(vbuf);
  if (rc == BCAST_OK && stats) {
    double wire = 0;
    for (size_t j = 0; j < nmine; j++) wire += bt[j].wire_s;
    fill_stats(stats, p, t0, bt, nmine, bytes, wire);
    stats->refused_connections = refused;
    bt = NULL;
  }
  free(bt);
  return rc;
}

/* ======================= receiver ============================================ */

static int connect_root(const bcast_plan *p, const char *ep, int cancel_fd, double deadline, int *fdp,
                        bcast_err *err) {
  char host[256], port[32];
  if (split_addr(ep, host, sizeof host, port, sizeof port))
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': host_endpoint '%s' is not host:port", p->id, ep);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
  int g = getaddrinfo(host, port, &hints, &res);
  if (g) return bcast__fail(err, BCAST_EIO, "host_endpoint '%s': %s", ep, gai_strerror(g));
  int e = 0;
  for (;;) {
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
      int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
      if (fd < 0) continue;
      tune(fd);
      int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
      if (r < 0 && errno == EINPROGRESS) {
        socklen_t sl = sizeof e;
        if (wait_fd(fd, POLLOUT, cancel_fd, deadline)) {
          if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &sl) == 0 && e == 0) r = 0;
        } else {
          e = errno;
        }
      } else if (r < 0) e = errno;
      if (r == 0) {
        freeaddrinfo(res);
        *fdp = fd;
        return BCAST_OK;
      }
      close(fd);
      if (e == ECANCELED) break;
    }
    if (e == ECANCELED || bcast__now() + 0.05 >= deadline) break;
    /* The root may not listen yet: retry in 50 ms, unless cancelled meanwhile. */
    struct pollfd pf = {cancel_fd, POLLIN, 0};
    if (cancel_fd >= 0 && poll(&pf, 1, 50) == 1) {
      e = ECANCELED;
      break;
    }
    if (cancel_fd < 0) nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
  }
  freeaddrinfo(res);
  if (e == ECANCELED) return bcast__fail(err, BCAST_ECANCELED, "plan '%s': cancelled before the root answered", p->id);
  return bcast__fail(err, BCAST_ETIMEDOUT, "plan '%s': root at %s not reachable before the deadline: %s", p->id,
                     ep, strerror(e ? e : ETIMEDOUT));
}

/* The root closed the connection before its challenge: a root shedding
 * unauthenticated connections under a flood, say.  Worth another try. */
#define HANDSHAKE_RETRY 1

/* Answers the root's challenge and checks the root's proof in return.  0,
 * HANDSHAKE_RETRY, or a negative code with err filled. */
static int handshake(bcast__conn *c, const bcast_plan *p, const char *ep, uint32_t rank, int cancel_fd,
                     double deadline, bcast_err *err) {
  uint8_t ch[CHALLENGE_BYTES];
  if (io_full(c, ch, sizeof ch, 0, cancel_fd, deadline)) {
    int e = errno;
    if (e == EPIPE || e == ECONNRESET) return HANDSHAKE_RETRY;
    return bcast__fail(err, io_code(e), "plan '%s': no handshake challenge from root %s: %s", p->id,
                       ep, strerror(e));
  }
  if (get32(ch) != MAGIC_CHALLENGE || get32(ch + 4) != PROTO_VERSION)
    return bcast__fail(err, BCAST_EPEER, "plan '%s': root %s does not speak data-channel protocol version %u",
                       p->id, ep, PROTO_VERSION);
  uint8_t h[BCAST_HELLO_MAX], *nonce = ch + 8;
  size_t idlen = strnlen(p->id, sizeof p->id - 1);
  put32(h, MAGIC_HELLO);
  put32(h + 4, PROTO_VERSION);
  put32(h + 8, rank);
  put32(h + 12, (uint32_t)idlen);
  put64(h + 16, p->hash);
  uint8_t *rx_nonce = h + 24;
  if (bcast__random(rx_nonce, BCAST_NONCE_BYTES))
    return bcast__fail(err, BCAST_EIO, "plan '%s': no randomness for a handshake nonce: %s", p->id, strerror(errno));
  memcpy(h + BCAST_HELLO_FIXED, p->id, idlen);
  if (bcast__hello_mac(p->secret, nonce, rx_nonce, rank, p->hash, p->id, h + BCAST_HELLO_FIXED + idlen))
    return bcast__fail(err, BCAST_EIO, "plan '%s': HMAC-SHA256 failed in libcrypto", p->id);
  uint8_t r[12];
  if (io_full(c, h, BCAST_HELLO_FIXED + idlen + BCAST_MAC_BYTES, 1, cancel_fd, deadline) ||
      io_full(c, r, sizeof r, 0, cancel_fd, deadline)) {
    int e = errno;
    if (e == EPIPE || e == ECONNRESET)
      return bcast__fail(err, BCAST_EMISMATCH, "plan '%s': root %s closed the connection without accepting rank %u: "
                         "it holds another plan or another secret", p->id, ep, rank);
    return bcast__fail(err, io_code(e), "plan '%s': handshake with root %s failed: %s", p->id, ep,
                       strerror(e));
  }
  int32_t status = (int32_t)get32(r + 4);
  uint32_t len = get32(r + 8);
  if (get32(r) != MAGIC_REPLY || len > 511 || (status == 0 && len != BCAST_MAC_BYTES))
    return bcast__fail(err, BCAST_EPEER, "plan '%s': root %s sent a malformed reply", p->id, ep);
  char msg[512];
  if (io_full(c, msg, len, 0, cancel_fd, deadline))
    return bcast__fail(err, io_code(errno), "plan '%s': reply of root %s cut short: %s", p->id, ep,
                       strerror(errno));
  if (status) {
    msg[len] = 0;
    for (uint32_t i = 0; i < len; i++)
      if (msg[i] < 0x20 || msg[i] > 0x7e) msg[i] = '?'; /* it goes into logs */
    /* The root's code when it is one of ours (a mismatch, a cancel): the peer's
     * number is no code of this engine otherwise. */
    return bcast__fail(err, status <= BCAST_EINVAL && status >= BCAST_ECANCELED ? status : BCAST_EPEER,
                       "root refused rank %u: %s", rank, msg);
  }
  uint8_t want[BCAST_MAC_BYTES];
  int ok = bcast__reply_mac(p->secret, nonce, rx_nonce, rank, p->hash, p->id, want) == 0 &&
           bcast__mac_equal(want, (const uint8_t *)msg);
  bcast__wipe(want, sizeof want);
  if (!ok)
    return bcast__fail(err, BCAST_EPEER, "plan '%s': root %s did not prove it holds the plan's secret: its data "
                       "is not taken", p->id, ep);
  if (p->tls) {
    uint8_t key[BCAST_SECRET_BYTES];
    char tw[256] = "";
    int rc = bcast__tls_key(p->secret, nonce, rx_nonce, rank, p->hash, p->id, key);
    if (!rc) rc = tls_handshake(c, 0, key, cancel_fd, deadline, tw, sizeof tw);
    int e = errno;
    bcast__wipe(key, sizeof key);
    if (rc)
      return bcast__fail(err, e == ECANCELED || e == ETIMEDOUT ? io_code(e) : BCAST_EPEER,
                         "plan '%s': TLS with root %s failed: %s", p->id, ep, tw);
  }
  return BCAST_OK;
}

/* Connects and authenticates, again while the root closes connections
 * before challenging them and the deadline allows. */
static int connect_and_handshake(const bcast_plan *p, const char *ep, uint32_t rank, const bcast__host_io *io,
                                 bcast__conn *c, bcast_err *err) {
  double deadline = bcast__deadline(io->timeout_s, p->deadline_unix_ms);
  for (;;) {
    *c = (bcast__conn){.fd = -1};
    int rc = connect_root(p, ep, io->cancel_fd, deadline, &c->fd, err);
    if (rc) return rc;
    rc = handshake(c, p, ep, rank, io->cancel_fd, deadline, err);
    if (rc == BCAST_OK) return BCAST_OK;
    bcast__conn_close(c);
    if (rc != HANDSHAKE_RETRY) return rc;
    if (bcast__now() + 0.05 >= deadline)
      return bcast__fail(err, BCAST_ETIMEDOUT, "plan '%s': root %s closed every connection before its challenge "
                         "until the deadline", p->id, ep);
    struct pollfd pf = {io->cancel_fd, POLLIN, 0};
    if (io->cancel_fd >= 0 && poll(&pf, 1, 50) == 1)
      return bcast__fail(err, BCAST_ECANCELED, "plan '%s': cancelled before the root answered", p->id);
    if (io->cancel_fd < 0) nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
  }
}

static int scatter_run(void *ud, uint64_t off, uint64_t local, uint64_t n) {
  (void)off;
  run_copy *v = ud;
  memcpy(v->dst + local * v->wsz, v->src + v->at, n * v->wsz);
  v->at += n * v->wsz;
  return 0;
}

/* A whole receiver takes each slice at its bucket offset into the full
 * tensor; one of a view takes the packed runs into its dense parts. */
static void scatter(const bcast_plan *p, size_t k, uint32_t view, const uint8_t *buf, const bcast_tensor *local,
                    const uint32_t *map) {
  const bcast_bucket *b = &p->buckets[k];
  size_t wsz = bcast_dtype_size(b->wire_dtype);
  run_copy v = {.src = buf, .wsz = wsz};
  for (size_t s = 0; s < b->nslices; s++) {
    const bcast_slice *sl = &b->slices[s];
    if (view == BCAST_VIEW_WHOLE) {
      uint8_t *dst = (uint8_t *)local[map[sl->tensor]].data + sl->elem_offset * wsz;
      memcpy(dst, buf + sl->bucket_offset, sl->elem_count * wsz);
      continue;
    }
    const bcast_part *pt = bcast__view_part(p, view, sl->tensor);
    if (pt->kind == BCAST_PART_NONE) continue;
    v.dst = local[map[sl->tensor]].data;
    bcast__part_runs(&p->tensors[sl->tensor], pt, sl->elem_offset, sl->elem_count, scatter_run, &v);
  }
}

/* Receives bucket k into buf, verifies it, scatters it.  On a checksum error
 * the ACK tells the root why before the connection closes. */
/* An ABORT frame in place of bucket k's header (a relay whose upstream
 * failed): its reason, read within a second. */
static int upstream_aborted(bcast__conn *c, const char *ep, size_t k, const uint8_t *h, bcast_err *err) {
  uint32_t len = get32(h + 8);
  char msg[512];
  if (len > 511 || io_full(c, msg, len, 0, -1, bcast__now() + 1.0))
    return bcast__fail(err, BCAST_EPEER, "upstream %s gave up at bucket %zu without a readable reason", ep, k);
  msg[len] = 0;
  for (uint32_t i = 0; i < len; i++)
    if (msg[i] < 0x20 || msg[i] > 0x7e) msg[i] = '?'; /* it goes into logs */
  return bcast__fail(err, BCAST_EPEER, "upstream %s gave up at bucket %zu: %s", ep, k, msg);
}

static int recv_bucket(bcast__conn *c, const bcast_plan *p, const char *ep, size_t k, uint32_t view,
                       uint8_t *buf, const bcast_tensor *local, const uint32_t *map, const bcast__host_io *io,
                       bcast_bucket_timing *bt, uint64_t *sum, bcast_err *err) {
  const bcast_bucket *b = &p->buckets[k];
  uint64_t bytes = bcast__view_bucket_bytes(p, view, k);
  /* Longer than the root's own bound: when a peer holds the bucket up, the
   * root, which can name it, speaks first. */
  double dl = bucket_deadline(p, k, io, 2 * BUCKET_SLACK_S), t0 = bcast__now();
  uint8_t h[HEADER_BYTES];
  size_t took = 0;
  int e = 0;
  if (io_full(c, h, sizeof h, 0, io->cancel_fd, dl)) e = errno;
  else if (get32(h) == MAGIC_ABORT) return upstream_aborted(c, ep, k, h, err);
  else if (get32(h) == MAGIC_BUCKET && get64(h + 8) == bytes && io_full_done(c, buf, bytes, 0, io->cancel_fd, dl, &took))
    e = errno;
  if (e) {
    double el = bcast__now() - t0;
    if (e == ETIMEDOUT && p->min_gbps > 0)
      return bcast__fail(err, BCAST_ETIMEDOUT, "root %s stalled at bucket %zu (layer %u): observed %.3g GB/s (%.1f "
                         "of %.1f MB in %.2f s), expected at least %.3g GB/s per receiver for host mode",
                         ep, k, b->layer, el > 0 ? (double)took / el / 1e9 : 0, (double)took / 1e6,
                         (double)bytes / 1e6, el, per_receiver_floor(p));
    return bcast__fail(err, io_code(e), "root %s: bucket %zu (layer %u) not received: %s", ep, k,
                       b->layer, e == EPIPE ? "connection closed" : strerror(e));
  }
  if (get32(h) != MAGIC_BUCKET || get32(h + 4) != k || get64(h + 8) != bytes)
    return bcast__fail(err, BCAST_EPEER, "root %s: bad header for bucket %zu (layer %u): %llu bytes, this "
                       "receiver's view takes %llu", ep, k, b->layer, (unsigned long long)get64(h + 8),
                       (unsigned long long)bytes);
  double t1 = bcast__now();
  if (p->checksum == BCAST_CHECKSUM_XXH3_64) {
    uint64_t got = bcast_checksum64(buf, bytes), want = get64(h + 16);
    if (got != want) {
      int rc = bcast__fail(err, BCAST_ECHECKSUM, "bucket %zu (layer %u): checksum %016llx, root sent %016llx", k,
                           b->layer, (unsigned long long)got, (unsigned long long)want);
      send_status(c, MAGIC_ACK, rc, err ? err->msg : "checksum mismatch", -1, bcast__now() + 1.0);
      return rc;
    }
  }
  scatter(p, k, view, buf, local, map);
  if (sum) *sum = get64(h + 16);
  bt->bucket = (uint32_t)k;
  bt->wire_s = t1 - t0;
  bt->cast_s = bcast__now() - t1; /* receivers: verify and scatter */
  return BCAST_OK;
}

/* Several sources: a receiver confirms to every source only once it has
 * every source's buckets, so a source that returns OK knows each receiver
 * holds the whole version, not just its shard of it. */
typedef struct ack_gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint32_t received, want; /* sources whose buckets all arrived, of want */
  int aborted;
} ack_gate;

/* 0 once every source's buckets are in; -1 when the receive was aborted. */
static int gate_pass(ack_gate *g) {
  if (!g) return 0;
  pthread_mutex_lock(&g->mu);
  g->received++;
  pthread_cond_broadcast(&g->cv);
  while (g->received < g->want && !g->aborted) pthread_cond_wait(&g->cv, &g->mu);
  int aborted = g->aborted;
  pthread_mutex_unlock(&g->mu);
  return aborted ? -1 : 0;
}

static void gate_abort(ack_gate *g) {
  pthread_mutex_lock(&g->mu);
  g->aborted = 1;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* One source's stream into this receiver: its buckets, in plan order, then
 * the ACK (after the gate, when there is one).  bt has an entry per plan
 * bucket; only this source's are written (sources scatter into disjoint
 * elements, the plan tiles every tensor), and *wire_s sums this source's
 * time on the wire. */
static int recv_source(const bcast_plan *p, uint32_t src, uint32_t rank, const bcast_tensor *local,
                       const uint32_t *map, const bcast__host_io *io, ack_gate *gate, bcast_bucket_timing *bt,
                       double *wire_s, bcast_err *err) {
  /* Relays have one source: a receiver takes from its upstream. */
  const char *ep = p->relay_from ? bcast_plan_upstream_endpoint(p, rank) : bcast_plan_source_endpoint(p, src);
  if (!ep[0]) return bcast__fail(err, BCAST_EINVAL, "plan '%s': host mode without host_endpoint", p->id);
  bcast__conn c;
  int rc = connect_and_handshake(p, ep, rank, io, &c, err);
  if (rc) return rc;
  uint64_t mb = 0;
  for (size_t k = 0; k < p->nbuckets; k++)
    if (p->buckets[k].source_rank == src && p->buckets[k].bytes > mb) mb = p->buckets[k].bytes;
  uint8_t *buf = malloc(mb ? mb : 1);
  if (!buf) rc = bcast__fail(err, BCAST_ENOMEM, "out of memory for a %llu-byte wire buffer", (unsigned long long)mb);
  uint32_t view = bcast_plan_rank_view(p, rank);
  for (size_t k = 0; k < p->nbuckets && !rc; k++) {
    /* A bucket the view gets nothing of is not sent to it. */
    if (p->buckets[k].source_rank != src || !bcast__view_bucket_bytes(p, view, k)) continue;
    rc = recv_bucket(&c, p, ep, k, view, buf, local, map, io, &bt[k], NULL, err);
    *wire_s += bt[k].wire_s;
  }
  if (!rc && gate_pass(gate))
    rc = bcast__fail(err, BCAST_ECANCELED, "plan '%s': another source's stream failed", p->id);
  if (!rc && send_status(&c, MAGIC_ACK, 0, "", io->cancel_fd, bcast__deadline(io->timeout_s, p->deadline_unix_ms)))
    rc = bcast__fail(err, BCAST_EPEER, "root %s: final confirmation not delivered: %s", ep, strerror(errno));
  bcast__conn_close(&c);
  free(buf);
  return rc;
}

/* Several sources: a thread per source, each a blocking stream of its own
 * (recv_source, the one-source code as it is), rather than one poll loop
 * over every source's connection: the per-bucket deadlines, TLS state and
 * error naming stay per stream, and a receiver has a few sources, not
 * hundreds.  The calling thread watches the engine's cancel fd and the
 * threads' exits; the first failure (or a cancel) writes the `abort` pipe,
 * which every thread takes as its cancel fd, so they all end at their next
 * wait and the receiver reports the failure of the source that failed. */
typedef struct src_job {
  const bcast_plan *p;
  uint32_t src, rank;
  const bcast_tensor *local;
  const uint32_t *map;
  bcast__host_io io;
  ack_gate *gate;
  bcast_bucket_timing *bt;
  double wire_s;
  int rc;
  bcast_err err;
  int notify_fd; /* the thread writes its source rank here when it ends */
} src_job;

static void *src_job_main(void *arg) {
  src_job *j = arg;
  j->rc = recv_source(j->p, j->src, j->rank, j->local, j->map, &j->io, j->gate, j->bt, &j->wire_s, &j->err);
  ssize_t w = write(j->notify_fd, &j->src, sizeof j->src); /* 4 bytes: atomic on a pipe */
  (void)w;
  return NULL;
}

static void pipe_close(int fd[2]) {
  if (fd[0] >= 0) close(fd[0]);
  if (fd[1] >= 0) close(fd[1]);
}

static int recv_sources(const bcast_plan *p, uint32_t rank, const bcast_tensor *local, const uint32_t *map,
                        const bcast__host_io *io, bcast_bucket_timing *bt, double *wire_alone_s, bcast_err *err) {
  uint32_t ns = bcast__plan_nsources(p);
  int abort_p[2] = {-1, -1}, notify_p[2] = {-1, -1};
  src_job *jobs = calloc(ns, sizeof *jobs);
  pthread_t *tids = calloc(ns, sizeof *tids);
  if (!jobs || !tids) {
    free(jobs);
    free(tids);
    return bcast__fail(err, BCAST_ENOMEM, "out of memory for %u source streams", ns);
  }
  if (pipe2(abort_p, O_CLOEXEC | O_NONBLOCK) || pipe2(notify_p, O_CLOEXEC)) {
    int e = errno;
    pipe_close(abort_p);
    free(jobs);
    free(tids);
    return bcast__fail(err, BCAST_EIO, "plan '%s': pipe for the source streams: %s", p->id, strerror(e));
  }
  ack_gate gate = {.want = ns};
  pthread_mutex_init(&gate.mu, NULL);
  pthread_cond_init(&gate.cv, NULL);
  uint32_t started = 0;
  int rc = BCAST_OK;
  for (; started < ns; started++) {
    src_job *j = &jobs[started];
    *j = (src_job){.p = p, .src = started, .rank = rank, .local = local, .map = map, .io = *io, .gate = &gate,
                   .bt = bt, .notify_fd = notify_p[1]};
    j->io.cancel_fd = abort_p[0];
    if (pthread_create(&tids[started], NULL, src_job_main, j)) {
      rc = bcast__fail(err, BCAST_ENOMEM, "plan '%s': cannot start the stream of source rank %u", p->id, started);
      break;
    }
  }
  int aborted = rc != BCAST_OK, cancelled = 0;
  int64_t failed = -1;
  if (aborted) {
    ssize_t w = write(abort_p[1], "x", 1);
    (void)w;
    gate_abort(&gate);
  }
  for (uint32_t done = 0; done < started;) {
    struct pollfd pf[2] = {{notify_p[0], POLLIN, 0}, {io->cancel_fd, POLLIN, 0}};
    int n = poll(pf, !aborted && io->cancel_fd >= 0 ? 2 : 1, -1);
    if (n < 0) continue; /* EINTR; the threads end by their own deadlines regardless */
    if (pf[1].revents && !aborted) {
      cancelled = aborted = 1;
      ssize_t w = write(abort_p[1], "x", 1);
      (void)w;
      gate_abort(&gate);
    }
    uint32_t who;
    if (!(pf[0].revents & POLLIN) || read(notify_p[0], &who, sizeof who) != (ssize_t)sizeof who || who >= ns)
      continue;
    done++;
    if (jobs[who].rc && !aborted) {
      failed = who;
      aborted = 1;
      ssize_t w = write(abort_p[1], "x", 1); /* the others stop at their next wait */
      (void)w;
      gate_abort(&gate);
    }
  }
  for (uint32_t i = 0; i < started; i++) pthread_join(tids[i], NULL);
  pthread_cond_destroy(&gate.cv);
  pthread_mutex_destroy(&gate.mu);
  *wire_alone_s = 0;
  for (uint32_t i = 0; i < started; i++)
    if (jobs[i].wire_s > *wire_alone_s) *wire_alone_s = jobs[i].wire_s;
  if (!rc && failed >= 0)
    rc = bcast__fail(err, jobs[failed].rc, "source rank %u: %s", (uint32_t)failed, jobs[failed].err.msg);
  else if (!rc && cancelled)
    rc = bcast__fail(err, BCAST_ECANCELED, "plan '%s': cancelled while receiving from %u sources", p->id, ns);
  pipe_close(abort_p);
  pipe_close(notify_p);
  free(jobs);
  free(tids);
  return rc;
}

/* ======================= relay ================================================ */

/* A relay is a receiver of its upstream and a root of its downstreams: a
 * thread takes every bucket from the upstream into slot k % 2 (verified and
 * scattered as by any receiver) while the calling thread forwards the other
 * slot to every downstream at once (send_bucket), so the upstream link and
 * the downstream links run together, a bucket apart.  The thread waits
 * while both slots are still to be forwarded: a slow downstream slows the
 * upstream, which the per-bucket bounds (at the busiest link's fanout)
 * allow for. */
typedef struct relay_rx {
  const bcast_plan *p;
  bcast__conn *up;
  const char *ep;
  const bcast_tensor *local;
  const uint32_t *map;
  bcast__host_io io; /* cancel_fd: the relay's own abort pipe */
  bcast_bucket_timing *bt;
  uint8_t *buf[2];
  uint64_t sum[2];
  pthread_mutex_t mu;
  pthread_cond_t cv;
  size_t filled, forwarded; /* buckets received, buckets forwarded (their slots free) */
  int done, stop, rc;
  bcast_err err;
  int notify_fd; /* a byte per bucket received and one at the end (non-blocking: a hint) */
} relay_rx;

static void notify(int fd) {
  ssize_t w = write(fd, "x", 1); /* a full pipe already says "look" */
  (void)w;
}

static void *relay_rx_main(void *arg) {
  relay_rx *x = arg;
  int rc = BCAST_OK;
  for (size_t k = 0; k < x->p->nbuckets && !rc; k++) {
    pthread_mutex_lock(&x->mu);
    while (k - x->forwarded >= 2 && !x->stop) pthread_cond_wait(&x->cv, &x->mu);
    int stop = x->stop;
    pthread_mutex_unlock(&x->mu);
    if (stop) {
      rc = bcast__fail(&x->err, BCAST_ECANCELED, "plan '%s': relay stopped at bucket %zu", x->p->id, k);
      break;
    }
    uint64_t sum = 0;
    rc = recv_bucket(x->up, x->p, x->ep, k, BCAST_VIEW_WHOLE, x->buf[k & 1], x->local, x->map, &x->io, &x->bt[k],
                     &sum, &x->err);
    if (rc) break;
    pthread_mutex_lock(&x->mu);
    x->sum[k & 1] = sum;
    x->filled = k + 1;
    pthread_mutex_unlock(&x->mu);
    notify(x->notify_fd);
  }
  pthread_mutex_lock(&x->mu);
  x->rc = rc;
  x->done = 1;
  pthread_mutex_unlock(&x->mu);
  notify(x->notify_fd);
  return NULL;
}

/* Forwards every bucket as the thread brings it.  *boundary: the failure
 * came between buckets (the upstream failed, or a cancel), so the
 * downstreams can still be told why; a failed send leaves them mid-bucket. */
static int relay_forward(relay_rx *x, uint32_t rank, peer *peers, size_t np, int notify_fd,
                         const bcast__host_io *io, int *boundary, bcast_err *err) {
  const bcast_plan *p = x->p;
  char drain[64];
  *boundary = 1;
  for (size_t k = 0; k < p->nbuckets; k++) {
    for (;;) {
      pthread_mutex_lock(&x->mu);
      int ready = x->filled > k, done = x->done, xrc = x->rc;
      pthread_mutex_unlock(&x->mu);
      if (ready) break;
      if (done)
        return bcast__fail(err, xrc ? xrc : BCAST_EPEER, "upstream rank %u: %s", bcast_plan_upstream(p, rank),
                           x->err.msg);
      /* The thread's waits are bounded by the plan: it always ends. */
      struct pollfd pf[2] = {{notify_fd, POLLIN, 0}, {io->cancel_fd, POLLIN, 0}};
      int n = poll(pf, io->cancel_fd >= 0 ? 2 : 1, -1);
      if (n > 0 && io->cancel_fd >= 0 && pf[1].revents)
        return bcast__fail(err, BCAST_ECANCELED, "plan '%s': cancelled at bucket %zu", p->id, k);
      while (read(notify_fd, drain, sizeof drain) > 0) {
      }
    }
    *boundary = 0;
    peers_bucket(p, k, x->buf[k & 1], x->sum[k & 1], peers, np, NULL);
    int rc = send_bucket(p, k, peers, np, io->cancel_fd, bucket_deadline(p, k, io, BUCKET_SLACK_S), err);
    if (rc) return rc;
    *boundary = 1;
    pthread_mutex_lock(&x->mu);
    x->forwarded = k + 1;
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
  }
  return BCAST_OK;
}

/* Tells a downstream, between buckets, why no more come: an ABORT frame
 * ("RLBX" i32 status, u32 len, 12 zero bytes: a header's size) and the
 * reason.  Best effort within a second: the connection closes after it. */
static void send_abort(peer *pr, int status, const char *msg) {
  uint8_t b[HEADER_BYTES + 512] = {0};
  size_t len = strnlen(msg, 511);
  put32(b, MAGIC_ABORT);
  put32(b + 4, (uint32_t)status);
  put32(b + 8, (uint32_t)len);
  memcpy(b + HEADER_BYTES, msg, len);
  io_full(&pr->c, b, HEADER_BYTES + len, 1, -1, bcast__now() + 1.0);
}

/* After a failed relay's ACK: reads (and drops) what the upstream still
 * sends until it closes, for a second at most, so that closing with unread
 * bytes does not reset the connection and lose the ACK before it is read. */
static void drain_until_closed(bcast__conn *c, int cancel_fd) {
  uint8_t junk[16384];
  double deadline = bcast__now() + 1.0;
  for (;;) {
    short want = POLLIN;
    ssize_t r = bcast__conn_io(c, junk, sizeof junk, 0, &want);
    if (r > 0) continue;
    if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return;
    if (!wait_fd(c->fd, want, cancel_fd, deadline)) return;
  }
}

/* Tells the upstream why this relay fails, then waits for it to close. */
static void report_upstream(bcast__conn *up, int rc, const bcast_err *err, int cancel_fd) {
  send_status(up, MAGIC_ACK, rc, err ? err->msg : "relay failed", -1, bcast__now() + 1.0);
  drain_until_closed(up, cancel_fd);
}

/* A relaying receiver: accepts its downstreams on the engine's listener (as
 * a source does), then connects to its upstream, forwards every bucket as
 * it arrives, waits for every downstream's ACK, then sends its own: OK only
 * when it and every downstream (and theirs) hold every bucket.  Connecting
 * upstream only once its downstreams are in makes the source wait for a
 * late downstream where it waits for a late receiver anyway, at its accept
 * (bounded by the plan's deadline), never inside a bucket's bound.  A
 * failure of a downstream goes upstream in the ACK (even one that never
 * connected: the relay then connects only to say so); one of the upstream
 * goes to the downstreams in an ABORT frame. */
static int relay_serve(int lfd, const bcast_plan *p, uint32_t rank, const bcast_tensor *local, const uint32_t *map,
                       const bcast__host_io *io, bcast_bucket_timing *bt, double *wire_s, uint32_t *refused,
                       bcast_err *err) {
  uint32_t np = bcast_plan_downstreams(p, rank);
  if (lfd < 0)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': rank %u relays for %u receiver(s), but its engine was opened "
                       "without host_listen", p->id, rank, np);
  const char *ep = bcast_plan_upstream_endpoint(p, rank);
  double deadline = bcast__deadline(io->timeout_s, p->deadline_unix_ms);
  uint64_t mb = max_bucket(p);
  peer *peers = calloc(np, sizeof *peers);
  bcast__conn up = {.fd = -1};
  relay_rx x = {.p = p, .up = &up, .ep = ep, .local = local, .map = map, .io = *io, .bt = bt};
  x.buf[0] = malloc(mb ? mb : 1);
  x.buf[1] = malloc(mb ? mb : 1);
  int abort_p[2] = {-1, -1}, notify_p[2] = {-1, -1}, started = 0, boundary = 1, connected = 0, rc = BCAST_OK;
  pthread_mutex_init(&x.mu, NULL);
  pthread_cond_init(&x.cv, NULL);
  pthread_t tid;
  if (!peers || !x.buf[0] || !x.buf[1])
    rc = bcast__fail(err, BCAST_ENOMEM, "out of memory for two %llu-byte relay buffers", (unsigned long long)mb);
  else if (pipe2(abort_p, O_CLOEXEC | O_NONBLOCK) || pipe2(notify_p, O_CLOEXEC | O_NONBLOCK))
    rc = bcast__fail(err, BCAST_EIO, "plan '%s': pipe for the relay: %s", p->id, strerror(errno));
  acceptor ac = {.p = p, .io = io, .rank = rank, .peers = peers, .want = np};
  /* Downstreams get until a little before the deadline: what is left is the
   * time to tell the upstream about one that never came. */
  double left = deadline - bcast__now(), margin = left / 2 < RELAY_REPORT_S ? left / 2 : RELAY_REPORT_S;
  if (!rc) rc = accept_all(lfd, &ac, deadline - margin, err);
  while (ac.npend) pending_drop(&ac, ac.npend - 1, 1);
  *refused = ac.refused;
  if (rc != BCAST_ENOMEM && rc != BCAST_ECANCELED) {
    bcast_err cerr = {0};
    bcast__host_io cio = *io;
    if (rc) cio.timeout_s = margin; /* only to report */
    int crc = connect_and_handshake(p, ep, rank, &cio, &up, &cerr);
    connected = crc == BCAST_OK;
    if (!rc && crc) rc = bcast__fail(err, crc, "%s", cerr.msg);
  }
  if (!rc) {
    x.io.cancel_fd = abort_p[0];
    x.notify_fd = notify_p[1];
    if (pthread_create(&tid, NULL, relay_rx_main, &x))
      rc = bcast__fail(err, BCAST_ENOMEM, "plan '%s': cannot start the relay's receiving thread", p->id);
    else started = 1;
  }
  if (!rc) rc = relay_forward(&x, rank, peers, np, notify_p[0], io, &boundary, err);
  if (!rc && (rc = collect_acks(p, peers, np, io, err))) boundary = 0; /* past the last bucket */
  if (started) {
    if (rc) { /* the thread may still wait on the upstream or for a slot */
      notify(abort_p[1]);
      pthread_mutex_lock(&x.mu);
      x.stop = 1;
      pthread_cond_broadcast(&x.cv);
      pthread_mutex_unlock(&x.mu);
    }
    pthread_join(tid, NULL);
  }
  int upstream_failed = started && x.rc && x.rc != BCAST_ECANCELED;
  if (rc && boundary)
    for (size_t i = 0; i < ac.have; i++) send_abort(&peers[i], rc, err ? err->msg : "relay failed");
  if (!rc) {
    double t = 0;
    for (size_t k = 0; k < p->nbuckets; k++) t += bt[k].wire_s;
    *wire_s = t;
    if (send_status(&up, MAGIC_ACK, 0, "", io->cancel_fd, deadline))
      rc = bcast__fail(err, BCAST_EPEER, "upstream %s: final confirmation not delivered: %s", ep, strerror(errno));
  } else if (connected && !upstream_failed) { /* the upstream is fine: it learns why */
    report_upstream(&up, rc, err, io->cancel_fd);
  }
  for (size_t i = 0; i < ac.have; i++) bcast__conn_close(&peers[i].c);
  if (up.fd >= 0) bcast__conn_close(&up);
  pthread_cond_destroy(&x.cv);
  pthread_mutex_destroy(&x.mu);
  pipe_close(abort_p);
  pipe_close(notify_p);
  free(x.buf[0]);
  free(x.buf[1]);
  free(peers);
  return rc;
}

int bcast__host_recv(int lfd, const bcast_plan *p, uint32_t rank, const bcast_tensor *local, const uint32_t *map,
                     const bcast__host_io *io, bcast_stats *stats, bcast_err *err) {
  double t0 = bcast__now();
  if (!p->has_secret)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': no data-channel secret: host mode cannot authenticate "
                       "its root", p->id);
  bcast_bucket_timing *bt = calloc(p->nbuckets ? p->nbuckets : 1, sizeof *bt);
  if (!bt) return bcast__fail(err, BCAST_ENOMEM, "out of memory for %zu bucket timings", p->nbuckets);
  for (size_t b = 0; b < p->nbuckets; b++) bt[b].bucket = (uint32_t)b;
  double wire_alone_s = 0;
  uint32_t refused = 0;
  int rc = p->relay_from && bcast_plan_downstreams(p, rank)
               ? relay_serve(lfd, p, rank, local, map, io, bt, &wire_alone_s, &refused, err)
           : bcast__plan_nsources(p) > 1
               ? recv_sources(p, rank, local, map, io, bt, &wire_alone_s, err)
               : recv_source(p, p->root_rank, rank, local, map, io, NULL, bt, &wire_alone_s, err);
  if (rc == BCAST_OK && stats) {
    uint32_t view = bcast_plan_rank_view(p, rank);
    fill_stats(stats, p, t0, bt, p->nbuckets,
               view == BCAST_VIEW_WHOLE ? bcast_plan_wire_bytes(p) : bcast_plan_view_bytes(p, view, UINT32_MAX),
               wire_alone_s);
    stats->refused_connections = refused;
    bt = NULL;
  }
  free(bt);
  return rc;
}
