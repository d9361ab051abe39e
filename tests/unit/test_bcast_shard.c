/* Sharded trainers: several source ranks, each sending its own shard over
 * the host transport.  Sources and receivers are threads of this process,
 * each with its own engine (and, for sources, its own listener on
 * 127.0.0.1:0); the tiling check, the plan's layout, validation and
 * protobuf form are checked on their own. */
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

#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_internal.h"
#include "workers/bcast/bcast_pb.h"
#include "tests/unit/bcast_peer.h"

#define NT 6
#define MAXS 4
#define RECEIVERS 2

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint32_t rng = 0x2545f491u;

/* ---- a model and its shards ------------------------------------------------- */

typedef struct model {
  bcast_tensor full[NT]; /* whole tensors, data in storage dtype */
  size_t n;
  uint32_t nranks;
  bcast_tensor shard[MAXS][NT]; /* what each rank holds, data its own copy */
  size_t nshard[MAXS];
} model;

static void add(model *m, const char *name, uint32_t layer, bcast_dtype st, bcast_dtype wt, uint64_t d0,
                uint64_t d1) {
  bp_random_tensor(&m->full[m->n++], name, layer, st, wt, d0, d1, BCAST_RES_HOST_PAGEABLE, 0, &rng);
}

/* Rank r holds elements [off, off + count) of tensor i, in a buffer of its own. */
static void give(model *m, uint32_t r, size_t i, uint64_t off, uint64_t count) {
  const bcast_tensor *f = &m->full[i];
  bcast_tensor *t = &m->shard[r][m->nshard[r]++];
  *t = *f;
  size_t ssz = bcast_dtype_size(f->storage_dtype);
  t->data = malloc(count * ssz);
  memcpy(t->data, (const uint8_t *)f->data + off * ssz, count * ssz);
  t->shard_offset = off;
  t->shard_elems = count == bcast_tensor_elems(f) ? 0 : count; /* whole: 0/0 */
}

/* Cuts tensor i over every rank at uneven points: rank r takes a share that
 * grows with r; `rows` cuts on row boundaries (an FSDP2 dim-0 shard), else
 * anywhere (FSDP1's flat shards). */
static void split(model *m, size_t i, int rows) {
  uint64_t n = bcast_tensor_elems(&m->full[i]), unit = rows ? m->full[i].shape[1] : 1, units = n / unit;
  uint64_t weights = (uint64_t)m->nranks * (m->nranks + 1) / 2, off = 0;
  for (uint32_t r = 0; r < m->nranks; r++) {
    uint64_t take = r + 1 == m->nranks ? units - off / unit : units * (r + 1) / weights;
    if (!rows && r + 1 < m->nranks) take += 3; /* off any row */
    give(m, r, i, off, take * unit);
    off += take * unit;
  }
}

static void model_init(model *m, uint32_t nranks) {
  memset(m, 0, sizeof *m);
  m->nranks = nranks;
  add(m, "embed", 0, BCAST_DTYPE_FP32, BCAST_DTYPE_BF16, 300, 257); /* larger than the budget */
  add(m, "l1.attn", 1, BCAST_DTYPE_FP32, BCAST_DTYPE_BF16, 64, 33);
  add(m, "l1.flat", 1, BCAST_DTYPE_FP32, BCAST_DTYPE_BF16, 128, 65);
  add(m, "l1.ids", 1, BCAST_DTYPE_U16, BCAST_DTYPE_U16, 31, 7);
  add(m, "l2.norm", 2, BCAST_DTYPE_FP32, BCAST_DTYPE_FP16, 5, 999);
  add(m, "l2.bf", 2, BCAST_DTYPE_BF16, BCAST_DTYPE_BF16, 17, 3);
  split(m, 0, 1);                                 /* dim-0 shards */
  give(m, nranks - 1, 1, 0, 64 * 33);             /* whole, on the last rank */
  split(m, 2, 0);                                 /* flat shards */
  give(m, 0, 3, 0, 31 * 7);                       /* whole, on rank 0 */
  split(m, 4, 0);
  split(m, 5, 1);
}

static void model_free(model *m) {
  for (size_t i = 0; i < m->n; i++) free(m->full[i].data);
  for (uint32_t r = 0; r < m->nranks; r++)
    for (size_t i = 0; i < m->nshard[r]; i++) free(m->shard[r][i].data);
}

static bcast_shard_map *shard_map(const model *m) {
  const bcast_tensor *ranks[MAXS];
  for (uint32_t r = 0; r < m->nranks; r++) ranks[r] = m->shard[r];
  bcast_shard_map *map = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_shards_check(ranks, m->nshard, m->nranks, NULL, &map, &err), BCAST_OK, "%s", err.msg);
  return map;
}

static bcast_engine *engine(uint32_t rank, const char *listen, double timeout) {
  bcast_engine_opts o = {.rank = rank, .device = -1, .timeout_s = timeout, .host_listen = listen};
  bcast_engine *e = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_engine_new(&o, &e, &err), BCAST_OK, "%s", err.msg);
  return e;
}

static bcast_plan *sharded_plan(const bcast_shard_map *map, const char *const *eps, uint64_t budget, int tls) {
  bcast_plan_opts o = {.id = "shard/step-1", .mode = BCAST_MODE_HOST, .staging_budget = budget,
                       .world_size = map->nranks + RECEIVERS, .root_rank = 0, .source_endpoints = eps,
                       .tls = tls};
  bcast_plan *p = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_build_sharded(map, &o, &p, &err), BCAST_OK, "%s", err.msg);
  return p;
}

/* ---- participants as threads ------------------------------------------------ */

typedef struct part {
  bcast_engine *e;
  const bcast_plan *p;
  const bcast_tensor *local;
  size_t n;
  int rc;
  bcast_err err;
  bcast_stats st;
  double seconds;
  pthread_t tid;
} part;

static void *part_main(void *arg) {
  part *x = arg;
  double t0 = now_s();
  x->rc = bcast_engine_execute(x->e, x->p, x->local, x->n, &x->st, &x->err);
  x->seconds = now_s() - t0;
  return NULL;
}

static void part_start(part *x) { cr_assert_eq(pthread_create(&x->tid, NULL, part_main, x), 0); }
static void part_join(part *x) { pthread_join(x->tid, NULL); }

/* A receiver's whole tensors in the wire dtype, in another order than the
 * plan's (matching is by name). */
static void rx_tensors(const model *m, bcast_tensor *dst) {
  for (size_t i = 0; i < m->n; i++) {
    dst[m->n - 1 - i] = m->full[i];
    dst[m->n - 1 - i].data = calloc(bcast_tensor_elems(&m->full[i]), 2);
  }
}

typedef struct world {
  model m;
  bcast_shard_map *map;
  bcast_engine *src[MAXS], *rx[RECEIVERS];
  const char *eps[MAXS];
  bcast_plan *p;
  part sp[MAXS], rp[RECEIVERS];
  bcast_tensor dst[RECEIVERS][NT];
} world;

static void world_init(world *w, uint32_t nranks, int tls, double timeout) {
  memset(w, 0, sizeof *w);
  model_init(&w->m, nranks);
  w->map = shard_map(&w->m);
  for (uint32_t r = 0; r < nranks; r++) {
    w->src[r] = engine(r, "127.0.0.1:0", timeout);
    w->eps[r] = bcast_engine_data_address(w->src[r]);
  }
  for (uint32_t i = 0; i < RECEIVERS; i++) {
    w->rx[i] = engine(nranks + i, NULL, timeout);
    rx_tensors(&w->m, w->dst[i]);
  }
  w->p = sharded_plan(w->map, w->eps, 64 << 10, tls);
  for (uint32_t r = 0; r < nranks; r++)
    w->sp[r] = (part){.e = w->src[r], .p = w->p, .local = w->m.shard[r], .n = w->m.nshard[r]};
  for (uint32_t i = 0; i < RECEIVERS; i++) w->rp[i] = (part){.e = w->rx[i], .p = w->p, .local = w->dst[i], .n = w->m.n};
}

static void world_free(world *w) {
  for (uint32_t r = 0; r < w->m.nranks; r++) {
    bcast_stats_free(&w->sp[r].st);
    bcast_engine_free(w->src[r]);
  }
  for (uint32_t i = 0; i < RECEIVERS; i++) {
    bcast_stats_free(&w->rp[i].st);
    bcast_engine_free(w->rx[i]);
    for (size_t k = 0; k < w->m.n; k++) free(w->dst[i][k].data);
  }
  bcast_plan_free(w->p);
  bcast_shard_map_free(w->map);
  model_free(&w->m);
}

static void run_all(world *w, uint32_t nsrc_started) {
  for (uint32_t r = 0; r < nsrc_started; r++) part_start(&w->sp[r]);
  for (uint32_t i = 0; i < RECEIVERS; i++) part_start(&w->rp[i]);
  for (uint32_t r = 0; r < nsrc_started; r++) part_join(&w->sp[r]);
  for (uint32_t i = 0; i < RECEIVERS; i++) part_join(&w->rp[i]);
}

static void run_sharded(uint32_t nranks, int tls) {
  world w;
  world_init(&w, nranks, tls, 20);
  const bcast_plan *p = w.p;
  cr_assert_eq(p->nsources, nranks);
  cr_assert_geq(p->nbuckets, 2 * nranks);
  run_all(&w, nranks);
  for (uint32_t r = 0; r < nranks; r++) {
    part *x = &w.sp[r];
    cr_assert_eq(x->rc, BCAST_OK, "source %u: %s", r, x->err.msg);
    /* A source's stats are its own buckets and bytes. */
    uint32_t mine = 0;
    uint64_t bytes = 0;
    for (size_t k = 0; k < p->nbuckets; k++)
      if (p->buckets[k].source_rank == r) {
        cr_assert_eq(x->st.buckets[mine].bucket, k);
        mine++;
        bytes += p->buckets[k].bytes;
      }
    cr_assert_gt(mine, 0, "source %u sends nothing", r);
    cr_assert_eq(x->st.nbuckets, mine);
    cr_assert_eq(x->st.wire_bytes, bytes);
    cr_assert_str_eq(x->st.transport, tls ? "host-tls" : "host-tcp");
  }
  for (uint32_t i = 0; i < RECEIVERS; i++) {
    part *x = &w.rp[i];
    cr_assert_eq(x->rc, BCAST_OK, "receiver %u: %s", nranks + i, x->err.msg);
    cr_assert_eq(x->st.nbuckets, p->nbuckets);
    cr_assert_eq(x->st.wire_bytes, bcast_plan_wire_bytes(p));
    /* The streams overlap: the wire ran alone for the longest stream, at
     * most the sum over buckets. */
    cr_assert_leq(x->st.wire_alone_s, x->st.wire_s + 1e-9);
    cr_assert_gt(x->st.wire_alone_s, 0);
    for (size_t t = 0; t < w.m.n; t++) {
      void *ref = bp_reference(&w.m.full[t]);
      cr_assert_eq(memcmp(ref, w.dst[i][w.m.n - 1 - t].data, bcast_tensor_elems(&w.m.full[t]) * 2), 0,
                   "receiver %u: tensor %s differs from the full tensor's cast", nranks + i, w.m.full[t].name);
      free(ref);
    }
    /* Each source's part as the receiver holds it sums as the source's own
     * shard, cast to the wire dtype, does (bcast_plan_source_checksum). */
    for (uint32_t r = 0; r < nranks; r++) {
      uint64_t mine = 0, theirs = 0;
      bcast_err e = {0};
      cr_assert_eq(bcast_plan_source_checksum(p, r, w.m.shard[r], w.m.nshard[r], 0, &mine, &e), BCAST_OK,
                   "%s", e.msg);
      cr_assert_eq(bcast_plan_source_checksum(p, r, w.dst[i], w.m.n, 1, &theirs, &e), BCAST_OK, "%s", e.msg);
      cr_assert_eq(mine, theirs, "receiver %u, source %u", nranks + i, r);
    }
  }
  /* One element changed on a receiver changes the checksum of the source
   * that sent it, and of that source only. */
  if (nranks > 1) {
    const bcast_slice *sl = &p->buckets[1].slices[0];
    uint32_t src = p->buckets[1].source_rank;
    bcast_tensor *t = NULL;
    for (size_t k = 0; k < w.m.n; k++)
      if (!strcmp(w.dst[0][k].name, p->tensors[sl->tensor].name)) t = &w.dst[0][k];
    cr_assert_not_null(t);
    uint64_t before[MAXS], after[MAXS];
    bcast_err e = {0};
    for (uint32_t r = 0; r < nranks; r++)
      cr_assert_eq(bcast_plan_source_checksum(p, r, w.dst[0], w.m.n, 1, &before[r], &e), BCAST_OK, "%s", e.msg);
    ((uint16_t *)t->data)[sl->elem_offset] ^= 1;
    for (uint32_t r = 0; r < nranks; r++) {
      cr_assert_eq(bcast_plan_source_checksum(p, r, w.dst[0], w.m.n, 1, &after[r], &e), BCAST_OK, "%s", e.msg);
      if (r == src) cr_assert_neq(before[r], after[r], "source %u's part changed", r);
      else cr_assert_eq(before[r], after[r], "source %u's part did not change", r);
    }
    /* A source whose tensors lack what the plan has it send is named. */
    cr_assert_eq(bcast_plan_source_checksum(p, src, w.m.shard[(src + 1) % nranks],
                                            w.m.nshard[(src + 1) % nranks], 0, &after[0], &e),
                 BCAST_EINVAL);
    cr_assert(strstr(e.msg, "tensor '") != NULL, "%s", e.msg);
    cr_assert_eq(bcast_plan_source_checksum(p, nranks, w.dst[0], w.m.n, 1, &after[0], &e), BCAST_EINVAL);
    cr_assert(strstr(e.msg, "source rank") != NULL, "%s", e.msg);
  }
  world_free(&w);
}

Test(bcast_shard, one_source_bit_exact) { run_sharded(1, 0); }
Test(bcast_shard, two_sources_bit_exact) { run_sharded(2, 0); }
Test(bcast_shard, four_sources_bit_exact) { run_sharded(4, 0); }
Test(bcast_shard, two_sources_over_tls_bit_exact) { run_sharded(2, 1); }

/* ---- the layout ------------------------------------------------------------------ */

/* Buckets carry one source's slices; within a layer the sources take turns. */
Test(bcast_shard, buckets_are_one_sources_and_sources_take_turns) {
  model m;
  model_init(&m, 4);
  bcast_shard_map *map = shard_map(&m);
  const char *eps[4] = {"a:1", "b:2", "c:3", "d:4"};
  bcast_plan *p = sharded_plan(map, eps, 64 << 10, 0);
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_validate(p, &err), BCAST_OK, "%s", err.msg);
  cr_assert_str_eq(p->host_endpoint, "a:1");
  for (uint32_t r = 0; r < 4; r++) cr_assert_str_eq(bcast_plan_source_endpoint(p, r), eps[r]);
  /* Layer 0 is "embed" alone, split over every rank: its first four buckets
   * are sources 0, 1, 2, 3 in turn. */
  for (uint32_t k = 0; k < 4; k++) {
    cr_assert_eq(p->buckets[k].layer, 0);
    cr_assert_eq(p->buckets[k].source_rank, k, "bucket %u", k);
    cr_assert_eq(p->buckets[k].stage_rank, k);
  }
  /* Every slice is of a piece its bucket's source holds. */
  for (size_t k = 0; k < p->nbuckets; k++)
    for (size_t s = 0; s < p->buckets[k].nslices; s++) {
      const bcast_slice *sl = &p->buckets[k].slices[s];
      int held = 0;
      for (size_t j = map->first[sl->tensor]; j < map->first[sl->tensor + 1]; j++) {
        const bcast_piece *pc = &map->pieces[j];
        held |= pc->rank == p->buckets[k].source_rank && sl->elem_offset >= pc->elem_offset &&
                sl->elem_offset + sl->elem_count <= pc->elem_offset + pc->elem_count;
      }
      cr_assert(held, "bucket %zu slice %zu is not its source's", k, s);
    }
  /* The tensor held whole by the last rank is in that rank's buckets only. */
  for (size_t k = 0; k < p->nbuckets; k++)
    for (size_t s = 0; s < p->buckets[k].nslices; s++)
      if (!strcmp(p->tensors[p->buckets[k].slices[s].tensor].name, "l1.attn"))
        cr_assert_eq(p->buckets[k].source_rank, 3);
  bcast_plan_free(p);
  bcast_shard_map_free(map);
  model_free(&m);
}

/* One rank holding every tensor whole is today's plan: the same buckets,
 * the same hash, the same protobuf bytes. */
Test(bcast_shard, one_source_is_the_plan_of_one_root_byte_for_byte) {
  model m;
  memset(&m, 0, sizeof m);
  m.nranks = 1;
  add(&m, "embed", 0, BCAST_DTYPE_FP32, BCAST_DTYPE_BF16, 300, 257);
  add(&m, "l1.attn", 1, BCAST_DTYPE_FP32, BCAST_DTYPE_BF16, 64, 33);
  add(&m, "l1.ids", 1, BCAST_DTYPE_U16, BCAST_DTYPE_U16, 31, 7);
  add(&m, "l2.norm", 2, BCAST_DTYPE_FP32, BCAST_DTYPE_FP16, 5, 999);
  for (size_t i = 0; i < m.n; i++) give(&m, 0, i, 0, bcast_tensor_elems(&m.full[i]));
  bcast_shard_map *map = shard_map(&m);
  uint8_t secret[BCAST_SECRET_BYTES];
  memset(secret, 7, sizeof secret);
  bcast_plan_opts o = {.id = "s/1", .mode = BCAST_MODE_HOST, .staging_budget = 64 << 10, .world_size = 3,
                       .host_endpoint = "127.0.0.1:9", .secret = secret};
  bcast_plan *a = NULL, *b = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_build(m.full, m.n, &o, &a, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(bcast_plan_build_sharded(map, &o, &b, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(a->hash, b->hash);
  cr_assert_eq(a->hash, bcast_plan_hash(a));
  cr_assert_eq(b->nsources, 1);
  cr_assert_null(b->source_endpoints);
  Rlorch__V1__BroadcastPlan *ma = NULL, *mb = NULL;
  cr_assert_eq(bcast_plan_to_pb(a, &ma, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(bcast_plan_to_pb(b, &mb, &err), BCAST_OK, "%s", err.msg);
  size_t la = rlorch__v1__broadcast_plan__get_packed_size(ma), lb = rlorch__v1__broadcast_plan__get_packed_size(mb);
  cr_assert_eq(la, lb);
  uint8_t *ba = malloc(la), *bb = malloc(lb);
  rlorch__v1__broadcast_plan__pack(ma, ba);
  rlorch__v1__broadcast_plan__pack(mb, bb);
  cr_assert_eq(memcmp(ba, bb, la), 0, "the encodings differ");
  free(ba);
  free(bb);
  bcast_pb_free(&ma->base);
  bcast_pb_free(&mb->base);
  /* Several sources are covered by the hash; the endpoints are not. */
  bcast_plan *c = bcast_plan_dup(b);
  c->nsources = 2;
  cr_assert_neq(bcast_plan_hash(c), b->hash);
  c->nsources = 1;
  c->buckets[0].source_rank = 1;
  cr_assert_neq(bcast_plan_hash(c), b->hash);
  bcast_plan_free(c);
  bcast_plan_free(a);
  bcast_plan_free(b);
  bcast_shard_map_free(map);
  model_free(&m);
}

/* ---- the tiling check --------------------------------------------------------------- */


static int check_ranks(bcast_tensor (*ranks)[2], uint32_t nranks, const size_t *n, bcast_err *err) {
  const bcast_tensor *v[4];
  for (uint32_t r = 0; r < nranks; r++) v[r] = ranks[r];
  bcast_shard_map *map = NULL;
  int rc = bcast_shards_check(v, n, nranks, NULL, &map, err);
  cr_assert_eq(rc != BCAST_OK, map == NULL);
  bcast_shard_map_free(map);
  return rc;
}

static bcast_tensor piece(const char *name, uint64_t d0, uint64_t d1, uint64_t off, uint64_t count) {
  bcast_tensor t;
  memset(&t, 0, sizeof t);
  snprintf(t.name, sizeof t.name, "%s", name);
  t.layer = 3;
  t.storage_dtype = BCAST_DTYPE_FP32;
  t.wire_dtype = BCAST_DTYPE_BF16;
  t.ndim = 2;
  t.shape[0] = d0;
  t.shape[1] = d1;
  t.residency = BCAST_RES_HOST_PAGEABLE;
  t.shard_offset = off;
  t.shard_elems = count;
  return t;
}

/* The ranks heard from so far (an absent rank holds nothing): an overlap or
 * a disagreement is found, a gap is not (only the whole group shows it). */
Test(bcast_shard, partial_check_finds_overlaps_not_gaps) {
  bcast_tensor a = piece("w", 4, 4, 0, 6), c = piece("w", 4, 4, 10, 6);
  bcast_tensor over = piece("w", 4, 4, 4, 4), other = piece("w", 2, 8, 6, 4);
  const bcast_tensor *v[3] = {&a, NULL, &c};
  size_t n[3] = {1, 0, 1};
  bcast_err err = {0};
  cr_assert_eq(bcast_shards_check_partial(v, n, 3, NULL, &err), BCAST_OK, "%s", err.msg);
  bcast_shard_map *map = NULL;
  cr_assert_eq(bcast_shards_check(v, n, 3, NULL, &map, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "held by no rank") != NULL, "%s", err.msg);
  v[1] = &over;
  n[1] = 1;
  cr_assert_eq(bcast_shards_check_partial(v, n, 3, NULL, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "tensor 'w': rank 0 holds [0, 6) and rank 1 holds [4, 8): they overlap");
  v[1] = &other;
  cr_assert_eq(bcast_shards_check_partial(v, n, 3, NULL, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "rank 0 and rank 1 disagree on shape") != NULL, "%s", err.msg);
  /* A piece inside another, after a gap: still an overlap. */
  bcast_tensor in = piece("w", 4, 4, 11, 2);
  v[1] = &in;
  cr_assert_eq(bcast_shards_check_partial(v, n, 3, NULL, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "they overlap") != NULL, "%s", err.msg);
}

Test(bcast_shard, tiling_errors_name_the_tensor_the_ranks_and_the_elements) {
  bcast_tensor r[3][2];
  size_t n[3] = {1, 1, 1};
  bcast_err err = {0};
  /* A gap between two ranks. */
  r[0][0] = piece("w", 10, 10, 0, 40);
  r[1][0] = piece("w", 10, 10, 50, 30);
  r[2][0] = piece("w", 10, 10, 80, 20);
  cr_assert_eq(check_ranks(r, 3, n, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "tensor 'w': elements [40, 50) of 100 are held by no rank (between rank 0 and rank 1)");
  /* At the start and at the end. */
  r[0][0] = piece("w", 10, 10, 10, 30);
  r[1][0] = piece("w", 10, 10, 40, 40);
  cr_assert_eq(check_ranks(r, 3, n, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "tensor 'w': elements [0, 10) of 100 are held by no rank (between the start and rank 0)");
  r[0][0] = piece("w", 10, 10, 0, 40);
  r[2][0] = piece("w", 10, 10, 80, 10);
  cr_assert_eq(check_ranks(r, 3, n, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "tensor 'w': elements [90, 100) of 100 are held by no rank (between rank 2 and the end)");
  /* An overlap. */
  r[2][0] = piece("w", 10, 10, 75, 25);
  cr_assert_eq(check_ranks(r, 3, n, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "tensor 'w': rank 1 holds [40, 80) and rank 2 holds [75, 100): they overlap");
  /* Two ranks each holding it whole overlap too. */
  r[0][0] = piece("w", 10, 10, 0, 0);
  r[1][0] = piece("w", 10, 10, 0, 0);
  cr_assert_eq(check_ranks(r, 2, n, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "tensor 'w': rank 0 holds [0, 100) and rank 1 holds [0, 100): they overlap");
  /* Shape, layer, dtypes. */
  r[0][0] = piece("w", 10, 10, 0, 50);
  r[1][0] = piece("w", 20, 5, 50, 50);
  cr_assert_eq(check_ranks(r, 2, n, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "tensor 'w': rank 0 and rank 1 disagree on shape ([10, 10] vs [20, 5])");
  r[1][0] = piece("w", 10, 10, 50, 50);
  r[1][0].layer = 4;
  cr_assert_eq(check_ranks(r, 2, n, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "tensor 'w': rank 0 and rank 1 disagree on layer (3 vs 4)");
  r[1][0] = piece("w", 10, 10, 50, 50);
  r[1][0].storage_dtype = BCAST_DTYPE_BF16;
  cr_assert_eq(check_ranks(r, 2, n, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "tensor 'w': rank 0 and rank 1 disagree on storage_dtype (fp32 vs bf16)");
  r[1][0] = piece("w", 10, 10, 50, 50);
  r[1][0].wire_dtype = BCAST_DTYPE_FP16;
  cr_assert_eq(check_ranks(r, 2, n, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "tensor 'w': rank 0 and rank 1 disagree on wire_dtype (bf16 vs fp16)");
  /* A range outside the tensor, and a rank's own manifest error, name the rank. */
  r[1][0] = piece("w", 10, 10, 50, 51);
  cr_assert_eq(check_ranks(r, 2, n, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "source rank 1: tensor #0 'w': shard [50, +51) outside its 100 elements");
  r[1][0] = piece("w", 10, 10, 50, 50);
  r[1][1] = piece("w", 10, 10, 0, 50);
  size_t n2[2] = {1, 2};
  cr_assert_eq(check_ranks(r, 2, n2, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "source rank 1: tensors #0 and #1: duplicate name 'w'");
  /* And a tiling that is right passes, in order of first appearance. */
  r[0][0] = piece("b", 10, 10, 0, 0);
  r[0][1] = piece("w", 10, 10, 0, 50);
  r[1][0] = piece("a", 10, 10, 0, 0);
  r[1][1] = piece("w", 10, 10, 50, 50);
  const bcast_tensor *v[2] = {r[0], r[1]};
  size_t n3[2] = {2, 2};
  bcast_shard_map *map = NULL;
  cr_assert_eq(bcast_shards_check(v, n3, 2, NULL, &map, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(map->ntensors, 3);
  cr_assert_str_eq(map->tensors[0].name, "b");
  cr_assert_str_eq(map->tensors[1].name, "w");
  cr_assert_str_eq(map->tensors[2].name, "a");
  cr_assert_eq(map->first[1], 1);
  cr_assert_eq(map->first[2], 3);
  cr_assert_eq(map->pieces[1].rank, 0);
  cr_assert_eq(map->pieces[2].rank, 1);
  cr_assert_eq(map->pieces[2].elem_offset, 50);
  cr_assert_eq(map->tensors[1].shard_elems, 0, "the global view describes whole tensors");
  bcast_shard_map_free(map);
}

/* 10^6 pieces: 8 ranks, each holding an eighth of 125000 tensors.  One
 * sort, not a comparison of every pair (10^12 of them would never finish),
 * so it takes seconds at most even here; a gap in the last tensor is still
 * found. */
Test(bcast_shard, a_million_pieces_are_checked_in_seconds, .timeout = 120) {
  enum { R = 8, T = 125000 };
  bcast_tensor *v[R];
  size_t n[R];
  for (uint32_t r = 0; r < R; r++) {
    v[r] = calloc(T, sizeof *v[r]);
    n[r] = T;
    for (size_t i = 0; i < T; i++) {
      char name[32];
      snprintf(name, sizeof name, "layers.%zu.w", (i * 7919) % T); /* every rank in another order */
      v[r][(i + r * 31) % T] = piece(name, 8, 16, (uint64_t)r * 16, 16);
    }
  }
  bcast_shard_map *map = NULL;
  bcast_err err = {0};
  double t0 = now_s();
  cr_assert_eq(bcast_shards_check((const bcast_tensor *const *)v, n, R, NULL, &map, &err), BCAST_OK, "%s",
               err.msg);
  double took = now_s() - t0;
  cr_assert_eq(map->npieces, (size_t)R * T);
  cr_assert_eq(map->ntensors, T);
  cr_assert_lt(took, 30.0, "%.1f s for 10^6 pieces", took);
  bcast_shard_map_free(map);
  v[R - 1][T - 1].shard_elems = 15; /* one element short, somewhere in the middle of the sort */
  cr_assert_eq(bcast_shards_check((const bcast_tensor *const *)v, n, R, NULL, &map, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "of 128 are held by no rank (between rank 7 and the end)"), "%s", err.msg);
  cr_assert_null(map);
  for (uint32_t r = 0; r < R; r++) free(v[r]);
}

/* ---- validation and the protobuf form ------------------------------------------------- */

Test(bcast_shard, validation_names_what_is_inconsistent) {
  model m;
  model_init(&m, 2);
  bcast_shard_map *map = shard_map(&m);
  const char *eps[2] = {"127.0.0.1:1", "127.0.0.1:2"};
  bcast_plan *p = sharded_plan(map, eps, 64 << 10, 0);
  bcast_err err = {0};
  bcast_plan *q = bcast_plan_dup(p);
  q->buckets[1].source_rank = q->buckets[1].stage_rank = 2;
  cr_assert_eq(bcast_plan_validate(q, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "bucket 1 (layer 0): source rank 2, but the plan has 2 sources (ranks 0..1)");
  q->buckets[1].source_rank = 1;
  q->buckets[1].stage_rank = 0;
  cr_assert_eq(bcast_plan_validate(q, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "bucket 1 (layer 0): stage rank 0 differs from its source rank 1");
  bcast_plan_free(q);
  q = bcast_plan_dup(p);
  q->nsources = 4;
  cr_assert_eq(bcast_plan_validate(q, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "plan 'shard/step-1': 4 sources in a world of 4 leave no receiver");
  q->nsources = 2;
  q->mode = BCAST_MODE_STAGED;
  cr_assert_eq(bcast_plan_validate(q, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "plan 'shard/step-1': 2 sources in staged mode, which has one source");
  q->mode = BCAST_MODE_HOST;
  q->root_rank = 1;
  cr_assert_eq(bcast_plan_validate(q, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "plan 'shard/step-1': root_rank 1 with 2 sources; the sources are ranks 0..1");
  q->root_rank = 0;
  snprintf(q->host_endpoint, sizeof q->host_endpoint, "127.0.0.1:3");
  cr_assert_eq(bcast_plan_validate(q, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "plan 'shard/step-1': source_endpoints[0] '127.0.0.1:1' is not host_endpoint "
                   "'127.0.0.1:3'");
  bcast_plan_free(q);
  /* A piece of a tensor given to the wrong bucket leaves a gap and an overlap. */
  q = bcast_plan_dup(p);
  q->buckets[0].slices[0].elem_offset += 1;
  cr_assert_eq(bcast_plan_validate(q, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "tensor 'embed': slice in bucket 0 starts at element 1, expected 0 (gap)");
  bcast_plan_free(q);
  /* Options: several sources only in host mode, root 0, a receiver left. */
  bcast_plan_opts o = {.id = "x", .mode = BCAST_MODE_DIRECT, .world_size = 4};
  bcast_plan *r = NULL;
  cr_assert_eq(bcast_plan_build_sharded(map, &o, &r, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "plan options: 2 source ranks: direct mode has one source; only host and colocated "
                   "mode send from several");
  o.mode = BCAST_MODE_HOST;
  o.world_size = 2;
  cr_assert_eq(bcast_plan_build_sharded(map, &o, &r, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "plan options: 2 source ranks need a world_size above them, not 2");
  /* A shard is no input of the one-source planner. */
  o.world_size = 2;
  cr_assert_eq(bcast_plan_build(m.shard[0], m.nshard[0], &o, &r, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "a shard (elements [0, +"), "%s", err.msg);
  cr_assert_null(r);
  bcast_plan_free(p);
  bcast_shard_map_free(map);
  model_free(&m);
}

Test(bcast_shard, protobuf_round_trip_keeps_sources_and_endpoints) {
  model m;
  model_init(&m, 4);
  bcast_shard_map *map = shard_map(&m);
  const char *eps[4] = {"10.0.0.1:1", "10.0.0.2:2", "10.0.0.3:3", "10.0.0.4:4"};
  bcast_plan *p = sharded_plan(map, eps, 64 << 10, 1);
  bcast_err err = {0};
  uint8_t *buf = NULL;
  size_t len = 0;
  cr_assert_eq(bcast_plan_pack(p, &buf, &len, &err), BCAST_OK, "%s", err.msg);
  bcast_plan *q = NULL;
  cr_assert_eq(bcast_plan_unpack(buf, len, &q, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(q->hash, p->hash);
  cr_assert_eq(q->nsources, 4);
  for (uint32_t r = 0; r < 4; r++) cr_assert_str_eq(bcast_plan_source_endpoint(q, r), eps[r]);
  cr_assert_eq(q->nbuckets, p->nbuckets);
  for (size_t k = 0; k < p->nbuckets; k++) cr_assert_eq(q->buckets[k].source_rank, p->buckets[k].source_rank);
  bcast_plan_free(q);
  free(buf);
  /* Endpoints that do not match the sources are refused by name. */
  Rlorch__V1__BroadcastPlan *msg = NULL;
  cr_assert_eq(bcast_plan_to_pb(p, &msg, &err), BCAST_OK, "%s", err.msg);
  msg->n_source_endpoints = 3;
  cr_assert_eq(bcast_plan_from_pb(msg, &q, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "plan 'shard/step-1': 3 source endpoints for 4 source ranks");
  msg->n_source_endpoints = 4;
  msg->source_ranks = 5;
  msg->n_source_endpoints = 0;
  cr_assert_eq(bcast_plan_from_pb(msg, &q, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "plan 'shard/step-1': 5 sources but no source endpoints");
  msg->n_source_endpoints = 4;
  msg->source_ranks = 4;
  bcast_pb_free(&msg->base);
  bcast_plan_free(p);
  bcast_shard_map_free(map);
  model_free(&m);
}

/* Colocated mode takes several sources too (every trainer rank on the
 * receivers' GPU, writing its own slices): the same layout, validation and
 * source binding as host mode, no endpoints needed, and the plan survives
 * the protobuf form. The GPU writes themselves are tests/gpu's. */
Test(bcast_shard, colocated_plans_take_several_sources) {
  model m;
  model_init(&m, 4);
  bcast_shard_map *map = shard_map(&m);
  bcast_plan_opts o = {.id = "coloc/step-1", .mode = BCAST_MODE_COLOCATED, .staging_budget = 64 << 10,
                       .world_size = 4 + RECEIVERS};
  bcast_plan *p = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_build_sharded(map, &o, &p, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(bcast_plan_validate(p, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(bcast_plan_sources(p), 4);
  /* The host plan of the same map, bucket for bucket: only the mode differs. */
  const char *eps[4] = {"a:1", "b:2", "c:3", "d:4"};
  bcast_plan *h = sharded_plan(map, eps, 64 << 10, 0);
  cr_assert_eq(p->nbuckets, h->nbuckets);
  for (size_t k = 0; k < p->nbuckets; k++) {
    cr_assert_eq(p->buckets[k].source_rank, h->buckets[k].source_rank, "bucket %zu", k);
    cr_assert_eq(p->buckets[k].stage_rank, p->buckets[k].source_rank, "bucket %zu", k);
    cr_assert_eq(p->buckets[k].nslices, h->buckets[k].nslices, "bucket %zu", k);
  }
  cr_assert_neq(p->hash, h->hash, "the mode is covered by the hash");
  bcast_plan_free(h);
  /* Each source binds its own shards; another rank's shards are refused
   * naming the tensor and the ranges. */
  for (uint32_t r = 0; r < 4; r++)
    cr_assert_eq(bcast_plan_check_source(p, r, m.shard[r], m.nshard[r], &err), BCAST_OK, "rank %u: %s", r,
                 err.msg);
  cr_assert_eq(bcast_plan_check_source(p, 1, m.shard[0], m.nshard[0], &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "of source rank 1 carries elements"), "%s", err.msg);
  cr_assert_eq(bcast_plan_check_source(p, 4, m.shard[0], m.nshard[0], &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "plan 'coloc/step-1': rank 4 is not one of its 4 sources");
  /* Validation holds colocated plans to the host rules. */
  bcast_plan *q = bcast_plan_dup(p);
  q->buckets[1].source_rank = q->buckets[1].stage_rank = 4;
  cr_assert_eq(bcast_plan_validate(q, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "source rank 4, but the plan has 4 sources (ranks 0..3)"), "%s", err.msg);
  q->buckets[1].source_rank = 1;
  cr_assert_eq(bcast_plan_validate(q, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "stage rank 4 differs from its source rank 1"), "%s", err.msg);
  q->buckets[1].stage_rank = 1;
  q->nsources = 6;
  cr_assert_eq(bcast_plan_validate(q, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "plan 'coloc/step-1': 6 sources in a world of 6 leave no receiver");
  q->nsources = 4;
  q->mode = BCAST_MODE_DIRECT;
  cr_assert_eq(bcast_plan_validate(q, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "plan 'coloc/step-1': 4 sources in direct mode, which has one source");
  bcast_plan_free(q);
  o.mode = BCAST_MODE_STAGED;
  cr_assert_eq(bcast_plan_build_sharded(map, &o, &q, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "plan options: 4 source ranks: staged mode has one source; only host and colocated "
                   "mode send from several");
  /* Through the protobuf form, as the orchestrator sends it. */
  uint8_t *buf = NULL;
  size_t len = 0;
  cr_assert_eq(bcast_plan_pack(p, &buf, &len, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(bcast_plan_unpack(buf, len, &q, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(q->hash, p->hash);
  cr_assert_eq(q->mode, BCAST_MODE_COLOCATED);
  cr_assert_eq(q->nsources, 4);
  cr_assert_eq(bcast_plan_validate(q, &err), BCAST_OK, "%s", err.msg);
  bcast_plan_free(q);
  free(buf);
  /* An engine without a GPU refuses to run it, naming the mode, not the shards. */
  bcast_engine *e = engine(0, NULL, 5);
  cr_assert_neq(bcast_engine_execute(e, p, m.shard[0], m.nshard[0], NULL, &err), BCAST_OK);
  cr_assert(strstr(err.msg, "colocated mode") && !strstr(err.msg, "a shard"), "%s", err.msg);
  bcast_engine_free(e);
  bcast_plan_free(p);
  bcast_shard_map_free(map);
  model_free(&m);
}

/* ---- failures ---------------------------------------------------------------------------- */

/* A port nothing listens on. */
static void dead_endpoint(char *out, size_t len) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof a;
  cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &sl), 0);
  snprintf(out, len, "127.0.0.1:%u", ntohs(a.sin_port));
  close(fd);
}

Test(bcast_shard, a_source_never_started_fails_every_receiver_by_name_within_the_deadline) {
  world w;
  world_init(&w, 2, 0, 2.0);
  char dead[64];
  dead_endpoint(dead, sizeof dead);
  free(w.p->source_endpoints[1]);
  w.p->source_endpoints[1] = strdup(dead); /* not covered by the hash */
  run_all(&w, 1);                          /* source 1 never runs */
  char want[160];
  snprintf(want, sizeof want, "source rank 1: plan 'shard/step-1': root at %s not reachable before the deadline",
           dead);
  for (uint32_t i = 0; i < RECEIVERS; i++) {
    cr_assert_eq(w.rp[i].rc, BCAST_ETIMEDOUT, "receiver %u: %d %s", i, w.rp[i].rc, w.rp[i].err.msg);
    cr_assert(!strncmp(w.rp[i].err.msg, want, strlen(want)), "%s", w.rp[i].err.msg);
    cr_assert_lt(w.rp[i].seconds, 4.0, "receiver took %.2f s", w.rp[i].seconds);
  }
  /* Source 0 lost its receivers: a named failure, within its own bound. */
  cr_assert_neq(w.sp[0].rc, BCAST_OK);
  cr_assert(strstr(w.sp[0].err.msg, "receiver"), "%s", w.sp[0].err.msg);
  cr_assert_lt(w.sp[0].seconds, 6.0, "source 0 took %.2f s", w.sp[0].seconds);
  world_free(&w);
}

/* A fake source 1: proves itself to both receivers, sends half of its first
 * bucket, then closes both connections. */
typedef struct fake_source {
  int lfd;
  const bcast_plan *p;
  int ok;
} fake_source;

static void *fake_main(void *arg) {
  fake_source *f = arg;
  const bcast_plan *p = f->p;
  size_t k = 0;
  while (p->buckets[k].source_rank != 1) k++;
  int fds[RECEIVERS];
  f->ok = 1;
  for (int i = 0; i < RECEIVERS; i++) {
    fds[i] = accept(f->lfd, NULL, NULL);
    uint8_t nonce[BP_NONCE], hello[512];
    size_t hl = 0;
    memset(nonce, i + 1, sizeof nonce);
    if (fds[i] < 0 || bp_root_challenge(fds[i], nonce) || bp_root_read_hello(fds[i], hello, sizeof hello, &hl) ||
        bp_root_accept(fds[i], p, p->secret, nonce, hello))
      f->ok = 0;
  }
  uint8_t hdr[24], *half = calloc(1, p->buckets[k].bytes / 2);
  bp_put32(hdr, 0x4b424c52u);
  bp_put32(hdr + 4, (uint32_t)k);
  bp_put64(hdr + 8, p->buckets[k].bytes);
  bp_put64(hdr + 16, 0);
  for (int i = 0; i < RECEIVERS; i++) {
    if (send(fds[i], hdr, sizeof hdr, MSG_NOSIGNAL) != (ssize_t)sizeof hdr) f->ok = 0;
    if (send(fds[i], half, p->buckets[k].bytes / 2, MSG_NOSIGNAL) < 0) f->ok = 0;
  }
  usleep(100 * 1000);
  for (int i = 0; i < RECEIVERS; i++) close(fds[i]);
  free(half);
  return NULL;
}

Test(bcast_shard, a_source_that_closes_mid_plan_fails_every_receiver_by_name) {
  world w;
  world_init(&w, 2, 0, 10.0);
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof a;
  cr_assert_eq(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
  cr_assert_eq(listen(lfd, 8), 0);
  cr_assert_eq(getsockname(lfd, (struct sockaddr *)&a, &sl), 0);
  char ep[64];
  snprintf(ep, sizeof ep, "127.0.0.1:%u", ntohs(a.sin_port));
  free(w.p->source_endpoints[1]);
  w.p->source_endpoints[1] = strdup(ep);
  fake_source f = {.lfd = lfd, .p = w.p};
  pthread_t ft;
  cr_assert_eq(pthread_create(&ft, NULL, fake_main, &f), 0);
  double t0 = now_s();
  run_all(&w, 1);
  pthread_join(ft, NULL);
  double took = now_s() - t0;
  cr_assert(f.ok, "the fake source's handshakes failed");
  char want[160];
  snprintf(want, sizeof want, "source rank 1: root %s: bucket ", ep);
  for (uint32_t i = 0; i < RECEIVERS; i++) {
    cr_assert_eq(w.rp[i].rc, BCAST_EPEER, "receiver %u: %d %s", i, w.rp[i].rc, w.rp[i].err.msg);
    cr_assert(!strncmp(w.rp[i].err.msg, want, strlen(want)), "%s", w.rp[i].err.msg);
    cr_assert(strstr(w.rp[i].err.msg, "not received: connection closed"), "%s", w.rp[i].err.msg);
  }
  cr_assert_neq(w.sp[0].rc, BCAST_OK, "source 0 cannot have finished: its receivers left");
  cr_assert_lt(took, 8.0, "took %.2f s", took);
  close(lfd);
  world_free(&w);
}

/* Cancel on a receiver ends its every stream at once; the sources then see
 * it leave and fail, long before their deadlines. */
Test(bcast_shard, cancel_ends_every_stream_at_once) {
  world w;
  world_init(&w, 2, 0, 30.0); /* no source runs: the receivers wait to connect */
  for (uint32_t i = 0; i < RECEIVERS; i++) part_start(&w.rp[i]);
  usleep(300 * 1000);
  double t0 = now_s();
  for (uint32_t i = 0; i < RECEIVERS; i++) cr_assert_eq(bcast_engine_cancel(w.rx[i], w.p->id), BCAST_OK);
  for (uint32_t i = 0; i < RECEIVERS; i++) part_join(&w.rp[i]);
  double took = now_s() - t0;
  for (uint32_t i = 0; i < RECEIVERS; i++) {
    cr_assert_eq(w.rp[i].rc, BCAST_ECANCELED, "receiver %u: %d %s", i, w.rp[i].rc, w.rp[i].err.msg);
    cr_assert_str_eq(w.rp[i].err.msg, "plan 'shard/step-1': cancelled while receiving from 2 sources");
  }
  cr_assert_lt(took, 2.0, "cancel took %.2f s", took);
  world_free(&w);
}

/* ---- wrong local tensors ------------------------------------------------------------------- */

Test(bcast_shard, local_tensors_that_do_not_fit_the_plan_are_refused_by_name) {
  world w;
  world_init(&w, 2, 0, 2.0);
  bcast_err err = {0};
  /* Each source's own shards fit the plan; another's do not. */
  for (uint32_t r = 0; r < 2; r++)
    cr_assert_eq(bcast_plan_check_source(w.p, r, w.m.shard[r], w.m.nshard[r], &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(bcast_plan_check_source(w.p, 1, w.m.shard[0], w.m.nshard[0], &err), BCAST_EINVAL);
  cr_assert_eq(bcast_plan_check_source(w.p, 2, w.m.shard[0], w.m.nshard[0], &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "plan 'shard/step-1': rank 2 is not one of its 2 sources");
  /* Source 1 claims rank 0's piece of "embed". */
  bcast_tensor wrong[NT];
  memcpy(wrong, w.m.shard[1], w.m.nshard[1] * sizeof *wrong);
  for (size_t i = 0; i < w.m.nshard[1]; i++)
    if (!strcmp(wrong[i].name, "embed")) wrong[i].shard_offset = 0;
  cr_assert_eq(bcast_engine_execute(w.src[1], w.p, wrong, w.m.nshard[1], NULL, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "tensor 'embed': bucket ") && strstr(err.msg, "of source rank 1 carries elements"),
            "%s", err.msg);
  /* A receiver holding a shard. */
  bcast_tensor rx[NT];
  memcpy(rx, w.dst[0], w.m.n * sizeof *rx);
  rx[0].shard_offset = 0;
  rx[0].shard_elems = 10;
  cr_assert_eq(bcast_engine_execute(w.rx[0], w.p, rx, w.m.n, NULL, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "the local tensor is a shard (elements [0, +10) of") &&
            strstr(err.msg, "receivers hold whole tensors"), "%s", err.msg);
  /* The GPU modes have one source: a plan of several is refused naming the mode. */
  bcast_plan *staged = bcast_plan_dup(w.p);
  staged->mode = BCAST_MODE_STAGED;
  staged->hash = bcast_plan_hash(staged);
  cr_assert_eq(bcast_engine_execute(w.rx[0], staged, w.dst[0], w.m.n, NULL, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "plan 'shard/step-1': 2 sources in staged mode, which has one source");
  bcast_plan_free(staged);
  /* A source missing a tensor it holds part of. */
  cr_assert_eq(bcast_engine_execute(w.src[1], w.p, w.m.shard[1], 1, NULL, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "in the plan but missing from the local tensors"), "%s", err.msg);
  world_free(&w);
}

/* ---- receiver views: receivers that hold part of the model -------------------------- */

#define VRX 4 /* a whole receiver, a tensor-parallel pair, an expert-parallel one */

static bcast_part slice_of(uint32_t dim, uint64_t start, uint64_t count) {
  return (bcast_part){.kind = BCAST_PART_SLICE, .dim = dim, .start = start, .count = count};
}

/* What each view receiver asks for (see model_init's tensors): the TP pair
 * cuts embed by rows and l1.flat and l2.norm by columns, unevenly, and
 * keeps the rest whole; the EP receiver holds none of l1.attn and l1.ids
 * and rows [5, 12) of l2.bf. */
static const bcast_part_spec TP0[] = {{"embed", {BCAST_PART_SLICE, 0, 0, 151}},
                                      {"l1.flat", {BCAST_PART_SLICE, 1, 0, 33}},
                                      {"l2.norm", {BCAST_PART_SLICE, 1, 0, 500}}};
static const bcast_part_spec TP1[] = {{"embed", {BCAST_PART_SLICE, 0, 151, 149}},
                                      {"l1.flat", {BCAST_PART_SLICE, 1, 33, 32}},
                                      {"l2.norm", {BCAST_PART_SLICE, 1, 500, 499}}};
static const bcast_part_spec EP[] = {{"l1.attn", {BCAST_PART_NONE, 0, 0, 0}},
                                     {"l1.ids", {BCAST_PART_NONE, 0, 0, 0}},
                                     {"l2.bf", {BCAST_PART_SLICE, 0, 5, 7}}};

static void views_for(uint32_t ns, bcast_receiver_view *rv) {
  memset(rv, 0, (ns + VRX) * sizeof *rv);
  rv[ns + 1] = (bcast_receiver_view){TP0, 3};
  rv[ns + 2] = (bcast_receiver_view){TP1, 3};
  rv[ns + 3] = (bcast_receiver_view){EP, 3};
}

static bcast_plan *view_plan(const bcast_shard_map *map, const char *const *eps, const bcast_receiver_view *rv,
                             bcast_mode mode, bcast_err *err) {
  bcast_plan_opts o = {.id = "views/step-1", .mode = mode, .staging_budget = 64 << 10,
                       .world_size = map->nranks + VRX, .root_rank = 0, .source_endpoints = eps,
                       .receiver_views = rv};
  bcast_plan *p = NULL;
  if (bcast_plan_build_sharded(map, &o, &p, err) != BCAST_OK) return NULL;
  return p;
}

/* The part's elements of a 2-D tensor's reference bytes (2 per element),
 * written out by index: rows [s, s + c) for dim 0, columns for dim 1. */
static void *expected_part(const bcast_tensor *full, const bcast_part *pt, uint64_t *elems) {
  uint16_t *ref = bp_reference(full);
  uint64_t rows = full->shape[0], cols = full->shape[1];
  if (pt->kind == BCAST_PART_WHOLE) {
    *elems = rows * cols;
    return ref;
  }
  uint64_t r0 = pt->dim == 0 ? pt->start : 0, nr = pt->dim == 0 ? pt->count : rows;
  uint64_t c0 = pt->dim == 1 ? pt->start : 0, nc = pt->dim == 1 ? pt->count : cols;
  uint16_t *out = malloc(nr * nc * 2);
  for (uint64_t r = 0; r < nr; r++)
    for (uint64_t c = 0; c < nc; c++) out[r * nc + c] = ref[(r0 + r) * cols + c0 + c];
  free(ref);
  *elems = nr * nc;
  return out;
}

/* A receiver's local tensors for its view: its parts, dense, full shapes. */
static size_t view_tensors(const model *m, const bcast_plan *p, uint32_t rank, bcast_tensor *dst) {
  size_t k = 0;
  for (size_t i = 0; i < m->n; i++) {
    size_t pi = 0;
    while (strcmp(p->tensors[pi].name, m->full[i].name)) pi++;
    const bcast_part *pt = bcast_plan_part(p, rank, pi);
    if (pt->kind == BCAST_PART_NONE) continue;
    dst[k] = m->full[i];
    dst[k].part = *pt;
    dst[k].data = calloc(bcast_part_elems(&m->full[i], pt), 2);
    k++;
  }
  return k;
}

static void run_views(uint32_t ns) {
  model m;
  model_init(&m, ns);
  bcast_shard_map *map = shard_map(&m);
  bcast_engine *src[MAXS], *rx[VRX];
  const char *eps[MAXS];
  for (uint32_t r = 0; r < ns; r++) {
    src[r] = engine(r, "127.0.0.1:0", 20);
    eps[r] = bcast_engine_data_address(src[r]);
  }
  bcast_receiver_view rv[MAXS + VRX];
  views_for(ns, rv);
  bcast_err err = {0};
  bcast_plan *p = view_plan(map, eps, rv, BCAST_MODE_HOST, &err);
  cr_assert_not_null(p, "%s", err.msg);
  cr_assert_eq(p->nviews, 3, "the TP pair and the EP receiver: three views");
  cr_assert_eq(bcast_plan_rank_view(p, ns), BCAST_VIEW_WHOLE);
  for (uint32_t r = 0; r < ns; r++) cr_assert_eq(bcast_plan_rank_view(p, r), BCAST_VIEW_WHOLE);
  for (uint32_t i = 1; i < VRX; i++) cr_assert_eq(bcast_plan_rank_view(p, ns + i), i - 1);
  cr_assert_eq(bcast_plan_validate(p, &err), BCAST_OK, "%s", err.msg);
  part sp[MAXS], rp[VRX];
  bcast_tensor dst[VRX][NT];
  size_t nd[VRX];
  for (uint32_t i = 0; i < VRX; i++) {
    rx[i] = engine(ns + i, NULL, 20);
    nd[i] = view_tensors(&m, p, ns + i, dst[i]);
    cr_assert_eq(bcast_plan_check_receiver(p, ns + i, dst[i], nd[i], &err), BCAST_OK, "%s", err.msg);
    rp[i] = (part){.e = rx[i], .p = p, .local = dst[i], .n = nd[i]};
  }
  cr_assert_eq(nd[3], NT - 2, "the EP receiver holds two tensors fewer");
  for (uint32_t r = 0; r < ns; r++) sp[r] = (part){.e = src[r], .p = p, .local = m.shard[r], .n = m.nshard[r]};
  for (uint32_t r = 0; r < ns; r++) part_start(&sp[r]);
  for (uint32_t i = 0; i < VRX; i++) part_start(&rp[i]);
  for (uint32_t r = 0; r < ns; r++) part_join(&sp[r]);
  for (uint32_t i = 0; i < VRX; i++) part_join(&rp[i]);
  for (uint32_t r = 0; r < ns; r++) cr_assert_eq(sp[r].rc, BCAST_OK, "source %u: %s", r, sp[r].err.msg);
  for (uint32_t i = 0; i < VRX; i++) {
    cr_assert_eq(rp[i].rc, BCAST_OK, "receiver %u: %s", ns + i, rp[i].err.msg);
    uint32_t v = bcast_plan_rank_view(p, ns + i);
    /* What it got over the wire is its view's bytes. */
    uint64_t want = v == BCAST_VIEW_WHOLE ? bcast_plan_wire_bytes(p) : bcast_plan_view_bytes(p, v, UINT32_MAX);
    cr_assert_eq(rp[i].st.wire_bytes, want, "receiver %u", ns + i);
    if (v != BCAST_VIEW_WHOLE) cr_assert_lt(want, bcast_plan_wire_bytes(p), "receiver %u gets less", ns + i);
    /* Every part it holds is that part of the full tensor's cast. */
    for (size_t k = 0; k < nd[i]; k++) {
      const bcast_tensor *full = NULL;
      for (size_t t = 0; t < m.n; t++)
        if (!strcmp(m.full[t].name, dst[i][k].name)) full = &m.full[t];
      uint64_t elems = 0;
      void *exp = expected_part(full, &dst[i][k].part, &elems);
      cr_assert_eq(elems, bcast_part_elems(full, &dst[i][k].part));
      cr_assert_eq(memcmp(exp, dst[i][k].data, elems * 2), 0, "receiver %u: tensor %s", ns + i, full->name);
      free(exp);
    }
    /* Each source's sum for the receiver's view equals the receiver's own. */
    for (uint32_t r = 0; r < ns; r++) {
      uint64_t mine = 0, theirs = 0;
      cr_assert_eq(bcast_plan_view_checksum(p, r, v, m.shard[r], m.nshard[r], 0, &mine, &err), BCAST_OK, "%s",
                   err.msg);
      cr_assert_eq(bcast_plan_view_checksum(p, r, v, dst[i], nd[i], 1, &theirs, &err), BCAST_OK, "%s", err.msg);
      cr_assert_eq(mine, theirs, "receiver %u, source %u", ns + i, r);
      if (v != BCAST_VIEW_WHOLE) {
        uint64_t whole = 0;
        cr_assert_eq(bcast_plan_source_checksum(p, r, m.shard[r], m.nshard[r], 0, &whole, &err), BCAST_OK);
        cr_assert_neq(whole, mine, "a view's sum is not the whole one's");
      }
    }
  }
  /* A TP receiver's element changed: its sum no longer matches. */
  uint64_t before = 0, after = 0;
  uint32_t v1 = bcast_plan_rank_view(p, ns + 1);
  for (uint32_t r = 0; r < ns; r++) {
    cr_assert_eq(bcast_plan_view_checksum(p, r, v1, dst[1], nd[1], 1, &before, &err), BCAST_OK);
    ((uint16_t *)dst[1][0].data)[0] ^= 1;
    cr_assert_eq(bcast_plan_view_checksum(p, r, v1, dst[1], nd[1], 1, &after, &err), BCAST_OK);
    ((uint16_t *)dst[1][0].data)[0] ^= 1;
    if (before != after) break;
  }
  cr_assert_neq(before, after, "some source's sum covers the changed element");
  for (uint32_t r = 0; r < ns; r++) {
    bcast_stats_free(&sp[r].st);
    bcast_engine_free(src[r]);
  }
  for (uint32_t i = 0; i < VRX; i++) {
    bcast_stats_free(&rp[i].st);
    bcast_engine_free(rx[i]);
    for (size_t k = 0; k < nd[i]; k++) free(dst[i][k].data);
  }
  bcast_plan_free(p);
  bcast_shard_map_free(map);
  model_free(&m);
}

Test(bcast_shard, views_one_source_each_receiver_gets_its_parts) { run_views(1); }
Test(bcast_shard, views_two_sources_each_receiver_gets_its_parts) { run_views(2); }

static void view_refused(const bcast_shard_map *map, const char *const *eps, bcast_receiver_view *rv,
                         bcast_mode mode, const char *want) {
  bcast_err err = {0};
  bcast_plan *p = view_plan(map, eps, rv, mode, &err);
  cr_assert_null(p, "refused: %s", want);
  cr_assert_eq(err.code, BCAST_EINVAL);
  cr_assert(strstr(err.msg, want), "'%s' has no '%s'", err.msg, want);
}

Test(bcast_shard, bad_views_are_refused_naming_rank_tensor_and_field) {
  model m;
  model_init(&m, 2);
  bcast_shard_map *map = shard_map(&m);
  const char *eps[2] = {"10.0.0.1:1", "10.0.0.2:2"};
  bcast_receiver_view rv[2 + VRX];
  bcast_part_spec one[2];
  memset(rv, 0, sizeof rv);
  rv[3] = (bcast_receiver_view){one, 1};
  one[0] = (bcast_part_spec){"nope", slice_of(0, 0, 1)};
  view_refused(map, eps, rv, BCAST_MODE_HOST, "rank 3: tensor 'nope' is not in the plan");
  one[0] = (bcast_part_spec){"embed", slice_of(2, 0, 1)};
  view_refused(map, eps, rv, BCAST_MODE_HOST, "rank 3: tensor 'embed': part dim 2, the tensor has 2 dimensions");
  one[0] = (bcast_part_spec){"embed", slice_of(0, 3, 0)};
  view_refused(map, eps, rv, BCAST_MODE_HOST, "rank 3: tensor 'embed': part count 0");
  one[0] = (bcast_part_spec){"embed", slice_of(0, 290, 11)};
  view_refused(map, eps, rv, BCAST_MODE_HOST, "tensor 'embed': part [290, 301) along dim 0 is past its 300");
  one[0] = (bcast_part_spec){"embed", {.kind = 9}};
  view_refused(map, eps, rv, BCAST_MODE_HOST, "tensor 'embed': unknown part kind 9");
  one[0] = (bcast_part_spec){"embed", slice_of(0, 0, 1)};
  one[1] = one[0];
  rv[3].nparts = 2;
  view_refused(map, eps, rv, BCAST_MODE_HOST, "rank 3: tensor 'embed' is listed twice");
  rv[3].nparts = 1;
  view_refused(map, eps, rv, BCAST_MODE_COLOCATED, "colocated mode moves whole buckets");
  /* A source holds its tensors whole. */
  rv[3] = (bcast_receiver_view){0};
  rv[1] = (bcast_receiver_view){one, 1};
  view_refused(map, eps, rv, BCAST_MODE_HOST, "rank 1 is a source");
  rv[1] = (bcast_receiver_view){0};
  /* A view of nothing. */
  bcast_part_spec none[NT];
  for (size_t i = 0; i < m.n; i++) none[i] = (bcast_part_spec){m.full[i].name, {.kind = BCAST_PART_NONE}};
  rv[4] = (bcast_receiver_view){none, m.n};
  view_refused(map, eps, rv, BCAST_MODE_HOST, "rank 4: every tensor is NONE");
  bcast_shard_map_free(map);
  model_free(&m);
}

Test(bcast_shard, views_are_hashed_encoded_and_checked) {
  model m;
  model_init(&m, 2);
  bcast_shard_map *map = shard_map(&m);
  const char *eps[2] = {"10.0.0.1:1", "10.0.0.2:2"};
  uint8_t secret[BCAST_SECRET_BYTES] = {1};
  bcast_receiver_view rv[2 + VRX];
  bcast_err err = {0};
  bcast_plan_opts o = {.id = "views/step-1", .mode = BCAST_MODE_HOST, .staging_budget = 64 << 10,
                       .world_size = 2 + VRX, .source_endpoints = eps, .secret = secret};
  bcast_plan *none = NULL, *empty = NULL, *with = NULL, *other = NULL;
  cr_assert_eq(bcast_plan_build_sharded(map, &o, &none, &err), BCAST_OK, "%s", err.msg);
  /* Receivers that ask for nothing, or for whole tensors, are no view. */
  memset(rv, 0, sizeof rv);
  bcast_part_spec whole[] = {{"embed", slice_of(0, 0, 300)}, {"l1.ids", {.kind = BCAST_PART_WHOLE}}};
  rv[3] = (bcast_receiver_view){whole, 2};
  o.receiver_views = rv;
  cr_assert_eq(bcast_plan_build_sharded(map, &o, &empty, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(empty->nviews, 0);
  cr_assert_eq(empty->hash, none->hash, "a plan of whole receivers hashes as before");
  views_for(2, rv);
  cr_assert_eq(bcast_plan_build_sharded(map, &o, &with, &err), BCAST_OK, "%s", err.msg);
  cr_assert_neq(with->hash, none->hash);
  cr_assert_eq(with->nbuckets, none->nbuckets, "views change what each receiver gets, not the buckets");
  /* Two receivers asking the same get the same view. */
  rv[5] = rv[4];
  cr_assert_eq(bcast_plan_build_sharded(map, &o, &other, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(other->nviews, 2);
  cr_assert_eq(other->rank_view[5], other->rank_view[4]);
  cr_assert_neq(other->hash, with->hash, "the assignment is covered");
  bcast_plan_free(other);
  /* The protobuf form keeps them, hash for hash. */
  uint8_t *buf = NULL;
  size_t len = 0;
  cr_assert_eq(bcast_plan_pack(with, &buf, &len, &err), BCAST_OK, "%s", err.msg);
  bcast_plan *q = NULL;
  cr_assert_eq(bcast_plan_unpack(buf, len, &q, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(q->hash, with->hash);
  cr_assert_eq(q->nviews, 3);
  cr_assert_eq(memcmp(q->view_parts, with->view_parts, 3 * q->ntensors * sizeof *q->view_parts), 0);
  bcast_plan *d = bcast_plan_dup(q);
  cr_assert_not_null(d);
  cr_assert_eq(bcast_plan_hash(d), with->hash);
  bcast_plan_free(d);
  free(buf);
  /* A received plan whose views are inconsistent is refused by name. */
  Rlorch__V1__BroadcastPlan *msg = NULL;
  cr_assert_eq(bcast_plan_to_pb(with, &msg, &err), BCAST_OK, "%s", err.msg);
  msg->n_rank_views = 3;
  cr_assert_eq(bcast_plan_from_pb(msg, &other, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "3 views and 3 rank_views for 6 ranks"), "%s", err.msg);
  msg->n_rank_views = 6;
  msg->rank_views[0] = 1;
  cr_assert_eq(bcast_plan_from_pb(msg, &other, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "source rank 0 has view 1"), "%s", err.msg);
  msg->rank_views[0] = BCAST_VIEW_WHOLE;
  msg->views[0]->parts[0]->tensor = 99;
  cr_assert_eq(bcast_plan_from_pb(msg, &other, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "views[0].parts[0].tensor 99"), "%s", err.msg);
  bcast_pb_free(&msg->base);
  /* A receiver's local part that is not its view's is refused by name. */
  bcast_tensor dst[NT];
  size_t nd = view_tensors(&m, with, 3, dst);
  cr_assert_eq(bcast_plan_check_receiver(with, 3, dst, nd, &err), BCAST_OK, "%s", err.msg);
  dst[0].part.start++;
  cr_assert_eq(bcast_plan_check_receiver(with, 3, dst, nd, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "the plan gives rank 3"), "%s", err.msg);
  dst[0].part.start--;
  cr_assert_eq(bcast_plan_check_receiver(with, 2, dst, nd, &err), BCAST_EINVAL, "another rank's view");
  for (size_t k = 0; k < nd; k++) free(dst[k].data);
  bcast_plan_free(q);
  bcast_plan_free(with);
  bcast_plan_free(empty);
  bcast_plan_free(none);
  bcast_shard_map_free(map);
  model_free(&m);
}
