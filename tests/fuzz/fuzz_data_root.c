/* Fuzz target: the root's side of the host data channel — what anyone who
 * connects to a trainer's data port can send it: the HELLO handshake, then
 * the ACK after the last bucket (workers/bcast/bcast_host.c, through the
 * public engine API).
 *
 * One root engine for the process, listening on loopback, with the plan of
 * data_plan.h. For each input the engine executes the plan while a client
 * thread connects, sends the input, closes its sending side and reads
 * whatever the root sends until the root closes the connection; then it
 * cancels the plan, which ends an execution still waiting for a receiver (the
 * input was ignored) at once instead of at its deadline. The client only
 * cancels once the root is done with its connection, so every input takes
 * the same path each time.
 *
 * Properties: the execution succeeds only for a receiver that presented this
 * plan and confirmed it; that receiver got every bucket with the plan's bytes
 * and a header whose checksum is the payload's. FUZZ_VERBOSE=1 in the
 * environment prints each execution's outcome. */
#include "fuzz_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>

#include "data_plan.h"
#include "workers/bcast/bcast.h"

#define FUZZ_MAX_INPUT (1u << 16)

static bcast_engine *root;
static bcast_plan *plan;
static bcast_tensor local[DATA_NTENSORS];
static float storage0[64], storage1[8];
static struct sockaddr_storage addr;
static socklen_t addrlen;

typedef struct client {
  const uint8_t *data;
  size_t size;
  uint8_t *got; /* what the root sent */
  size_t ngot, cap;
} client;

static void *client_main(void *arg) {
  client *c = arg;
  int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  FUZZ_CHECK(fd >= 0, "socket");
  FUZZ_CHECK(fuzz_connect(fd, (struct sockaddr *)&addr, addrlen) == 0, "connect: %s",
             strerror(errno));
  /* The root reads while we write; what it sends meanwhile waits in the
   * socket buffer (the plan is a few hundred bytes). */
  for (size_t off = 0; off < c->size;) {
    ssize_t w = fuzz_send(fd, c->data + off, c->size - off);
    if (w <= 0) break; /* the root closed on us */
    off += (size_t)w;
  }
  shutdown(fd, SHUT_WR);
  for (;;) {
    if (c->ngot == c->cap) {
      c->cap = c->cap ? 2 * c->cap : 4096;
      c->got = realloc(c->got, c->cap);
      FUZZ_CHECK(c->got, "out of memory");
    }
    FUZZ_CHECK(fuzz_poll(fd, POLLIN, 10000), "the root kept the connection open for 10 s");
    ssize_t r = fuzz_recv(fd, c->got + c->ngot, c->cap - c->ngot);
    if (r <= 0) break;
    c->ngot += (size_t)r;
  }
  close(fd);
  bcast_engine_cancel(root, DATA_PLAN_ID);
  return NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  bcast_err e = {0};
  bcast_engine_opts o = {.rank = 0, .device = -1, .timeout_s = 5, .host_listen = "127.0.0.1:0"};
  FUZZ_CHECK(bcast_engine_new(&o, &root, &e) == 0, "engine: %s", e.msg);
  FUZZ_CHECK(data_plan("", BCAST_CHECKSUM_XXH3_64, &plan, &e) == 0, "plan: %s", e.msg);
  data_tensors(local);
  for (size_t i = 0; i < 64; i++) storage0[i] = (float)i * 0.25f - 3.0f;
  for (size_t i = 0; i < 8; i++) storage1[i] = 1.0f / (float)(i + 1);
  local[0].data = storage0;
  local[1].data = storage1;
  /* Where the engine listens. */
  const char *bound = bcast_engine_data_address(root);
  char host[64], port[16];
  const char *colon = strrchr(bound, ':');
  FUZZ_CHECK(colon && (size_t)(colon - bound) < sizeof host, "bound address '%s'", bound);
  snprintf(host, sizeof host, "%.*s", (int)(colon - bound), bound);
  snprintf(port, sizeof port, "%s", colon + 1);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
  FUZZ_CHECK(getaddrinfo(host, port, &hints, &res) == 0, "resolve '%s'", bound);
  memcpy(&addr, res->ai_addr, res->ai_addrlen);
  addrlen = res->ai_addrlen;
  freeaddrinfo(res);
  /* Receivers presenting the plan cancelled last are leftovers: ignored. */
  bcast_engine_cancel(root, DATA_STALE_ID);
  return 0;
}

/* The root's bytes to an accepted receiver: REPLY 0, then every bucket, its
 * header carrying the checksum of its payload. */
static void check_sent(const uint8_t *b, size_t n) {
  FUZZ_CHECK(n >= 12 && data_get32(b) == DATA_MAGIC_REPLY && data_get32(b + 4) == 0,
             "accepted without a REPLY 0");
  size_t off = 12 + data_get32(b + 8);
  for (size_t k = 0; k < plan->nbuckets; k++) {
    const bcast_bucket *bk = &plan->buckets[k];
    FUZZ_CHECK(off + 24 + bk->bytes <= n, "bucket %zu cut short", k);
    FUZZ_CHECK(data_get32(b + off) == DATA_MAGIC_BUCKET && data_get32(b + off + 4) == k &&
                   data_get64(b + off + 8) == bk->bytes,
               "bad header for bucket %zu", k);
    FUZZ_CHECK(data_get64(b + off + 16) == bcast_checksum64(b + off + 24, bk->bytes),
               "bucket %zu: checksum is not the payload's", k);
    off += 24 + bk->bytes;
  }
  FUZZ_CHECK(off == n, "%zu bytes after the last bucket", n - off);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > FUZZ_MAX_INPUT) size = FUZZ_MAX_INPUT;
  client c = {.data = data, .size = size};
  pthread_t tid;
  FUZZ_CHECK(pthread_create(&tid, NULL, client_main, &c) == 0, "pthread_create");
  bcast_stats st;
  memset(&st, 0, sizeof st);
  bcast_err e = {0};
  int rc = bcast_engine_execute(root, plan, local, DATA_NTENSORS, &st, &e);
  pthread_join(tid, NULL);
  /* The client's cancel may land after the execution ended: the plan stays
   * executable for the next input, and the stale id stays the same. */
  bcast_engine_cancel(root, DATA_STALE_ID);
  FUZZ_CHECK(rc == BCAST_OK || rc == BCAST_ECANCELED || rc == BCAST_EMISMATCH ||
                 rc == BCAST_EPEER || rc == BCAST_ETIMEDOUT,
             "unexpected outcome %d: %s", rc, e.msg);
  if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "execute: %d %s\n", rc, e.msg);
  if (rc == BCAST_OK) {
    check_sent(c.got, c.ngot);
    FUZZ_CHECK(st.wire_bytes == bcast_plan_wire_bytes(plan), "stats: %llu wire bytes",
               (unsigned long long)st.wire_bytes);
    /* Only a receiver that presented this very plan gets it. */
    FUZZ_CHECK(size >= DATA_HELLO_FIXED + strlen(DATA_PLAN_ID) && data_get32(data) == DATA_MAGIC_HELLO &&
                   data_get64(data + 16) == plan->hash &&
                   !memcmp(data + DATA_HELLO_FIXED, DATA_PLAN_ID, strlen(DATA_PLAN_ID)),
               "plan sent to a peer that did not present it");
    bcast_stats_free(&st);
  } else {
    FUZZ_CHECK(e.msg[0], "failure %d without a reason", rc);
  }
  free(c.got);
  return 0;
}
