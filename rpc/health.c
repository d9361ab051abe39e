/* grpc.health.v1.Health, built into every server: Check answers the current
 * status (NOT_FOUND for a service nobody declared), Watch sends the current
 * status at once and then every change (SERVICE_UNKNOWN while undeclared).
 * Runs on the loop thread like every handler. */
#include <stdlib.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "rpc/rpc_internal.h"

#define RPC__SERVICE_UNKNOWN GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN

typedef struct rpc__hsvc {
  char *name;
  int known;
  int status;
  rpc_call **w; /* open Watch calls */
  size_t nw, capw;
} rpc__hsvc;

struct rpc__health {
  rpc__hsvc *v;
  size_t n, cap;
};

rpc__health *rpc__health_new(void) { return calloc(1, sizeof(rpc__health)); }

void rpc__health_free(rpc__health *h) {
  for (size_t i = 0; i < h->n; i++) {
    free(h->v[i].name);
    free(h->v[i].w);
  }
  free(h->v);
  free(h);
}

static rpc__hsvc *rpc__hsvc_find(rpc__health *h, const char *name, int create) {
  for (size_t i = 0; i < h->n; i++)
    if (!strcmp(h->v[i].name, name)) return &h->v[i];
  if (!create) return NULL;
  if (h->n == h->cap) {
    size_t cap = h->cap ? h->cap * 2 : 8;
    rpc__hsvc *v = realloc(h->v, cap * sizeof *v);
    if (!v) return NULL;
    h->v = v;
    h->cap = cap;
  }
  rpc__hsvc *s = &h->v[h->n];
  memset(s, 0, sizeof *s);
  s->name = strdup(name);
  if (!s->name) return NULL;
  s->status = RPC__SERVICE_UNKNOWN;
  h->n++;
  return s;
}

static int rpc__send_status(rpc_call *c, int status) {
  Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  r.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)status;
  return rpc_call_send(c, &r.base);
}

void rpc__health_set(rpc__health *h, const char *service, int status) {
  rpc__hsvc *s = rpc__hsvc_find(h, service, 1);
  if (!s) return;
  int changed = !s->known || s->status != status;
  s->known = 1;
  s->status = status;
  if (!changed) return;
  for (size_t i = 0; i < s->nw; i++) rpc__send_status(s->w[i], status);
}

static void rpc__health_check(rpc_call *c, const ProtobufCMessage *req, void *ud) {
  rpc__health *h = ud;
  const Grpc__Health__V1__HealthCheckRequest *r = (const void *)req;
  rpc__hsvc *s = rpc__hsvc_find(h, r->service, 0);
  if (!s || !s->known) {
    rpc_call_fail(c, GRPC_STATUS_NOT_FOUND, "unknown service '%s'", r->service);
    return;
  }
  Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  resp.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)s->status;
  rpc_call_reply(c, &resp.base);
}

/* The client went away (or the server is shutting down): forget the watcher. */
static void rpc__health_unwatch(rpc_call *c, void *ud) {
  rpc__health *h = ud;
  for (size_t i = 0; i < h->n; i++)
    for (size_t j = 0; j < h->v[i].nw; j++)
      if (h->v[i].w[j] == c) {
        h->v[i].w[j] = h->v[i].w[--h->v[i].nw];
        rpc_call_finish(c, GRPC_STATUS_CANCELLED, "watch cancelled");
        return;
      }
}

static void rpc__health_watch(rpc_call *c, const ProtobufCMessage *req, void *ud) {
  rpc__health *h = ud;
  const Grpc__Health__V1__HealthCheckRequest *r = (const void *)req;
  rpc__hsvc *s = rpc__hsvc_find(h, r->service, 1);
  if (!s) {
    rpc_call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  if (s->nw == s->capw) {
    size_t cap = s->capw ? s->capw * 2 : 4;
    rpc_call **w = realloc(s->w, cap * sizeof *w);
    if (!w) {
      rpc_call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      return;
    }
    s->w = w;
    s->capw = cap;
  }
  s->w[s->nw++] = c;
  rpc_call_set_cancel_cb(c, rpc__health_unwatch, h);
  rpc__send_status(c, s->known ? s->status : RPC__SERVICE_UNKNOWN);
}

void rpc__health_methods(rpc__health *h, rpc_method out[2]) {
  out[0] = (rpc_method){"/grpc.health.v1.Health/Check",
                        RPC_UNARY,
                        &grpc__health__v1__health_check_request__descriptor,
                        &grpc__health__v1__health_check_response__descriptor,
                        0,
                        rpc__health_check,
                        h};
  out[1] = (rpc_method){"/grpc.health.v1.Health/Watch",
                        RPC_SERVER_STREAM,
                        &grpc__health__v1__health_check_request__descriptor,
                        &grpc__health__v1__health_check_response__descriptor,
                        0,
                        rpc__health_watch,
                        h};
}
