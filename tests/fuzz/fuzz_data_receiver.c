/* Fuzz target: the receiver's side of the host data channel — what the root
 * (or whoever answers at the plan's host_endpoint) sends an inference worker:
 * the REPLY to its HELLO, then each bucket's header and payload
 * (workers/bcast/bcast_host.c, through the public engine API).
 *
 * Input: one byte whose low bit picks the plan's checksum kind (XXH3 or
 * none: without a checksum, mutated payloads reach the scatter), then the
 * root's bytes. For each input a receiver engine executes the plan of
 * data_plan.h while a root thread accepts its connection, reads its HELLO,
 * sends the input, closes its sending side and reads until the receiver
 * closes.
 *
 * Properties: the HELLO presents the plan (id, hash, rank); the execution
 * succeeds only when the input held a REPLY 0 and every bucket, and then
 * every local tensor holds the bytes its slices had in the buckets; a failure
 * is one of the engine's BCAST_E* codes, with a message. FUZZ_VERBOSE=1 in
 * the environment prints each execution's outcome. */
#include "fuzz_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>

#include "data_plan.h"
#include "workers/bcast/bcast.h"

#define FUZZ_MAX_INPUT (1u << 16)

static bcast_engine *recv_engine;
static bcast_plan *plans[2]; /* [0] XXH3, [1] no checksum */
static int lfd;
static bcast_tensor local[DATA_NTENSORS];
static uint16_t buf0[64]; /* bf16 on the wire */
static float buf1[8];

typedef struct root {
  const bcast_plan *p;
  const uint8_t *data;
  size_t size;
} root;

static void read_full(int fd, uint8_t *b, size_t n) {
  for (size_t off = 0; off < n;) {
    FUZZ_CHECK(fuzz_poll(fd, POLLIN, 10000), "no HELLO within 10 s");
    ssize_t r = fuzz_recv(fd, b + off, n - off);
    FUZZ_CHECK(r > 0, "connection closed within the HELLO");
    off += (size_t)r;
  }
}

static void *root_main(void *arg) {
  root *r = arg;
  FUZZ_CHECK(fuzz_poll(lfd, POLLIN, 10000), "the receiver did not connect within 10 s");
  int fd = fuzz_accept(lfd);
  FUZZ_CHECK(fd >= 0, "accept: %s", strerror(errno));
  /* The receiver's HELLO names this plan and its own rank. */
  size_t idlen = strlen(DATA_PLAN_ID);
  uint8_t h[24 + sizeof DATA_PLAN_ID];
  read_full(fd, h, 24 + idlen);
  FUZZ_CHECK(data_get32(h) == DATA_MAGIC_HELLO && data_get32(h + 4) == DATA_VERSION &&
                 data_get32(h + 8) == 1 && data_get32(h + 12) == idlen &&
                 data_get64(h + 16) == r->p->hash && !memcmp(h + 24, DATA_PLAN_ID, idlen),
             "HELLO does not present the plan");
  for (size_t off = 0; off < r->size;) {
    ssize_t w = fuzz_send(fd, r->data + off, r->size - off);
    if (w <= 0) break; /* the receiver closed on us */
    off += (size_t)w;
  }
  shutdown(fd, SHUT_WR);
  uint8_t sink[4096];
  for (;;) {
    FUZZ_CHECK(fuzz_poll(fd, POLLIN, 10000), "the receiver kept the connection open for 10 s");
    if (fuzz_recv(fd, sink, sizeof sink) <= 0) break;
  }
  close(fd);
  return NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  FUZZ_CHECK(lfd >= 0, "socket");
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  FUZZ_CHECK(bind(lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(lfd, 4) == 0 &&
                 getsockname(lfd, (struct sockaddr *)&a, &al) == 0,
             "listen: %s", strerror(errno));
  char endpoint[64];
  snprintf(endpoint, sizeof endpoint, "127.0.0.1:%u", ntohs(a.sin_port));
  bcast_err e = {0};
  FUZZ_CHECK(data_plan(endpoint, BCAST_CHECKSUM_XXH3_64, &plans[0], &e) == 0, "plan: %s", e.msg);
  FUZZ_CHECK(data_plan(endpoint, BCAST_CHECKSUM_NONE, &plans[1], &e) == 0, "plan: %s", e.msg);
  bcast_engine_opts o = {.rank = 1, .device = -1, .timeout_s = 5};
  FUZZ_CHECK(bcast_engine_new(&o, &recv_engine, &e) == 0, "engine: %s", e.msg);
  data_tensors(local);
  local[0].data = buf0;
  local[1].data = buf1;
  return 0;
}

/* An accepted input: REPLY 0, then the buckets; each slice's bytes are now
 * the local tensor's. */
static void check_scattered(const bcast_plan *p, const uint8_t *b, size_t n) {
  FUZZ_CHECK(n >= 12 && data_get32(b) == DATA_MAGIC_REPLY && data_get32(b + 4) == 0,
             "accepted without a REPLY 0");
  size_t off = 12 + data_get32(b + 8);
  for (size_t k = 0; k < p->nbuckets; k++) {
    const bcast_bucket *bk = &p->buckets[k];
    FUZZ_CHECK(off + 24 + bk->bytes <= n, "accepted with bucket %zu cut short", k);
    const uint8_t *payload = b + off + 24;
    size_t wsz = bcast_dtype_size(bk->wire_dtype);
    for (size_t s = 0; s < bk->nslices; s++) {
      const bcast_slice *sl = &bk->slices[s];
      const uint8_t *dst = (const uint8_t *)local[sl->tensor].data + sl->elem_offset * wsz;
      FUZZ_CHECK(!memcmp(dst, payload + sl->bucket_offset, sl->elem_count * wsz),
                 "bucket %zu slice %zu not where the plan puts it", k, s);
    }
    off += 24 + bk->bytes;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  if (size > FUZZ_MAX_INPUT) size = FUZZ_MAX_INPUT;
  const bcast_plan *p = plans[data[0] & 1];
  memset(buf0, 0, sizeof buf0);
  memset(buf1, 0, sizeof buf1);
  root r = {.p = p, .data = data + 1, .size = size - 1};
  pthread_t tid;
  FUZZ_CHECK(pthread_create(&tid, NULL, root_main, &r) == 0, "pthread_create");
  bcast_stats st;
  memset(&st, 0, sizeof st);
  bcast_err e = {0};
  int rc = bcast_engine_execute(recv_engine, p, local, DATA_NTENSORS, &st, &e);
  pthread_join(tid, NULL);
  /* Whatever the root says, the receiver's outcome is one of the engine's codes. */
  FUZZ_CHECK(rc <= BCAST_OK && rc >= BCAST_ECANCELED, "outcome %d is no BCAST_E* code: %s", rc,
             e.msg);
  if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "execute: %d %s\n", rc, e.msg);
  if (rc == BCAST_OK) {
    check_scattered(p, r.data, r.size);
    bcast_stats_free(&st);
  } else {
    FUZZ_CHECK(e.msg[0], "failure %d without a reason", rc);
  }
  return 0;
}
