/* Host transport end to end between processes on loopback. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
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

/* ---- a manifest with every dtype pair, several layers, one oversized tensor --- */

typedef struct fixture {
  bcast_tensor src[6];
  size_t n;
} fixture;

static uint32_t rng = 0x9e3779b9u;

static void add(fixture *f, const char *name, uint32_t layer, bcast_dtype st, bcast_dtype wt, uint64_t d0,
                uint64_t d1) {
  bcast_residency res = (f->n & 1) ? BCAST_RES_HOST_PAGEABLE : BCAST_RES_HOST_PINNED;
  bp_random_tensor(&f->src[f->n], name, layer, st, wt, d0, d1, res, 1, &rng);
  f->n++;
}

static void fixture_init(fixture *f) {
  memset(f, 0, sizeof *f);
  add(f, "embed", 0, BCAST_DTYPE_FP32, BCAST_DTYPE_BF16, 300, 257); /* larger than the budget */
  add(f, "l1.attn", 1, BCAST_DTYPE_FP32, BCAST_DTYPE_BF16, 64, 33);
  add(f, "l1.experts", 1, BCAST_DTYPE_FP32, BCAST_DTYPE_BF16, 128, 65);
  add(f, "l1.router_ids", 1, BCAST_DTYPE_U16, BCAST_DTYPE_U16, 31, 7);
  add(f, "l2.norm", 2, BCAST_DTYPE_FP32, BCAST_DTYPE_FP16, 5, 999);
  add(f, "l2.bf", 2, BCAST_DTYPE_BF16, BCAST_DTYPE_BF16, 17, 3);
}

static void fixture_free(fixture *f) {
  for (size_t i = 0; i < f->n; i++) free(f->src[i].data);
}

static bcast_plan *make_plan_tls(const fixture *f, uint32_t world, const char *endpoint, uint64_t budget,
                                 int tls) {
  bcast_plan_opts o = {.id = "test/step-1", .mode = BCAST_MODE_HOST, .staging_budget = budget,
                       .world_size = world, .root_rank = 0, .host_endpoint = endpoint, .tls = tls};
  bcast_plan *p = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_build(f->src, f->n, &o, &p, &err), BCAST_OK, "%s", err.msg);
  return p;
}

static bcast_plan *make_plan(const fixture *f, uint32_t world, const char *endpoint, uint64_t budget) {
  return make_plan_tls(f, world, endpoint, budget, 0);
}

static bcast_engine *engine(uint32_t rank, const char *listen, double timeout) {
  bcast_engine_opts o = {.rank = rank, .device = -1, .timeout_s = timeout, .host_listen = listen};
  bcast_engine *e = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_engine_new(&o, &e, &err), BCAST_OK, "%s", err.msg);
  return e;
}

/* ---- the receiver child ------------------------------------------------------- */

#define CHILD_FAIL(...)                 \
  do {                                  \
    fprintf(stderr, "rank %u: ", rank); \
    fprintf(stderr, __VA_ARGS__);       \
    fputc('\n', stderr);                \
    _exit(1);                           \
  } while (0)

/* Receives the plan, checks every tensor bit for bit against the reference
 * and every bucket, rebuilt from the tensors, against the reference checksum. */
static void receiver_child(const fixture *f, const bcast_plan *p, uint32_t rank) {
  bcast_engine *e = engine(rank, NULL, 20);
  bcast_tensor dst[6];
  for (size_t i = 0; i < f->n; i++) {
    dst[f->n - 1 - i] = f->src[i]; /* other order: matching is by name */
    dst[f->n - 1 - i].data = calloc(bcast_tensor_elems(&f->src[i]), 2);
    dst[f->n - 1 - i].residency = BCAST_RES_HOST_PAGEABLE;
  }
  bcast_stats st;
  bcast_err err = {0};
  int rc = bcast_engine_execute(e, p, dst, f->n, &st, &err);
  if (rc) CHILD_FAIL("execute: %d %s", rc, err.msg);
  if (strcmp(st.transport, p->tls ? "host-tls" : "host-tcp") || st.nbuckets != p->nbuckets || st.wire_bytes != bcast_plan_wire_bytes(p))
    CHILD_FAIL("stats: transport %s, %u buckets", st.transport, st.nbuckets);
  void *ref[6];
  for (size_t i = 0; i < f->n; i++) {
    ref[i] = bp_reference(&f->src[i]);
    if (memcmp(ref[i], dst[f->n - 1 - i].data, bcast_tensor_elems(&f->src[i]) * 2))
      CHILD_FAIL("tensor %s differs from the reference cast", f->src[i].name);
  }
  uint8_t *a = malloc(p->staging_budget), *b = malloc(p->staging_budget);
  for (size_t k = 0; k < p->nbuckets; k++) {
    const bcast_bucket *bk = &p->buckets[k];
    memset(a, 0, bk->bytes);
    memset(b, 0, bk->bytes);
    for (size_t s = 0; s < bk->nslices; s++) {
      const bcast_slice *sl = &bk->slices[s];
      memcpy(a + sl->bucket_offset, (uint8_t *)ref[sl->tensor] + sl->elem_offset * 2, sl->elem_count * 2);
      memcpy(b + sl->bucket_offset, (uint8_t *)dst[f->n - 1 - sl->tensor].data + sl->elem_offset * 2,
             sl->elem_count * 2);
    }
    if (bcast_checksum64(a, bk->bytes) != bcast_checksum64(b, bk->bytes)) CHILD_FAIL("bucket %zu checksum", k);
  }
  bcast_stats_free(&st);
  bcast_engine_free(e);
  _exit(0);
}

static void wait_children(pid_t *pids, int n) {
  for (int i = 0; i < n; i++) {
    int status = 0;
    cr_assert_eq(waitpid(pids[i], &status, 0), pids[i]);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "receiver %d failed (status %d)", i + 1, status);
  }
}

static void run_end_to_end(uint32_t receivers, int tls) {
  fixture f;
  fixture_init(&f);
  bcast_engine *root = engine(0, "127.0.0.1:0", 20);
  const char *addr = bcast_engine_data_address(root);
  cr_assert_not_null(addr);
  bcast_plan *p = make_plan_tls(&f, receivers + 1, addr, 64 << 10, tls);
  cr_assert_geq(p->nbuckets, 4);
  for (int round = 0; round < 2; round++) { /* the listening socket serves plan after plan */
    pid_t pids[8];
    for (uint32_t r = 1; r <= receivers; r++)
      if ((pids[r - 1] = fork()) == 0) receiver_child(&f, p, r);
    bcast_stats st;
    bcast_err err = {0};
    cr_assert_eq(bcast_engine_execute(root, p, f.src, f.n, &st, &err), BCAST_OK, "%s", err.msg);
    cr_assert_str_eq(st.transport, tls ? "host-tls" : "host-tcp");
    cr_assert_eq(st.mode, BCAST_MODE_HOST);
    cr_assert_eq(st.nbuckets, p->nbuckets);
    cr_assert_eq(st.wire_bytes, bcast_plan_wire_bytes(p));
    cr_assert_gt(st.total_s, 0);
    /* The host wire runs alone: its alone time is the sum of the buckets'
     * wire times, and what the total adds on top of it is exposed. */
    double wire = 0, cast = 0;
    for (uint32_t k = 0; k < st.nbuckets; k++) {
      cr_assert_eq(st.buckets[k].bucket, k);
      cr_assert_geq(st.buckets[k].wire_s, 0);
      wire += st.buckets[k].wire_s;
      cast += st.buckets[k].cast_s;
    }
    cr_assert_float_eq(st.wire_s, wire, 1e-9);
    cr_assert_float_eq(st.cast_s, cast, 1e-9);
    cr_assert(st.exposed_measured);
    cr_assert_float_eq(st.wire_alone_s, wire, 1e-9);
    cr_assert_leq(wire, st.total_s, "the buckets' wire time is part of the total");
    cr_assert_float_eq(st.exposed_s, st.total_s - wire, 1e-9, "exposed %.9f, total %.9f, wire %.9f",
                       st.exposed_s, st.total_s, wire);
    cr_assert_float_eq(st.gbps, (double)st.wire_bytes / st.total_s / 1e9, 1e-9);
    bcast_stats_free(&st);
    wait_children(pids, (int)receivers);
  }
  bcast_plan_free(p);
  bcast_engine_free(root);
  fixture_free(&f);
}

Test(bcast_host, one_receiver_bit_exact) { run_end_to_end(1, 0); }
Test(bcast_host, three_receivers_bit_exact) { run_end_to_end(3, 0); }
Test(bcast_host, three_receivers_over_tls_bit_exact) { run_end_to_end(3, 1); }

/* A receiver that holds another plan (here another policy version, so
 * another hash) cannot prove it holds this one: the root closes its
 * connection without a word and keeps waiting for the real receiver, whose
 * broadcast then succeeds. The stray one learns that the root did not accept
 * it. */
Test(bcast_host, receiver_with_another_plan_is_closed_and_costs_the_plan_nothing) {
  fixture f;
  fixture_init(&f);
  bcast_engine *root = engine(0, "127.0.0.1:0", 10);
  bcast_plan *p = make_plan(&f, 2, bcast_engine_data_address(root), 64 << 10);
  pid_t pids[2];
  if ((pids[0] = fork()) == 0) {
    uint32_t rank = 1;
    bcast_plan *q = bcast_plan_dup(p);
    q->policy_version = 99; /* the receiver believes another version */
    q->hash = bcast_plan_hash(q);
    bcast_engine *e = engine(1, NULL, 10);
    bcast_tensor dst[6];
    memcpy(dst, f.src, sizeof dst);
    bcast_err err = {0};
    int rc = bcast_engine_execute(e, q, dst, f.n, NULL, &err);
    if (rc != BCAST_EMISMATCH || !strstr(err.msg, "without accepting rank 1")) CHILD_FAIL("got %d: %s", rc, err.msg);
    _exit(0);
  }
  if ((pids[1] = fork()) == 0) { /* the real one comes once the stray was refused */
    usleep(500 * 1000);
    receiver_child(&f, p, 1);
  }
  bcast_err err = {0};
  bcast_stats st;
  double t0 = bcast__now();
  cr_assert_eq(bcast_engine_execute(root, p, f.src, f.n, &st, &err), BCAST_OK, "%s", err.msg);
  cr_assert_lt(bcast__now() - t0, 5.0);
  cr_assert_eq(st.refused_connections, 1);
  bcast_stats_free(&st);
  wait_children(pids, 2);
  bcast_plan_free(p);
  bcast_engine_free(root);
  fixture_free(&f);
}

Test(bcast_host, missing_receiver_times_out) {
  fixture f;
  fixture_init(&f);
  bcast_engine *root = engine(0, "127.0.0.1:0", 1.0);
  bcast_plan *p = make_plan(&f, 3, bcast_engine_data_address(root), 64 << 10);
  pid_t pid = fork();
  if (pid == 0) { /* rank 1 comes; rank 2 never does */
    uint32_t rank = 1;
    bcast_engine *e = engine(1, NULL, 5);
    bcast_tensor dst[6];
    memcpy(dst, f.src, sizeof dst);
    for (size_t i = 0; i < f.n; i++) dst[i].data = calloc(bcast_tensor_elems(&f.src[i]), 2);
    bcast_err err = {0};
    int rc = bcast_engine_execute(e, p, dst, f.n, NULL, &err);
    if (rc != BCAST_EPEER && rc != BCAST_ETIMEDOUT) CHILD_FAIL("got %d: %s", rc, err.msg);
    _exit(0);
  }
  bcast_err err = {0};
  double t0 = bcast__now();
  cr_assert_eq(bcast_engine_execute(root, p, f.src, f.n, NULL, &err), BCAST_ETIMEDOUT, "%s", err.msg);
  double dt = bcast__now() - t0;
  cr_assert(strstr(err.msg, "missing rank(s) 2"), "%s", err.msg);
  cr_assert(dt > 0.9 && dt < 4.0, "took %.2f s", dt);
  wait_children(&pid, 1);
  bcast_plan_free(p);
  bcast_engine_free(root);
  fixture_free(&f);
}

Test(bcast_host, receiver_without_root_times_out) {
  fixture f;
  fixture_init(&f);
  bcast_engine *tmp = engine(0, "127.0.0.1:0", 1);
  char addr[96];
  snprintf(addr, sizeof addr, "%s", bcast_engine_data_address(tmp));
  bcast_engine_free(tmp); /* nobody listens there now */
  bcast_plan *p = make_plan(&f, 2, addr, 64 << 10);
  bcast_engine *e = engine(1, NULL, 0.5);
  bcast_tensor dst[6];
  memcpy(dst, f.src, sizeof dst);
  bcast_err err = {0};
  double t0 = bcast__now();
  cr_assert_eq(bcast_engine_execute(e, p, dst, f.n, NULL, &err), BCAST_ETIMEDOUT, "%s", err.msg);
  cr_assert_lt(bcast__now() - t0, 3.0);
  cr_assert(strstr(err.msg, "not reachable"), "%s", err.msg);
  bcast_engine_free(e);
  bcast_plan_free(p);
  fixture_free(&f);
}

/* ---- raw peers speaking the documented protocol --------------------------------- */

Test(bcast_host, receiver_killed_mid_transfer_fails_the_sender_fast) {
  /* 48 MiB of raw u16 on the wire, far more than the socket buffers hold. */
  fixture f;
  memset(&f, 0, sizeof f);
  add(&f, "ids", 3, BCAST_DTYPE_U16, BCAST_DTYPE_U16, 6144, 4096);
  bcast_engine *root = engine(0, "127.0.0.1:0", 20);
  bcast_plan *p = make_plan(&f, 3, bcast_engine_data_address(root), 1 << 20);
  pid_t pids[2];
  if ((pids[0] = fork()) == 0) receiver_child(&f, p, 1) /* a healthy receiver */;
  if ((pids[1] = fork()) == 0) {
    int fd = bp_dial(bcast_engine_data_address(root));
    uint8_t rx_nonce[BP_NONCE], buf[1 << 16];
    if (fd < 0 || bp_handshake(fd, p, 2, rx_nonce) != 0) _exit(3);
    for (int i = 0; i < 40; i++) /* about 2.5 MiB: a few buckets */
      if (bp_read(fd, buf, sizeof buf)) _exit(4);
    raise(SIGKILL);
  }
  bcast_err err = {0};
  double t0 = bcast__now();
  cr_assert_eq(bcast_engine_execute(root, p, f.src, f.n, NULL, &err), BCAST_EPEER, "%s", err.msg);
  double dt = bcast__now() - t0;
  cr_assert(strstr(err.msg, "receiver rank 2 closed the connection at bucket"), "%s", err.msg);
  cr_assert(strstr(err.msg, "(layer 3)"), "%s", err.msg);
  cr_assert_lt(dt, 5.0, "took %.2f s with a 20 s timeout", dt);
  int status;
  waitpid(pids[1], &status, 0);
  cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  waitpid(pids[0], &status, 0); /* the healthy one sees the root go away: exits 1 */
  cr_assert(WIFEXITED(status));
  bcast_plan_free(p);
  bcast_engine_free(root);
  fixture_free(&f);
}

/* A receiver that stops reading (SIGSTOP: its socket stays open, its buffer
 * fills) is cut off once its bucket is past the plan's throughput floor, long
 * before the engine's own 20 s timeout, and the error says what it took
 * against what the plan expects. */
Test(bcast_host, a_stopped_receiver_is_cut_off_at_the_plans_floor) {
  fixture f;
  memset(&f, 0, sizeof f);
  add(&f, "ids", 3, BCAST_DTYPE_U16, BCAST_DTYPE_U16, 6144, 4096); /* 48 MiB */
  bcast_engine *root = engine(0, "127.0.0.1:0", 20);
  bcast_plan *p = make_plan(&f, 3, bcast_engine_data_address(root), 1 << 20);
  p->min_gbps = 0.1; /* 1 MiB buckets to 2 receivers: 21 ms each at the floor, + 2 s slack */
  pid_t pids[2];
  if ((pids[0] = fork()) == 0) receiver_child(&f, p, 1);
  if ((pids[1] = fork()) == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a stopped orphan would outlive a failed test */
    int fd = bp_dial(bcast_engine_data_address(root));
    uint8_t rx_nonce[BP_NONCE], buf[1 << 16];
    if (fd < 0 || bp_handshake(fd, p, 2, rx_nonce) != 0) _exit(3);
    for (int i = 0; i < 40; i++)
      if (bp_read(fd, buf, sizeof buf)) _exit(4);
    raise(SIGSTOP);
    _exit(0);
  }
  bcast_err err = {0};
  double t0 = bcast__now();
  cr_assert_eq(bcast_engine_execute(root, p, f.src, f.n, NULL, &err), BCAST_ETIMEDOUT, "%s", err.msg);
  double dt = bcast__now() - t0;
  cr_assert(strstr(err.msg, "receiver rank 2 stalled at bucket"), "%s", err.msg);
  cr_assert(strstr(err.msg, "observed") && strstr(err.msg, "expected at least 0.05 GB/s per receiver for host mode"),
            "%s", err.msg);
  cr_assert_lt(dt, 6.0, "took %.2f s: the floor allows about 2 s past the stall", dt);
  kill(pids[1], SIGKILL);
  int status;
  waitpid(pids[1], &status, 0);
  waitpid(pids[0], &status, 0); /* the healthy one sees the root go away */
  cr_assert(WIFEXITED(status));
  bcast_plan_free(p);
  bcast_engine_free(root);
  fixture_free(&f);
}

/* A receiver stopped after the last bytes reached its socket buffers never
 * confirms them: the root gives up at the floor's bound for what was in
 * flight, not at the engine's 20 s, and says what it waited for. */
Test(bcast_host, a_receiver_that_never_confirms_is_cut_off_at_the_plans_floor) {
  fixture f;
  memset(&f, 0, sizeof f);
  add(&f, "w", 1, BCAST_DTYPE_FP32, BCAST_DTYPE_BF16, 64, 64);
  bcast_engine *root = engine(0, "127.0.0.1:0", 20);
  bcast_plan *p = make_plan(&f, 2, bcast_engine_data_address(root), 64 << 10);
  p->min_gbps = 1.0;
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = bp_dial(bcast_engine_data_address(root));
    uint8_t rx_nonce[BP_NONCE], buf[24 + 8192];
    if (fd < 0 || bp_handshake(fd, p, 1, rx_nonce) != 0) _exit(3);
    if (bp_read(fd, buf, 24 + p->buckets[0].bytes)) _exit(4); /* all of it, then silence */
    sleep(30);
    _exit(0);
  }
  bcast_err err = {0};
  double t0 = bcast__now();
  cr_assert_eq(bcast_engine_execute(root, p, f.src, f.n, NULL, &err), BCAST_ETIMEDOUT, "%s", err.msg);
  double dt = bcast__now() - t0;
  cr_assert(strstr(err.msg, "receiver rank 1 did not confirm the last bucket: observed no confirmation in"),
            "%s", err.msg);
  cr_assert(strstr(err.msg, "expected within"), "%s", err.msg);
  cr_assert_lt(dt, 6.0, "took %.2f s", dt);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  bcast_plan_free(p);
  bcast_engine_free(root);
  fixture_free(&f);
}

Test(bcast_host, corrupted_bucket_is_refused_by_the_receiver) {
  fixture f;
  memset(&f, 0, sizeof f);
  add(&f, "w", 7, BCAST_DTYPE_FP32, BCAST_DTYPE_BF16, 64, 64);
  /* A fake root: listens, accepts, sends bucket 0 with a wrong checksum. */
  int lfd = -1;
  char addr[96];
  bcast_err err = {0};
  cr_assert_eq(bcast__host_listen("127.0.0.1:0", &lfd, addr, sizeof addr, &err), BCAST_OK, "%s", err.msg);
  bcast_plan *p = make_plan(&f, 2, addr, 64 << 10);
  pid_t pid = fork();
  if (pid == 0) {
    uint32_t rank = 1;
    bcast_engine *e = engine(1, NULL, 10);
    bcast_tensor dst = f.src[0];
    dst.data = calloc(64 * 64, 2);
    int rc = bcast_engine_execute(e, p, &dst, 1, NULL, &err);
    if (rc != BCAST_ECHECKSUM || !strstr(err.msg, "bucket 0 (layer 7)")) CHILD_FAIL("got %d: %s", rc, err.msg);
    _exit(0);
  }
  int fd = -1;
  for (int i = 0; i < 500 && fd < 0; i++) {
    fd = accept(lfd, NULL, NULL);
    if (fd < 0) usleep(10000);
  }
  cr_assert_geq(fd, 0);
  /* It holds the plan's secret, so the receiver takes what it sends. */
  uint8_t nonce[BP_NONCE] = {1, 2, 3}, hello[256];
  size_t hlen = 0;
  cr_assert_eq(bp_root_challenge(fd, nonce), 0);
  cr_assert_eq(bp_root_read_hello(fd, hello, sizeof hello, &hlen), 0);
  cr_assert_eq(bp_root_accept(fd, p, p->secret, nonce, hello), 0);
  uint8_t hdr[24];
  uint64_t bytes = p->buckets[0].bytes;
  uint8_t *payload = calloc(1, bytes);
  bp_put32(hdr, 0x4b424c52u);
  bp_put32(hdr + 4, 0);
  bp_put64(hdr + 8, bytes);
  bp_put64(hdr + 16, bcast_checksum64(payload, bytes) ^ 1);
  cr_assert_eq(write(fd, hdr, 24), 24);
  cr_assert_eq(write(fd, payload, bytes), (ssize_t)bytes);
  uint8_t ack[12];
  cr_assert_eq(bp_read(fd, ack, 12), 0);
  int32_t status = (int32_t)(ack[4] | ack[5] << 8 | ack[6] << 16 | (uint32_t)ack[7] << 24);
  cr_assert_eq(status, BCAST_ECHECKSUM);
  wait_children(&pid, 1);
  free(payload);
  close(fd);
  close(lfd);
  bcast_plan_free(p);
  fixture_free(&f);
}

Test(bcast_host, unsupported_requests_say_why) {
  fixture f;
  fixture_init(&f);
  bcast_engine *root = engine(0, "127.0.0.1:0", 1);
  bcast_plan *p = make_plan(&f, 2, bcast_engine_data_address(root), 64 << 10);
  bcast_err err = {0};
  bcast_plan *q = bcast_plan_dup(p);
  q->buckets[1].source_rank = 1;
  q->hash = bcast_plan_hash(q);
  cr_assert_eq(bcast_engine_execute(root, q, f.src, f.n, NULL, &err), BCAST_ENOTSUP);
  cr_assert(strstr(err.msg, "bucket 1"), "%s", err.msg);
  bcast_plan_free(q);

  q = bcast_plan_dup(p);
  q->buckets[0].bytes += 0; /* tampered contents, stale hash */
  q->policy_version = 5;
  cr_assert_eq(bcast_engine_execute(root, q, f.src, f.n, NULL, &err), BCAST_EMISMATCH);
  cr_assert(strstr(err.msg, "does not match its contents"), "%s", err.msg);
  bcast_plan_free(q);

  bcast_tensor loc[6];
  memcpy(loc, f.src, sizeof loc);
  loc[2].residency = BCAST_RES_GPU;
  cr_assert_eq(bcast_engine_execute(root, p, loc, f.n, NULL, &err), BCAST_ENOTSUP);
  cr_assert(strstr(err.msg, "'l1.experts': GPU-resident"), "%s", err.msg);

  bcast_caps caps;
  bcast_caps_probe(&caps);
  char why[256];
  if (!bcast_mode_available(&caps, BCAST_MODE_STAGED, why, sizeof why)) {
    q = bcast_plan_dup(p);
    q->mode = BCAST_MODE_STAGED;
    q->hash = bcast_plan_hash(q);
    cr_assert_eq(bcast_engine_execute(root, q, f.src, f.n, NULL, &err), BCAST_ENOTSUP);
    cr_assert(strstr(err.msg, why), "'%s' lacks '%s'", err.msg, why);
    bcast_plan_free(q);
  }
  bcast_engine *recv = engine(1, NULL, 1);
  memcpy(loc, f.src, sizeof loc);
  loc[0].data = NULL;
  cr_assert_eq(bcast_engine_execute(recv, p, loc, f.n, NULL, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "'embed': local data pointer is NULL"), "%s", err.msg);
  bcast_engine_free(recv);
  bcast_plan_free(p);
  bcast_engine_free(root);
  fixture_free(&f);
}

Test(bcast_host, exposed_time_is_total_minus_wire_alone_clamped_at_zero) {
  cr_assert_float_eq(bcast__exposed_s(1.5, 0.9), 0.6, 1e-12);
  cr_assert_float_eq(bcast__exposed_s(0.9, 0.0), 0.9, 1e-12);
  cr_assert_eq(bcast__exposed_s(0.9, 0.9), 0.0);
  /* A calibrated wire-alone time above this broadcast's total (the GPU path
   * measures it once, apart): nothing was exposed, never a negative time. */
  cr_assert_eq(bcast__exposed_s(0.5, 0.9), 0.0);
  cr_assert_eq(bcast__exposed_s(0.0, 1e-9), 0.0);
}
