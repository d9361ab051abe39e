/* Host-transport relays: receivers that forward what they receive to other
 * receivers, end to end between threads on loopback, and the plan's relay
 * layout (validation by field, hash, protobuf). */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tests/unit/bcast_peer.h"
#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_internal.h"
#include "workers/bcast/bcast_pb.h"

#define NT 4
#define MAXW 6

typedef struct model {
  bcast_tensor src[NT];
} model;

static uint32_t rng = 0x2545f491u;

static void tensor(bcast_tensor *t, const char *name, uint32_t layer, bcast_dtype st, bcast_dtype wt, uint64_t d0,
                   uint64_t d1) {
  bp_random_tensor(t, name, layer, st, wt, d0, d1, BCAST_RES_HOST_PAGEABLE, 0, &rng);
}

/* A model of more than the socket buffers hold (a 4096 x 4096 fp32 tensor
 * first), so that a relay or a source must wait on a slow peer. */
static void big_model(model *m) {
  tensor(&m->src[0], "big", 0, BCAST_DTYPE_FP32, BCAST_DTYPE_BF16, 4096, 4096);
  tensor(&m->src[1], "l1.a", 1, BCAST_DTYPE_FP32, BCAST_DTYPE_BF16, 64, 64);
  tensor(&m->src[2], "l1.b", 1, BCAST_DTYPE_U16, BCAST_DTYPE_U16, 64, 64);
  tensor(&m->src[3], "l2.c", 2, BCAST_DTYPE_BF16, BCAST_DTYPE_BF16, 64, 64);
}

static void model_init(model *m) {
  tensor(&m->src[0], "embed", 0, BCAST_DTYPE_FP32, BCAST_DTYPE_BF16, 512, 300); /* cut over buckets */
  tensor(&m->src[1], "l1.attn", 1, BCAST_DTYPE_FP32, BCAST_DTYPE_FP16, 96, 65);
  tensor(&m->src[2], "l1.ids", 1, BCAST_DTYPE_U16, BCAST_DTYPE_U16, 31, 7);
  tensor(&m->src[3], "l2.mlp", 2, BCAST_DTYPE_BF16, BCAST_DTYPE_BF16, 200, 129);
}

static void model_free(model *m) {
  for (int i = 0; i < NT; i++) free(m->src[i].data);
}

static bcast_engine *engine(uint32_t rank, const char *listen, double timeout) {
  bcast_engine_opts o = {.rank = rank, .device = -1, .timeout_s = timeout, .host_listen = listen};
  bcast_engine *e = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_engine_new(&o, &e, &err), BCAST_OK, "%s", err.msg);
  return e;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- one participant per thread ------------------------------------------------ */

typedef struct part {
  bcast_engine *e;
  const bcast_plan *p;
  bcast_tensor local[NT];
  int sender;
  int rc;
  bcast_err err;
  bcast_stats st;
  double took_s;
} part;

static void *part_main(void *arg) {
  part *x = arg;
  double t0 = now_s();
  x->rc = bcast_engine_execute(x->e, x->p, x->local, NT, &x->st, &x->err);
  x->took_s = now_s() - t0;
  return NULL;
}

static void part_receiver(part *x, const model *m) {
  for (int i = 0; i < NT; i++) {
    x->local[i] = m->src[i];
    x->local[i].data = calloc(bcast_tensor_elems(&m->src[i]), 2);
  }
}

static void part_free(part *x) {
  if (!x->sender)
    for (int i = 0; i < NT; i++) free(x->local[i].data);
  bcast_stats_free(&x->st);
  bcast_engine_free(x->e);
}

/* A world of `world` ranks: rank 0 the source, the ranks in `relays` with a
 * listener; relay_from as given (NULL: none). Runs ranks [0, run) only. */
typedef struct world {
  model m;
  part parts[MAXW];
  uint32_t n;
  bcast_plan *p;
} world;

static void world_make(world *w, uint32_t n, const uint32_t *relay_from, int tls, double timeout) {
  memset(w, 0, sizeof *w);
  model_init(&w->m);
  w->n = n;
  const char *eps[MAXW] = {0};
  for (uint32_t r = 0; r < n; r++) {
    int listens = r == 0;
    for (uint32_t d = 1; relay_from && d < n; d++) listens |= r != 0 && relay_from[d] == r;
    w->parts[r].e = engine(r, listens ? "127.0.0.1:0" : NULL, timeout);
    if (r && listens) eps[r] = bcast_engine_data_address(w->parts[r].e);
  }
  bcast_plan_opts o = {.id = "relay/step-1", .mode = BCAST_MODE_HOST, .staging_budget = 64 << 10, .world_size = n,
                       .host_endpoint = bcast_engine_data_address(w->parts[0].e), .tls = tls,
                       .relay_from = relay_from, .relay_endpoints = relay_from ? eps : NULL};
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_build(w->m.src, NT, &o, &w->p, &err), BCAST_OK, "%s", err.msg);
  cr_assert_geq(w->p->nbuckets, 4, "several buckets, so forwarding overlaps receiving");
  for (uint32_t r = 0; r < n; r++) {
    w->parts[r].p = w->p;
    if (r == 0) {
      w->parts[r].sender = 1;
      memcpy(w->parts[r].local, w->m.src, sizeof w->m.src);
    } else {
      part_receiver(&w->parts[r], &w->m);
    }
  }
}

static void world_run(world *w, uint32_t run) {
  pthread_t t[MAXW];
  for (uint32_t r = 0; r < run; r++) cr_assert_eq(pthread_create(&t[r], NULL, part_main, &w->parts[r]), 0);
  for (uint32_t r = 0; r < run; r++) pthread_join(t[r], NULL);
}

static void world_free(world *w) {
  for (uint32_t r = 0; r < w->n; r++) part_free(&w->parts[r]);
  bcast_plan_free(w->p);
  model_free(&w->m);
}

/* Every receiver holds the reference cast bit for bit, and its checksum of
 * what it holds equals the source's. */
static void check_all_received(world *w) {
  uint64_t want = 0, got = 0;
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_source_checksum(w->p, 0, w->m.src, NT, 0, &want, &err), BCAST_OK, "%s", err.msg);
  for (uint32_t r = 0; r < w->n; r++)
    cr_assert_eq(w->parts[r].rc, BCAST_OK, "rank %u: %s", r, w->parts[r].err.msg);
  for (uint32_t r = 1; r < w->n; r++) {
    for (int i = 0; i < NT; i++) {
      void *ref = bp_reference(&w->m.src[i]);
      cr_assert(memcmp(ref, w->parts[r].local[i].data, bcast_tensor_elems(&w->m.src[i]) * 2) == 0,
                "rank %u: tensor %s differs from the reference cast", r, w->m.src[i].name);
      free(ref);
    }
    cr_assert_eq(bcast_plan_source_checksum(w->p, 0, w->parts[r].local, NT, 1, &got, &err), BCAST_OK, "%s",
                 err.msg);
    cr_assert_eq(got, want, "rank %u: checksum %016llx, source %016llx", r, (unsigned long long)got,
                 (unsigned long long)want);
    cr_assert_eq(w->parts[r].st.nbuckets, w->p->nbuckets, "rank %u reports every bucket", r);
    cr_assert_eq(w->parts[r].st.wire_bytes, bcast_plan_wire_bytes(w->p));
  }
}

static void run_tree(const uint32_t *relay_from, uint32_t n, int tls) {
  world w;
  world_make(&w, n, relay_from, tls, 20);
  for (int round = 0; round < 2; round++) { /* the relay's listener serves plan after plan */
    for (uint32_t r = 1; r < n; r++) {
      bcast_stats_free(&w.parts[r].st);
      for (int i = 0; i < NT; i++) memset(w.parts[r].local[i].data, 0, bcast_tensor_elems(&w.m.src[i]) * 2);
    }
    bcast_stats_free(&w.parts[0].st);
    world_run(&w, n);
    check_all_received(&w);
    cr_assert_str_eq(w.parts[0].st.transport, tls ? "host-tls" : "host-tcp");
    /* The source's link carried one copy per receiver it serves. */
    cr_assert_eq(w.parts[0].st.wire_bytes, bcast_plan_wire_bytes(w.p));
  }
  world_free(&w);
}

Test(bcast_relay, one_relay_forwards_to_two_receivers_bit_exact) {
  uint32_t rf[] = {0, 0, 1, 1};
  run_tree(rf, 4, 0);
}

Test(bcast_relay, a_chain_of_relays_is_bit_exact) {
  uint32_t rf[] = {0, 0, 1, 2};
  run_tree(rf, 4, 0);
}

Test(bcast_relay, a_tree_of_two_nodes_over_tls_is_bit_exact) {
  /* Two relays, each for one more receiver, and one receiver of the source. */
  uint32_t rf[] = {0, 0, 0, 1, 2, 0};
  run_tree(rf, 6, 1);
}

Test(bcast_relay, a_plan_without_relays_runs_as_before) { run_tree(NULL, 3, 0); }

Test(bcast_relay, a_downstream_that_never_connects_is_named_by_the_relay_and_the_source) {
  uint32_t rf[] = {0, 0, 1, 1};
  world w;
  world_make(&w, 4, rf, 0, 2.0);
  double t0 = now_s();
  world_run(&w, 3); /* rank 3 never comes */
  double took = now_s() - t0;
  cr_assert_eq(w.parts[1].rc, BCAST_ETIMEDOUT, "relay: %d %s", w.parts[1].rc, w.parts[1].err.msg);
  cr_assert(strstr(w.parts[1].err.msg, "missing rank(s) 3"), "relay: %s", w.parts[1].err.msg);
  cr_assert_neq(w.parts[0].rc, BCAST_OK);
  cr_assert(strstr(w.parts[0].err.msg, "receiver rank 1") && strstr(w.parts[0].err.msg, "missing rank(s) 3"),
            "source: %s", w.parts[0].err.msg);
  cr_assert_eq(w.parts[2].rc, BCAST_EPEER, "rank 2: %d %s", w.parts[2].rc, w.parts[2].err.msg);
  cr_assert(strstr(w.parts[2].err.msg, "gave up") && strstr(w.parts[2].err.msg, "missing rank(s) 3"),
            "rank 2: %s", w.parts[2].err.msg);
  cr_assert_lt(took, 6.0, "bounded by the plan's timeout (2 s), took %.2f s", took);
  world_free(&w);
}

/* A fake source: takes the relay's connection, proves itself, sends bucket
 * 0 whole and correct, then dies. */
typedef struct fake_root {
  int lfd;
  const bcast_plan *p;
  const model *m;
  int hold_fd; /* -1: die after bucket 0; else stay silent until it is readable */
} fake_root;

static void *fake_root_main(void *arg) {
  fake_root *f = arg;
  int fd = accept(f->lfd, NULL, NULL);
  if (fd < 0) return NULL;
  uint8_t nonce[BP_NONCE], hello[512];
  size_t hl = 0;
  memset(nonce, 0x5a, sizeof nonce);
  if (bp_root_challenge(fd, nonce) || bp_root_read_hello(fd, hello, sizeof hello, &hl) ||
      bp_root_accept(fd, f->p, f->p->secret, nonce, hello)) {
    close(fd);
    return NULL;
  }
  const bcast_bucket *b = &f->p->buckets[0];
  uint8_t *buf = calloc(1, b->bytes);
  for (size_t s = 0; s < b->nslices; s++) {
    const bcast_slice *sl = &b->slices[s];
    uint8_t *ref = bp_reference(&f->m->src[sl->tensor]);
    memcpy(buf + sl->bucket_offset, ref + sl->elem_offset * 2, sl->elem_count * 2);
    free(ref);
  }
  uint8_t h[24];
  bp_put32(h, 0x4b424c52u); /* "RLBK" */
  bp_put32(h + 4, 0);
  bp_put64(h + 8, b->bytes);
  bp_put64(h + 16, bcast_checksum64(buf, b->bytes));
  if (send(fd, h, sizeof h, MSG_NOSIGNAL) == (ssize_t)sizeof h) {
    ssize_t w = send(fd, buf, b->bytes, MSG_NOSIGNAL);
    (void)w;
  }
  free(buf);
  if (f->hold_fd >= 0) {
    char c;
    ssize_t r = read(f->hold_fd, &c, 1);
    (void)r;
  } else {
    usleep(200 * 1000);
  }
  close(fd); /* dies with the plan half sent */
  return NULL;
}

/* A listener for a fake source on loopback; its "host:port" in ep. */
static int fake_listen(char *ep, size_t len) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  cr_assert_eq(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
  cr_assert_eq(listen(lfd, 4), 0);
  socklen_t sl = sizeof sa;
  cr_assert_eq(getsockname(lfd, (struct sockaddr *)&sa, &sl), 0);
  snprintf(ep, len, "127.0.0.1:%u", ntohs(sa.sin_port));
  return lfd;
}

/* Ranks 1 (a relay) and 2, 3 (its downstreams) of a plan whose source is
 * at root_ep, each started on a thread of its own. */
static bcast_plan *relayed_start(model *m, part parts[4], const char *root_ep, const char *id) {
  memset(parts, 0, 4 * sizeof *parts);
  for (uint32_t r = 1; r < 4; r++) parts[r].e = engine(r, r == 1 ? "127.0.0.1:0" : NULL, 30);
  const char *eps[4] = {"", bcast_engine_data_address(parts[1].e), "", ""};
  uint32_t rf[] = {0, 0, 1, 1};
  bcast_plan_opts o = {.id = id, .mode = BCAST_MODE_HOST, .staging_budget = 64 << 10, .world_size = 4,
                       .host_endpoint = root_ep, .relay_from = rf, .relay_endpoints = eps};
  bcast_plan *p = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_build(m->src, NT, &o, &p, &err), BCAST_OK, "%s", err.msg);
  for (uint32_t r = 1; r < 4; r++) {
    parts[r].p = p;
    part_receiver(&parts[r], m);
  }
  return p;
}

static void relayed_run(part parts[4], pthread_t t[4]) {
  for (uint32_t r = 1; r < 4; r++) cr_assert_eq(pthread_create(&t[r], NULL, part_main, &parts[r]), 0);
}

static void relayed_join(part parts[4], pthread_t t[4]) {
  for (uint32_t r = 1; r < 4; r++) pthread_join(t[r], NULL);
}

static void relayed_free(part parts[4], bcast_plan *p) {
  for (uint32_t r = 1; r < 4; r++) part_free(&parts[r]);
  bcast_plan_free(p);
}

Test(bcast_relay, an_upstream_that_dies_mid_plan_fails_the_downstreams_promptly_with_a_message) {
  char root_ep[64];
  int lfd = fake_listen(root_ep, sizeof root_ep);
  model m;
  model_init(&m);
  part parts[4];
  pthread_t ft, t[4];
  bcast_plan *p = relayed_start(&m, parts, root_ep, "relay/dies");
  fake_root f = {lfd, p, &m, -1}; /* sends bucket 0, then dies */
  cr_assert_eq(pthread_create(&ft, NULL, fake_root_main, &f), 0);
  double t0 = now_s();
  relayed_run(parts, t);
  relayed_join(parts, t);
  double took = now_s() - t0;
  pthread_join(ft, NULL);
  cr_assert_eq(parts[1].rc, BCAST_EPEER, "relay: %d %s", parts[1].rc, parts[1].err.msg);
  cr_assert(strstr(parts[1].err.msg, "upstream rank 0") && strstr(parts[1].err.msg, "bucket 1"), "relay: %s",
            parts[1].err.msg);
  for (uint32_t r = 2; r < 4; r++) {
    cr_assert_eq(parts[r].rc, BCAST_EPEER, "rank %u: %d %s", r, parts[r].rc, parts[r].err.msg);
    cr_assert(strstr(parts[r].err.msg, "gave up at bucket 1") && strstr(parts[r].err.msg, "upstream rank 0"),
              "rank %u: %s", r, parts[r].err.msg);
  }
  cr_assert_lt(took, 5.0, "the downstreams are told at once, not at the 30 s deadline (%.2f s)", took);
  relayed_free(parts, p);
  model_free(&m);
  close(lfd);
}

Test(bcast_relay, a_relay_without_a_listener_is_refused_by_name) {
  uint32_t rf[] = {0, 0, 1};
  world w;
  world_make(&w, 3, rf, 0, 2.0);
  /* Rank 1's engine listens; run a copy of the plan on one that does not. */
  bcast_engine *bare = engine(1, NULL, 2.0);
  bcast_err err = {0};
  int rc = bcast_engine_execute(bare, w.p, w.parts[1].local, NT, NULL, &err);
  cr_assert_eq(rc, BCAST_EINVAL);
  cr_assert(strstr(err.msg, "rank 1 relays for 1 receiver(s)") && strstr(err.msg, "host_listen"), "%s", err.msg);
  bcast_engine_free(bare);
  world_free(&w);
}

/* ---- the layout: validation, hash, protobuf ------------------------------------- */

static bcast_plan *plan4(const model *m, bcast_mode mode) {
  bcast_plan_opts o = {.id = "relay/layout", .mode = mode, .staging_budget = 64 << 10, .world_size = 4,
                       .host_endpoint = "127.0.0.1:7000"};
  bcast_plan *p = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_build(m->src, NT, &o, &p, &err), BCAST_OK, "%s", err.msg);
  return p;
}

static void refused(bcast_plan *p, const uint32_t *rf, const char *const *eps, const char *want) {
  uint64_t h = p->hash;
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_set_relays(p, rf, eps, &err), BCAST_EINVAL, "accepted; wanted '%s'", want);
  cr_assert(strstr(err.msg, want), "'%s' does not say '%s'", err.msg, want);
  cr_assert_eq(p->hash, h, "a refused layout leaves the plan as it was");
  cr_assert_null(p->relay_from);
}

Test(bcast_relay, every_malformed_layout_is_refused_by_field) {
  model m;
  model_init(&m);
  bcast_plan *p = plan4(&m, BCAST_MODE_HOST);
  const char *eps[] = {"", "10.0.0.2:9000", "", ""};
  refused(p, (uint32_t[]){0, 0, 4, 1}, eps, "relay_from[2] = 4: out of range (world size 4)");
  refused(p, (uint32_t[]){0, 0, 2, 1}, eps, "relay_from[2] = 2: a receiver takes from the source or a relay, "
                                            "not from itself");
  refused(p, (uint32_t[]){1, 0, 1, 1}, eps, "relay_from[0] = 1: rank 0 is the source");
  refused(p, (uint32_t[]){0, 2, 1, 1}, (const char *[]){"", "a:1", "b:2", ""}, "is on a cycle that never reaches "
                                                                               "the source");
  refused(p, (uint32_t[]){0, 0, 1, 1}, (const char *[]){"", "", "", ""},
          "relay_endpoints[1] empty: rank 1 relays for 2 receiver(s)");
  refused(p, (uint32_t[]){0, 0, 1, 1}, NULL, "relay_endpoints[1] empty");
  refused(p, (uint32_t[]){0, 0, 1, 1}, (const char *[]){"", "a:1", "b:2", ""},
          "relay_endpoints[2] 'b:2': rank 2 relays for no receiver");
  refused(p, (uint32_t[]){0, 0, 1, 1}, (const char *[]){"c:3", "a:1", "", ""},
          "relay_endpoints[0] 'c:3': rank 0 is the source");
  char longep[300];
  memset(longep, 'x', sizeof longep - 1);
  longep[sizeof longep - 1] = 0;
  refused(p, (uint32_t[]){0, 0, 1, 1}, (const char *[]){"", longep, "", ""}, "relay_endpoints[1] longer than 255");
  refused(p, NULL, eps, "relay_endpoints without relay_from");
  bcast_plan_free(p);

  p = plan4(&m, BCAST_MODE_DIRECT);
  refused(p, (uint32_t[]){0, 0, 1, 1}, eps, "relay_from in direct mode");
  bcast_plan_free(p);

  /* Receiver views: rank 2 holds half of l2.mlp. */
  bcast_part_spec half = {.name = "l2.mlp", .part = {.kind = BCAST_PART_SLICE, .dim = 0, .start = 0, .count = 100}};
  bcast_receiver_view views[4] = {{0}, {0}, {&half, 1}, {0}};
  bcast_plan_opts o = {.id = "relay/views", .mode = BCAST_MODE_HOST, .staging_budget = 64 << 10, .world_size = 4,
                       .host_endpoint = "127.0.0.1:7000", .receiver_views = views,
                       .relay_from = (uint32_t[]){0, 0, 1, 1}, .relay_endpoints = eps};
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_build(m.src, NT, &o, &p, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "relay_from with receiver views"), "%s", err.msg);

  /* Several sources: two ranks holding halves of every tensor. */
  bcast_tensor a[NT], b[NT];
  for (int i = 0; i < NT; i++) {
    uint64_t n = bcast_tensor_elems(&m.src[i]), h = (n / m.src[i].shape[1] / 2) * m.src[i].shape[1];
    a[i] = b[i] = m.src[i];
    a[i].shard_offset = 0;
    a[i].shard_elems = h;
    b[i].shard_offset = h;
    b[i].shard_elems = n - h;
  }
  const bcast_tensor *ranks[2] = {a, b};
  size_t ns[2] = {NT, NT};
  bcast_shard_map *map = NULL;
  cr_assert_eq(bcast_shards_check(ranks, ns, 2, NULL, &map, &err), BCAST_OK, "%s", err.msg);
  const char *seps[] = {"127.0.0.1:7000", "127.0.0.1:7001"};
  bcast_plan_opts so = {.id = "relay/sharded", .mode = BCAST_MODE_HOST, .staging_budget = 64 << 10,
                        .world_size = 4, .source_endpoints = seps};
  cr_assert_eq(bcast_plan_build_sharded(map, &so, &p, &err), BCAST_OK, "%s", err.msg);
  refused(p, (uint32_t[]){0, 1, 0, 2}, (const char *[]){"", "", "x:1", ""}, "relay_from with 2 sources");
  bcast_plan_free(p);
  bcast_shard_map_free(map);
  model_free(&m);
}

Test(bcast_relay, the_hash_covers_the_layout_only_when_there_is_one) {
  model m;
  model_init(&m);
  bcast_plan *p = plan4(&m, BCAST_MODE_HOST), *q = plan4(&m, BCAST_MODE_HOST);
  /* Same contents but the secret: equal hashes (the secret is never hashed). */
  cr_assert_eq(p->hash, q->hash);
  uint64_t plain = p->hash;
  bcast_err err = {0};
  uint32_t star[] = {0, 0, 0, 0}, relayed[] = {0, 0, 1, 1};
  cr_assert_eq(bcast_plan_set_relays(p, star, (const char *[]){"", "", "", ""}, &err), BCAST_OK, "%s", err.msg);
  cr_assert_neq(p->hash, plain, "a layout is covered even when every receiver takes from the source");
  uint64_t h_star = p->hash;
  cr_assert_eq(bcast_plan_set_relays(p, relayed, (const char *[]){"", "a:1", "", ""}, &err), BCAST_OK, "%s",
               err.msg);
  cr_assert_neq(p->hash, h_star);
  cr_assert_neq(p->hash, plain);
  uint64_t h_rel = p->hash;
  cr_assert_eq(p->hash, bcast_plan_hash(p));
  cr_assert_eq(bcast_plan_set_relays(p, relayed, (const char *[]){"", "b:2", "", ""}, &err), BCAST_OK, "%s",
               err.msg);
  cr_assert_eq(p->hash, h_rel, "endpoints are not covered");
  cr_assert_str_eq(bcast_plan_upstream_endpoint(p, 3), "b:2");
  cr_assert_str_eq(bcast_plan_upstream_endpoint(p, 1), "127.0.0.1:7000");
  cr_assert_eq(bcast_plan_upstream(p, 2), 1);
  cr_assert_eq(bcast_plan_downstreams(p, 0), 1);
  cr_assert_eq(bcast_plan_downstreams(p, 1), 2);
  cr_assert_eq(bcast_plan_downstreams(q, 0), 3, "without relays the source serves every receiver");
  /* A copy keeps the layout. */
  bcast_plan *d = bcast_plan_dup(p);
  cr_assert_not_null(d);
  cr_assert_eq(d->relay_from[3], 1);
  cr_assert_str_eq(d->relay_endpoints[1], "b:2");
  cr_assert_eq(bcast_plan_hash(d), h_rel);
  bcast_plan_free(d);
  cr_assert_eq(bcast_plan_set_relays(p, NULL, NULL, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(p->hash, plain, "cleared relays hash as a plan that never had them");
  bcast_plan_free(p);
  bcast_plan_free(q);
  model_free(&m);
}

Test(bcast_relay, the_layout_survives_a_protobuf_round_trip_and_bad_counts_are_refused) {
  model m;
  model_init(&m);
  bcast_plan *p = plan4(&m, BCAST_MODE_HOST), *q = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_set_relays(p, (uint32_t[]){0, 0, 1, 2}, (const char *[]){"", "a:1", "b:2", ""}, &err),
               BCAST_OK, "%s", err.msg);
  uint8_t *buf = NULL;
  size_t len = 0;
  cr_assert_eq(bcast_plan_pack(p, &buf, &len, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(bcast_plan_unpack(buf, len, &q, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(q->hash, p->hash);
  for (uint32_t r = 0; r < 4; r++) {
    cr_assert_eq(q->relay_from[r], p->relay_from[r]);
    cr_assert_str_eq(q->relay_endpoints[r], p->relay_endpoints[r]);
  }
  bcast_plan_free(q);
  free(buf);

  Rlorch__V1__BroadcastPlan *pb = NULL;
  cr_assert_eq(bcast_plan_to_pb(p, &pb, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(pb->n_relay_from, 4);
  pb->n_relay_from = 3;
  cr_assert_eq(bcast_plan_from_pb(pb, &q, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "relay_from has 3 entries for 4 ranks"), "%s", err.msg);
  pb->n_relay_from = 4;
  pb->n_relay_endpoints = 2;
  cr_assert_eq(bcast_plan_from_pb(pb, &q, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "relay_endpoints has 2 entries for 4 ranks"), "%s", err.msg);
  pb->n_relay_endpoints = 4;
  pb->relay_from[3] = 3; /* the hash no longer matches either: the layout is judged first */
  cr_assert_eq(bcast_plan_from_pb(pb, &q, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "relay_from[3] = 3"), "%s", err.msg);
  pb->relay_from[3] = 0; /* valid, but not the layout the hash covers */
  free(pb->relay_endpoints[2]);
  pb->relay_endpoints[2] = strdup("");
  cr_assert_eq(bcast_plan_from_pb(pb, &q, &err), BCAST_EMISMATCH, "%s", err.msg);
  bcast_pb_free(&pb->base);
  bcast_plan_free(p);

  /* A plan without relays encodes no relay fields. */
  p = plan4(&m, BCAST_MODE_HOST);
  cr_assert_eq(bcast_plan_to_pb(p, &pb, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(pb->n_relay_from, 0);
  cr_assert_eq(pb->n_relay_endpoints, 0);
  bcast_pb_free(&pb->base);
  bcast_plan_free(p);
  model_free(&m);
}

/* ---- a downstream that stops reading -------------------------------------------- */

/* Proves itself to the relay as rank `rank`, then reads nothing more: a
 * stopped process keeps its socket open. */
typedef struct mute_peer {
  const char *relay;
  const bcast_plan *p;
  uint32_t rank;
  int ok;
  int done_fd; /* readable when the test is over */
} mute_peer;

static void *mute_main(void *arg) {
  mute_peer *m = arg;
  int fd = -1;
  for (int i = 0; i < 100 && fd < 0; i++) /* the relay's listener exists already: one try suffices */
    fd = bp_dial(m->relay);
  uint8_t nonce[BP_NONCE], rx[BP_NONCE], hello[512];
  if (fd < 0 || bp_challenge(fd, nonce)) return NULL;
  size_t hl = bp_hello(hello, m->p, m->rank, m->p->secret, nonce, rx);
  if (send(fd, hello, hl, MSG_NOSIGNAL) != (ssize_t)hl) return NULL;
  m->ok = bp_reply(fd, m->p, m->rank, nonce, rx) == 0;
  char c;
  ssize_t r = read(m->done_fd, &c, 1);
  (void)r;
  close(fd);
  return NULL;
}

Test(bcast_relay, a_downstream_that_stops_reading_is_named_by_the_relay_and_the_source) {
  model m;
  memset(&m, 0, sizeof m);
  /* More than the socket buffers hold, so the relay must wait on it. */
  big_model(&m);
  part parts[4];
  memset(parts, 0, sizeof parts);
  parts[0].e = engine(0, "127.0.0.1:0", 30);
  parts[1].e = engine(1, "127.0.0.1:0", 30);
  parts[2].e = engine(2, NULL, 30);
  const char *eps[4] = {"", bcast_engine_data_address(parts[1].e), "", ""};
  uint32_t rf[] = {0, 0, 1, 1};
  bcast_plan_opts o = {.id = "relay/mute", .mode = BCAST_MODE_HOST, .staging_budget = 4 << 20, .world_size = 4,
                       .host_endpoint = bcast_engine_data_address(parts[0].e), .min_gbps = 0.5,
                       .relay_from = rf, .relay_endpoints = eps};
  bcast_plan *p = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_build(m.src, NT, &o, &p, &err), BCAST_OK, "%s", err.msg);
  int done[2];
  cr_assert_eq(pipe(done), 0);
  mute_peer mp = {.relay = eps[1], .p = p, .rank = 3, .done_fd = done[0]};
  pthread_t mt, t[3];
  cr_assert_eq(pthread_create(&mt, NULL, mute_main, &mp), 0);
  parts[0].sender = 1;
  memcpy(parts[0].local, m.src, sizeof m.src);
  for (uint32_t r = 0; r < 3; r++) {
    parts[r].p = p;
    if (r) part_receiver(&parts[r], &m);
  }
  double t0 = now_s();
  for (uint32_t r = 0; r < 3; r++) cr_assert_eq(pthread_create(&t[r], NULL, part_main, &parts[r]), 0);
  for (uint32_t r = 0; r < 3; r++) pthread_join(t[r], NULL);
  double took = now_s() - t0;
  ssize_t w = write(done[1], "x", 1);
  (void)w;
  pthread_join(mt, NULL);
  cr_assert(mp.ok, "the mute peer proved itself to the relay");
  cr_assert_eq(parts[1].rc, BCAST_ETIMEDOUT, "relay: %d %s", parts[1].rc, parts[1].err.msg);
  cr_assert(strstr(parts[1].err.msg, "receiver rank 3 stalled at bucket"), "relay: %s", parts[1].err.msg);
  cr_assert_neq(parts[0].rc, BCAST_OK);
  cr_assert(strstr(parts[0].err.msg, "receiver rank 1 failed") &&
                strstr(parts[0].err.msg, "receiver rank 3 stalled"),
            "source: %s", parts[0].err.msg);
  cr_assert_neq(parts[2].rc, BCAST_OK, "rank 2 cannot complete: its relay gave up");
  cr_assert_lt(took, 15.0, "cut off at the plan's floor, far before the 30 s timeout (%.2f s)", took);
  close(done[0]);
  close(done[1]);
  for (uint32_t r = 0; r < 3; r++) part_free(&parts[r]);
  bcast_plan_free(p);
  model_free(&m);
}

Test(bcast_relay, one_relay_per_node_is_the_first_receiver_there_that_can_relay) {
  /* Source on node a with one receiver; node b: ranks 2, 4, 5 (2 cannot
   * relay); node c: rank 3 alone; node d: ranks 6, 7, neither can relay. */
  const char *node[] = {"a", "a", "b", "c", "b", "b", "d", "d"};
  int can[] = {1, 1, 0, 1, 1, 1, 0, 0};
  uint32_t rf[8];
  cr_assert_eq(bcast_relay_layout(8, 0, node, can, rf), 1);
  uint32_t want[] = {0, 0, 4, 0, 0, 4, 0, 0};
  for (int r = 0; r < 8; r++) cr_assert_eq(rf[r], want[r], "rank %d takes from %u, want %u", r, rf[r], want[r]);
  /* Every receiver may relay: node b's first, rank 2, and node d's, rank 6. */
  cr_assert_eq(bcast_relay_layout(8, 0, node, NULL, rf), 2);
  uint32_t all[] = {0, 0, 0, 0, 2, 2, 0, 6};
  for (int r = 0; r < 8; r++) cr_assert_eq(rf[r], all[r], "rank %d takes from %u, want %u", r, rf[r], all[r]);
  /* The layout is one the plan takes, with the relays' endpoints. */
  model m;
  model_init(&m);
  bcast_plan_opts o = {.id = "relay/nodes", .mode = BCAST_MODE_HOST, .staging_budget = 64 << 10, .world_size = 8,
                       .host_endpoint = "10.0.0.1:7000"};
  bcast_plan *p = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_build(m.src, NT, &o, &p, &err), BCAST_OK, "%s", err.msg);
  const char *eps[8] = {"", "", "10.0.0.2:9000", "", "", "", "10.0.0.4:9000", ""};
  cr_assert_eq(bcast_plan_set_relays(p, rf, eps, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(bcast_plan_downstreams(p, 0), 4);
  cr_assert_str_eq(bcast_plan_upstream_endpoint(p, 5), "10.0.0.2:9000");
  bcast_plan_free(p);
  model_free(&m);
  /* No labels: one node, no relay. */
  cr_assert_eq(bcast_relay_layout(4, 0, NULL, NULL, rf), 0);
  for (int r = 0; r < 4; r++) cr_assert_eq(rf[r], 0);
}

Test(bcast_relay, a_cancelled_relay_ends_at_once_and_tells_its_downstreams) {
  char root_ep[64];
  int lfd = fake_listen(root_ep, sizeof root_ep);
  model m;
  model_init(&m);
  part parts[4];
  pthread_t ft, t[4];
  bcast_plan *p = relayed_start(&m, parts, root_ep, "relay/cancel");
  int hold[2];
  cr_assert_eq(pipe(hold), 0);
  fake_root f = {lfd, p, &m, hold[0]}; /* sends bucket 0, then nothing */
  cr_assert_eq(pthread_create(&ft, NULL, fake_root_main, &f), 0);
  relayed_run(parts, t);
  usleep(500 * 1000);
  double t0 = now_s();
  cr_assert_eq(bcast_engine_cancel(parts[1].e, "relay/cancel"), BCAST_OK);
  relayed_join(parts, t);
  double took = now_s() - t0;
  ssize_t w = write(hold[1], "x", 1);
  (void)w;
  pthread_join(ft, NULL);
  cr_assert_eq(parts[1].rc, BCAST_ECANCELED, "relay: %d %s", parts[1].rc, parts[1].err.msg);
  for (uint32_t r = 2; r < 4; r++) {
    cr_assert_eq(parts[r].rc, BCAST_EPEER, "rank %u: %d %s", r, parts[r].rc, parts[r].err.msg);
    cr_assert(strstr(parts[r].err.msg, "gave up at bucket 1") && strstr(parts[r].err.msg, "cancelled"),
              "rank %u: %s", r, parts[r].err.msg);
  }
  cr_assert_lt(took, 3.0, "every rank ends at the cancel, not at the 30 s timeout (%.2f s)", took);
  close(hold[0]);
  close(hold[1]);
  relayed_free(parts, p);
  model_free(&m);
  close(lfd);
}

/* A participant that proves itself to the source as a rank that takes from
 * a relay is told why it is refused, and the source names it. */
Test(bcast_relay, a_rank_that_takes_from_a_relay_is_refused_by_the_source) {
  uint32_t rf[] = {0, 0, 1};
  world w;
  world_make(&w, 3, rf, 0, 3.0);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, part_main, &w.parts[0]), 0);
  int fd = bp_dial(w.p->host_endpoint);
  cr_assert_geq(fd, 0);
  uint8_t nonce[BP_NONCE], rx[BP_NONCE], hello[512];
  cr_assert_eq(bp_challenge(fd, nonce), 0);
  size_t hl = bp_hello(hello, w.p, 2, w.p->secret, nonce, rx);
  cr_assert_eq(send(fd, hello, hl, MSG_NOSIGNAL), (ssize_t)hl);
  int st = bp_reply(fd, w.p, 2, nonce, rx);
  cr_assert_eq(st, BCAST_EPEER, "the source refuses rank 2 with a reason (status %d)", st);
  pthread_join(t, NULL);
  close(fd);
  cr_assert_eq(w.parts[0].rc, BCAST_EPEER, "%d %s", w.parts[0].rc, w.parts[0].err.msg);
  cr_assert(strstr(w.parts[0].err.msg, "receiver claims rank 2: it takes its bytes from rank 1, not from rank 0"),
            "%s", w.parts[0].err.msg);
  world_free(&w);
}

static void *late_main(void *arg) {
  usleep(3000 * 1000); /* longer than a bucket's bound at the plan's floor */
  return part_main(arg);
}

/* A downstream that comes late holds the source at its accept, as a late
 * receiver does without relays, not inside a bucket's bound: the plan goes
 * through, bit for bit. */
Test(bcast_relay, a_late_downstream_delays_the_plan_but_does_not_fail_it) {
  model m;
  memset(&m, 0, sizeof m);
  /* More than the socket buffers hold: a relay receiving before its
   * downstreams came would hold the source up mid-plan. */
  big_model(&m);
  part parts[4];
  memset(parts, 0, sizeof parts);
  parts[0].e = engine(0, "127.0.0.1:0", 30);
  parts[1].e = engine(1, "127.0.0.1:0", 30);
  parts[2].e = engine(2, NULL, 30);
  parts[3].e = engine(3, NULL, 30);
  const char *eps[4] = {"", bcast_engine_data_address(parts[1].e), "", ""};
  uint32_t rf[] = {0, 0, 1, 1};
  bcast_plan_opts o = {.id = "relay/late", .mode = BCAST_MODE_HOST, .staging_budget = 4 << 20, .world_size = 4,
                       .host_endpoint = bcast_engine_data_address(parts[0].e), .min_gbps = 0.5,
                       .relay_from = rf, .relay_endpoints = eps};
  bcast_plan *p = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_build(m.src, NT, &o, &p, &err), BCAST_OK, "%s", err.msg);
  parts[0].sender = 1;
  memcpy(parts[0].local, m.src, sizeof m.src);
  for (uint32_t r = 0; r < 4; r++) {
    parts[r].p = p;
    if (r) part_receiver(&parts[r], &m);
  }
  pthread_t t[4];
  for (uint32_t r = 0; r < 4; r++)
    cr_assert_eq(pthread_create(&t[r], NULL, r == 3 ? late_main : part_main, &parts[r]), 0);
  for (uint32_t r = 0; r < 4; r++) pthread_join(t[r], NULL);
  uint64_t want = 0, got = 0;
  cr_assert_eq(bcast_plan_source_checksum(p, 0, m.src, NT, 0, &want, &err), BCAST_OK, "%s", err.msg);
  for (uint32_t r = 0; r < 4; r++) cr_assert_eq(parts[r].rc, BCAST_OK, "rank %u: %s", r, parts[r].err.msg);
  for (uint32_t r = 1; r < 4; r++) {
    cr_assert_eq(bcast_plan_source_checksum(p, 0, parts[r].local, NT, 1, &got, &err), BCAST_OK, "%s", err.msg);
    cr_assert_eq(got, want, "rank %u holds the version sent", r);
  }
  for (uint32_t r = 0; r < 4; r++) part_free(&parts[r]);
  bcast_plan_free(p);
  model_free(&m);
}
