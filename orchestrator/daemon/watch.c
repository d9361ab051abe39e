/* WatchRun subscribers: a list per daemon, swept lazily. A client that goes
 * away only clears its subscriber's call (from the cancel callback, where the
 * list must not change under a publish); the next publish or end unlinks it. */
#include "orchestrator/daemon/watch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/daemon/now.h"

struct watch_sub {
  rpc_call *call; /* NULL once ended or cancelled */
  char run_id[64];
  uint64_t seq;
  struct watch_sub *next;
};

struct watch_hub {
  watch_sub *subs;
  int closing;
};

int watch_hub_new(watch_hub **out) {
  *out = calloc(1, sizeof **out);
  return *out ? 0 : -1;
}

void watch_hub_free(watch_hub *h) {
  if (!h) return;
  while (h->subs) {
    watch_sub *s = h->subs;
    h->subs = s->next;
    free(s);
  }
  free(h);
}

void watch_hub_closing(watch_hub *h) { h->closing = 1; }

watch_sub *watch_sub_new(rpc_call *call, const char *run_id) {
  watch_sub *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->call = call;
  snprintf(s->run_id, sizeof s->run_id, "%s", run_id);
  return s;
}

void watch_sub_free(watch_sub *s) { free(s); }

int watch_send(watch_sub *s, Rlorch__V1__RunEvent *ev) {
  ev->seq = ++s->seq;
  if (!ev->unix_ms) ev->unix_ms = now_unix_ms();
  return rpc_call_send(s->call, &ev->base);
}

static void watch__on_cancel(rpc_call *call, void *ud) {
  watch_sub *s = ud;
  /* Unlinked and freed by the next sweep; the call ends now. */
  s->call = NULL;
  rpc_call_finish(call, GRPC_STATUS_CANCELLED, "watch cancelled");
}

void watch_subscribe(watch_hub *h, watch_sub *s) {
  s->next = h->subs;
  h->subs = s;
  rpc_call_set_cancel_cb(s->call, watch__on_cancel, s);
}

static void watch__sweep(watch_hub *h) {
  watch_sub **pp = &h->subs;
  while (*pp) {
    watch_sub *s = *pp;
    if (!s->call) {
      *pp = s->next;
      free(s);
    } else {
      pp = &s->next;
    }
  }
}

void watch_publish(watch_hub *h, const char *run_id, const Rlorch__V1__RunEvent *ev) {
  watch__sweep(h);
  for (watch_sub *s = h->subs; s; s = s->next) {
    if (strcmp(s->run_id, run_id) != 0 || !s->call) continue;
    Rlorch__V1__RunEvent copy = *ev;
    copy.unix_ms = ev->unix_ms ? ev->unix_ms : now_unix_ms();
    watch_send(s, &copy);
  }
}

void watch_end(watch_hub *h, const char *run_id) {
  for (watch_sub *s = h->subs; s; s = s->next) {
    if (strcmp(s->run_id, run_id) != 0 || !s->call) continue;
    rpc_call_set_cancel_cb(s->call, NULL, NULL);
    if (h->closing)
      rpc_call_finish(s->call, GRPC_STATUS_UNAVAILABLE, "server shutting down");
    else
      rpc_call_finish(s->call, GRPC_STATUS_OK, "run ended");
    s->call = NULL;
  }
  watch__sweep(h);
}
