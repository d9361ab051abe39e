/* rpc server: gRPC C core served from a libuv loop.
 *
 * A thread per completion queue (rpc_server_opts.completion_queues) blocks in
 * grpc_completion_queue_next and appends (tag, ok) to one locked list, then
 * uv_async_send; async sends coalesce, so the loop drains the whole list each
 * time it wakes. Everything else (call state, every
 * grpc_call_start_batch, handlers, health) runs on the loop thread.
 *
 * Known methods are registered with gRPC so that the request message arrives
 * together with the new call (one hand-off instead of two); anything else
 * arrives through the generic grpc_server_request_call and is answered
 * UNIMPLEMENTED here, so that the hook sees it too. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "rlorch/rpc/v1/call.pb-c.h"
#include "rpc/rpc_internal.h"

#define RPC__ARM_PER_METHOD 24 /* > 16 concurrent clients on one method */
#define RPC__ARM_GENERIC 8
#define RPC__DEFAULT_MAX_MSG (4u << 20)
/* At most this many completion queues (rpc_server_opts.completion_queues). */
#define RPC__MAX_CQ 8

typedef enum {
  RPC__T_NEW = 1, /* a requested call arrived (or the request failed) */
  RPC__T_RECV,    /* request message of a generically received call */
  RPC__T_CLOSE,   /* RECV_CLOSE_ON_SERVER: the call is over or cancelled */
  RPC__T_SEND,    /* one stream message went out */
  RPC__T_STATUS,  /* the final batch (status) completed */
  RPC__T_OMSG,    /* RECV_MESSAGE of a one-way stream (NULL: half-closed) */
  RPC__T_SHUTDOWN /* grpc_server_shutdown_and_notify completed */
} rpc__tag_kind;

typedef struct rpc__tag {
  rpc__tag_kind kind;
  rpc_call *c;
} rpc__tag;

typedef struct rpc__event {
  rpc__tag *tag;
  int ok;
} rpc__event;

typedef struct rpc__evlist {
  rpc__event *v;
  size_t n, cap;
} rpc__evlist;

struct rpc_call {
  rpc_server *s;
  rpc__entry *e; /* NULL until the method is known */
  grpc_call *call;
  grpc_call_details details; /* generic calls only */
  grpc_metadata_array md;
  gpr_timespec deadline;
  grpc_byte_buffer *payload;
  rpc__tag t_new, t_recv, t_close, t_send, t_status;
  int started;      /* arrived: counted in the hook, lives in `live` */
  int pending;      /* batches in flight */
  int holds;        /* rpc__hold: code on the stack still uses the call */
  int cancelled;    /* RECV_CLOSE_ON_SERVER said so, or a send failed */
  int client_cancelled; /* value written by RECV_CLOSE_ON_SERVER */
  int close_done;
  int close_started;
  int close_merged; /* RECV_CLOSE_ON_SERVER started (alone or in the final batch) */
  int ended;        /* final batch started */
  int status_done, status_ok;
  int md_sent;
  int finish_pending; /* stream ended by the handler, queue still draining */
  int send_failed;    /* a stream message could not be started */
  int zombie;         /* ended by the server at shutdown: memory kept until free */
  int released;       /* gRPC resources given back */
  double cancel_deadline_left; /* deadline seconds left when cancelled */
  grpc_status_code code;
  char *finish_msg;
  grpc_slice status_slice;
  int has_status_slice;
  grpc_byte_buffer *reply_bb; /* unary reply, or the stream message in flight */
  grpc_byte_buffer **q;       /* queued stream messages */
  size_t qhead, qlen, qcap;
  void (*on_cancel)(rpc_call *, void *);
  void *cancel_ud;
  void (*on_writable)(rpc_call *, void *); /* rpc_call_set_writable_cb */
  void *writable_ud;
  char *method; /* as the client sent it (generic) */
  char *peer;
  double t0;
  rpc_call *prev, *next; /* s->live (started, not ended) or s->zombies; a message call:
                            its stream's msgs, or s->orphans */
  /* One-way streams. A message call is a bare rpc_call (no grpc_call of its
   * own) with is_msg set; its stream keeps it in `msgs` until the handler
   * ends it. */
  rpc__tag t_omsg;
  int is_msg;
  rpc_call *parent;   /* a message call: its stream; NULL once the stream is gone */
  rpc_call *msgs;     /* a stream: its message calls not yet ended */
  int n_open;         /* a stream: how many are in msgs */
  int recv_armed;     /* a stream: a RECV_MESSAGE is in flight */
  int half_closed;    /* a stream: the client sent its last message */
  int dispatching;    /* a stream: a handler runs for one of its messages */
  uint64_t seq;       /* a stream: the last sequence given; a message call: its own */
  grpc_status_code cancel_code; /* a message call cancelled: the code it counts with */
};

struct rpc_server {
  uv_loop_t *loop;
  rpc_server_opts o;
  char *token;
  rpc__table table;
  rpc__health *health;
  grpc_server *server;
  grpc_completion_queue *cq[RPC__MAX_CQ];
  int ncq;          /* queues in use, 1..RPC__MAX_CQ */
  unsigned next_cq; /* the queue the next requested call is bound to */
  int port;
  int generic_armed;

  struct rpc__cq_thread {
    rpc_server *s;
    grpc_completion_queue *cq;
    uv_thread_t tid;
    int started;
  } threads[RPC__MAX_CQ];
  uv_mutex_t mu;
  rpc__evlist in, work; /* in: filled by the cq thread; work: being drained */
  uv_async_t async;
  uv_timer_t grace;
  int handles_open;

  size_t ncalls;   /* allocated call objects that gRPC still knows (slots included) */
  rpc_call *live;  /* started and not yet ended */
  rpc_call *zombies;
  rpc_call *orphans; /* message calls whose stream is gone, not yet ended by their handler */
  rpc__tag t_shutdown;
  int shutting_down, notified, cancelled_all, finishing, closed;
  void (*done)(void *);
  void *done_ud;
  int test_skip_batches, test_fail_batches; /* rpc__test_fail_batches */
};

static void rpc__on_event(rpc_server *s, rpc__tag *tag, int ok);
static void rpc__check_shutdown(rpc_server *s);
static void rpc__oneway_cancel_msgs(rpc_call *c, grpc_status_code why);
static void rpc__oneway_orphan_msgs(rpc_call *c);

/* ---- completion-queue thread and hand-off ------------------------------------ */

static int rpc__evlist_push(rpc__evlist *l, rpc__tag *tag, int ok) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 64;
    rpc__event *v = realloc(l->v, cap * sizeof *v);
    if (!v) return -1;
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n++] = (rpc__event){tag, ok};
  return 0;
}

static void rpc__cq_thread(void *arg) {
  struct rpc__cq_thread *t = arg;
  rpc_server *s = t->s;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(t->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    if (ev.type != GRPC_OP_COMPLETE) continue;
    uv_mutex_lock(&s->mu);
    int wake = s->in.n == 0; /* a wake-up is already on its way otherwise */
    while (rpc__evlist_push(&s->in, ev.tag, ev.success) < 0) {
      /* Dropping an event would leak a call forever; memory comes back. */
      uv_mutex_unlock(&s->mu);
      uv_sleep(1);
      uv_mutex_lock(&s->mu);
    }
    uv_mutex_unlock(&s->mu);
    if (wake) uv_async_send(&s->async);
  }
}

/* Swap the lists under the lock, then run the events without it. */
static void rpc__drain(rpc_server *s) {
  for (;;) {
    uv_mutex_lock(&s->mu);
    rpc__evlist t = s->in;
    s->in = s->work;
    s->work = t;
    s->in.n = 0;
    uv_mutex_unlock(&s->mu);
    if (s->work.n == 0) return;
    for (size_t i = 0; i < s->work.n; i++) rpc__on_event(s, s->work.v[i].tag, s->work.v[i].ok);
    s->work.n = 0;
  }
}

static void rpc__finish(rpc_server *s);

static void rpc__on_async(uv_async_t *a) {
  rpc_server *s = a->data;
  rpc__drain(s);
  if (s->finishing && !s->closed) rpc__finish(s);
}

/* ---- call objects ------------------------------------------------------------ */

static void rpc__list_add(rpc_call **head, rpc_call *c) {
  c->prev = NULL;
  c->next = *head;
  if (*head) (*head)->prev = c;
  *head = c;
}

static void rpc__list_del(rpc_call **head, rpc_call *c) {
  if (c->prev)
    c->prev->next = c->next;
  else if (*head == c)
    *head = c->next;
  if (c->next) c->next->prev = c->prev;
  c->prev = c->next = NULL;
}

static rpc_call *rpc__call_alloc(rpc_server *s, rpc__entry *e) {
  rpc_call *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->s = s;
  c->e = e;
  c->t_new = (rpc__tag){RPC__T_NEW, c};
  c->t_recv = (rpc__tag){RPC__T_RECV, c};
  c->t_close = (rpc__tag){RPC__T_CLOSE, c};
  c->t_send = (rpc__tag){RPC__T_SEND, c};
  c->t_status = (rpc__tag){RPC__T_STATUS, c};
  c->t_omsg = (rpc__tag){RPC__T_OMSG, c};
  grpc_metadata_array_init(&c->md);
  grpc_call_details_init(&c->details);
  return c;
}

static void rpc__call_release(rpc_call *c) {
  if (c->released) return;
  c->released = 1;
  if (c->call) grpc_call_unref(c->call);
  c->call = NULL;
  grpc_metadata_array_destroy(&c->md);
  grpc_call_details_destroy(&c->details);
  if (c->payload) grpc_byte_buffer_destroy(c->payload);
  if (c->reply_bb) grpc_byte_buffer_destroy(c->reply_bb);
  for (size_t i = 0; i < c->qlen; i++) grpc_byte_buffer_destroy(c->q[(c->qhead + i) % c->qcap]);
  c->payload = c->reply_bb = NULL;
  c->qlen = 0;
  free(c->q);
  c->q = NULL;
  if (c->has_status_slice) grpc_slice_unref(c->status_slice);
  c->has_status_slice = 0;
  free(c->finish_msg);
  c->finish_msg = NULL;
  if (c->peer) gpr_free(c->peer);
  c->peer = NULL;
}

static void rpc__call_free(rpc_call *c) {
  rpc__call_release(c);
  free(c->method);
  free(c);
}

static void rpc__arm(rpc_server *s, rpc__entry *e) {
  rpc_call *c = rpc__call_alloc(s, e);
  if (!c) return;
  grpc_call_error err;
  /* A one-way stream's messages are read with RECV_MESSAGE: gRPC wants no
   * payload pointer for a method registered with GRPC_SRM_PAYLOAD_NONE. */
  grpc_byte_buffer **payload = e && e->m.kind == RPC_ONEWAY_STREAM ? NULL : &c->payload;
  grpc_completion_queue *cq = s->cq[s->next_cq++ % (unsigned)s->ncq];
  if (e)
    err = grpc_server_request_registered_call(s->server, e->registered, &c->call, &c->deadline,
                                              &c->md, payload, cq, cq, &c->t_new);
  else
    err = grpc_server_request_call(s->server, &c->call, &c->details, &c->md, cq, cq, &c->t_new);
  if (err != GRPC_CALL_OK) {
    rpc__call_free(c);
    return;
  }
  s->ncalls++;
  if (e)
    e->armed++;
  else
    s->generic_armed++;
}

static void rpc__rearm(rpc_server *s) {
  if (s->shutting_down) return;
  for (size_t i = 0; i < s->table.n; i++)
    while (s->table.e[i].armed < RPC__ARM_PER_METHOD) {
      int before = s->table.e[i].armed;
      rpc__arm(s, &s->table.e[i]);
      if (s->table.e[i].armed == before) break;
    }
  while (s->generic_armed < RPC__ARM_GENERIC) {
    int before = s->generic_armed;
    rpc__arm(s, NULL);
    if (s->generic_armed == before) break;
  }
}

static int rpc__batch(rpc_call *c, const grpc_op *ops, size_t n, rpc__tag *tag) {
  rpc_server *s = c->s;
  if (s->test_skip_batches > 0) {
    s->test_skip_batches--;
  } else if (s->test_fail_batches > 0) {
    s->test_fail_batches--;
    return -1;
  }
  grpc_call_error err = grpc_call_start_batch(c->call, ops, n, tag, NULL);
  if (err != GRPC_CALL_OK) return -1;
  c->pending++;
  return 0;
}

static grpc_status_code rpc__effective_code(const rpc_call *c) {
  if (c->status_ok && !c->client_cancelled) return c->code;
  /* The client's deadline passes a little before the server's (the server
   * counts from arrival), so a cancel just before it is the deadline too. */
  if (c->cancelled && c->cancel_deadline_left < 0.1) return GRPC_STATUS_DEADLINE_EXCEEDED;
  return c->code == GRPC_STATUS_UNAVAILABLE ? c->code : GRPC_STATUS_CANCELLED;
}

/* gRPC is done with the call once its final batch and RECV_CLOSE_ON_SERVER
 * have completed; only then can its memory go, and only when no code up the
 * stack still holds it (see rpc__hold). */
static void rpc__maybe_free(rpc_call *c) {
  if (!c->ended || !c->status_done || c->pending > 0 || c->holds > 0 || c->released) return;
  rpc_server *s = c->s;
  if (c->msgs) rpc__oneway_orphan_msgs(c);
  if (s->o.on_call_done)
    s->o.on_call_done(rpc_call_method(c), rpc__effective_code(c), rpc__now() - c->t0,
                      s->o.hook_ud);
  s->ncalls--;
  if (c->zombie) {
    rpc__call_release(c); /* the handler may still hold the pointer */
  } else {
    rpc__call_free(c);
  }
  rpc__check_shutdown(s);
}

/* Every entry into a call's state machine (a completion, a handler's reply,
 * a send, a shutdown) holds the call for its whole run: whatever it calls may
 * end the call, and ending it may make it free to go (a failed final batch
 * completes nothing), yet the caller still reads it afterwards. The memory
 * goes in the outermost rpc__unhold, never under a caller's feet. */
static void rpc__hold(rpc_call *c) { c->holds++; }

static void rpc__unhold(rpc_call *c) {
  c->holds--;
  rpc__maybe_free(c);
}

/* Starts the final batch: initial metadata if not sent, the unary reply if
 * any, the status. Runs under a hold (every caller has one), so `c` stays
 * valid here even when the batch fails. */
static int rpc__end(rpc_call *c, grpc_status_code code, const char *msg,
                    grpc_byte_buffer *reply) {
  rpc_server *s = c->s;
  grpc_op ops[4];
  size_t n = 0;
  memset(ops, 0, sizeof ops);
  /* Messages were lost: OK would make the client take what it got for the
   * whole stream. */
  if (c->send_failed && code == GRPC_STATUS_OK) {
    code = GRPC_STATUS_INTERNAL;
    msg = "a stream message could not be sent";
  }
  c->ended = 1;
  c->finish_pending = 0;
  c->on_writable = NULL; /* nothing more can be sent */
  c->code = code;
  if (c->started) rpc__list_del(&s->live, c);
  if (c->zombie) rpc__list_add(&s->zombies, c);
  if (!c->md_sent) {
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    c->md_sent = 1;
  }
  if (reply) {
    c->reply_bb = reply;
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = reply;
  }
  c->status_slice = grpc_slice_from_copied_string(msg ? msg : "");
  c->has_status_slice = 1;
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = code;
  ops[n++].data.send_status_from_server.status_details = &c->status_slice;
  if (!c->close_started) { /* ended at once: one batch, one hand-off */
    c->close_started = 1;
    c->close_merged = 1;
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n++].data.recv_close_on_server.cancelled = &c->client_cancelled;
  }
  if (rpc__batch(c, ops, n, &c->t_status) < 0)
    c->status_done = 1; /* nothing will complete: the caller's unhold frees it */
  if (c->msgs) rpc__oneway_cancel_msgs(c, code);
  if (s->shutting_down) rpc__check_shutdown(s);
  return 0;
}

static void rpc__fail_now(rpc_call *c, grpc_status_code code, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  rpc__end(c, code, buf, NULL);
}

static const grpc_metadata *rpc__find_md(const grpc_metadata_array *md, const char *key) {
  for (size_t i = 0; i < md->count; i++)
    if (!grpc_slice_str_cmp(md->metadata[i].key, key)) return &md->metadata[i];
  return NULL;
}

/* The bearer token of a method that requires one: 0, or -1 with the call
 * ended UNAUTHENTICATED. */
static int rpc__auth(rpc_call *c) {
  rpc_server *s = c->s;
  if (!c->e->m.requires_auth || !s->token) return 0;
  const grpc_metadata *a = rpc__find_md(&c->md, "authorization");
  if (!a) {
    rpc__fail_now(c, GRPC_STATUS_UNAUTHENTICATED, "missing bearer token");
    return -1;
  }
  if (rpc__check_bearer((const char *)GRPC_SLICE_START_PTR(a->value),
                        GRPC_SLICE_LENGTH(a->value), s->token) < 0) {
    rpc__fail_now(c, GRPC_STATUS_UNAUTHENTICATED, "invalid bearer token");
    return -1;
  }
  return 0;
}

/* Size limit, precheck, decoder, for a unary request and a one-way message
 * alike. Takes bb. The request, or NULL with the refusal in *code and why. */
static ProtobufCMessage *rpc__read_request(rpc_server *s, const rpc_method *m,
                                           grpc_byte_buffer *bb, grpc_status_code *code,
                                           char *why, size_t whylen) {
  size_t max = s->o.max_message_bytes ? s->o.max_message_bytes : RPC__DEFAULT_MAX_MSG;
  size_t len = grpc_byte_buffer_length(bb);
  if (len > max) {
    grpc_byte_buffer_destroy(bb);
    *code = GRPC_STATUS_RESOURCE_EXHAUSTED;
    snprintf(why, whylen, "request of %zu bytes is over the limit of %zu bytes", len, max);
    return NULL;
  }
  uint8_t *bytes = NULL;
  size_t nbytes = 0;
  int flat = rpc__flatten(bb, &bytes, &nbytes);
  grpc_byte_buffer_destroy(bb);
  if (flat == 0 && m->precheck) {
    why[0] = '\0';
    grpc_status_code st = m->precheck(bytes, nbytes, m->ud, why, whylen);
    if (st != GRPC_STATUS_OK) {
      free(bytes);
      *code = st;
      return NULL;
    }
  }
  ProtobufCMessage *req = flat == 0 ? rpc_unpack(m->request, bytes, nbytes) : NULL;
  free(bytes);
  if (!req) {
    *code = GRPC_STATUS_INVALID_ARGUMENT;
    snprintf(why, whylen, "cannot decode %s", m->request->name);
  }
  return req;
}

static void rpc__oneway_open(rpc_call *c);

/* Auth, decode, handler. The request message is freed when the handler
 * returns. */
static void rpc__dispatch(rpc_call *c) {
  const rpc_method *m = &c->e->m;
  if (m->kind == RPC_ONEWAY_STREAM) {
    rpc__oneway_open(c);
    return;
  }
  if (rpc__auth(c) < 0) return;
  if (!c->payload) {
    rpc__fail_now(c, GRPC_STATUS_INVALID_ARGUMENT, "missing request message %s",
                  m->request->name);
    return;
  }
  grpc_byte_buffer *bb = c->payload;
  c->payload = NULL;
  grpc_status_code code = GRPC_STATUS_OK;
  char why[512] = "";
  ProtobufCMessage *req = rpc__read_request(c->s, m, bb, &code, why, sizeof why);
  if (!req) {
    rpc__fail_now(c, code, "%s", why);
    return;
  }
  m->handler(c, req, m->ud);
  protobuf_c_message_free_unpacked(req, NULL);
}

/* A requested call arrived: re-arm first, so the next client never waits,
 * then watch for cancellation and dispatch. */
/* Watches for cancellation of a call the handler did not end at once. */
static void rpc__watch_close(rpc_call *c) {
  if (c->close_started || c->ended) return;
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  op.data.recv_close_on_server.cancelled = &c->client_cancelled;
  c->close_started = 1;
  if (rpc__batch(c, &op, 1, &c->t_close) < 0) c->close_done = 1;
}

/* Runs under the caller's hold: the handler may end the call. */
static void rpc__dispatch_and_watch(rpc_call *c) {
  rpc__dispatch(c);
  rpc__watch_close(c);
}

/* A requested call arrived. RECV_CLOSE_ON_SERVER is started right after the
 * handler unless the handler ended the call at once, in which case it rides
 * in the final batch. Re-arming comes after the handler: it is off the
 * latency path and enough calls stay requested meanwhile. */
static void rpc__on_new(rpc_server *s, rpc_call *c, int ok) {
  if (c->e)
    c->e->armed--;
  else
    s->generic_armed--;
  if (!ok || !c->call) { /* the server is shutting down */
    s->ncalls--;
    rpc__call_free(c);
    rpc__check_shutdown(s);
    return;
  }
  c->t0 = rpc__now();
  c->started = 1;
  rpc__list_add(&s->live, c);
  rpc__hold(c);
  if (c->e) { /* requested for its method: the request came with it */
    rpc__dispatch_and_watch(c);
  } else {
    c->deadline = c->details.deadline;
    c->method = grpc_slice_to_c_string(c->details.method);
    c->e = rpc__table_find(&s->table, (const char *)GRPC_SLICE_START_PTR(c->details.method),
                           GRPC_SLICE_LENGTH(c->details.method));
    if (!c->e) {
      rpc__fail_now(c, GRPC_STATUS_UNIMPLEMENTED, "unknown method %s", c->method);
    } else if (c->e->m.kind == RPC_ONEWAY_STREAM) {
      rpc__dispatch_and_watch(c); /* its messages are read with RECV_MESSAGE anyway */
    } else {
      /* A known method that gRPC did not match (another host): read the
       * request ourselves. */
      grpc_op op;
      memset(&op, 0, sizeof op);
      op.op = GRPC_OP_RECV_MESSAGE;
      op.data.recv_message.recv_message = &c->payload;
      rpc__watch_close(c);
      if (rpc__batch(c, &op, 1, &c->t_recv) < 0)
        rpc__fail_now(c, GRPC_STATUS_INTERNAL, "cannot read the request");
    }
  }
  rpc__unhold(c); /* may free c */
  rpc__rearm(s);
}

static void rpc__pump(rpc_call *c);
static void rpc__maybe_writable(rpc_call *c);
static void rpc__oneway_on_recv(rpc_call *c, int ok);

static void rpc__notice_cancel(rpc_call *c) {
  if (c->cancelled) return;
  c->cancelled = 1;
  c->on_writable = NULL; /* sends fail from now on: nothing to be asked for */
  c->cancel_deadline_left = rpc_call_deadline_remaining(c);
  /* Queued stream messages will never go out. */
  for (size_t i = 0; i < c->qlen; i++) grpc_byte_buffer_destroy(c->q[(c->qhead + i) % c->qcap]);
  c->qlen = 0;
  if (!c->ended && !c->finish_pending && c->on_cancel) {
    void (*cb)(rpc_call *, void *) = c->on_cancel;
    c->on_cancel = NULL;
    cb(c, c->cancel_ud);
  } else if (c->finish_pending) {
    rpc__pump(c);
  }
  /* No handler holds a one-way stream itself: it ends here (its message
   * calls get their cancel callbacks), and its memory goes as usual. */
  if (c->e && c->e->m.kind == RPC_ONEWAY_STREAM && c->started && !c->ended &&
      !c->finish_pending) {
    if (c->s->shutting_down)
      rpc__end(c, GRPC_STATUS_UNAVAILABLE, "server shutting down", NULL);
    else if (c->send_failed)
      rpc__end(c, GRPC_STATUS_INTERNAL, "a stream message could not be sent", NULL);
    else
      rpc__end(c, GRPC_STATUS_CANCELLED, "stream cancelled", NULL);
    return;
  }
  /* At shutdown a call the handler does not end would hold the server
   * forever: end it here and keep its memory for the handler's pointer. */
  if (c->s->shutting_down && c->started && !c->ended && !c->finish_pending) {
    c->zombie = 1;
    rpc__end(c, GRPC_STATUS_UNAVAILABLE, "server shutting down", NULL);
  }
}

static void rpc__on_event(rpc_server *s, rpc__tag *tag, int ok) {
  rpc_call *c = tag->c;
  if (tag->kind == RPC__T_NEW) {
    rpc__on_new(s, c, ok);
    return;
  }
  if (tag->kind == RPC__T_SHUTDOWN) {
    s->notified = 1;
    rpc__check_shutdown(s);
    return;
  }
  rpc__hold(c);
  switch (tag->kind) {
  case RPC__T_RECV:
    c->pending--;
    if (!ok) {
      rpc__notice_cancel(c);
      if (!c->ended) rpc__fail_now(c, GRPC_STATUS_CANCELLED, "request not received");
    } else if (!c->ended) {
      rpc__dispatch_and_watch(c);
    }
    break;
  case RPC__T_OMSG:
    c->pending--;
    c->recv_armed = 0;
    rpc__oneway_on_recv(c, ok);
    break;
  case RPC__T_CLOSE:
    c->pending--;
    c->close_done = 1;
    if (c->client_cancelled) rpc__notice_cancel(c);
    break;
  case RPC__T_SEND:
    c->pending--;
    if (c->reply_bb) grpc_byte_buffer_destroy(c->reply_bb);
    c->reply_bb = NULL;
    if (!ok) rpc__notice_cancel(c);
    rpc__pump(c);
    rpc__maybe_writable(c);
    break;
  case RPC__T_STATUS:
    c->pending--;
    c->status_done = 1;
    c->status_ok = ok;
    if (c->close_merged) c->close_done = 1;
    break;
  default:
    break;
  }
  rpc__unhold(c); /* may free c */
}

/* ---- streams ------------------------------------------------------------------ */

/* One SEND_MESSAGE in flight at a time keeps the order and bounds what gRPC
 * buffers; the status follows the last queued message. */
static void rpc__pump(rpc_call *c) {
  if (c->ended || c->reply_bb) return;
  if (c->qlen && !c->cancelled) {
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    int md_now = !c->md_sent;
    if (md_now) {
      ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
      c->md_sent = 1;
    }
    c->reply_bb = c->q[c->qhead];
    c->qhead = (c->qhead + 1) % c->qcap;
    c->qlen--;
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = c->reply_bb;
    if (rpc__batch(c, ops, n, &c->t_send) < 0) {
      grpc_byte_buffer_destroy(c->reply_bb);
      c->reply_bb = NULL;
      c->send_failed = 1;
      if (md_now) c->md_sent = 0; /* it did not go out: the status batch sends it */
      rpc__notice_cancel(c);
    }
    return;
  }
  if (c->finish_pending) rpc__end(c, c->code, c->finish_msg, NULL);
}

/* A message went out and nothing is queued behind it: the handler that paces
 * its stream (rpc_call_set_writable_cb) may encode the next one. Not once the
 * call is cancelled, ended or finishing: its handler may have freed what ud
 * points to. */
static void rpc__maybe_writable(rpc_call *c) {
  if (!c->on_writable || c->ended || c->finish_pending || c->cancelled || c->reply_bb || c->qlen)
    return;
  c->on_writable(c, c->writable_ud);
}

/* Doubles the ring of queued stream messages; -1 when out of memory. */
static int rpc__queue_grow(rpc_call *c) {
  size_t cap = c->qcap ? c->qcap * 2 : 8;
  grpc_byte_buffer **q = malloc(cap * sizeof *q);
  if (!q) return -1;
  for (size_t i = 0; i < c->qlen; i++) q[i] = c->q[(c->qhead + i) % c->qcap];
  free(c->q);
  c->q = q;
  c->qcap = cap;
  c->qhead = 0;
  return 0;
}

/* Queues an encoded stream message (taken) and starts it when nothing is
 * in flight; -1 (bb freed) once the stream is over or out of memory. */
static int rpc__queue_send(rpc_call *c, grpc_byte_buffer *bb) {
  if (c->ended || c->finish_pending || c->cancelled ||
      (c->qlen == c->qcap && rpc__queue_grow(c) < 0)) {
    grpc_byte_buffer_destroy(bb);
    return -1;
  }
  c->q[(c->qhead + c->qlen) % c->qcap] = bb;
  c->qlen++;
  rpc__hold(c);
  rpc__pump(c);
  rpc__unhold(c);
  return 0;
}

int rpc_call_send(rpc_call *c, const ProtobufCMessage *msg) {
  if (c->is_msg || c->ended || c->finish_pending || c->cancelled) return -1;
  return rpc__queue_send(c, rpc__encode(msg));
}

/* Ends a stream once what is queued went out. */
static int rpc__stream_finish(rpc_call *c, grpc_status_code code, const char *msg) {
  if (c->ended || c->finish_pending) return -1;
  if (c->reply_bb || c->qlen) {
    c->finish_pending = 1;
    c->code = code;
    c->finish_msg = strdup(msg ? msg : "");
    return 0;
  }
  rpc__hold(c);
  int rc = rpc__end(c, code, msg, NULL);
  rpc__unhold(c);
  return rc;
}

static int rpc__msg_end(rpc_call *m, grpc_status_code code, const char *msg);

int rpc_call_finish(rpc_call *c, grpc_status_code code, const char *msg) {
  if (c->is_msg) return -1;
  return rpc__stream_finish(c, code, msg);
}

int rpc_call_reply(rpc_call *c, const ProtobufCMessage *resp) {
  if (c->is_msg) return rpc__msg_end(c, GRPC_STATUS_OK, ""); /* not answered */
  if (c->ended || c->finish_pending) return -1;
  rpc__hold(c);
  int rc = rpc__end(c, GRPC_STATUS_OK, "", rpc__encode(resp));
  rpc__unhold(c);
  return rc;
}

int rpc_call_fail(rpc_call *c, grpc_status_code code, const char *fmt, ...) {
  if (c->ended || c->finish_pending) return -1;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (c->is_msg) return rpc__msg_end(c, code, buf);
  return rpc__stream_finish(c, code, buf);
}

const char *rpc_call_method(const rpc_call *c) {
  if (c->method) return c->method;
  return c->e ? c->e->m.name : "";
}

const char *rpc_call_peer(const rpc_call *c) {
  if (c->is_msg) return c->parent ? rpc_call_peer(c->parent) : "";
  if (!c->peer && c->call) ((rpc_call *)c)->peer = grpc_call_get_peer(c->call);
  return c->peer ? c->peer : "";
}

double rpc_call_deadline_remaining(const rpc_call *c) {
  gpr_timespec d = gpr_convert_clock_type(c->deadline, GPR_CLOCK_MONOTONIC);
  if (gpr_time_cmp(d, gpr_inf_future(GPR_CLOCK_MONOTONIC)) >= 0) return INFINITY;
  double r = gpr_timespec_to_micros(gpr_time_sub(d, gpr_now(GPR_CLOCK_MONOTONIC))) * 1e-6;
  return r > 0 ? r : 0;
}

int rpc_call_cancelled(const rpc_call *c) { return c->cancelled; }

void rpc_call_set_cancel_cb(rpc_call *c, void (*on_cancel)(rpc_call *c, void *ud), void *ud) {
  c->on_cancel = on_cancel;
  c->cancel_ud = ud;
}

void rpc_call_set_writable_cb(rpc_call *c, void (*on_writable)(rpc_call *c, void *ud), void *ud) {
  if (c->is_msg) return; /* a message call sends nothing */
  c->on_writable = on_writable;
  c->writable_ud = ud;
}

rpc_server *rpc_call_server(const rpc_call *c) { return c->s; }

/* ---- one-way streams ------------------------------------------------------------ */

/* The stream's initial metadata carries this entry: a client tells a stream
 * that opened from a refusal (UNIMPLEMENTED, UNAUTHENTICATED), which also
 * brings initial metadata, before the status, without waiting for it. */
#define RPC__ONEWAY_MD_KEY "rlorch-oneway"

static void rpc__oneway_read(rpc_call *c);

/* Arrived: auth, then the initial metadata and the first read in one batch.
 * RECV_CLOSE_ON_SERVER follows (rpc__dispatch_and_watch). */
static void rpc__oneway_open(rpc_call *c) {
  if (c->s->shutting_down) { /* arrived as the server stopped: it would hold it */
    rpc__fail_now(c, GRPC_STATUS_UNAVAILABLE, "server shutting down");
    return;
  }
  if (rpc__auth(c) < 0) return;
  grpc_metadata md;
  memset(&md, 0, sizeof md);
  md.key = grpc_slice_from_static_string(RPC__ONEWAY_MD_KEY);
  md.value = grpc_slice_from_static_string("1");
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[0].data.send_initial_metadata.count = 1;
  ops[0].data.send_initial_metadata.metadata = &md;
  ops[1].op = GRPC_OP_RECV_MESSAGE;
  ops[1].data.recv_message.recv_message = &c->payload;
  if (rpc__batch(c, ops, 2, &c->t_omsg) < 0) {
    rpc__fail_now(c, GRPC_STATUS_INTERNAL, "cannot read the stream");
    return;
  }
  c->md_sent = 1;
  c->recv_armed = 1;
}

/* Answers message `seq` with a CallFailure, behind what is queued. */
static void rpc__oneway_answer(rpc_call *c, uint64_t seq, grpc_status_code code,
                               const char *msg) {
  if (c->ended || c->finish_pending || c->cancelled) return;
  Rlorch__Rpc__V1__CallFailure f = RLORCH__RPC__V1__CALL_FAILURE__INIT;
  f.sequence = seq;
  f.code = (int32_t)code;
  f.message = (char *)msg;
  (void)rpc__queue_send(c, rpc__encode(&f.base)); /* -1: the stream ends, it says how */
}

/* The client half-closed: the stream ends OK once every message call ended;
 * rpc__stream_finish lets the queued answers out first. */
static void rpc__oneway_maybe_done(rpc_call *c) {
  if (!c->half_closed || c->n_open > 0 || c->dispatching || c->ended || c->finish_pending)
    return;
  rpc__stream_finish(c, GRPC_STATUS_OK, "");
}

/* Reads the next message, unless one is being read or handled, the stream
 * is over or RPC_ONEWAY_PENDING message calls are still open. */
static void rpc__oneway_read(rpc_call *c) {
  if (c->recv_armed || c->dispatching || c->half_closed || c->ended || c->finish_pending ||
      c->cancelled || c->n_open >= RPC_ONEWAY_PENDING)
    return;
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &c->payload;
  if (rpc__batch(c, &op, 1, &c->t_omsg) < 0) {
    rpc__fail_now(c, GRPC_STATUS_INTERNAL, "cannot read the stream");
    return;
  }
  c->recv_armed = 1;
}

static grpc_status_code rpc__msg_code(const rpc_call *m) {
  return m->cancelled ? m->cancel_code : m->code;
}

static void rpc__msg_report(rpc_call *m) {
  rpc_server *s = m->s;
  if (s->o.on_call_done)
    s->o.on_call_done(m->e->m.name, rpc__msg_code(m), rpc__now() - m->t0, s->o.hook_ud);
}

/* A message call's memory goes once it is ended and no caller up the stack
 * (dispatch, a cancel callback's run) still reads it. */
static void rpc__msg_unhold(rpc_call *m) {
  if (--m->holds == 0 && m->ended) free(m);
}

/* Ends a message call: answers a failure on its stream, counts it, and lets
 * the stream read on (or end, once half-closed). 0, or -1 when it was ended
 * already or its stream is gone (nothing is answered then: an orphan, which
 * was counted when its stream went). */
static int rpc__msg_end(rpc_call *m, grpc_status_code code, const char *msg) {
  if (m->ended) return -1;
  m->ended = 1;
  m->code = code;
  rpc_call *c = m->parent;
  if (!c) {
    rpc__list_del(&m->s->orphans, m);
    m->holds++;
    rpc__msg_unhold(m);
    return -1;
  }
  m->parent = NULL;
  rpc__list_del(&c->msgs, m);
  c->n_open--;
  rpc__hold(c);
  rpc__msg_report(m);
  if (code != GRPC_STATUS_OK && !m->cancelled) rpc__oneway_answer(c, m->seq, code, msg);
  m->holds++;
  rpc__msg_unhold(m); /* m may go here: nothing below reads it */
  rpc__oneway_read(c);
  rpc__oneway_maybe_done(c);
  rpc__unhold(c); /* may free c */
  return 0;
}

/* One message arrived: a message call of its own, checked, decoded and
 * handed to the handler (or refused with a CallFailure); then the next read.
 * Runs under the stream's hold. */
static void rpc__oneway_message(rpc_call *c, grpc_byte_buffer *bb) {
  const rpc_method *meth = &c->e->m;
  rpc_call *m = calloc(1, sizeof *m);
  if (!m) {
    grpc_byte_buffer_destroy(bb);
    rpc__fail_now(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  m->s = c->s;
  m->e = c->e;
  m->is_msg = 1;
  m->parent = c;
  m->seq = ++c->seq;
  m->deadline = c->deadline;
  m->t0 = rpc__now();
  m->holds = 1;
  rpc__list_add(&c->msgs, m);
  c->n_open++;
  c->dispatching = 1;
  grpc_status_code code = GRPC_STATUS_OK;
  char why[512] = "";
  ProtobufCMessage *req = rpc__read_request(c->s, meth, bb, &code, why, sizeof why);
  if (req) {
    meth->handler(m, req, meth->ud);
    protobuf_c_message_free_unpacked(req, NULL);
  }
  c->dispatching = 0;
  if (!req) rpc__msg_end(m, code, why);
  rpc__msg_unhold(m);
  rpc__oneway_read(c);
  rpc__oneway_maybe_done(c);
}

/* A RECV_MESSAGE completed: a message, the client's half-close (no message)
 * or the stream's end (not ok). Runs under the stream's hold. */
static void rpc__oneway_on_recv(rpc_call *c, int ok) {
  grpc_byte_buffer *bb = c->payload;
  c->payload = NULL;
  if (!ok) {
    if (bb) grpc_byte_buffer_destroy(bb);
    rpc__notice_cancel(c); /* ends the stream, cancelling its message calls */
    if (!c->ended && !c->finish_pending)
      rpc__fail_now(c, GRPC_STATUS_CANCELLED, "stream not readable");
    return;
  }
  if (!bb) {
    c->half_closed = 1;
    rpc__oneway_maybe_done(c);
    return;
  }
  if (c->ended || c->finish_pending || c->cancelled) {
    grpc_byte_buffer_destroy(bb);
    return;
  }
  rpc__oneway_message(c, bb);
}

/* The stream ended: every message call still open gets its cancel callback,
 * once; the handler ends it then or later. All are held while the callbacks
 * run, since one may end another. Runs under the caller's hold on the
 * stream (rpc__end's callers have one). */
static void rpc__oneway_cancel_msgs(rpc_call *c, grpc_status_code why) {
  rpc_call *todo[RPC_ONEWAY_PENDING];
  size_t n;
  do { /* reading pauses at RPC_ONEWAY_PENDING open: one round, as a rule */
    n = 0;
    for (rpc_call *m = c->msgs; m && n < RPC_ONEWAY_PENDING; m = m->next) {
      if (m->cancelled) continue;
      m->cancelled = 1;
      m->cancel_code = why == GRPC_STATUS_UNAVAILABLE ? why : GRPC_STATUS_CANCELLED;
      m->holds++;
      todo[n++] = m;
    }
    for (size_t i = 0; i < n; i++) {
      void (*cb)(rpc_call *, void *) = todo[i]->on_cancel;
      todo[i]->on_cancel = NULL;
      if (cb && !todo[i]->ended) cb(todo[i], todo[i]->cancel_ud);
    }
    for (size_t i = 0; i < n; i++) rpc__msg_unhold(todo[i]);
  } while (n == RPC_ONEWAY_PENDING);
}

/* The stream's memory goes while handlers still hold message calls they
 * have not ended: they become orphans, counted now (they were cancelled),
 * freed when their handler ends them or with the server. */
static void rpc__oneway_orphan_msgs(rpc_call *c) {
  while (c->msgs) {
    rpc_call *m = c->msgs;
    rpc__list_del(&c->msgs, m);
    c->n_open--;
    if (!m->cancelled) { /* not expected: the stream's end cancelled them */
      m->cancelled = 1;
      m->cancel_code = GRPC_STATUS_CANCELLED;
    }
    m->parent = NULL;
    rpc__msg_report(m);
    rpc__list_add(&c->s->orphans, m);
  }
}

/* ---- server lifetime ---------------------------------------------------------- */

static char *rpc__read_file(const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "cannot read %s", path);
    return NULL;
  }
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  for (;;) {
    if (!buf) break;
    n += fread(buf + n, 1, cap - n - 1, f);
    if (n < cap - 1) break;
    char *nb = realloc(buf, cap * 2);
    if (!nb) {
      free(buf);
      buf = NULL;
      break;
    }
    buf = nb;
    cap *= 2;
  }
  int bad = ferror(f);
  fclose(f);
  if (!buf || bad) {
    free(buf);
    snprintf(err, errlen, "cannot read %s", path);
    return NULL;
  }
  buf[n] = '\0';
  return buf;
}

char *rpc__read_pem(const char *path, char *err, size_t errlen) {
  return rpc__read_file(path, err, errlen);
}

static grpc_server_credentials *rpc__server_creds(const rpc_server_opts *o, char *err,
                                                  size_t errlen) {
  int has_cert = o->tls_cert_file && *o->tls_cert_file;
  int has_key = o->tls_key_file && *o->tls_key_file;
  if (!has_cert && !has_key) {
    if (o->tls_client_ca_file && *o->tls_client_ca_file) {
      snprintf(err, errlen, "client certificates (tls_client_ca_file) need TLS: tls_cert_file and tls_key_file");
      return NULL;
    }
    return grpc_insecure_server_credentials_create();
  }
  if (!has_cert || !has_key) {
    snprintf(err, errlen, "TLS needs both tls_cert_file and tls_key_file");
    return NULL;
  }
  char *cert = rpc__read_file(o->tls_cert_file, err, errlen);
  if (!cert) return NULL;
  char *key = rpc__read_file(o->tls_key_file, err, errlen);
  if (!key) {
    free(cert);
    return NULL;
  }
  char *client_ca = NULL;
  if (o->tls_client_ca_file && *o->tls_client_ca_file &&
      !(client_ca = rpc__read_file(o->tls_client_ca_file, err, errlen))) {
    free(cert);
    free(key);
    return NULL;
  }
  grpc_ssl_pem_key_cert_pair pair = {key, cert};
  /* With client roots, a client without a certificate they signed does not
   * get past the handshake: mutual TLS. */
  grpc_server_credentials *cr = grpc_ssl_server_credentials_create_ex(
      client_ca, &pair, 1,
      client_ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
      NULL);
  free(cert);
  memset(key, 0, strlen(key));
  free(key);
  free(client_ca);
  if (!cr) snprintf(err, errlen, "bad TLS certificate %s, key %s or client roots %s", o->tls_cert_file,
                    o->tls_key_file, o->tls_client_ca_file ? o->tls_client_ca_file : "-");
  return cr;
}

/* Service names of the table ("/a.B/C" -> "a.B") start SERVING. */
static void rpc__health_defaults(rpc_server *s) {
  rpc__health_set(s->health, "", 1);
  for (size_t i = 0; i < s->table.n; i++) {
    const char *name = s->table.e[i].m.name;
    const char *slash = strrchr(name, '/');
    char svc[256];
    size_t len = (size_t)(slash - name - 1);
    if (len >= sizeof svc) continue;
    memcpy(svc, name + 1, len);
    svc[len] = '\0';
    if (strcmp(svc, "grpc.health.v1.Health")) rpc__health_set(s->health, svc, 1);
  }
}

static int rpc__setup(rpc_server *s, const rpc_method *methods, size_t n, char *err,
                      size_t errlen) {
  rpc_method *all = calloc(n + 2, sizeof *all);
  if (!all) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  if (n) memcpy(all, methods, n * sizeof *all);
  rpc__health_methods(s->health, all + n);
  int rc = rpc__table_init(&s->table, all, n + 2, err, errlen);
  free(all);
  if (rc < 0) return -1;
  rpc__health_defaults(s);

  /* gRPC core refuses larger messages before the application sees them, so
   * they would go uncounted; let some excess through (twice the limit, at
   * least 1 MiB more) and refuse it in rpc__dispatch, where the refusal is
   * counted like any call. Only larger messages are refused by the core. */
  size_t max = s->o.max_message_bytes ? s->o.max_message_bytes : RPC__DEFAULT_MAX_MSG;
  max = max > 0x3fffffff ? 0x7fffffff : (max < (1u << 20) ? max + (1u << 20) : 2 * max);
  grpc_arg args[2];
  args[0].type = GRPC_ARG_INTEGER;
  args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  args[0].value.integer = (int)max;
  /* Without this a second server on a taken port silently "succeeds". */
  args[1].type = GRPC_ARG_INTEGER;
  args[1].key = GRPC_ARG_ALLOW_REUSEPORT;
  args[1].value.integer = 0;
  grpc_channel_args ca = {2, args};
  s->server = grpc_server_create(&ca, NULL);
  for (int i = 0; i < s->ncq; i++) {
    s->cq[i] = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(s->server, s->cq[i], NULL);
  }
  for (size_t i = 0; i < s->table.n; i++) {
    int oneway = s->table.e[i].m.kind == RPC_ONEWAY_STREAM;
    s->table.e[i].registered = grpc_server_register_method(
        s->server, s->table.e[i].m.name, NULL,
        oneway ? GRPC_SRM_PAYLOAD_NONE : GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
    if (!s->table.e[i].registered) {
      snprintf(err, errlen, "cannot register method %s", s->table.e[i].m.name);
      return -1;
    }
  }
  grpc_server_credentials *cr = rpc__server_creds(&s->o, err, errlen);
  if (!cr) return -1;
  s->port = grpc_server_add_http2_port(s->server, s->o.listen, cr);
  grpc_server_credentials_release(cr);
  if (s->port <= 0) {
    snprintf(err, errlen, "cannot listen on %s (address in use or invalid)", s->o.listen);
    return -1;
  }
  return 0;
}

/* Shuts the queues that have a thread down and joins the threads (the
 * others rpc__destroy drains). */
static void rpc__join_cq_threads(rpc_server *s) {
  for (int i = 0; i < s->ncq; i++)
    if (s->threads[i].started) grpc_completion_queue_shutdown(s->cq[i]);
  for (int i = 0; i < s->ncq; i++)
    if (s->threads[i].started) {
      uv_thread_join(&s->threads[i].tid);
      s->threads[i].started = 0;
    }
}

static void rpc__destroy(rpc_server *s) {
  if (s->server) grpc_server_destroy(s->server);
  rpc__join_cq_threads(s); /* none left but after a failed start */
  for (int i = 0; i < s->ncq; i++) {
    if (!s->cq[i]) continue;
    if (!s->threads[i].started) { /* nobody drains it: drain it here */
      grpc_completion_queue_shutdown(s->cq[i]);
      while (grpc_completion_queue_next(s->cq[i], gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL)
                 .type != GRPC_QUEUE_SHUTDOWN) {
      }
    }
    grpc_completion_queue_destroy(s->cq[i]);
  }
  for (rpc_call *c = s->zombies, *nx; c; c = nx) {
    nx = c->next;
    rpc__call_free(c);
  }
  for (rpc_call *m = s->orphans, *nx; m; m = nx) {
    nx = m->next;
    free(m);
  }
  rpc__table_free(&s->table);
  if (s->health) rpc__health_free(s->health);
  uv_mutex_destroy(&s->mu);
  free(s->in.v);
  free(s->work.v);
  free(s->token);
  free((char *)s->o.listen);
  free(s);
  grpc_shutdown();
}

int rpc_server_new(uv_loop_t *loop, const rpc_server_opts *o, const rpc_method *methods,
                   size_t n, rpc_server **out, char *err, size_t errlen) {
  *out = NULL;
  if (!o || !o->listen || !*o->listen) {
    snprintf(err, errlen, "listen address is empty");
    return -1;
  }
  (void)rpc__init(); /* without it, detection only costs CPU */
  rpc_server *s = calloc(1, sizeof *s);
  if (!s) {
    grpc_shutdown();
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  uv_mutex_init(&s->mu);
  s->loop = loop;
  s->o = *o;
  s->o.listen = strdup(o->listen);
  s->token = o->token && *o->token ? strdup(o->token) : NULL;
  s->health = rpc__health_new();
  s->t_shutdown = (rpc__tag){RPC__T_SHUTDOWN, NULL};
  s->ncq = o->completion_queues < 1             ? 1
           : o->completion_queues > RPC__MAX_CQ ? RPC__MAX_CQ
                                                : o->completion_queues;
  if (!s->o.listen || !s->health || rpc__setup(s, methods, n, err, errlen) < 0) {
    if (!s->o.listen || !s->health) snprintf(err, errlen, "out of memory");
    rpc__destroy(s);
    return -1;
  }
  grpc_server_start(s->server);
  uv_async_init(loop, &s->async, rpc__on_async);
  s->async.data = s;
  uv_timer_init(loop, &s->grace);
  s->grace.data = s;
  s->handles_open = 2;
  for (int i = 0; i < s->ncq; i++) {
    struct rpc__cq_thread *t = &s->threads[i];
    t->s = s;
    t->cq = s->cq[i];
    if (uv_thread_create(&t->tid, rpc__cq_thread, t) == 0) {
      t->started = 1;
      continue;
    }
    snprintf(err, errlen, "cannot start the completion-queue threads");
    /* Handles are open on the loop: shut down through the normal path,
     * the notification going to a queue no thread drains (rpc__destroy
     * drains it). */
    s->shutting_down = 1;
    grpc_server_shutdown_and_notify(s->server, s->cq[i], &s->t_shutdown);
    grpc_server_cancel_all_calls(s->server);
    uv_close((uv_handle_t *)&s->async, NULL);
    uv_close((uv_handle_t *)&s->grace, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
    rpc__destroy(s);
    return -1;
  }
  rpc__rearm(s);
  *out = s;
  return 0;
}

int rpc_server_port(const rpc_server *s) { return s->port; }

void rpc_server_set_health(rpc_server *s, const char *service, int status) {
  rpc__health_set(s->health, service ? service : "", status);
}

static void rpc__on_handle_closed(uv_handle_t *h) {
  rpc_server *s = h->data;
  if (--s->handles_open == 0 && s->done) s->done(s->done_ud);
}

static int rpc__unary_live(rpc_server *s) {
  for (rpc_call *c = s->live; c; c = c->next)
    if (!c->e || c->e->m.kind == RPC_UNARY) return 1;
  return 0;
}

static void rpc__cancel_all(rpc_server *s) {
  if (s->cancelled_all) return;
  s->cancelled_all = 1;
  uv_timer_stop(&s->grace);
  grpc_server_cancel_all_calls(s->server);
}

/* Everything is over once gRPC has notified the shutdown and no call object
 * is left: stop the cq thread, then close the loop handles. */
static void rpc__check_shutdown(rpc_server *s) {
  if (!s->shutting_down || s->finishing) return;
  /* The unary calls are over before the grace period: no need to wait. */
  if (!s->cancelled_all && !rpc__unary_live(s)) uv_timer_stop(&s->grace);
  if (!s->notified || s->ncalls > 0) return;
  /* Finish from the async callback: this may run inside rpc__drain. */
  s->finishing = 1;
  uv_async_send(&s->async);
}

static void rpc__finish(rpc_server *s) {
  s->closed = 1;
  rpc__join_cq_threads(s);
  rpc__drain(s); /* nothing should be left; run it anyway */
  uv_close((uv_handle_t *)&s->async, rpc__on_handle_closed);
  uv_close((uv_handle_t *)&s->grace, rpc__on_handle_closed);
}

static void rpc__on_grace(uv_timer_t *t) {
  rpc_server *s = t->data;
  rpc__cancel_all(s);
}

/* Ends one open stream the handler has not ended; returns 0 when none is left. */
static int rpc__end_one_stream(rpc_server *s) {
  for (rpc_call *c = s->live; c; c = c->next) {
    /* The analyser takes the call ended below for freed and still in `live`:
     * rpc__end hands pointers into *c to gRPC, so it forgets that the call
     * is a zombie (released, never freed here) and that rpc__end took it off
     * `live`. */
    if (!c->e || c->e->m.kind == RPC_UNARY || c->ended || c->finish_pending) /* NOLINT(clang-analyzer-unix.Malloc) */
      continue;
    void (*cb)(rpc_call *, void *) = c->on_cancel;
    c->on_cancel = NULL;
    c->on_writable = NULL;
    /* A handler may keep a server stream's pointer; none sees a one-way
     * stream itself (its message calls outlive it as orphans). */
    c->zombie = c->e->m.kind == RPC_SERVER_STREAM;
    rpc__hold(c);
    for (size_t i = 0; i < c->qlen; i++) grpc_byte_buffer_destroy(c->q[(c->qhead + i) % c->qcap]);
    c->qlen = 0;
    c->cancelled = 1; /* sends fail from now on */
    c->cancel_deadline_left = INFINITY;
    if (c->reply_bb) { /* the status follows the message in flight */
      c->finish_pending = 1;
      c->code = GRPC_STATUS_UNAVAILABLE;
      c->finish_msg = strdup("server shutting down");
    } else {
      rpc__end(c, GRPC_STATUS_UNAVAILABLE, "server shutting down", NULL);
    }
    if (c->msgs) rpc__oneway_cancel_msgs(c, GRPC_STATUS_UNAVAILABLE);
    if (cb) cb(c, c->cancel_ud);
    rpc__unhold(c); /* a zombie: released, its memory kept for the handler */
    return 1;
  }
  return 0;
}

void rpc_server_shutdown(rpc_server *s, void (*done)(void *ud), void *ud) {
  if (s->shutting_down) return;
  s->shutting_down = 1;
  s->done = done;
  s->done_ud = ud;
  grpc_server_shutdown_and_notify(s->server, s->cq[0], &s->t_shutdown);
  while (rpc__end_one_stream(s)) {
  }
  double grace = s->o.shutdown_grace_s > 0 ? s->o.shutdown_grace_s : 5.0;
  if (rpc__unary_live(s))
    uv_timer_start(&s->grace, rpc__on_grace, (uint64_t)(grace * 1e3), 0);
  rpc__check_shutdown(s);
}

void rpc__test_fail_batches(rpc_server *s, int skip, int fail) {
  s->test_skip_batches = skip;
  s->test_fail_batches = fail;
}

size_t rpc__test_unsent(const rpc_call *c) { return c->qlen + (c->reply_bb ? 1 : 0); }

void rpc_server_free(rpc_server *s) {
  if (!s) return;
  rpc__destroy(s);
}
