/* Fuzz target: the HTTP request path of the daemon's /metrics, /healthz and
 * /readyz endpoint (orchestrator/daemon/http.c), as a client's bytes reach it.
 *
 * One server on a libuv loop in this thread, for the whole process; each
 * input is one TCP connection over loopback that sends the input and then
 * closes its sending side, while the loop runs. The input goes out in pieces
 * (their size derived from its length) with the loop run between them, so
 * that requests, header lines and URLs are cut across reads as a network
 * cuts them. The connection ends when the server closes it; everything the
 * server answered must be HTTP/1.1 responses, and every connection it opened
 * must be closed again. */
#include "fuzz_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <uv.h>

#include "orchestrator/daemon/http.h"
#include "orchestrator/daemon/metrics.h"

#define FUZZ_MAX_INPUT (64u << 10)

static uv_loop_t loop;
static http_server *srv;
static struct sockaddr_in addr;
static metrics_registry *reg;
static int ready_flip;
static uint64_t requests;

static int on_ready(void *arg, char *reason, size_t n) {
  if (++ready_flip & 1) return 1;
  snprintf(reason, n, "no trainer registered");
  return 0;
}

static void on_request(void *arg, const char *route, int status, double seconds) {
  FUZZ_CHECK(!strcmp(route, "/metrics") || !strcmp(route, "/healthz") ||
                 !strcmp(route, "/readyz") || !strcmp(route, "other"),
             "unbounded route label '%s'", route);
  FUZZ_CHECK(status >= 200 && status < 600, "status %d", status);
  FUZZ_CHECK(seconds >= 0, "negative duration");
  requests++;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  FUZZ_CHECK(uv_loop_init(&loop) == 0, "uv_loop_init");
  reg = metrics_registry_new();
  metrics_counter *c = metrics_counter_new(reg, "rlorch_fuzz_total", "Requests seen.",
                                           (const char *[]){"code", NULL}, NULL, 0);
  FUZZ_CHECK(c, "metrics_counter_new");
  metrics_counter_add(c, (const char *[]){"OK"}, 1);
  /* A small header limit, so that inputs of a few KiB reach it. */
  http_server_opts o = {.metrics = reg, .ready = on_ready, .on_request = on_request,
                        .timeout_ms = 2000, .max_connections = 8, .max_header_bytes = 1024};
  char err[256];
  FUZZ_CHECK(http_server_start(&loop, "127.0.0.1:0", &o, &srv, err, sizeof err) == 0, "%s", err);
  addr.sin_family = AF_INET;
  addr.sin_port = htons((uint16_t)http_server_port(srv));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return 0;
}

/* What came back: whole responses, one after the other, each a status line
 * and headers that end in a blank line and a body of its Content-Length. */
static void check_responses(const char *r, size_t n) {
  while (n > 0) {
    FUZZ_CHECK(n >= 12 && !memcmp(r, "HTTP/1.1 ", 9), "not a status line: '%.*s'",
               (int)(n < 40 ? n : 40), r);
    const char *end = memmem(r, n, "\r\n\r\n", 4);
    FUZZ_CHECK(end, "response headers never end");
    const char *cl = memmem(r, (size_t)(end - r), "Content-Length: ", 16);
    FUZZ_CHECK(cl, "response without Content-Length");
    size_t body = strtoul(cl + 16, NULL, 10), head = (size_t)(end - r) + 4;
    /* HEAD answers carry the length of the body they leave out. */
    int headless = 0;
    if (head + body > n || (head + body < n && memcmp(r + head + body, "HTTP/1.1 ", 9) != 0))
      headless = 1;
    if (headless) body = 0;
    FUZZ_CHECK(head + body <= n, "response body cut short");
    r += head + body;
    n -= head + body;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > FUZZ_MAX_INPUT) size = FUZZ_MAX_INPUT;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  FUZZ_CHECK(fd >= 0, "socket");
  FUZZ_CHECK(fuzz_connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0, "connect: %s",
             strerror(errno));
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  size_t piece = size % 3 == 0 ? size : 1 + size % 97, sent = 0, got = 0, cap = 1 << 16;
  char *resp = malloc(cap);
  FUZZ_CHECK(resp, "out of memory");
  int shut = 0, eof = 0;
  size_t conns_before = http_server_connections(srv);
  while (!eof) {
    if (sent < size) {
      size_t want = size - sent < piece ? size - sent : piece;
      ssize_t w = fuzz_send(fd, data + sent, want);
      if (w > 0) sent += (size_t)w;
      else if (w < 0 && errno != EAGAIN && errno != EINTR) sent = size; /* closed on us */
    }
    if (sent == size && !shut) {
      shutdown(fd, SHUT_WR);
      shut = 1;
    }
    /* Twice: libuv watches a socket it accepted from its next iteration on. */
    uv_run(&loop, UV_RUN_NOWAIT);
    uv_run(&loop, UV_RUN_NOWAIT);
    for (;;) {
      if (got == cap) {
        char *bigger = realloc(resp, cap *= 2);
        FUZZ_CHECK(bigger, "out of memory");
        resp = bigger;
      }
      ssize_t r = fuzz_recv(fd, resp + got, cap - got);
      if (r > 0) {
        got += (size_t)r;
        continue;
      }
      if (r == 0 || (errno != EAGAIN && errno != EINTR)) eof = 1;
      break;
    }
    if (!eof && shut) {
      /* Nothing left to send: wait for the server, in the loop or on the socket. */
      struct pollfd pf[2] = {{fd, POLLIN, 0}, {uv_backend_fd(&loop), POLLIN, 0}};
      poll(pf, 2, 10);
    }
  }
  close(fd);
  /* Let the server's close callbacks run: the connection is released. */
  for (int i = 0; i < 100 && http_server_connections(srv) > conns_before; i++)
    uv_run(&loop, UV_RUN_NOWAIT);
  uv_run(&loop, UV_RUN_NOWAIT);
  FUZZ_CHECK(http_server_connections(srv) == conns_before, "%zu connections left open",
             http_server_connections(srv));
  check_responses(resp, got);
  free(resp);
  return 0;
}
