/* Cancelling a host-mode broadcast (bcast_engine_cancel) from another thread.
 *
 * The order that matters: a receiver acks a plan and dies before it connects
 * to the root. The orchestrator sees it lost, aborts the plan and re-plans
 * without it; the root, waiting in accept for that receiver, and the surviving
 * receiver, waiting for buckets, must give the plan up at once so that they
 * can ack the re-plan, not at their deadline (which is later than the
 * re-plan's ack timeout, so the run failed). */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_internal.h"

#define SLOW_S 30.0 /* every engine's own timeout: a test that hits it has failed */

typedef struct fixture {
  bcast_tensor src[1];
  bcast_tensor dst[1];
  size_t n;
} fixture;

static void fixture_init(fixture *f) {
  memset(f, 0, sizeof *f);
  bcast_tensor *t = &f->src[0];
  snprintf(t->name, sizeof t->name, "w");
  t->storage_dtype = BCAST_DTYPE_FP32;
  t->wire_dtype = BCAST_DTYPE_BF16;
  t->ndim = 2;
  t->shape[0] = 256;
  t->shape[1] = 64;
  t->residency = BCAST_RES_HOST_PAGEABLE;
  t->data = malloc(256 * 64 * sizeof(float));
  for (size_t i = 0; i < 256 * 64; i++) ((float *)t->data)[i] = (float)i * 0.25f;
  f->dst[0] = *t;
  f->dst[0].data = calloc(256 * 64, 2);
  f->n = 1;
}

static void fixture_free(fixture *f) {
  free(f->src[0].data);
  free(f->dst[0].data);
}

static bcast_plan *make_plan(const fixture *f, const char *id, uint32_t world, const char *endpoint) {
  bcast_plan_opts o = {.id = id, .mode = BCAST_MODE_HOST, .staging_budget = 8 << 10,
                       .world_size = world, .root_rank = 0, .host_endpoint = endpoint};
  bcast_plan *p = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_build(f->src, f->n, &o, &p, &err), BCAST_OK, "%s", err.msg);
  return p;
}

static bcast_engine *engine(uint32_t rank, const char *listen) {
  bcast_engine_opts o = {.rank = rank, .device = -1, .timeout_s = SLOW_S, .host_listen = listen};
  bcast_engine *e = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_engine_new(&o, &e, &err), BCAST_OK, "%s", err.msg);
  return e;
}

/* One execution on its own thread, as an agent's command thread runs it. */
typedef struct job {
  bcast_engine *e;
  const bcast_plan *p;
  const bcast_tensor *local;
  size_t n;
  int rc;
  double seconds;
  bcast_err err;
  pthread_t tid;
} job;

static void *job_main(void *arg) {
  job *j = arg;
  double t0 = bcast__now();
  j->rc = bcast_engine_execute(j->e, j->p, j->local, j->n, NULL, &j->err);
  j->seconds = bcast__now() - t0;
  return NULL;
}

static void job_start(job *j, bcast_engine *e, const bcast_plan *p, const bcast_tensor *local, size_t n) {
  memset(j, 0, sizeof *j);
  j->e = e, j->p = p, j->local = local, j->n = n;
  cr_assert_eq(pthread_create(&j->tid, NULL, job_main, j), 0);
}

static void job_join(job *j) { cr_assert_eq(pthread_join(j->tid, NULL), 0); }

static void sleep_s(double s) { usleep((useconds_t)(s * 1e6)); }

/* A loopback TCP client: connected to addr ("127.0.0.1:port"). */
static int dial(const char *addr) {
  const char *colon = strrchr(addr, ':');
  cr_assert_not_null(colon);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  cr_assert_geq(fd, 0);
  cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

static void put32(uint8_t *b, uint32_t v) {
  for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *b, uint64_t v) {
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}

/* Sends the HELLO a receiver of plan p with `rank` sends (bcast_host.c's protocol). */
static void send_hello(int fd, const bcast_plan *p, uint32_t rank) {
  uint8_t h[24 + 128];
  size_t idlen = strlen(p->id);
  put32(h, 0x48424c52u);
  put32(h + 4, 1);
  put32(h + 8, rank);
  put32(h + 12, (uint32_t)idlen);
  put64(h + 16, p->hash);
  memcpy(h + 24, p->id, idlen);
  cr_assert_eq(send(fd, h, 24 + idlen, 0), (ssize_t)(24 + idlen));
}

/* The root's REPLY status, or 1 when none came. */
static int reply_status(int fd) {
  uint8_t b[12];
  size_t got = 0;
  while (got < sizeof b) {
    ssize_t r = recv(fd, b + got, sizeof b - got, 0);
    if (r <= 0) return 1;
    got += (size_t)r;
  }
  return (int32_t)((uint32_t)b[4] | (uint32_t)b[5] << 8 | (uint32_t)b[6] << 16 | (uint32_t)b[7] << 24);
}

Test(bcast_cancel, root_and_survivor_waiting_for_a_dead_receiver_stop_at_cancel) {
  fixture f;
  fixture_init(&f);
  bcast_engine *root = engine(0, "127.0.0.1:0"), *survivor = engine(1, NULL);
  bcast_plan *p = make_plan(&f, "run/step-3", 3, bcast_engine_data_address(root));
  job jr, js;
  job_start(&jr, root, p, f.src, f.n);
  job_start(&js, survivor, p, f.dst, f.n); /* rank 2 acked, then died: it never connects */
  sleep_s(0.3);
  /* The orchestrator aborts the plan: both agents cancel it. */
  cr_assert_eq(bcast_engine_cancel(root, p->id), BCAST_OK);
  cr_assert_eq(bcast_engine_cancel(survivor, p->id), BCAST_OK);
  job_join(&jr);
  job_join(&js);
  cr_assert_eq(jr.rc, BCAST_ECANCELED, "root: %d %s", jr.rc, jr.err.msg);
  cr_assert(strstr(jr.err.msg, "cancelled"), "%s", jr.err.msg);
  cr_assert_lt(jr.seconds, 3.0, "root took %.2f s", jr.seconds);
  /* Cancelled itself, or saw the root close the connection first. */
  cr_assert(js.rc == BCAST_ECANCELED || js.rc == BCAST_EPEER, "survivor: %d %s", js.rc, js.err.msg);
  cr_assert_lt(js.seconds, 3.0, "survivor took %.2f s", js.seconds);

  /* The re-plan without the dead receiver runs on the same engines. */
  bcast_plan *q = make_plan(&f, "run/step-3-r2", 2, bcast_engine_data_address(root));
  job_start(&js, survivor, q, f.dst, f.n);
  bcast_err err = {0};
  cr_assert_eq(bcast_engine_execute(root, q, f.src, f.n, NULL, &err), BCAST_OK, "%s", err.msg);
  job_join(&js);
  cr_assert_eq(js.rc, BCAST_OK, "%s", js.err.msg);
  bcast_plan_free(q);
  bcast_plan_free(p);
  bcast_engine_free(survivor);
  bcast_engine_free(root);
  fixture_free(&f);
}

Test(bcast_cancel, receiver_stops_at_cancel_in_connect_and_in_handshake) {
  fixture f;
  fixture_init(&f);
  /* Handshake: a root that accepts (the kernel does) but never answers. */
  int lfd = -1;
  char bound[96];
  bcast_err err = {0};
  cr_assert_eq(bcast__host_listen("127.0.0.1:0", &lfd, bound, sizeof bound, &err), BCAST_OK, "%s", err.msg);
  bcast_engine *rx = engine(1, NULL);
  bcast_plan *p = make_plan(&f, "run/step-0", 2, bound);
  job j;
  job_start(&j, rx, p, f.dst, f.n);
  sleep_s(0.3);
  cr_assert_eq(bcast_engine_cancel(rx, p->id), BCAST_OK);
  job_join(&j);
  cr_assert_eq(j.rc, BCAST_ECANCELED, "%d %s", j.rc, j.err.msg);
  cr_assert_lt(j.seconds, 3.0, "took %.2f s", j.seconds);
  bcast_plan_free(p);

  /* Connect: nobody listens at all, the receiver retries until cancelled. */
  close(lfd);
  p = make_plan(&f, "run/step-1", 2, bound);
  job_start(&j, rx, p, f.dst, f.n);
  sleep_s(0.3);
  cr_assert_eq(bcast_engine_cancel(rx, p->id), BCAST_OK);
  job_join(&j);
  cr_assert_eq(j.rc, BCAST_ECANCELED, "%d %s", j.rc, j.err.msg);
  cr_assert_lt(j.seconds, 3.0, "took %.2f s", j.seconds);
  bcast_plan_free(p);
  bcast_engine_free(rx);
  fixture_free(&f);
}

Test(bcast_cancel, a_cancel_before_the_trigger_fails_that_plan_only) {
  fixture f;
  fixture_init(&f);
  bcast_engine *root = engine(0, "127.0.0.1:0"), *rx = engine(1, NULL);
  bcast_plan *p = make_plan(&f, "run/step-5", 2, bcast_engine_data_address(root));
  /* The abort arrived while the trigger was still queued. */
  cr_assert_eq(bcast_engine_cancel(root, p->id), BCAST_OK);
  bcast_err err = {0};
  double t0 = bcast__now();
  cr_assert_eq(bcast_engine_execute(root, p, f.src, f.n, NULL, &err), BCAST_ECANCELED, "%s", err.msg);
  cr_assert_lt(bcast__now() - t0, 1.0);
  cr_assert(strstr(err.msg, "run/step-5"), "%s", err.msg);
  cr_assert_eq(bcast_engine_cancel(rx, p->id), BCAST_OK);
  cr_assert_eq(bcast_engine_execute(rx, p, f.dst, f.n, NULL, &err), BCAST_ECANCELED, "%s", err.msg);

  /* Another plan id is not affected, and the pipe holds no stale signal. */
  bcast_plan *q = make_plan(&f, "run/step-5-r2", 2, bcast_engine_data_address(root));
  job j;
  job_start(&j, rx, q, f.dst, f.n);
  cr_assert_eq(bcast_engine_execute(root, q, f.src, f.n, NULL, &err), BCAST_OK, "%s", err.msg);
  job_join(&j);
  cr_assert_eq(j.rc, BCAST_OK, "%s", j.err.msg);
  /* A cancel of a plan that is not running leaves the next one alone. */
  cr_assert_eq(bcast_engine_cancel(root, "run/step-4"), BCAST_OK);
  job_start(&j, rx, q, f.dst, f.n);
  cr_assert_eq(bcast_engine_execute(root, q, f.src, f.n, NULL, &err), BCAST_OK, "%s", err.msg);
  job_join(&j);
  cr_assert_eq(j.rc, BCAST_OK, "%s", j.err.msg);
  bcast_plan_free(q);
  bcast_plan_free(p);
  bcast_engine_free(rx);
  bcast_engine_free(root);
  fixture_free(&f);
}

Test(bcast_cancel, a_leftover_hello_of_the_cancelled_plan_does_not_fail_the_next) {
  fixture f;
  fixture_init(&f);
  bcast_engine *root = engine(0, "127.0.0.1:0"), *rx = engine(1, NULL);
  const char *addr = bcast_engine_data_address(root);
  bcast_plan *p = make_plan(&f, "run/step-7", 2, addr);
  bcast_plan *q = make_plan(&f, "run/step-7-r2", 2, addr);
  cr_assert_eq(bcast_engine_cancel(root, p->id), BCAST_OK);
  /* A receiver connected for the cancelled plan before it learnt of the abort. */
  int stale = dial(addr);
  send_hello(stale, p, 1);
  job j;
  job_start(&j, rx, q, f.dst, f.n);
  bcast_err err = {0};
  cr_assert_eq(bcast_engine_execute(root, q, f.src, f.n, NULL, &err), BCAST_OK, "%s", err.msg);
  job_join(&j);
  cr_assert_eq(j.rc, BCAST_OK, "%s", j.err.msg);
  cr_assert_eq(reply_status(stale), BCAST_ECANCELED, "the leftover is told its plan is over");
  close(stale);

  /* A HELLO for a plan that was never cancelled is still a disagreement. */
  bcast_plan *other = make_plan(&f, "run/step-6", 2, addr);
  int odd = dial(addr);
  send_hello(odd, other, 1);
  double t0 = bcast__now();
  cr_assert_eq(bcast_engine_execute(root, q, f.src, f.n, NULL, &err), BCAST_EMISMATCH, "%s", err.msg);
  cr_assert_lt(bcast__now() - t0, 3.0);
  cr_assert(strstr(err.msg, "run/step-6"), "%s", err.msg);
  close(odd);
  bcast_plan_free(other);
  bcast_plan_free(q);
  bcast_plan_free(p);
  bcast_engine_free(rx);
  bcast_engine_free(root);
  fixture_free(&f);
}

Test(bcast_cancel, bad_arguments_are_refused) {
  bcast_engine *e = engine(1, NULL);
  cr_assert_eq(bcast_engine_cancel(NULL, "x"), BCAST_EINVAL);
  cr_assert_eq(bcast_engine_cancel(e, NULL), BCAST_EINVAL);
  cr_assert_eq(bcast_engine_cancel(e, ""), BCAST_EINVAL);
  cr_assert_str_eq(bcast_strerror(BCAST_ECANCELED), "cancelled");
  bcast_engine_free(e);
}
