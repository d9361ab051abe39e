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
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_internal.h"
#include "tests/unit/bcast_peer.h"

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
  uint32_t refused; /* bcast_stats.refused_connections of a root */
  bcast_err err;
  pthread_t tid;
} job;

static void *job_main(void *arg) {
  job *j = arg;
  double t0 = bcast__now();
  bcast_stats st;
  j->rc = bcast_engine_execute(j->e, j->p, j->local, j->n, &st, &j->err);
  j->refused = st.refused_connections;
  bcast_stats_free(&st);
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

/* A connection that holds the secret of the plan the root cancelled last
 * (it connected before its agent learnt of the abort) gets nothing: the next
 * plan's secret is another. Neither it nor a hello for some other plan
 * fails the plan the root executes. */
Test(bcast_cancel, hellos_of_other_plans_do_not_fail_the_next) {
  fixture f;
  fixture_init(&f);
  bcast_engine *root = engine(0, "127.0.0.1:0"), *rx = engine(1, NULL);
  const char *addr = bcast_engine_data_address(root);
  bcast_plan *p = make_plan(&f, "run/step-7", 2, addr);
  bcast_plan *q = make_plan(&f, "run/step-7-r2", 2, addr);
  cr_assert_eq(bcast_engine_cancel(root, p->id), BCAST_OK);
  int stale = bp_dial(addr);
  cr_assert_geq(stale, 0);
  /* The root runs first and answers the leftover's handshake while its own
   * receiver has not come yet. */
  job jr, j;
  job_start(&jr, root, q, f.src, f.n);
  uint8_t rx_nonce[BP_NONCE];
  cr_assert_eq(bp_handshake(stale, p, 1, rx_nonce), 1, "the leftover gets no reply");
  job_start(&j, rx, q, f.dst, f.n);
  job_join(&j);
  job_join(&jr);
  cr_assert_eq(jr.rc, BCAST_OK, "%s", jr.err.msg);
  cr_assert_eq(j.rc, BCAST_OK, "%s", j.err.msg);
  cr_assert_eq(jr.refused, 0, "a leftover of the cancelled plan is no stranger");
  close(stale);

  /* A hello for a plan that was never cancelled: closed, counted, harmless. */
  bcast_plan *other = make_plan(&f, "run/step-6", 2, addr);
  int odd = bp_dial(addr);
  job_start(&jr, root, q, f.src, f.n);
  cr_assert_eq(bp_handshake(odd, other, 1, rx_nonce), 1);
  job_start(&j, rx, q, f.dst, f.n);
  job_join(&j);
  job_join(&jr);
  cr_assert_eq(jr.rc, BCAST_OK, "%s", jr.err.msg);
  cr_assert_lt(jr.seconds, 3.0);
  cr_assert_eq(jr.refused, 1);
  cr_assert_eq(j.rc, BCAST_OK, "%s", j.err.msg);
  close(odd);
  bcast_plan_free(other);
  bcast_plan_free(q);
  bcast_plan_free(p);
  bcast_engine_free(rx);
  bcast_engine_free(root);
  fixture_free(&f);
}

/* The root writes to a receiver that stopped reading (SIGSTOP keeps its
 * socket open; the kernel buffers fill and every send would block): the
 * orchestrator's abort must still end the broadcast at once, so the trainer
 * can ack the re-plan. */
Test(bcast_cancel, a_root_writing_to_a_stopped_receiver_stops_at_cancel) {
  fixture f;
  memset(&f, 0, sizeof f);
  bcast_tensor *t = &f.src[0];
  snprintf(t->name, sizeof t->name, "big");
  t->storage_dtype = t->wire_dtype = BCAST_DTYPE_U16;
  t->ndim = 2;
  t->shape[0] = 8192;
  t->shape[1] = 4096; /* 64 MiB: far beyond the socket buffers */
  t->residency = BCAST_RES_HOST_PAGEABLE;
  t->data = calloc(8192 * 4096, 2);
  f.n = 1;
  bcast_engine *root = engine(0, "127.0.0.1:0");
  bcast_plan_opts o = {.id = "run/step-9", .mode = BCAST_MODE_HOST, .staging_budget = 8 << 20,
                       .world_size = 2, .root_rank = 0, .host_endpoint = bcast_engine_data_address(root)};
  bcast_plan *p = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_build(f.src, f.n, &o, &p, &err), BCAST_OK, "%s", err.msg);
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a stopped orphan would outlive a failed test */
    int fd = bp_dial(bcast_engine_data_address(root));
    uint8_t rx_nonce[BP_NONCE], buf[4096];
    if (fd < 0 || bp_handshake(fd, p, 1, rx_nonce) != 0) _exit(3);
    if (bp_read(fd, buf, sizeof buf)) _exit(4); /* the transfer began */
    raise(SIGSTOP);
    _exit(0);
  }
  job jr;
  job_start(&jr, root, p, f.src, f.n);
  sleep_s(1.0); /* well into the stall: the root sits in poll for POLLOUT */
  cr_assert_eq(bcast_engine_cancel(root, p->id), BCAST_OK);
  double t0 = bcast__now();
  job_join(&jr);
  cr_assert_eq(jr.rc, BCAST_ECANCELED, "%d %s", jr.rc, jr.err.msg);
  cr_assert_lt(bcast__now() - t0, 1.0, "the cancel took %.2f s to reach the blocked root", bcast__now() - t0);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  bcast_plan_free(p);
  bcast_engine_free(root);
  free(t->data);
}

Test(bcast_cancel, bad_arguments_are_refused) {
  bcast_engine *e = engine(1, NULL);
  cr_assert_eq(bcast_engine_cancel(NULL, "x"), BCAST_EINVAL);
  cr_assert_eq(bcast_engine_cancel(e, NULL), BCAST_EINVAL);
  cr_assert_eq(bcast_engine_cancel(e, ""), BCAST_EINVAL);
  cr_assert_str_eq(bcast_strerror(BCAST_ECANCELED), "cancelled");
  bcast_engine_free(e);
}
