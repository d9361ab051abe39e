/* Small HTTP/1.1 server for the operational endpoints. One connection = one
 * uv_tcp_t + one uv_timer_t (the deadline) + an http_parser. Responses are
 * built whole and written with uv_write; libuv keeps them in order, which is
 * all pipelining needs. The deadline is armed at accept and re-armed only when
 * a request completes, so a client trickling bytes cannot keep it alive.
 *
 * Probes must get through a full server: at the connection cap, the
 * connection that has waited longest for its next request is closed to make
 * room (answered 408 when it holds part of one) unless a response is still
 * being written to it; only when every connection is being written to does a
 * newcomer get 503. The connections are kept in the order they began waiting
 * (accept, or their last request), so the candidate is found from the tail.
 * A client holding connections open without finishing a request (slowloris)
 * therefore costs a probe nothing: the probe takes the place of the oldest,
 * and is itself pushed out only after as many newer connections as the cap,
 * long after its request arrived. No minimum age protects a newcomer: an
 * attacker that reconnects whenever it is closed would keep every connection
 * younger than it and shut probes out; without one, its reconnections push
 * out its own older connections. */
#include <errno.h>
#include <http_parser.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/common/opt.h"
#include "orchestrator/daemon/http.h"

#define HTTP__MAX_URL 2048
#define HTTP__MAX_BODY 65536
#define HTTP__MAX_WRITE_QUEUE (8u << 20) /* a client that never reads is dropped */

typedef struct http__conn {
  uv_tcp_t tcp;
  uv_timer_t timer;
  http_parser parser;
  http_server *srv;
  struct http__conn *prev, *next;
  char url[HTTP__MAX_URL + 1];
  size_t url_len;
  size_t header_bytes, body_bytes;
  uint64_t t0; /* uv_hrtime at the first byte of the request */
  int handles; /* open handles; freed at 0 */
  int in_message;
  int oversized;  /* header limit hit: answer 431 */
  int closing;
} http__conn;

struct http_server {
  uv_loop_t *loop;
  uv_tcp_t listener;
  http_server_opts o;
  http__conn *conns; /* most recently waiting first */
  http__conn *tail;  /* waiting longest */
  size_t nconns;
  int port;
  int closing;
  int pending; /* handles still closing, listener included */
  void (*done)(void *);
  void *done_arg;
  char slab[16384];
};

static void http__conn_close(http__conn *c);

static void http__unlink(http__conn *c) {
  http_server *s = c->srv;
  if (c->prev) c->prev->next = c->next;
  else s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  else s->tail = c->prev;
  c->prev = c->next = NULL;
}

/* At the head: the connection that began waiting last. */
static void http__push(http__conn *c) {
  http_server *s = c->srv;
  c->prev = NULL;
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  else s->tail = c;
  s->conns = c;
}

/* ---- responses -------------------------------------------------------------- */

typedef struct {
  uv_write_t req;
  char *data;
} http__write;

static void http__on_write(uv_write_t *req, int status) {
  http__write *w = (http__write *)req;
  free(w->data);
  free(w);
}

static const char *http__reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

/* Queues one response. head_only: headers only (HEAD), length still that of body. */
static int http__respond(http__conn *c, int status, const char *ctype, const char *body, size_t blen,
                         int head_only, int keep_alive, const char *extra) {
  char head[512];
  int hl = snprintf(head, sizeof head,
                    "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s%s\r\n", status,
                    http__reason(status), ctype, blen, extra ? extra : "",
                    keep_alive ? "" : "Connection: close\r\n");
  size_t total = (size_t)hl + (head_only ? 0 : blen);
  http__write *w = malloc(sizeof *w);
  char *data = malloc(total ? total : 1);
  if (!w || !data) {
    free(w);
    free(data);
    return -ENOMEM;
  }
  memcpy(data, head, (size_t)hl);
  if (!head_only && blen) memcpy(data + hl, body, blen);
  w->data = data;
  uv_buf_t buf = uv_buf_init(data, (unsigned)total);
  int rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, &buf, 1, http__on_write);
  if (rc) {
    free(data);
    free(w);
  }
  return rc;
}

static void http__hook(http__conn *c, const char *route, int status) {
  http_server *s = c->srv;
  if (s->o.on_request) s->o.on_request(s->o.arg, route, status, (double)(uv_hrtime() - c->t0) / 1e9);
}

/* Answers a request that cannot be parsed further, then closes. */
static void http__fail(http__conn *c, int status, const char *body) {
  if (!c->in_message) c->t0 = uv_hrtime();
  http__respond(c, status, "text/plain; charset=utf-8", body, strlen(body), 0, 0, NULL);
  http__hook(c, "other", status);
  http__conn_close(c);
}

static const char *http__route(const http__conn *c) {
  size_t n = strcspn(c->url, "?#");
  static const char *const routes[] = {"/metrics", "/healthz", "/readyz"};
  for (size_t i = 0; i < 3; i++)
    if (strlen(routes[i]) == n && !strncmp(c->url, routes[i], n)) return routes[i];
  return NULL;
}

static void http__serve(http__conn *c, int keep_alive) {
  http_server *s = c->srv;
  const char *route = http__route(c);
  int method = c->parser.method, head = method == HTTP_HEAD, status = 200;
  const char *text = "text/plain; charset=utf-8";
  char reason[256], body[320];
  if (!route) {
    status = 404;
    http__respond(c, status, text, "not found\n", 10, head, keep_alive, NULL);
  } else if (method != HTTP_GET && method != HTTP_HEAD) {
    status = 405;
    http__respond(c, status, text, "method not allowed\n", 19, 0, keep_alive, "Allow: GET, HEAD\r\n");
  } else if (!strcmp(route, "/healthz")) {
    http__respond(c, status, text, "ok\n", 3, head, keep_alive, NULL);
  } else if (!strcmp(route, "/readyz")) {
    reason[0] = 0;
    int ready = !s->o.ready || s->o.ready(s->o.arg, reason, sizeof reason);
    if (!ready) status = 503;
    int n = ready ? snprintf(body, sizeof body, "ready\n")
                  : snprintf(body, sizeof body, "not ready: %s\n", reason[0] ? reason : "unknown");
    http__respond(c, status, text, body, (size_t)n, head, keep_alive, NULL);
  } else {
    char *buf = NULL;
    size_t len = 0;
    if (s->o.on_scrape) s->o.on_scrape(s->o.arg);
    if (s->o.metrics ? metrics_render(s->o.metrics, &buf, &len) : 0) buf = NULL, len = 0;
    http__respond(c, status, "text/plain; version=0.0.4; charset=utf-8", buf ? buf : "", len, head,
                  keep_alive, NULL);
    free(buf);
  }
  http__hook(c, route ? route : "other", status);
}

/* ---- parser callbacks --------------------------------------------------------- */

static int http__on_begin(http_parser *p) {
  http__conn *c = p->data;
  c->in_message = 1;
  c->url_len = 0;
  c->url[0] = 0;
  c->header_bytes = 0;
  c->body_bytes = 0;
  c->t0 = uv_hrtime();
  return 0;
}

static int http__count_header(http_parser *p, size_t n) {
  http__conn *c = p->data;
  c->header_bytes += n;
  if (c->header_bytes > c->srv->o.max_header_bytes) {
    c->oversized = 1;
    return 1; /* stops the parser */
  }
  return 0;
}

static int http__on_url(http_parser *p, const char *at, size_t n) {
  http__conn *c = p->data;
  if (http__count_header(p, n)) return 1;
  if (c->url_len + n > HTTP__MAX_URL) {
    c->oversized = 1;
    return 1;
  }
  memcpy(c->url + c->url_len, at, n);
  c->url_len += n;
  c->url[c->url_len] = 0;
  return 0;
}

static int http__on_header(http_parser *p, const char *at, size_t n) { return http__count_header(p, n); }

static int http__on_body(http_parser *p, const char *at, size_t n) {
  http__conn *c = p->data;
  c->body_bytes += n;
  return c->body_bytes > HTTP__MAX_BODY; /* bodies are ignored, but not unbounded */
}

static int http__on_complete(http_parser *p) {
  http__conn *c = p->data;
  int keep = http_should_keep_alive(p) && !p->upgrade && !c->srv->closing;
  c->in_message = 0;
  http__serve(c, keep);
  if (!keep) {
    http__conn_close(c);
    return 1;
  }
  uv_timer_again(&c->timer); /* next request gets a fresh deadline */
  http__unlink(c);
  http__push(c); /* and waits again from now */
  return 0;
}

static const http_parser_settings http__settings = {
    .on_message_begin = http__on_begin,
    .on_url = http__on_url,
    .on_header_field = http__on_header,
    .on_header_value = http__on_header,
    .on_body = http__on_body,
    .on_message_complete = http__on_complete,
};

/* ---- connections ---------------------------------------------------------------- */

static void http__maybe_done(http_server *s) {
  if (!s->closing || s->pending > 0) return;
  void (*done)(void *) = s->done;
  void *arg = s->done_arg;
  free(s);
  if (done) done(arg);
}

static void http__on_conn_handle_closed(uv_handle_t *h) {
  http__conn *c = h->data;
  if (--c->handles > 0) return;
  http_server *s = c->srv;
  free(c);
  s->pending--;
  http__maybe_done(s);
}

static void http__conn_close(http__conn *c) {
  if (c->closing) return;
  c->closing = 1;
  http_server *s = c->srv;
  http__unlink(c);
  s->nconns--;
  s->pending++;
  uv_read_stop((uv_stream_t *)&c->tcp);
  uv_timer_stop(&c->timer);
  /* Queued writes still complete (with an error) before the close callback. */
  uv_close((uv_handle_t *)&c->timer, http__on_conn_handle_closed);
  uv_close((uv_handle_t *)&c->tcp, http__on_conn_handle_closed);
}

/* Closes a connection that did not send its request in time or had to make
 * room: one that holds part of a request is told so. */
static void http__drop(http__conn *c) {
  if (c->in_message) http__fail(c, 408, "request timeout\n");
  else http__conn_close(c);
}

static void http__on_deadline(uv_timer_t *t) { http__drop(t->data); }

/* Makes room at the cap (see the top of the file); 0 when nothing may go. */
static int http__evict(http_server *s) {
  for (http__conn *c = s->tail; c; c = c->prev) {
    if (uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) > 0) continue;
    http__drop(c);
    return 1;
  }
  return 0;
}

/* Every read lands in the server's one buffer: it is consumed before the
 * read callback returns, and all connections run on the one loop thread. */
static void http__alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  http__conn *c = h->data;
  (void)suggested;
  *buf = uv_buf_init(c->srv->slab, sizeof c->srv->slab);
}

static void http__on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
  http__conn *c = st->data;
  if (n < 0) {
    http__conn_close(c);
    return;
  }
  if (n == 0 || c->closing) return;
  if (uv_stream_get_write_queue_size(st) > HTTP__MAX_WRITE_QUEUE) {
    http__conn_close(c);
    return;
  }
  size_t used = http_parser_execute(&c->parser, &http__settings, buf->base, (size_t)n);
  if (c->closing) return; /* closed by on_message_complete */
  enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
  if (c->oversized || e == HPE_HEADER_OVERFLOW) {
    http__fail(c, 431, "request header fields too large\n");
  } else if (e == HPE_CB_body) {
    http__fail(c, 413, "request body too large\n");
  } else if (e != HPE_OK || used != (size_t)n) {
    char msg[160];
    snprintf(msg, sizeof msg, "bad request: %s\n", http_errno_description(e));
    http__fail(c, 400, msg);
  }
}

/* Over the cap: answer 503 without reading, then close. */
static void http__on_rejected_closed(uv_handle_t *h) {
  http_server *s = h->data;
  free(h);
  s->pending--;
  http__maybe_done(s);
}

static void http__reject(http_server *s) {
  uv_tcp_t *t = malloc(sizeof *t);
  if (!t) return;
  t->data = s;
  uv_tcp_init(s->loop, t);
  s->pending++;
  if (uv_accept((uv_stream_t *)&s->listener, (uv_stream_t *)t) == 0) {
    static const char busy[] =
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
        "Content-Length: 17\r\nConnection: close\r\n\r\ntoo many clients\n";
    uv_buf_t b = uv_buf_init((char *)busy, sizeof busy - 1);
    uv_try_write((uv_stream_t *)t, &b, 1); /* best effort: never block */
  }
  uv_close((uv_handle_t *)t, http__on_rejected_closed);
}

static void http__on_connection(uv_stream_t *l, int status) {
  http_server *s = l->data;
  if (status < 0 || s->closing) return;
  if (s->nconns >= s->o.max_connections && !http__evict(s)) {
    http__reject(s);
    return;
  }
  http__conn *c = calloc(1, sizeof *c);
  if (!c) return;
  c->srv = s;
  uv_tcp_init(s->loop, &c->tcp);
  uv_timer_init(s->loop, &c->timer);
  c->tcp.data = c->timer.data = c;
  c->handles = 2;
  c->parser.data = c;
  http_parser_init(&c->parser, HTTP_REQUEST);
  http__push(c);
  s->nconns++;
  if (uv_accept(l, (uv_stream_t *)&c->tcp) != 0) {
    http__conn_close(c);
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  uv_timer_start(&c->timer, http__on_deadline, s->o.timeout_ms, s->o.timeout_ms);
  if (uv_read_start((uv_stream_t *)&c->tcp, http__alloc, http__on_read) != 0) http__conn_close(c);
}

/* ---- server ------------------------------------------------------------------- */

static void http__on_listener_closed(uv_handle_t *h) {
  http_server *s = h->data;
  s->pending--;
  http__maybe_done(s);
}

static int http__resolve(const char *addr, struct sockaddr_storage *ss, char *err, size_t errlen) {
  char host[256];
  int port;
  if (opt_parse_addr(addr, host, sizeof host, &port) != 0) {
    snprintf(err, errlen, "http: invalid address \"%s\" (want HOST:PORT)", addr ? addr : "");
    return UV_EINVAL;
  }
  if (uv_ip4_addr(host, port, (struct sockaddr_in *)ss) == 0) return 0;
  if (uv_ip6_addr(host, port, (struct sockaddr_in6 *)ss) == 0) return 0;
  snprintf(err, errlen, "http: %s: host must be an IP address", addr);
  return UV_EINVAL;
}

int http_server_start(uv_loop_t *loop, const char *addr, const http_server_opts *opts,
                      http_server **out, char *err, size_t errlen) {
  *out = NULL;
  struct sockaddr_storage ss;
  int rc = http__resolve(addr, &ss, err, errlen);
  if (rc) return rc;
  http_server *s = calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "http: out of memory");
    return UV_ENOMEM;
  }
  if (opts) s->o = *opts;
  if (!s->o.timeout_ms) s->o.timeout_ms = 5000;
  if (!s->o.max_connections) s->o.max_connections = 256;
  if (!s->o.max_header_bytes) s->o.max_header_bytes = 16384;
  s->loop = loop;
  s->port = -1;
  uv_tcp_init(loop, &s->listener);
  s->listener.data = s;
  if ((rc = uv_tcp_bind(&s->listener, (struct sockaddr *)&ss, 0)) == 0)
    rc = uv_listen((uv_stream_t *)&s->listener, 128, http__on_connection);
  if (rc) {
    snprintf(err, errlen, "http: cannot listen on %s: %s", addr, uv_strerror(rc));
    /* The handle is live until its close callback, which frees s. */
    s->closing = 1;
    s->pending = 1;
    uv_close((uv_handle_t *)&s->listener, http__on_listener_closed);
    return rc;
  }
  struct sockaddr_storage bound;
  int len = sizeof bound;
  if (uv_tcp_getsockname(&s->listener, (struct sockaddr *)&bound, &len) == 0)
    s->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                : ((struct sockaddr_in *)&bound)->sin_port);
  *out = s;
  return 0;
}

int http_server_port(const http_server *s) { return s ? s->port : -1; }

size_t http_server_connections(const http_server *s) { return s ? s->nconns : 0; }

void http_server_close(http_server *s, void (*done)(void *), void *arg) {
  if (!s || s->closing) return;
  s->closing = 1;
  s->done = done;
  s->done_arg = arg;
  s->pending++;
  uv_close((uv_handle_t *)&s->listener, http__on_listener_closed);
  while (s->conns) http__conn_close(s->conns);
}
