/* Fuzz target: the receiver's side of the host data channel — what the root
 * (or whoever answers at the plan's host_endpoint) sends an inference worker
 * (workers/bcast/bcast_host.c, protocol 2, through the public engine API).
 *
 * Input: one byte of flags, then the root's bytes. Bit 0 picks the plan's
 * checksum kind (XXH3 or none: without a checksum, mutated payloads reach
 * the scatter); bit 1 picks what the bytes are:
 *
 *   0  the framing after the handshake. A root thread that holds the plan's
 *      secret accepts the receiver's connection, sends its challenge, reads
 *      and verifies the HELLO, sends REPLY 0 with its own proof, then the
 *      input (bucket headers and payloads).
 *   1  the root's handshake itself. The root thread sends the input as it is
 *      from the first byte (challenge, REPLY, then anything), reads what the
 *      receiver answers, and cancels the plan once the receiver closed, so
 *      that a receiver trying again after a challenge cut short ends at once
 *      instead of at its deadline.
 *
 * Either way the root thread then closes its sending side and reads until the
 * receiver closes.
 *
 * Properties: every HELLO presents the plan (id, hash, rank) and proves the
 * plan's secret for the challenge it answers (the proofs are computed in
 * data_plan.h, not with the engine's code); in mode 1 a HELLO follows only a
 * whole protocol-2 challenge, and the plan is never accepted (a root that
 * cannot know the receiver's nonce cannot prove the secret); in mode 0 a plan
 * is accepted only with every bucket whole, and then each tensor holds its
 * slices' bytes; a failure is one of the engine's BCAST_E* codes, with a
 * message. FUZZ_VERBOSE=1 in the environment prints each execution's
 * outcome. */
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
#define HELLO_BYTES (DATA_HELLO_FIXED + sizeof DATA_PLAN_ID - 1 + DATA_MAC)

static bcast_engine *recv_engine;
static bcast_plan *plans[2]; /* [0] XXH3, [1] no checksum */
static int lfd;
static bcast_tensor local[DATA_NTENSORS];
static uint16_t buf0[64]; /* bf16 on the wire */
static float buf1[8];
/* The fake root's challenge nonce in mode 0: fixed, so that every input takes
 * the same path each time. */
static const uint8_t root_nonce[DATA_NONCE] = "the fake root's challenge nonce";

typedef struct root {
  const bcast_plan *p;
  int handshake; /* mode 1: the input is the root's handshake */
  const uint8_t *data;
  size_t size;
  uint8_t got[2 * HELLO_BYTES]; /* mode 1: what the receiver sent */
  size_t ngot;
} root;

static void read_full(int fd, uint8_t *b, size_t n) {
  for (size_t off = 0; off < n;) {
    FUZZ_CHECK(fuzz_poll(fd, POLLIN, 10000), "no HELLO within 10 s");
    ssize_t r = fuzz_recv(fd, b + off, n - off);
    FUZZ_CHECK(r > 0, "connection closed within the HELLO");
    off += (size_t)r;
  }
}

static void send_all(int fd, const uint8_t *b, size_t n) {
  for (size_t off = 0; off < n;) {
    ssize_t w = fuzz_send(fd, b + off, n - off);
    if (w <= 0) return; /* the receiver closed on us */
    off += (size_t)w;
  }
}

/* The receiver's HELLO names this plan and its own rank, and proves the
 * plan's secret for this challenge nonce. */
static void check_hello(const uint8_t *h, size_t n, const uint8_t nonce[DATA_NONCE], uint64_t hash) {
  size_t idlen = strlen(DATA_PLAN_ID);
  FUZZ_CHECK(n == HELLO_BYTES, "a HELLO of %zu bytes, not %zu", n, (size_t)HELLO_BYTES);
  FUZZ_CHECK(data_get32(h) == DATA_MAGIC_HELLO && data_get32(h + 4) == DATA_VERSION &&
                 data_get32(h + 8) == 1 && data_get32(h + 12) == idlen && data_get64(h + 16) == hash &&
                 !memcmp(h + DATA_HELLO_FIXED, DATA_PLAN_ID, idlen),
             "HELLO does not present the plan");
  uint8_t want[DATA_MAC];
  data_mac("rlorch.bcast.hello/2", nonce, h + 24, 1, hash, DATA_PLAN_ID, want);
  FUZZ_CHECK(!memcmp(want, h + DATA_HELLO_FIXED + idlen, DATA_MAC),
             "the HELLO's proof is not the plan secret's answer to the challenge");
}

static void *root_main(void *arg) {
  root *r = arg;
  FUZZ_CHECK(fuzz_poll(lfd, POLLIN, 10000), "the receiver did not connect within 10 s");
  int fd = fuzz_accept(lfd);
  FUZZ_CHECK(fd >= 0, "accept: %s", strerror(errno));
  if (!r->handshake) {
    uint8_t b[HELLO_BYTES];
    send_all(fd, b, data_challenge(b, root_nonce));
    read_full(fd, b, sizeof b);
    check_hello(b, sizeof b, root_nonce, r->p->hash);
    uint8_t reply[12 + DATA_MAC];
    send_all(fd, reply, data_reply_ok(reply, 1, DATA_PLAN_ID, r->p->hash, root_nonce, b + 24));
  }
  send_all(fd, r->data, r->size);
  shutdown(fd, SHUT_WR);
  uint8_t sink[4096];
  for (;;) {
    FUZZ_CHECK(fuzz_poll(fd, POLLIN, 10000), "the receiver kept the connection open for 10 s");
    ssize_t n = fuzz_recv(fd, sink, sizeof sink);
    if (n <= 0) break;
    if (r->handshake) {
      FUZZ_CHECK(r->ngot + (size_t)n <= sizeof r->got, "the receiver sent %zu bytes and more",
                 r->ngot + (size_t)n);
      memcpy(r->got + r->ngot, sink, (size_t)n);
      r->ngot += (size_t)n;
    }
  }
  close(fd);
  if (r->handshake) bcast_engine_cancel(recv_engine, DATA_PLAN_ID);
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
  /* The plan's id must stay executable: the harness cancels it in mode 1. */
  FUZZ_CHECK(bcast_engine_cancel(recv_engine, DATA_STALE_ID) == 0, "cancel");
  data_tensors(local);
  local[0].data = buf0;
  local[1].data = buf1;
  return 0;
}

/* An accepted input in mode 0: every bucket; each slice's bytes are now the
 * local tensor's. */
static void check_scattered(const bcast_plan *p, const uint8_t *b, size_t n) {
  size_t off = 0;
  for (size_t k = 0; k < p->nbuckets; k++) {
    const bcast_bucket *bk = &p->buckets[k];
    FUZZ_CHECK(off + 24 + bk->bytes <= n, "accepted with bucket %zu cut short", k);
    FUZZ_CHECK(data_get32(b + off) == DATA_MAGIC_BUCKET && data_get32(b + off + 4) == k,
               "accepted with a bad header for bucket %zu", k);
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

/* Mode 1: a receiver answers only a whole protocol-2 challenge, with one
 * HELLO proving the secret for the nonce it was given. */
static void check_answer(const root *r) {
  if (r->ngot == 0) return;
  FUZZ_CHECK(r->size >= DATA_CHALLENGE && data_get32(r->data) == DATA_MAGIC_CHALLENGE &&
                 data_get32(r->data + 4) == DATA_VERSION,
             "the receiver sent %zu bytes without a protocol-2 challenge", r->ngot);
  check_hello(r->got, r->ngot, r->data + 8, r->p->hash);
}

/* Connections the receiver opened that no root thread accepted (a retry
 * after a challenge cut short, before the cancel): closed, so that the next
 * input's root meets its own receiver. */
static void drain_backlog(void) {
  while (fuzz_poll(lfd, POLLIN, 0)) {
    int fd = fuzz_accept(lfd);
    if (fd < 0) break;
    close(fd);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  if (size > FUZZ_MAX_INPUT) size = FUZZ_MAX_INPUT;
  const bcast_plan *p = plans[data[0] & 1];
  memset(buf0, 0, sizeof buf0);
  memset(buf1, 0, sizeof buf1);
  root r = {.p = p, .handshake = (data[0] >> 1) & 1, .data = data + 1, .size = size - 1};
  pthread_t tid;
  FUZZ_CHECK(pthread_create(&tid, NULL, root_main, &r) == 0, "pthread_create");
  bcast_stats st;
  memset(&st, 0, sizeof st);
  bcast_err e = {0};
  int rc = bcast_engine_execute(recv_engine, p, local, DATA_NTENSORS, &st, &e);
  pthread_join(tid, NULL);
  /* The cancel of mode 1 may land after the execution ended: the plan stays
   * executable for the next input. */
  bcast_engine_cancel(recv_engine, DATA_STALE_ID);
  drain_backlog();
  /* Whatever the root says, the receiver's outcome is one of the engine's codes. */
  FUZZ_CHECK(rc <= BCAST_OK && rc >= BCAST_ECANCELED, "outcome %d is no BCAST_E* code: %s", rc,
             e.msg);
  if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "execute (mode %d): %d %s\n", r.handshake, rc, e.msg);
  if (r.handshake) {
    check_answer(&r);
    FUZZ_CHECK(rc != BCAST_OK, "weights taken from a root that did not prove the plan's secret");
  }
  if (rc == BCAST_OK) {
    check_scattered(p, r.data, r.size);
    bcast_stats_free(&st);
  } else {
    FUZZ_CHECK(e.msg[0], "failure %d without a reason", rc);
  }
  return 0;
}
