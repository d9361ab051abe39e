/* Host transport: the plan over TCP between processes, casts on the CPU.
 *
 * Protocol (all integers little endian), one TCP connection per receiver and plan:
 *   receiver -> root  HELLO  "RLBH" u32 version, u32 rank, u32 idlen, u64 hash, id
 *   root -> receiver  REPLY  "RLBR" i32 status, u32 msglen, msg      (0: accepted)
 *   root -> receiver  per bucket: HEADER "RLBK" u32 index, u64 bytes, u64 checksum,
 *                     then `bytes` payload bytes (slices at plan offsets, zero padding)
 *   receiver -> root  ACK    "RLBA" i32 status, u32 msglen, msg      (after the last
 *                     bucket, or at the first error)
 * The root's listening socket lives as long as its engine; receivers connect
 * anew for every plan, so a receiver that failed one step starts clean next.
 *
 * The root casts bucket k+1 on a worker thread while bucket k is on the wire
 * (two buffers) and writes to all receivers at once with non-blocking sockets
 * and poll.  Every wait is bounded by the deadline and ends early when the
 * engine's cancel fd turns readable (the orchestrator aborted the plan: a peer
 * that will never connect must not hold the others until the deadline);
 * writes use MSG_NOSIGNAL so a dead receiver is an error code
 * (EPIPE/ECONNRESET), never a signal. */
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

#define MAGIC_HELLO 0x48424c52u /* "RLBH" */
#define MAGIC_REPLY 0x52424c52u /* "RLBR" */
#define MAGIC_BUCKET 0x4b424c52u /* "RLBK" */
#define MAGIC_ACK 0x41424c52u   /* "RLBA" */
#define PROTO_VERSION 1u
#define HEADER_BYTES 24
#define HELLO_WAIT_S 5.0       /* a connection that says nothing is not a peer */
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
static int io_full(int fd, void *buf, size_t n, int writing, int cancel_fd, double deadline) {
  uint8_t *p = buf;
  while (n > 0) {
    ssize_t r = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= (size_t)r;
      continue;
    }
    if (r == 0) {
      errno = EPIPE;
      return -1;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    if (!wait_fd(fd, writing ? POLLOUT : POLLIN, cancel_fd, deadline)) return -1;
  }
  return 0;
}

/* REPLY and ACK share one shape: magic, status, message. */
static int send_status(int fd, uint32_t magic, int status, const char *msg, int cancel_fd, double deadline) {
  uint8_t b[12 + 512];
  size_t len = strnlen(msg, 511);
  put32(b, magic);
  put32(b + 4, (uint32_t)status);
  put32(b + 8, (uint32_t)len);
  memcpy(b + 12, msg, len);
  return io_full(fd, b, 12 + len, 1, cancel_fd, deadline);
}

static int recv_status(int fd, uint32_t magic, int *status, char *msg, size_t msglen, int cancel_fd,
                       double deadline) {
  uint8_t b[12];
  char tmp[512];
  if (io_full(fd, b, 12, 0, cancel_fd, deadline)) return -1;
  uint32_t len = get32(b + 8);
  if (get32(b) != magic || len > 511) {
    errno = EPROTO;
    return -1;
  }
  if (io_full(fd, tmp, len, 0, cancel_fd, deadline)) return -1;
  tmp[len] = 0;
  *status = (int32_t)get32(b + 4);
  snprintf(msg, msglen, "%s", tmp);
  return 0;
}

static void fill_stats(bcast_stats *st, const bcast_plan *p, double t0, bcast_bucket_timing *bt) {
  st->mode = BCAST_MODE_HOST;
  st->transport = "host-tcp";
  st->wire_bytes = bcast_plan_wire_bytes(p);
  st->nbuckets = (uint32_t)p->nbuckets;
  st->buckets = bt;
  for (size_t b = 0; b < p->nbuckets; b++) {
    st->cast_s += bt[b].cast_s;
    st->wire_s += bt[b].wire_s;
  }
  st->total_s = bcast__now() - t0;
  /* The wire ran alone for wire_s: what the total adds on top was not hidden. */
  st->wire_alone_s = st->wire_s;
  st->exposed_measured = 1;
  st->exposed_s = bcast__exposed_s(st->total_s, st->wire_alone_s);
  st->gbps = st->total_s > 0 ? (double)st->wire_bytes / st->total_s / 1e9 : 0;
}

static uint64_t max_bucket(const bcast_plan *p) {
  uint64_t m = 0;
  for (size_t b = 0; b < p->nbuckets; b++)
    if (p->buckets[b].bytes > m) m = p->buckets[b].bytes;
  return m;
}

/* ======================= root (sender) ======================================= */

typedef struct peer {
  int fd;
  uint32_t rank;
  uint64_t sent; /* bytes of the current bucket's header + payload written */
} peer;

/* Accepts one connection and reads its HELLO.  Returns 1 with *out filled for
 * an accepted receiver, 0 for a connection to ignore, <0 to fail the plan. */
static int accept_one(int lfd, const bcast_plan *p, const bcast__host_io *io, peer *peers, size_t npeers,
                      double deadline, peer *out, bcast_err *err) {
  int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
  if (fd < 0) return 0;
  tune(fd);
  uint8_t h[24];
  char id[128], why[400];
  double hd = bcast__now() + HELLO_WAIT_S;
  if (hd > deadline) hd = deadline;
  if (io_full(fd, h, sizeof h, 0, io->cancel_fd, hd) || get32(h) != MAGIC_HELLO ||
      get32(h + 4) != PROTO_VERSION || get32(h + 12) >= sizeof id ||
      io_full(fd, id, get32(h + 12), 0, io->cancel_fd, hd)) {
    int e = errno;
    close(fd); /* not a receiver of this protocol version: ignore it */
    if (e == ECANCELED) return bcast__fail(err, BCAST_ECANCELED, "plan '%s': cancelled", p->id);
    return 0;
  }
  id[get32(h + 12)] = 0;
  if (io->stale_id && io->stale_id[0] && strcmp(id, p->id) != 0 && !strcmp(id, io->stale_id)) {
    /* Connected for the plan cancelled last, before it learnt of the cancel:
     * a leftover, not a receiver of this plan that disagrees with it. */
    send_status(fd, MAGIC_REPLY, BCAST_ECANCELED, "plan cancelled", -1, hd);
    close(fd);
    return 0;
  }
  uint32_t rank = get32(h + 8);
  uint64_t hash = get64(h + 16);
  int code = BCAST_OK;
  if (strcmp(id, p->id) != 0 || hash != p->hash) {
    code = BCAST_EMISMATCH;
    snprintf(why, sizeof why, "receiver rank %u holds plan '%.100s' hash %016llx, root has '%.100s' hash %016llx",
             rank, id, (unsigned long long)hash, p->id, (unsigned long long)p->hash);
  } else if (rank >= p->world_size || rank == p->root_rank) {
    code = BCAST_EPEER;
    snprintf(why, sizeof why, "receiver claims rank %u: not a receiver rank of world size %u with root %u", rank,
             p->world_size, p->root_rank);
  }
  for (size_t i = 0; i < npeers && !code; i++)
    if (peers[i].rank == rank) {
      code = BCAST_EPEER;
      snprintf(why, sizeof why, "receiver rank %u connected twice", rank);
    }
  if (code) {
    send_status(fd, MAGIC_REPLY, code, why, -1, hd);
    close(fd);
    return bcast__fail(err, code, "%s", why);
  }
  if (send_status(fd, MAGIC_REPLY, 0, "", io->cancel_fd, hd)) {
    close(fd);
    return 0; /* gone before we answered: let it retry */
  }
  *out = (peer){fd, rank, 0};
  return 1;
}

static int accept_all(int lfd, const bcast_plan *p, const bcast__host_io *io, peer *peers, size_t want,
                      double deadline, bcast_err *err) {
  size_t have = 0;
  while (have < want) {
    if (!wait_fd(lfd, POLLIN, io->cancel_fd, deadline)) {
      if (errno == ECANCELED)
        return bcast__fail(err, BCAST_ECANCELED, "plan '%s': cancelled with %zu of %zu receivers connected",
                           p->id, have, want);
      char missing[192] = "";
      size_t len = 0;
      for (uint32_t r = 0; r < p->world_size && len + 12 < sizeof missing; r++) {
        int found = r == p->root_rank;
        for (size_t i = 0; i < have; i++) found |= peers[i].rank == r;
        if (!found) len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%u", len ? "," : "", r);
      }
      return bcast__fail(err, BCAST_ETIMEDOUT, "plan '%s': %zu of %zu receivers connected before the deadline; "
                         "missing rank(s) %s", p->id, have, want, missing);
    }
    int rc = accept_one(lfd, p, io, peers, have, deadline, &peers[have], err);
    if (rc < 0) return rc;
    have += (size_t)rc;
  }
  return BCAST_OK;
}

/* The cast worker fills slot k % 2 with bucket k while the main thread sends. */
typedef struct caster {
  const bcast_plan *p;
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
    if (sl->bucket_offset > end) memset(buf + end, 0, sl->bucket_offset - end); /* padding */
    if (bcast__cast_parallel(buf + sl->bucket_offset, b->wire_dtype, (const uint8_t *)t->data + sl->elem_offset * ssz,
                             t->storage_dtype, sl->elem_count, c->threads))
      c->failed = (int)k + 1;
    end = sl->bucket_offset + sl->elem_count * wsz;
  }
}

static void *caster_main(void *arg) {
  caster *c = arg;
  for (size_t k = 0; k < c->p->nbuckets; k++) {
    int s = (int)(k & 1);
    pthread_mutex_lock(&c->mu);
    while (c->ready[s] && !c->stop) pthread_cond_wait(&c->cv, &c->mu);
    int stop = c->stop;
    pthread_mutex_unlock(&c->mu);
    if (stop) break;
    double t0 = bcast__now();
    cast_bucket(c, k, c->buf[s]);
    uint64_t sum = c->p->checksum == BCAST_CHECKSUM_XXH3_64 ? bcast_checksum64(c->buf[s], c->p->buckets[k].bytes) : 0;
    c->bt[k].cast_s = bcast__now() - t0;
    pthread_mutex_lock(&c->mu);
    c->sum[s] = sum;
    c->ready[s] = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
  }
  return NULL;
}

/* Names the failure of one receiver while sending bucket k, reading its ACK
 * first when it left one (a checksum or scatter error on its side). */
static int peer_failed(const bcast_plan *p, peer *pr, size_t k, int e, bcast_err *err) {
  int status = 0;
  char msg[512];
  if (e == ECANCELED) return bcast__fail(err, BCAST_ECANCELED, "plan '%s': cancelled at bucket %zu", p->id, k);
  if (e != ETIMEDOUT && recv_status(pr->fd, MAGIC_ACK, &status, msg, sizeof msg, -1, bcast__now() + 0.05) == 0 &&
      status)
    return bcast__fail(err, BCAST_EPEER, "receiver rank %u failed at bucket %zu (layer %u): %s", pr->rank, k,
                       p->buckets[k].layer, msg);
  if (e == ETIMEDOUT)
    return bcast__fail(err, BCAST_ETIMEDOUT, "receiver rank %u stalled: bucket %zu (layer %u) not taken before the "
                       "deadline", pr->rank, k, p->buckets[k].layer);
  return bcast__fail(err, BCAST_EPEER, "receiver rank %u closed the connection at bucket %zu (layer %u): %s", pr->rank,
                     k, p->buckets[k].layer, strerror(e));
}

/* Writes header + payload of bucket k to every receiver concurrently. */
static int send_bucket(const bcast_plan *p, size_t k, const uint8_t *buf, uint64_t sum, peer *peers, size_t np,
                       int cancel_fd, double deadline, bcast_err *err) {
  uint8_t hdr[HEADER_BYTES];
  uint64_t bytes = p->buckets[k].bytes, total = HEADER_BYTES + bytes;
  put32(hdr, MAGIC_BUCKET);
  put32(hdr + 4, (uint32_t)k);
  put64(hdr + 8, bytes);
  put64(hdr + 16, sum);
  for (size_t i = 0; i < np; i++) peers[i].sent = 0;
  struct pollfd pf[np + 1];
  for (;;) {
    size_t waiting = 0;
    for (size_t i = 0; i < np; i++) {
      peer *pr = &peers[i];
      while (pr->sent < total) {
        const uint8_t *src = pr->sent < HEADER_BYTES ? hdr + pr->sent : buf + (pr->sent - HEADER_BYTES);
        size_t len = pr->sent < HEADER_BYTES ? HEADER_BYTES - pr->sent : total - pr->sent;
        ssize_t r = send(pr->fd, src, len, MSG_NOSIGNAL);
        if (r > 0) {
          pr->sent += (uint64_t)r;
          continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        return peer_failed(p, pr, k, r < 0 ? errno : EPIPE, err);
      }
      if (pr->sent < total) pf[waiting++] = (struct pollfd){pr->fd, POLLOUT, 0};
    }
    if (!waiting) return BCAST_OK;
    size_t npf = waiting;
    if (cancel_fd >= 0) pf[npf++] = (struct pollfd){cancel_fd, POLLIN, 0};
    int ms = poll_ms(deadline);
    int n = ms ? poll(pf, npf, ms) : 0;
    if (n > 0 && cancel_fd >= 0 && pf[waiting].revents)
      return bcast__fail(err, BCAST_ECANCELED, "plan '%s': cancelled at bucket %zu", p->id, k);
    if (n == 0 && bcast__now() >= deadline) {
      for (size_t i = 0; i < np; i++)
        if (peers[i].sent < total) return peer_failed(p, &peers[i], k, ETIMEDOUT, err);
    }
  }
}

static int collect_acks(const bcast_plan *p, peer *peers, size_t np, const bcast__host_io *io, bcast_err *err) {
  for (size_t i = 0; i < np; i++) {
    int status = 0;
    char msg[512];
    double dl = bcast__deadline(io->timeout_s, p->deadline_unix_ms);
    if (recv_status(peers[i].fd, MAGIC_ACK, &status, msg, sizeof msg, io->cancel_fd, dl))
      return bcast__fail(err, io_code(errno),
                         "receiver rank %u did not confirm the last bucket: %s", peers[i].rank, strerror(errno));
    if (status) return bcast__fail(err, BCAST_EPEER, "receiver rank %u failed: %s", peers[i].rank, msg);
  }
  return BCAST_OK;
}

static int send_all(caster *c, peer *peers, size_t np, const bcast__host_io *io, bcast_err *err) {
  const bcast_plan *p = c->p;
  for (size_t k = 0; k < p->nbuckets; k++) {
    int s = (int)(k & 1);
    pthread_mutex_lock(&c->mu);
    while (!c->ready[s]) pthread_cond_wait(&c->cv, &c->mu);
    uint64_t sum = c->sum[s];
    int failed = c->failed;
    pthread_mutex_unlock(&c->mu);
    if (failed)
      return bcast__fail(err, BCAST_EINVAL, "bucket %d (layer %u): cast failed", failed - 1,
                         p->buckets[failed - 1].layer);
    double t0 = bcast__now();
    int rc = send_bucket(p, k, c->buf[s], sum, peers, np, io->cancel_fd,
                         bcast__deadline(io->timeout_s, p->deadline_unix_ms), err);
    c->bt[k].wire_s = bcast__now() - t0;
    if (rc) return rc;
    pthread_mutex_lock(&c->mu);
    c->ready[s] = 0;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
  }
  return collect_acks(p, peers, np, io, err);
}

int bcast__host_send(int lfd, const bcast_plan *p, const bcast_tensor *local, const uint32_t *map,
                     const bcast__host_io *io, int cast_threads, bcast_stats *stats, bcast_err *err) {
  double t0 = bcast__now();
  size_t np = p->world_size - 1;
  peer *peers = calloc(np ? np : 1, sizeof *peers);
  bcast_bucket_timing *bt = calloc(p->nbuckets ? p->nbuckets : 1, sizeof *bt);
  uint64_t mb = max_bucket(p);
  caster c = {.p = p, .local = local, .map = map, .threads = cast_threads, .bt = bt};
  c.buf[0] = malloc(mb ? mb : 1);
  c.buf[1] = malloc(mb ? mb : 1);
  int rc = BCAST_OK;
  if (!peers || !bt || !c.buf[0] || !c.buf[1]) {
    rc = bcast__fail(err, BCAST_ENOMEM, "out of memory for two %llu-byte wire buffers", (unsigned long long)mb);
    goto out;
  }
  for (size_t b = 0; b < p->nbuckets; b++) bt[b].bucket = (uint32_t)b;
  rc = accept_all(lfd, p, io, peers, np, bcast__deadline(io->timeout_s, p->deadline_unix_ms), err);
  if (rc) goto out;
  pthread_mutex_init(&c.mu, NULL);
  pthread_cond_init(&c.cv, NULL);
  pthread_t tid;
  if (pthread_create(&tid, NULL, caster_main, &c)) {
    rc = bcast__fail(err, BCAST_ENOMEM, "cannot start the cast thread");
  } else {
    rc = send_all(&c, peers, np, io, err);
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
    if (peers[i].fd > 0) close(peers[i].fd);
  free(peers);
  free(c.buf[0]);
  free(c.buf[1]);
  if (rc == BCAST_OK && stats) {
    fill_stats(stats, p, t0, bt);
    bt = NULL;
  }
  free(bt);
  return rc;
}

/* ======================= receiver ============================================ */

static int connect_root(const bcast_plan *p, int cancel_fd, double deadline, int *fdp, bcast_err *err) {
  char host[256], port[32];
  if (split_addr(p->host_endpoint, host, sizeof host, port, sizeof port))
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': host_endpoint '%s' is not host:port", p->id, p->host_endpoint);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
  int g = getaddrinfo(host, port, &hints, &res);
  if (g) return bcast__fail(err, BCAST_EIO, "host_endpoint '%s': %s", p->host_endpoint, gai_strerror(g));
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
                     p->host_endpoint, strerror(e ? e : ETIMEDOUT));
}

static int handshake(int fd, const bcast_plan *p, uint32_t rank, int cancel_fd, double deadline, bcast_err *err) {
  uint8_t h[24 + 128];
  size_t idlen = strnlen(p->id, sizeof p->id - 1);
  put32(h, MAGIC_HELLO);
  put32(h + 4, PROTO_VERSION);
  put32(h + 8, rank);
  put32(h + 12, (uint32_t)idlen);
  put64(h + 16, p->hash);
  memcpy(h + 24, p->id, idlen);
  int status = 0;
  char msg[512];
  if (io_full(fd, h, 24 + idlen, 1, cancel_fd, deadline) ||
      recv_status(fd, MAGIC_REPLY, &status, msg, sizeof msg, cancel_fd, deadline))
    return bcast__fail(err, io_code(errno),
                       "plan '%s': handshake with root %s failed: %s", p->id, p->host_endpoint, strerror(errno));
  /* The root's code when it is one of ours (a mismatch, a cancel): the peer's
   * number is no code of this engine otherwise. */
  if (status)
    return bcast__fail(err, status <= BCAST_EINVAL && status >= BCAST_ECANCELED ? status : BCAST_EPEER,
                       "root refused rank %u: %s", rank, msg);
  return BCAST_OK;
}

static void scatter(const bcast_plan *p, size_t k, const uint8_t *buf, const bcast_tensor *local, const uint32_t *map) {
  const bcast_bucket *b = &p->buckets[k];
  size_t wsz = bcast_dtype_size(b->wire_dtype);
  for (size_t s = 0; s < b->nslices; s++) {
    const bcast_slice *sl = &b->slices[s];
    uint8_t *dst = (uint8_t *)local[map[sl->tensor]].data + sl->elem_offset * wsz;
    memcpy(dst, buf + sl->bucket_offset, sl->elem_count * wsz);
  }
}

/* Receives bucket k into buf, verifies it, scatters it.  On a checksum error
 * the ACK tells the root why before the connection closes. */
static int recv_bucket(int fd, const bcast_plan *p, size_t k, uint8_t *buf, const bcast_tensor *local,
                       const uint32_t *map, const bcast__host_io *io, bcast_bucket_timing *bt, bcast_err *err) {
  const bcast_bucket *b = &p->buckets[k];
  double dl = bcast__deadline(io->timeout_s, p->deadline_unix_ms), t0 = bcast__now();
  uint8_t h[HEADER_BYTES];
  if (io_full(fd, h, sizeof h, 0, io->cancel_fd, dl) ||
      (get32(h) == MAGIC_BUCKET && io_full(fd, buf, b->bytes, 0, io->cancel_fd, dl)))
    return bcast__fail(err, io_code(errno),
                       "root %s: bucket %zu (layer %u) not received: %s", p->host_endpoint, k, b->layer,
                       errno == EPIPE ? "connection closed" : strerror(errno));
  if (get32(h) != MAGIC_BUCKET || get32(h + 4) != k || get64(h + 8) != b->bytes)
    return bcast__fail(err, BCAST_EPEER, "root %s: bad header for bucket %zu (layer %u)", p->host_endpoint, k, b->layer);
  double t1 = bcast__now();
  if (p->checksum == BCAST_CHECKSUM_XXH3_64) {
    uint64_t got = bcast_checksum64(buf, b->bytes), want = get64(h + 16);
    if (got != want) {
      int rc = bcast__fail(err, BCAST_ECHECKSUM, "bucket %zu (layer %u): checksum %016llx, root sent %016llx", k,
                           b->layer, (unsigned long long)got, (unsigned long long)want);
      send_status(fd, MAGIC_ACK, rc, err ? err->msg : "checksum mismatch", -1, bcast__now() + 1.0);
      return rc;
    }
  }
  scatter(p, k, buf, local, map);
  bt->bucket = (uint32_t)k;
  bt->wire_s = t1 - t0;
  bt->cast_s = bcast__now() - t1; /* receivers: verify and scatter */
  return BCAST_OK;
}

int bcast__host_recv(const bcast_plan *p, uint32_t rank, const bcast_tensor *local, const uint32_t *map,
                     const bcast__host_io *io, bcast_stats *stats, bcast_err *err) {
  double t0 = bcast__now();
  int fd = -1, rc = connect_root(p, io->cancel_fd, bcast__deadline(io->timeout_s, p->deadline_unix_ms), &fd, err);
  if (rc) return rc;
  uint64_t mb = max_bucket(p);
  uint8_t *buf = malloc(mb ? mb : 1);
  bcast_bucket_timing *bt = calloc(p->nbuckets ? p->nbuckets : 1, sizeof *bt);
  if (!buf || !bt) rc = bcast__fail(err, BCAST_ENOMEM, "out of memory for a %llu-byte wire buffer", (unsigned long long)mb);
  if (!rc) rc = handshake(fd, p, rank, io->cancel_fd, bcast__deadline(io->timeout_s, p->deadline_unix_ms), err);
  for (size_t k = 0; k < p->nbuckets && !rc; k++) rc = recv_bucket(fd, p, k, buf, local, map, io, &bt[k], err);
  if (!rc && send_status(fd, MAGIC_ACK, 0, "", io->cancel_fd, bcast__deadline(io->timeout_s, p->deadline_unix_ms)))
    rc = bcast__fail(err, BCAST_EPEER, "root %s: final confirmation not delivered: %s", p->host_endpoint,
                     strerror(errno));
  close(fd);
  free(buf);
  if (rc == BCAST_OK && stats) {
    fill_stats(stats, p, t0, bt);
    bt = NULL;
  }
  free(bt);
  return rc;
}
