/* The host transport's data channel admits only holders of the plan's secret.
 *
 * What a stranger on the root's port could do before: a 36-byte hello with
 * the (predictable) plan id and hash received the weights; a hello for
 * another step failed the plan and its reply named the root's plan id and
 * hash; six silent connections held the broadcast for 30 s. Each test here
 * plays one of those against a root serving a real receiver: the stranger
 * gets nothing but the challenge, and the broadcast succeeds, on time. */
#include <criterion/criterion.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/unit/bcast_peer.h"
#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_internal.h"

#define SLOW_S 30.0 /* every engine's own timeout: a test that waits for it has failed */

typedef struct fixture {
  bcast_tensor src[1], dst[1];
  bcast_engine *root, *rx;
  bcast_plan *p;
} fixture;

static void fixture_init_tls(fixture *f, const char *plan_id, int tls) {
  memset(f, 0, sizeof *f);
  bcast_tensor *t = &f->src[0];
  snprintf(t->name, sizeof t->name, "w");
  t->storage_dtype = BCAST_DTYPE_FP32;
  t->wire_dtype = BCAST_DTYPE_BF16;
  t->ndim = 2;
  t->shape[0] = 512;
  t->shape[1] = 256;
  t->residency = BCAST_RES_HOST_PAGEABLE;
  t->data = malloc(512 * 256 * sizeof(float));
  for (size_t i = 0; i < 512 * 256; i++) ((float *)t->data)[i] = (float)i * 0.5f;
  f->dst[0] = *t;
  f->dst[0].data = calloc(512 * 256, 2);
  bcast_engine_opts ro = {.rank = 0, .device = -1, .timeout_s = SLOW_S, .host_listen = "127.0.0.1:0"};
  bcast_engine_opts xo = {.rank = 1, .device = -1, .timeout_s = SLOW_S};
  bcast_err err = {0};
  cr_assert_eq(bcast_engine_new(&ro, &f->root, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(bcast_engine_new(&xo, &f->rx, &err), BCAST_OK, "%s", err.msg);
  bcast_plan_opts o = {.id = plan_id, .mode = BCAST_MODE_HOST, .staging_budget = 64 << 10, .world_size = 2,
                       .root_rank = 0, .host_endpoint = bcast_engine_data_address(f->root), .tls = tls};
  cr_assert_eq(bcast_plan_build(f->src, 1, &o, &f->p, &err), BCAST_OK, "%s", err.msg);
}

static void fixture_init(fixture *f, const char *plan_id) { fixture_init_tls(f, plan_id, 0); }

static void fixture_free(fixture *f) {
  bcast_plan_free(f->p);
  bcast_engine_free(f->rx);
  bcast_engine_free(f->root);
  free(f->src[0].data);
  free(f->dst[0].data);
}

/* One execution on its own thread, as an agent's command thread runs it. */
typedef struct job {
  bcast_engine *e;
  const bcast_plan *p;
  bcast_tensor *local;
  int rc;
  double seconds;
  uint32_t refused;
  bcast_err err;
  pthread_t tid;
} job;

static void *job_main(void *arg) {
  job *j = arg;
  bcast_stats st;
  double t0 = bcast__now();
  j->rc = bcast_engine_execute(j->e, j->p, j->local, 1, &st, &j->err);
  j->seconds = bcast__now() - t0;
  j->refused = st.refused_connections;
  bcast_stats_free(&st);
  return NULL;
}

static void job_start(job *j, bcast_engine *e, const bcast_plan *p, bcast_tensor *local) {
  memset(j, 0, sizeof *j);
  j->e = e, j->p = p, j->local = local;
  cr_assert_eq(pthread_create(&j->tid, NULL, job_main, j), 0);
}

static void job_join(job *j) { cr_assert_eq(pthread_join(j->tid, NULL), 0); }

/* The receiver got the root's weights, bit for bit. */
static void assert_received(const fixture *f) {
  const float *s = f->src[0].data;
  const uint16_t *d = f->dst[0].data;
  for (size_t i = 0; i < 512 * 256; i++)
    cr_assert_eq(d[i], bcast_f32_to_bf16(s[i]), "element %zu", i);
}

/* Nothing the stranger read after the challenge, and nothing at all that
 * names the plan: not its id, not its hash. */
static void assert_nothing_leaked(const bcast_plan *p, const uint8_t *got, size_t n) {
  cr_assert_eq(n, 0, "the root sent %zu bytes after the challenge", n);
  (void)got;
  (void)p;
}

static int contains(const uint8_t *hay, size_t n, const void *needle, size_t m) {
  for (size_t i = 0; i + m <= n; i++)
    if (!memcmp(hay + i, needle, m)) return 1;
  return 0;
}

Test(bcast_auth, strangers_get_nothing_and_the_broadcast_succeeds) {
  fixture f;
  fixture_init(&f, "run-1/step-5");
  job jr;
  job_start(&jr, f.root, f.p, f.src);
  const char *addr = bcast_engine_data_address(f.root);
  uint8_t nonce[BP_NONCE], rx_nonce[BP_NONCE], h[256], got[1 << 16];
  uint8_t wrong[32];
  memset(wrong, 0x5a, sizeof wrong);

  /* 1. Everything right but the proof: a guessed secret. */
  int fd = bp_dial(addr);
  cr_assert_geq(fd, 0);
  cr_assert_eq(bp_challenge(fd, nonce), 0);
  size_t n = bp_hello(h, f.p, 1, wrong, nonce, rx_nonce);
  cr_assert_eq(send(fd, h, n, 0), (ssize_t)n);
  size_t k = bp_read_to_end(fd, got, sizeof got);
  assert_nothing_leaked(f.p, got, k);
  close(fd);

  /* 2. The old attack: a version-1 hello, 24 bytes + "run-1/step-5" = 36,
   * carrying the plan's id and hash as they were predictable. */
  fd = bp_dial(addr);
  uint8_t c[BP_CHALLENGE];
  cr_assert_eq(bp_read(fd, c, sizeof c), 0);
  cr_assert(!contains(c, sizeof c, f.p->id, strlen(f.p->id)), "the challenge names the plan");
  uint8_t old[24 + 128];
  size_t idlen = strlen(f.p->id);
  bp_put32(old, 0x48424c52u);
  bp_put32(old + 4, 1);
  bp_put32(old + 8, 1);
  bp_put32(old + 12, (uint32_t)idlen);
  bp_put64(old + 16, f.p->hash);
  memcpy(old + 24, f.p->id, idlen);
  cr_assert_eq(24 + idlen, 36);
  cr_assert_eq(send(fd, old, 24 + idlen, 0), (ssize_t)(24 + idlen));
  k = bp_read_to_end(fd, got, sizeof got);
  assert_nothing_leaked(f.p, got, k);
  close(fd);

  /* 3. A hello for another step, with that step's own valid proof: the
   * reply that once failed the plan and named its id and hash. */
  bcast_plan *other = bcast_plan_dup(f.p);
  snprintf(other->id, sizeof other->id, "run-1/step-4");
  other->hash = bcast_plan_hash(other);
  fd = bp_dial(addr);
  cr_assert_eq(bp_challenge(fd, nonce), 0);
  n = bp_hello(h, other, 1, other->secret, nonce, rx_nonce);
  cr_assert_eq(send(fd, h, n, 0), (ssize_t)n);
  k = bp_read_to_end(fd, got, sizeof got);
  assert_nothing_leaked(f.p, got, k);
  uint8_t hash[8];
  bp_put64(hash, f.p->hash);
  cr_assert(!contains(got, k, hash, sizeof hash) && !contains(got, k, f.p->id, strlen(f.p->id)));
  close(fd);
  bcast_plan_free(other);

  /* 4. Garbage. */
  fd = bp_dial(addr);
  cr_assert_eq(bp_challenge(fd, nonce), 0);
  memset(h, 0xff, 120);
  cr_assert_eq(send(fd, h, 120, 0), 120);
  k = bp_read_to_end(fd, got, sizeof got);
  assert_nothing_leaked(f.p, got, k);
  close(fd);

  /* The root is still waiting for its receiver, which gets the weights. */
  job jx;
  job_start(&jx, f.rx, f.p, f.dst);
  job_join(&jx);
  job_join(&jr);
  cr_assert_eq(jr.rc, BCAST_OK, "root: %s", jr.err.msg);
  cr_assert_eq(jx.rc, BCAST_OK, "receiver: %s", jx.err.msg);
  cr_assert_eq(jr.refused, 4, "refused %u", jr.refused);
  assert_received(&f);
  fixture_free(&f);
}

/* A hello recorded from a real receiver is valid for the nonce it answered
 * only: replayed on a new connection (a fresh nonce) it gets nothing. The
 * recording: the receiver is pointed at a fake root (the plan's endpoint is
 * not covered by the hash, so its hello is the one it would send the real
 * root, for the fake root's nonce). */
Test(bcast_auth, a_replayed_handshake_is_refused) {
  fixture f;
  fixture_init(&f, "run-2/step-0");
  int lfd = -1;
  char fake[96];
  bcast_err err = {0};
  cr_assert_eq(bcast__host_listen("127.0.0.1:0", &lfd, fake, sizeof fake, &err), BCAST_OK, "%s", err.msg);
  bcast_plan *lure = bcast_plan_dup(f.p);
  snprintf(lure->host_endpoint, sizeof lure->host_endpoint, "%s", fake);
  cr_assert_eq(bcast_plan_hash(lure), f.p->hash);
  job jx;
  job_start(&jx, f.rx, lure, f.dst);
  int fd = -1;
  for (int i = 0; i < 500 && fd < 0; i++) {
    fd = accept(lfd, NULL, NULL);
    if (fd < 0) usleep(10000);
  }
  cr_assert_geq(fd, 0);
  uint8_t n1[BP_NONCE], rec[256];
  size_t reclen = 0;
  memset(n1, 0x11, sizeof n1);
  cr_assert_eq(bp_root_challenge(fd, n1), 0);
  cr_assert_eq(bp_root_read_hello(fd, rec, sizeof rec, &reclen), 0);
  close(fd); /* the recorder gives the receiver nothing */
  job_join(&jx);
  cr_assert_neq(jx.rc, BCAST_OK);
  close(lfd);

  job jr;
  job_start(&jr, f.root, f.p, f.src);
  int rp = bp_dial(bcast_engine_data_address(f.root));
  uint8_t n2[BP_NONCE], got[4096];
  cr_assert_eq(bp_challenge(rp, n2), 0);
  cr_assert_neq(memcmp(n1, n2, sizeof n1), 0);
  cr_assert_eq(send(rp, rec, reclen, 0), (ssize_t)reclen);
  cr_assert_eq(bp_read_to_end(rp, got, sizeof got), 0, "the replay got a reply");
  close(rp);
  /* Two connections never get the same nonce. */
  int a = bp_dial(bcast_engine_data_address(f.root)), b = bp_dial(bcast_engine_data_address(f.root));
  uint8_t na[BP_NONCE], nb[BP_NONCE];
  cr_assert_eq(bp_challenge(a, na), 0);
  cr_assert_eq(bp_challenge(b, nb), 0);
  cr_assert_neq(memcmp(na, nb, sizeof na), 0);
  close(a);
  close(b);

  job_start(&jx, f.rx, f.p, f.dst);
  job_join(&jx);
  job_join(&jr);
  cr_assert_eq(jr.rc, BCAST_OK, "root: %s", jr.err.msg);
  cr_assert_eq(jx.rc, BCAST_OK, "receiver: %s", jx.err.msg);
  cr_assert_eq(jr.refused, 3);
  assert_received(&f);
  bcast_plan_free(lure);
  fixture_free(&f);
}

/* Six connections that say nothing, open before the plan starts: every
 * handshake runs at once, so the broadcast is not delayed by them (it once
 * waited 5 s for each in turn); the root closes them at the handshake bound
 * at the latest. */
Test(bcast_auth, silent_connections_do_not_delay_the_broadcast) {
  fixture f;
  fixture_init(&f, "run-3/step-1");
  int silent[6];
  for (int i = 0; i < 6; i++) cr_assert_geq(silent[i] = bp_dial(bcast_engine_data_address(f.root)), 0);
  job jr, jx;
  job_start(&jr, f.root, f.p, f.src);
  usleep(100 * 1000);
  double t0 = bcast__now();
  job_start(&jx, f.rx, f.p, f.dst);
  job_join(&jx);
  job_join(&jr);
  double dt = bcast__now() - t0;
  cr_assert_eq(jr.rc, BCAST_OK, "root: %s", jr.err.msg);
  cr_assert_eq(jx.rc, BCAST_OK, "receiver: %s", jx.err.msg);
  cr_assert_lt(dt, 1.0, "the receiver waited %.2f s behind silent connections", dt);
  cr_assert_lt(jr.seconds, 2.0, "the root took %.2f s", jr.seconds);
  cr_assert_eq(jr.refused, 6);
  for (int i = 0; i < 6; i++) {
    uint8_t got[256];
    cr_assert_eq(bp_read_to_end(silent[i], got, sizeof got), BP_CHALLENGE, "only the challenge");
    close(silent[i]);
  }
  assert_received(&f);
  fixture_free(&f);
}

/* A silent connection during a plan whose receiver is late is closed at the
 * handshake bound (2 s), not held for the plan's duration. */
Test(bcast_auth, a_silent_connection_is_closed_at_the_handshake_bound) {
  fixture f;
  fixture_init(&f, "run-3/step-2");
  job jr, jx;
  job_start(&jr, f.root, f.p, f.src);
  int fd = bp_dial(bcast_engine_data_address(f.root));
  double t0 = bcast__now();
  uint8_t got[256];
  cr_assert_eq(bp_read_to_end(fd, got, sizeof got), BP_CHALLENGE);
  double dt = bcast__now() - t0;
  cr_assert(dt > 1.5 && dt < 3.0, "closed after %.2f s", dt);
  close(fd);
  job_start(&jx, f.rx, f.p, f.dst);
  job_join(&jx);
  job_join(&jr);
  cr_assert_eq(jr.rc, BCAST_OK, "root: %s", jr.err.msg);
  cr_assert_eq(jx.rc, BCAST_OK, "receiver: %s", jx.err.msg);
  fixture_free(&f);
}

/* More unauthenticated connections than the root keeps open at once: the
 * oldest are shed, memory stays bounded, and the receiver still gets in. */
Test(bcast_auth, a_flood_of_connections_is_bounded_and_the_receiver_gets_in) {
  fixture f;
  fixture_init(&f, "run-4/step-0");
  enum { FLOOD = 100 };
  int fds[FLOOD];
  job jr, jx;
  job_start(&jr, f.root, f.p, f.src);
  for (int i = 0; i < FLOOD; i++) cr_assert_geq(fds[i] = bp_dial(bcast_engine_data_address(f.root)), 0);
  usleep(200 * 1000);
  job_start(&jx, f.rx, f.p, f.dst);
  job_join(&jx);
  job_join(&jr);
  cr_assert_eq(jr.rc, BCAST_OK, "root: %s", jr.err.msg);
  cr_assert_eq(jx.rc, BCAST_OK, "receiver: %s", jx.err.msg);
  cr_assert_lt(jr.seconds, 2.5, "the root took %.2f s", jr.seconds);
  cr_assert_eq(jr.refused, FLOOD, "refused %u", jr.refused);
  /* The first ones were shed while the later ones arrived: closed early. */
  uint8_t got[256];
  cr_assert_eq(bp_read_to_end(fds[0], got, sizeof got), BP_CHALLENGE);
  for (int i = 0; i < FLOOD; i++) close(fds[i]);
  assert_received(&f);
  fixture_free(&f);
}

/* The receiver checks the root too: a fake root that does not hold the
 * secret is answered with nothing and gives nothing. */
Test(bcast_auth, a_root_without_the_secret_is_not_believed) {
  fixture f;
  fixture_init(&f, "run-5/step-0");
  int lfd = -1;
  char fake[96];
  bcast_err err = {0};
  cr_assert_eq(bcast__host_listen("127.0.0.1:0", &lfd, fake, sizeof fake, &err), BCAST_OK, "%s", err.msg);
  snprintf(f.p->host_endpoint, sizeof f.p->host_endpoint, "%s", fake);
  job jx;
  job_start(&jx, f.rx, f.p, f.dst);
  int fd = -1;
  for (int i = 0; i < 500 && fd < 0; i++) {
    fd = accept(lfd, NULL, NULL);
    if (fd < 0) usleep(10000);
  }
  cr_assert_geq(fd, 0);
  uint8_t nonce[BP_NONCE] = {9}, hello[256], wrong[32];
  size_t len = 0;
  memset(wrong, 0x33, sizeof wrong);
  cr_assert_eq(bp_root_challenge(fd, nonce), 0);
  cr_assert_eq(bp_root_read_hello(fd, hello, sizeof hello, &len), 0);
  cr_assert_eq(bp_root_accept(fd, f.p, wrong, nonce, hello), 0);
  job_join(&jx);
  cr_assert_eq(jx.rc, BCAST_EPEER, "%d %s", jx.rc, jx.err.msg);
  cr_assert(strstr(jx.err.msg, "did not prove it holds the plan's secret"), "%s", jx.err.msg);
  close(fd);
  close(lfd);
  fixture_free(&f);
}

/* A plan that carries no secret (from a peer that sent none) cannot run in
 * host mode, on either side, and says why. */
Test(bcast_auth, a_plan_without_a_secret_is_refused) {
  fixture f;
  fixture_init(&f, "run-6/step-0");
  f.p->has_secret = 0;
  bcast_err err = {0};
  cr_assert_eq(bcast_engine_execute(f.root, f.p, f.src, 1, NULL, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "no data-channel secret"), "%s", err.msg);
  cr_assert_eq(bcast_engine_execute(f.rx, f.p, f.dst, 1, NULL, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "no data-channel secret"), "%s", err.msg);
  fixture_free(&f);
}

/* Every plan draws its own secret; the hash does not depend on it. */
Test(bcast_auth, every_plan_has_its_own_secret_outside_the_hash) {
  fixture f;
  fixture_init(&f, "run-7/step-0");
  bcast_plan *q = NULL;
  bcast_err err = {0};
  bcast_plan_opts o = {.id = "run-7/step-0", .mode = BCAST_MODE_HOST, .staging_budget = 64 << 10,
                       .world_size = 2, .root_rank = 0, .host_endpoint = f.p->host_endpoint};
  cr_assert_eq(bcast_plan_build(f.src, 1, &o, &q, &err), BCAST_OK, "%s", err.msg);
  cr_assert(f.p->has_secret && q->has_secret);
  cr_assert_neq(memcmp(f.p->secret, q->secret, sizeof q->secret), 0, "two plans, one secret");
  cr_assert_eq(f.p->hash, q->hash, "the hash covers the secret");
  uint8_t mine[BCAST_SECRET_BYTES];
  memset(mine, 0xab, sizeof mine);
  bcast_plan_free(q);
  o.secret = mine;
  cr_assert_eq(bcast_plan_build(f.src, 1, &o, &q, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(memcmp(q->secret, mine, sizeof mine), 0);
  bcast_plan_free(q);
  fixture_free(&f);
}

Test(bcast_auth, hello_parse_takes_whole_hellos_of_this_version_only) {
  bcast_plan p;
  memset(&p, 0, sizeof p);
  snprintf(p.id, sizeof p.id, "run/step-1");
  p.hash = 0x1122334455667788ull;
  memset(p.secret, 1, sizeof p.secret);
  uint8_t nonce[BP_NONCE] = {0}, rx_nonce[BP_NONCE], h[256];
  size_t n = bp_hello(h, &p, 3, p.secret, nonce, rx_nonce), need = 0;
  bcast__hello out;
  for (size_t i = 0; i < n; i++) cr_assert_eq(bcast__hello_parse(h, i, &need, &out), 1, "prefix %zu", i);
  cr_assert_eq(need, n);
  cr_assert_eq(bcast__hello_parse(h, n, &need, &out), 0);
  cr_assert_eq(out.rank, 3);
  cr_assert_eq(out.hash, p.hash);
  cr_assert_str_eq(out.id, "run/step-1");
  cr_assert_eq(memcmp(out.rx_nonce, rx_nonce, BP_NONCE), 0);
  uint8_t want[BCAST_MAC_BYTES];
  cr_assert_eq(bcast__hello_mac(p.secret, nonce, rx_nonce, 3, p.hash, p.id, want), 0);
  cr_assert(bcast__mac_equal(want, out.mac), "the engine's MAC is the documented one");
  cr_assert_eq(bcast__hello_parse(h, n + 1, &need, &out), -1, "bytes after a hello");
  uint8_t bad[256];
  memcpy(bad, h, n);
  bad[0] ^= 1;
  cr_assert_eq(bcast__hello_parse(bad, 4, &need, &out), -1, "magic");
  memcpy(bad, h, n);
  bad[4] = 1;
  cr_assert_eq(bcast__hello_parse(bad, 8, &need, &out), -1, "version 1");
  memcpy(bad, h, n);
  bp_put32(bad + 12, 0);
  cr_assert_eq(bcast__hello_parse(bad, 16, &need, &out), -1, "empty id");
  bp_put32(bad + 12, 128);
  cr_assert_eq(bcast__hello_parse(bad, 16, &need, &out), -1, "id too long");
  memcpy(bad, h, n);
  bad[56 + 2] = 0;
  cr_assert_eq(bcast__hello_parse(bad, n, &need, &out), -1, "NUL in the id");
}

/* ---- TLS on the data channel ---------------------------------------------------------------- */

/* A TCP relay between one receiver and the root that keeps every byte the
 * root sent: what an on-path observer sees. */
typedef struct tap {
  int lfd;
  char addr[96];
  const char *root;
  uint8_t *seen;
  size_t nseen, cap;
  pthread_t tid;
} tap;

static void *tap_main(void *arg) {
  tap *t = arg;
  int a = -1;
  for (int i = 0; i < 1000 && a < 0; i++) {
    a = accept(t->lfd, NULL, NULL);
    if (a < 0) usleep(10000);
  }
  int b = a >= 0 ? bp_dial(t->root) : -1;
  if (b < 0) {
    if (a >= 0) close(a);
    return NULL;
  }
  uint8_t buf[65536];
  for (;;) {
    struct pollfd pf[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    if (poll(pf, 2, 10000) <= 0) break;
    int from = pf[0].revents ? a : b, to = from == a ? b : a;
    ssize_t r = recv(from, buf, sizeof buf, 0);
    if (r <= 0) break;
    if (from == b && t->nseen + (size_t)r <= t->cap) {
      memcpy(t->seen + t->nseen, buf, (size_t)r);
      t->nseen += (size_t)r;
    }
    if (send(to, buf, (size_t)r, MSG_NOSIGNAL) != r) break;
  }
  close(a);
  close(b);
  return NULL;
}

/* Runs f's plan through a tap; returns what the root sent, the receiver's
 * weights checked bit for bit. */
static void tapped_broadcast(fixture *f, tap *t) {
  memset(t, 0, sizeof *t);
  bcast_err err = {0};
  cr_assert_eq(bcast__host_listen("127.0.0.1:0", &t->lfd, t->addr, sizeof t->addr, &err), BCAST_OK, "%s", err.msg);
  t->root = bcast_engine_data_address(f->root);
  t->cap = 4u << 20;
  t->seen = malloc(t->cap);
  cr_assert_eq(pthread_create(&t->tid, NULL, tap_main, t), 0);
  bcast_plan *via = bcast_plan_dup(f->p);
  snprintf(via->host_endpoint, sizeof via->host_endpoint, "%s", t->addr);
  job jr, jx;
  job_start(&jr, f->root, f->p, f->src);
  job_start(&jx, f->rx, via, f->dst);
  job_join(&jx);
  job_join(&jr);
  cr_assert_eq(jr.rc, BCAST_OK, "root: %s", jr.err.msg);
  cr_assert_eq(jx.rc, BCAST_OK, "receiver: %s", jx.err.msg);
  pthread_join(t->tid, NULL);
  close(t->lfd);
  assert_received(f);
  bcast_plan_free(via);
}

/* 64 bf16 weights as the wire carries them, from the middle of the tensor. */
static void wire_sample(const fixture *f, uint8_t out[128]) {
  const float *s = f->src[0].data;
  for (size_t i = 0; i < 64; i++) {
    uint16_t v = bcast_f32_to_bf16(s[70000 + i]);
    memcpy(out + 2 * i, &v, 2);
  }
}

Test(bcast_auth, a_tls_plan_carries_no_weight_in_the_clear) {
  uint8_t sample[128], magic[4] = {'R', 'L', 'B', 'K'};
  fixture f;
  tap t;
  /* Without TLS the observer reads the weights: the check below can fail. */
  fixture_init(&f, "run-7/step-0");
  tapped_broadcast(&f, &t);
  wire_sample(&f, sample);
  cr_assert_gt(t.nseen, 512u * 256u * 2u, "the tap saw the whole transfer");
  cr_assert(contains(t.seen, t.nseen, sample, sizeof sample), "plaintext: the weights are on the wire");
  cr_assert(contains(t.seen, t.nseen, magic, sizeof magic));
  free(t.seen);
  fixture_free(&f);

  fixture_init_tls(&f, "run-7/step-0", 1);
  cr_assert(f.p->tls);
  tapped_broadcast(&f, &t);
  cr_assert_gt(t.nseen, 512u * 256u * 2u, "the tap saw the whole transfer");
  cr_assert_not(contains(t.seen, t.nseen, sample, sizeof sample), "TLS: no weight in the clear");
  cr_assert_not(contains(t.seen, t.nseen, magic, sizeof magic), "TLS: not even the framing");
  free(t.seen);
  fixture_free(&f);
}

/* A participant that proves it holds the secret and then skips TLS (an old
 * receiver, or one that wants the weights unencrypted) gets its reply and not
 * one byte more; the root closes it at the handshake bound and the real
 * receiver's broadcast succeeds. */
Test(bcast_auth, a_participant_that_skips_tls_gets_no_weights) {
  fixture f;
  fixture_init_tls(&f, "run-8/step-2", 1);
  job jr, jx;
  job_start(&jr, f.root, f.p, f.src);
  int fd = bp_dial(bcast_engine_data_address(f.root));
  uint8_t rx_nonce[BP_NONCE], nonce[BP_NONCE], got[4096];
  cr_assert_geq(fd, 0);
  /* bp_handshake reads the challenge itself; the nonce is only for bp_reply. */
  uint8_t ch[BP_CHALLENGE];
  cr_assert_eq(bp_read(fd, ch, sizeof ch), 0);
  memcpy(nonce, ch + 8, BP_NONCE);
  uint8_t hello[512];
  size_t hl = bp_hello(hello, f.p, 1, f.p->secret, nonce, rx_nonce);
  cr_assert_eq(send(fd, hello, hl, 0), (ssize_t)hl);
  cr_assert_eq(bp_reply(fd, f.p, 1, nonce, rx_nonce), 0, "it proved itself: the root proves itself too");
  const char plain[] = "not a ClientHello";
  send(fd, plain, sizeof plain, MSG_NOSIGNAL);
  double t0 = bcast__now();
  size_t n = bp_read_to_end(fd, got, sizeof got);
  double took = bcast__now() - t0;
  uint8_t magic[4] = {'R', 'L', 'B', 'K'};
  cr_assert_not(contains(got, n, magic, sizeof magic), "no bucket");
  cr_assert_leq(n, 16u, "at most a TLS alert (%zu bytes)", n);
  cr_assert_lt(took, 4.0, "closed within the handshake bound (%.2f s)", took);
  close(fd);
  job_start(&jx, f.rx, f.p, f.dst);
  job_join(&jx);
  job_join(&jr);
  cr_assert_eq(jr.rc, BCAST_OK, "root: %s", jr.err.msg);
  cr_assert_eq(jx.rc, BCAST_OK, "receiver: %s", jx.err.msg);
  assert_received(&f);
  fixture_free(&f);
}

/* The flag is part of the plan's hash: a receiver and a root that disagree
 * about TLS hold different plans, and the handshake says so. */
Test(bcast_auth, tls_is_covered_by_the_plan_hash) {
  fixture f;
  fixture_init_tls(&f, "run-9/step-0", 1);
  bcast_plan *plain = bcast_plan_dup(f.p);
  plain->tls = 0;
  cr_assert_neq(bcast_plan_hash(plain), f.p->hash);
  plain->hash = bcast_plan_hash(plain);
  job jr, jx;
  job_start(&jr, f.root, f.p, f.src);
  job_start(&jx, f.rx, plain, f.dst);
  job_join(&jx);
  cr_assert_eq(jx.rc, BCAST_EMISMATCH, "%s", jx.err.msg);
  bcast_engine_cancel(f.root, f.p->id);
  job_join(&jr);
  cr_assert_eq(jr.rc, BCAST_ECANCELED, "%s", jr.err.msg);
  bcast_plan_free(plain);
  fixture_free(&f);
}
