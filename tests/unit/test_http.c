/* HTTP endpoint: real TCP clients against a server on a loop thread. */
#define _GNU_SOURCE /* memmem, strcasestr */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "orchestrator/daemon/http.h"
#include "orchestrator/daemon/metrics.h"

typedef struct {
  uv_loop_t loop;
  uv_async_t stop;
  pthread_t thread;
  http_server *srv;
  metrics_registry *reg;
  int port;
  atomic_int ready;
  atomic_int requests;
  atomic_int scrapes;
  atomic_int closed_done;
  char last_route[32];
} fixture;

static fixture F;

static int on_ready(void *arg, char *reason, size_t n) {
  fixture *f = arg;
  if (atomic_load(&f->ready)) return 1;
  snprintf(reason, n, "no workers registered");
  return 0;
}

static void on_request(void *arg, const char *route, int status, double seconds) {
  fixture *f = arg;
  snprintf(f->last_route, sizeof f->last_route, "%s", route);
  cr_assert_geq(seconds, 0);
  atomic_fetch_add(&f->requests, 1);
}

static void on_scrape(void *arg) { atomic_fetch_add(&((fixture *)arg)->scrapes, 1); }

static void on_closed(void *arg) { atomic_store(&((fixture *)arg)->closed_done, 1); }

static void on_stop(uv_async_t *a) {
  fixture *f = a->data;
  http_server_close(f->srv, on_closed, f);
  uv_close((uv_handle_t *)a, NULL);
}

static void *loop_main(void *arg) {
  uv_run(&((fixture *)arg)->loop, UV_RUN_DEFAULT);
  return NULL;
}

static void start(uint32_t timeout_ms, uint32_t max_conns) {
  memset(&F, 0, sizeof F);
  cr_assert_eq(uv_loop_init(&F.loop), 0);
  F.reg = metrics_registry_new();
  metrics_counter *c = metrics_counter_new(F.reg, "rlorch_test_requests_total", "Test counter.",
                                           (const char *[]){"code", NULL}, NULL, 0);
  cr_assert_not_null(c);
  metrics_counter_add(c, (const char *[]){"OK"}, 41);
  http_server_opts o = {.metrics = F.reg, .ready = on_ready, .on_request = on_request,
                        .on_scrape = on_scrape, .arg = &F, .timeout_ms = timeout_ms,
                        .max_connections = max_conns, .max_header_bytes = 4096};
  char err[256];
  cr_assert_eq(http_server_start(&F.loop, "127.0.0.1:0", &o, &F.srv, err, sizeof err), 0, "%s", err);
  F.port = http_server_port(F.srv);
  cr_assert_gt(F.port, 0);
  F.stop.data = &F;
  uv_async_init(&F.loop, &F.stop, on_stop);
  cr_assert_eq(pthread_create(&F.thread, NULL, loop_main, &F), 0);
}

static void stop(void) {
  uv_async_send(&F.stop);
  pthread_join(F.thread, NULL);
  cr_assert(atomic_load(&F.closed_done), "close callback ran");
  cr_assert_eq(uv_loop_close(&F.loop), 0, "every handle closed");
  metrics_registry_free(F.reg);
}

static int dial(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  cr_assert_geq(fd, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)F.port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  struct timeval tv = {.tv_sec = 10};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

static void send_all(int fd, const char *s) {
  size_t n = strlen(s);
  cr_assert_eq(send(fd, s, n, MSG_NOSIGNAL), (ssize_t)n);
}

typedef struct {
  int status;
  char head[2048];
  char body[8192];
  size_t body_len;
} response;

/* Reads one response; head_only for HEAD. Returns 0, or -1 on EOF/timeout. */
static int read_response(int fd, response *r, int head_only) {
  char buf[16384];
  size_t n = 0;
  char *end = NULL;
  memset(r, 0, sizeof *r);
  while (!(end = memmem(buf, n, "\r\n\r\n", 4))) {
    ssize_t k = recv(fd, buf + n, 1, 0); /* byte by byte: never eat the next response */
    if (k <= 0) return -1;
    n += (size_t)k;
    cr_assert_lt(n, sizeof buf);
  }
  size_t hl = (size_t)(end - buf) + 4;
  memcpy(r->head, buf, hl < sizeof r->head ? hl : sizeof r->head - 1);
  cr_assert_eq(sscanf(r->head, "HTTP/1.1 %d", &r->status), 1, "%s", r->head);
  const char *cl = strcasestr(r->head, "Content-Length: ");
  cr_assert_not_null(cl, "%s", r->head);
  size_t want = strtoul(cl + 16, NULL, 10);
  if (head_only) return 0;
  cr_assert_lt(want, sizeof r->body);
  while (r->body_len < want) {
    ssize_t k = recv(fd, r->body + r->body_len, want - r->body_len, 0);
    if (k <= 0) return -1;
    r->body_len += (size_t)k;
  }
  return 0;
}

static response get(const char *req) {
  int fd = dial();
  send_all(fd, req);
  response r;
  cr_assert_eq(read_response(fd, &r, !strncmp(req, "HEAD", 4)), 0, "no response to %s", req);
  close(fd);
  return r;
}

/* True when the peer closes fd within ms milliseconds (read EOF or reset). */
static int closed_within(int fd, int ms) {
  struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char b[4096];
  for (;;) {
    ssize_t k = recv(fd, b, sizeof b, 0);
    if (k == 0 || (k < 0 && errno == ECONNRESET)) return 1;
    if (k < 0) return 0; /* timed out */
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

Test(http, routes) {
  start(5000, 64);
  response r = get("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  cr_assert_eq(r.status, 200);
  cr_assert(strstr(r.head, "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"), "%s", r.head);
  cr_assert(strstr(r.body, "rlorch_test_requests_total{code=\"OK\"} 41\n"), "%s", r.body);
  cr_assert_eq(atomic_load(&F.scrapes), 1);
  size_t get_len = r.body_len;

  r = get("HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  cr_assert_eq(r.status, 200);
  char want[64];
  snprintf(want, sizeof want, "Content-Length: %zu\r\n", get_len);
  cr_assert(strstr(r.head, want), "HEAD length: %s", r.head);

  r = get("GET /metrics?x=1 HTTP/1.1\r\n\r\n");
  cr_assert_eq(r.status, 200, "query string ignored");

  r = get("GET /healthz HTTP/1.1\r\n\r\n");
  cr_assert_eq(r.status, 200);
  cr_assert_str_eq(r.body, "ok\n");

  r = get("GET /readyz HTTP/1.1\r\n\r\n");
  cr_assert_eq(r.status, 503);
  cr_assert(strstr(r.body, "no workers registered"), "%s", r.body);
  atomic_store(&F.ready, 1);
  r = get("GET /readyz HTTP/1.1\r\n\r\n");
  cr_assert_eq(r.status, 200, "%s", r.body);

  r = get("GET /nope HTTP/1.1\r\n\r\n");
  cr_assert_eq(r.status, 404);
  r = get("POST /nope HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  cr_assert_eq(r.status, 404);

  r = get("POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc");
  cr_assert_eq(r.status, 405);
  cr_assert(strstr(r.head, "Allow: GET, HEAD\r\n"), "%s", r.head);
  r = get("DELETE /healthz HTTP/1.1\r\n\r\n");
  cr_assert_eq(r.status, 405);

  usleep(50000); /* the hook runs after the response is queued: let the last one land */
  int before = atomic_load(&F.requests);
  r = get("GET /healthz HTTP/1.1\r\n\r\n");
  usleep(50000);
  cr_assert_eq(atomic_load(&F.requests), before + 1, "on_request hook");
  cr_assert_str_eq(F.last_route, "/healthz");
  stop();
}

Test(http, malformed_and_oversized) {
  start(5000, 64);
  int fd = dial();
  send_all(fd, "\x01\x02garbage garbage\r\n\r\n");
  response r;
  cr_assert_eq(read_response(fd, &r, 0), 0);
  cr_assert_eq(r.status, 400);
  cr_assert(strstr(r.head, "Connection: close"), "%s", r.head);
  cr_assert(closed_within(fd, 2000), "closed after 400");
  close(fd);

  r = get("GET /metrics HTTP/9.Z\r\n\r\n");
  cr_assert_eq(r.status, 400);

  char big[8192];
  snprintf(big, sizeof big, "GET /metrics HTTP/1.1\r\nX-Big: %06000d\r\n\r\n", 0);
  r = get(big);
  cr_assert_eq(r.status, 431);

  char url[4096] = "GET /";
  memset(url + 5, 'a', 3000);
  strcpy(url + 3005, " HTTP/1.1\r\n\r\n");
  r = get(url);
  cr_assert_eq(r.status, 431, "long URL");
  stop();
}

Test(http, keep_alive_and_pipelining) {
  start(5000, 64);
  int fd = dial();
  response r;
  send_all(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  cr_assert_eq(read_response(fd, &r, 0), 0);
  cr_assert_eq(r.status, 200);
  cr_assert_null(strstr(r.head, "Connection: close"));
  send_all(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  cr_assert_eq(read_response(fd, &r, 0), 0, "second request on the same connection");
  cr_assert_eq(r.status, 200);
  /* Two requests in one segment, answered in order. */
  send_all(fd, "GET /nope HTTP/1.1\r\n\r\nGET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n");
  cr_assert_eq(read_response(fd, &r, 0), 0);
  cr_assert_eq(r.status, 404);
  cr_assert_eq(read_response(fd, &r, 0), 0);
  cr_assert_eq(r.status, 200);
  cr_assert(strstr(r.head, "Connection: close"), "%s", r.head);
  cr_assert(closed_within(fd, 2000));
  close(fd);
  /* HTTP/1.0 without keep-alive closes. */
  fd = dial();
  send_all(fd, "GET /healthz HTTP/1.0\r\n\r\n");
  cr_assert_eq(read_response(fd, &r, 0), 0);
  cr_assert(closed_within(fd, 2000));
  close(fd);
  stop();
}

Test(http, stalled_client_is_closed_and_others_proceed) {
  start(400, 64);
  int slow = dial();
  send_all(slow, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Half: ");
  double t0 = now_s();
  /* A second client is served while the first one stalls. */
  response r;
  r = get("GET /metrics HTTP/1.1\r\n\r\n");
  cr_assert_eq(r.status, 200);
  cr_assert_lt(now_s() - t0, 0.3, "served promptly");
  /* A client trickling bytes does not extend its deadline. */
  for (int i = 0; i < 3; i++) {
    usleep(100000);
    send(slow, "a", 1, MSG_NOSIGNAL);
  }
  cr_assert(closed_within(slow, 2000), "stalled client closed");
  double took = now_s() - t0;
  cr_assert(took >= 0.35 && took < 1.5, "closed after %.3fs, deadline 0.4s", took);
  close(slow);
  /* An idle keep-alive connection also goes at the deadline. */
  int idle = dial();
  send_all(idle, "GET /healthz HTTP/1.1\r\n\r\n");
  cr_assert_eq(read_response(idle, &r, 0), 0);
  cr_assert(closed_within(idle, 2000), "idle keep-alive closed");
  close(idle);
  usleep(50000);
  cr_assert_eq(http_server_connections(F.srv), 0);
  stop();
}

Test(http, many_connections_and_cap) {
  start(5000, 200);
  enum { N = 100 };
  int fds[N];
  for (int i = 0; i < N; i++) fds[i] = dial();
  for (int i = 0; i < N; i++) send_all(fds[i], "GET /healthz HTTP/1.1\r\n\r\n");
  for (int i = 0; i < N; i++) {
    response r;
    cr_assert_eq(read_response(fds[i], &r, 0), 0, "client %d", i);
    cr_assert_eq(r.status, 200);
    close(fds[i]);
  }
  stop();

  /* At the cap, a connection that is still being written to is not pushed
   * out: with nothing else to close, a newcomer gets 503. The writer
   * pipelines requests and reads nothing, through a small receive buffer. */
  start(5000, 1);
  int writer = socket(AF_INET, SOCK_STREAM, 0);
  int small = 4096;
  setsockopt(writer, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)F.port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  cr_assert_eq(connect(writer, (struct sockaddr *)&a, sizeof a), 0);
  static const char req[] = "GET /healthz HTTP/1.1\r\n\r\n";
  enum { PIPELINED = 40000 };
  char *many = malloc(PIPELINED * (sizeof req - 1) + 1);
  for (int i = 0; i < PIPELINED; i++) memcpy(many + i * (sizeof req - 1), req, sizeof req - 1);
  size_t total = PIPELINED * (sizeof req - 1), sent = 0;
  struct timeval tv = {.tv_sec = 2};
  setsockopt(writer, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  while (sent < total) { /* until the server stops reading: its answers are stuck */
    ssize_t k = send(writer, many + sent, total - sent, MSG_NOSIGNAL);
    if (k <= 0) break;
    sent += (size_t)k;
  }
  free(many);
  usleep(200000);
  response r;
  int extra = dial();
  cr_assert_eq(read_response(extra, &r, 0), 0);
  cr_assert_eq(r.status, 503, "over the cap, nothing to push out");
  cr_assert_str_eq(r.body, "too many clients\n");
  cr_assert(closed_within(extra, 2000));
  close(extra);
  close(writer);
  usleep(100000);
  r = get("GET /healthz HTTP/1.1\r\n\r\n");
  cr_assert_eq(r.status, 200, "a slot freed");
  stop();
}

/* A connection holding part of a request: the start of a header, no end. */
static int dial_slow(void) {
  int fd = dial();
  send_all(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ");
  return fd;
}

Test(http, slow_clients_at_the_cap_make_room_for_probes) {
  enum { CAP = 8 };
  start(3000, CAP);
  int slow[CAP];
  for (int i = 0; i < CAP; i++) slow[i] = dial_slow();
  usleep(100000);
  cr_assert_eq(http_server_connections(F.srv), CAP);
  /* Each probe takes the place of the one that waited longest. */
  response r;
  for (int i = 0; i < CAP; i++) {
    r = get(i % 2 ? "GET /readyz HTTP/1.1\r\n\r\n" : "GET /healthz HTTP/1.1\r\n\r\n");
    cr_assert(r.status == 200 || (i % 2 && r.status == 503 && strstr(r.body, "not ready")),
              "probe %d: %d %s", i, r.status, r.body);
    response e;
    cr_assert_eq(read_response(slow[i], &e, 0), 0, "slow connection %d was told", i);
    cr_assert_eq(e.status, 408, "slow connection %d", i);
    cr_assert(closed_within(slow[i], 2000), "slow connection %d closed", i);
    close(slow[i]);
  }
  /* /metrics is served the same way. */
  for (int i = 0; i < CAP; i++) slow[i] = dial_slow();
  usleep(100000);
  r = get("GET /metrics HTTP/1.1\r\n\r\n");
  cr_assert_eq(r.status, 200);
  cr_assert(strstr(r.body, "rlorch_test_requests_total"), "%s", r.body);
  for (int i = 0; i < CAP; i++) close(slow[i]);
  stop();
}

Test(http, idle_connections_make_room_too) {
  start(5000, 2);
  int idle[2];
  response r;
  for (int i = 0; i < 2; i++) {
    idle[i] = dial();
    send_all(idle[i], "GET /healthz HTTP/1.1\r\n\r\n");
    cr_assert_eq(read_response(idle[i], &r, 0), 0);
    cr_assert_eq(r.status, 200);
  }
  usleep(50000);
  /* idle[1] asks again: it is now the one that waited least. */
  send_all(idle[1], "GET /healthz HTTP/1.1\r\n\r\n");
  cr_assert_eq(read_response(idle[1], &r, 0), 0);
  usleep(50000);
  r = get("GET /healthz HTTP/1.1\r\n\r\n");
  cr_assert_eq(r.status, 200);
  /* The idle one is closed without an answer: it held no request. */
  cr_assert(closed_within(idle[0], 2000), "the longest idle connection made room");
  char b;
  cr_assert_eq(recv(idle[0], &b, 1, MSG_DONTWAIT), 0, "closed with nothing sent");
  send_all(idle[1], "GET /healthz HTTP/1.1\r\n\r\n");
  cr_assert_eq(read_response(idle[1], &r, 0), 0, "the other one stays");
  cr_assert_eq(r.status, 200);
  close(idle[0]);
  close(idle[1]);
  stop();
}

Test(http, partial_requests_get_408_at_the_deadline) {
  start(400, 64);
  int slow[3];
  for (int i = 0; i < 3; i++) slow[i] = dial_slow();
  double t0 = now_s();
  for (int i = 0; i < 3; i++) {
    response r;
    cr_assert_eq(read_response(slow[i], &r, 0), 0, "slow connection %d answered", i);
    cr_assert_eq(r.status, 408);
    cr_assert_str_eq(r.body, "request timeout\n");
    cr_assert(strstr(r.head, "Connection: close"), "%s", r.head);
    cr_assert(closed_within(slow[i], 2000));
    close(slow[i]);
  }
  double took = now_s() - t0;
  cr_assert(took >= 0.35 && took < 1.5, "closed after %.3fs, deadline 0.4s", took);
  stop();
}

Test(http, close_stops_listening) {
  start(5000, 8);
  int port = F.port, open_fd = dial();
  stop();
  cr_assert(closed_within(open_fd, 2000), "open connections closed");
  close(open_fd);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  cr_assert_neq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "still listening");
  close(fd);
}

Test(http, start_errors) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  http_server *s = (http_server *)1, *s2 = NULL;
  char err[256] = "";
  cr_assert_lt(http_server_start(&loop, "x:y:z", NULL, &s, err, sizeof err), 0);
  cr_assert_null(s);
  cr_assert(strstr(err, "\"x:y:z\""), "%s", err);
  cr_assert_lt(http_server_start(&loop, "no-such-host.invalid:80", NULL, &s, err, sizeof err), 0);
  cr_assert(strstr(err, "no-such-host.invalid:80"), "%s", err);
  cr_assert_eq(http_server_start(&loop, "127.0.0.1:0", NULL, &s, err, sizeof err), 0, "%s", err);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", http_server_port(s));
  cr_assert_lt(http_server_start(&loop, addr, NULL, &s2, err, sizeof err), 0, "port in use");
  cr_assert(strstr(err, addr) && strstr(err, "in use"), "%s", err);
  http_server_close(s, NULL, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  cr_assert_eq(uv_loop_close(&loop), 0);
}
