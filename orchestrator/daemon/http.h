/* The daemon's HTTP/1.1 endpoint on its libuv loop: /metrics, /healthz, /readyz.
 *
 *   GET|HEAD /metrics  200, Prometheus text (Content-Type text/plain;
 *                      version=0.0.4; charset=utf-8)
 *   GET|HEAD /healthz  200 "ok" while the loop runs
 *   GET|HEAD /readyz   200 "ready" or 503 with the reason from opts.ready
 *   other paths 404; other methods on these paths 405 with Allow: GET, HEAD;
 *   malformed requests 400; headers over max_header_bytes 431.
 *
 * Keep-alive is supported. Everything is non-blocking; each connection has a
 * deadline (timeout_ms) for its next request, header and body, counted from
 * its accept or its previous request and not extended by bytes that trickle
 * in, so a slow or stalled client is closed without affecting others (408
 * when it holds part of a request). At max_connections a new connection
 * takes the place of the one that has waited longest for its request and has
 * no response still being written (408 to it when it held part of a
 * request); when every connection is being written to, the newcomer gets 503
 * and is closed. So /healthz and /readyz answer while slow clients hold every
 * connection. All calls and callbacks happen on the loop thread. */
#ifndef RLORCH_HTTP_H
#define RLORCH_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "orchestrator/daemon/metrics.h"

typedef struct http_server http_server;

typedef struct http_server_opts {
  /* Rendered on /metrics; NULL gives an empty body. */
  metrics_registry *metrics;
  /* Called just before rendering /metrics, to refresh gauges. May be NULL. */
  void (*on_scrape)(void *arg);
  /* Returns non-zero when ready; when not, writes a reason (one line) into
   * reason. NULL means always ready. */
  int (*ready)(void *arg, char *reason, size_t reasonlen);
  /* Called after each response. route is "/metrics", "/healthz", "/readyz" or
   * "other" (bounded, so it can be a metric label); seconds from the first
   * byte of the request to the response being queued. May be NULL. */
  void (*on_request)(void *arg, const char *route, int status, double seconds);
  void *arg; /* passed to the three callbacks */
  uint32_t timeout_ms;       /* 0: 5000 */
  uint32_t max_connections;  /* 0: 256 */
  uint32_t max_header_bytes; /* 0: 16384 */
} http_server_opts;

/* Binds and listens on addr ("host:port", "[v6]:port"; port 0 picks one).
 * opts is copied. Returns 0, or a negative libuv code with err naming addr. */
int http_server_start(uv_loop_t *loop, const char *addr, const http_server_opts *opts,
                      http_server **out, char *err, size_t errlen);
/* The bound port (useful after port 0), or -1. */
int http_server_port(const http_server *s);
/* Number of open client connections. */
size_t http_server_connections(const http_server *s);
/* Stops listening and closes every connection; done(arg) runs on the loop once
 * all handles are closed, after which the server memory is gone. done may be
 * NULL. */
void http_server_close(http_server *s, void (*done)(void *arg), void *arg);

#endif
