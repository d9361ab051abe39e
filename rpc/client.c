/* rpc client: blocking calls, one pluck completion queue per call, so any
 * thread may call and several threads may share a client (one channel). */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "rlorch/rpc/v1/call.pb-c.h"
#include "rpc/rpc_internal.h"

#define RPC__CLIENT_MAX_MSG (64u << 20)

typedef struct rpc__open {
  grpc_call *call;
  struct rpc__open *next;
} rpc__open;

struct rpc_client {
  grpc_channel *ch;
  grpc_slice auth_key, auth_value;
  int has_auth;
  uv_mutex_t mu;
  rpc__open *streams; /* open blocking streams, for rpc_client_cancel_streams */
  int streams_cancelled;
};

int rpc_client_new(const rpc_client_opts *o, rpc_client **out, char *err, size_t errlen) {
  *out = NULL;
  if (!o || !o->target || !*o->target) {
    snprintf(err, errlen, "client target is empty");
    return -1;
  }
  int has_cert = o->tls_cert_file && *o->tls_cert_file, has_key = o->tls_key_file && *o->tls_key_file;
  if (has_cert != has_key) {
    snprintf(err, errlen, "a TLS client certificate needs its key and the reverse (%s given alone)",
             has_cert ? o->tls_cert_file : o->tls_key_file);
    return -1;
  }
  char *roots = NULL, *cert = NULL, *key = NULL;
  if (o->tls_ca_file && *o->tls_ca_file) {
    roots = rpc__read_pem(o->tls_ca_file, err, errlen);
    if (!roots) return -1;
  }
  if (has_cert && (!(cert = rpc__read_pem(o->tls_cert_file, err, errlen)) ||
                   !(key = rpc__read_pem(o->tls_key_file, err, errlen)))) {
    free(roots);
    free(cert);
    return -1;
  }
  rpc_client *c = calloc(1, sizeof *c);
  if (!c) {
    free(roots);
    free(cert);
    free(key);
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  (void)rpc__init(); /* without it, detection only costs CPU */
  uv_mutex_init(&c->mu);
  size_t max = o->max_message_bytes ? o->max_message_bytes : RPC__CLIENT_MAX_MSG;
  if (max > 0x7fffffff) max = 0x7fffffff;
  /* The callers retry with backoffs of their own (at most a few seconds):
   * gRPC's own reconnect backoff (1 s, then growing to 120 s) would hold a
   * channel down long after its server came back, a restarted orchestrator
   * waiting for agents that only wait for their channel. */
  grpc_arg args[4];
  args[0].type = GRPC_ARG_INTEGER;
  args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  args[0].value.integer = (int)max;
  args[1].type = GRPC_ARG_INTEGER;
  args[1].key = GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS;
  args[1].value.integer = 100;
  args[2].type = GRPC_ARG_INTEGER;
  args[2].key = GRPC_ARG_MIN_RECONNECT_BACKOFF_MS;
  args[2].value.integer = 100;
  args[3].type = GRPC_ARG_INTEGER;
  args[3].key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS;
  args[3].value.integer = 1000;
  grpc_channel_args ca = {4, args};
  grpc_ssl_pem_key_cert_pair pair = {key, cert};
  grpc_channel_credentials *cr =
      roots || cert ? grpc_ssl_credentials_create(roots, cert ? &pair : NULL, NULL, NULL)
                    : grpc_insecure_credentials_create();
  free(roots);
  if (key) memset(key, 0, strlen(key)); /* a private key does not linger in freed memory */
  free(key);
  free(cert);
  if (!cr) {
    snprintf(err, errlen, "bad TLS roots in %s or client certificate %s", o->tls_ca_file ? o->tls_ca_file : "-",
             o->tls_cert_file ? o->tls_cert_file : "-");
    rpc_client_free(c);
    return -1;
  }
  c->ch = grpc_channel_create(o->target, cr, &ca);
  grpc_channel_credentials_release(cr);
  if (o->token && *o->token) {
    char *v = malloc(strlen(o->token) + 8);
    if (!v) {
      snprintf(err, errlen, "out of memory");
      rpc_client_free(c);
      return -1;
    }
    sprintf(v, "Bearer %s", o->token);
    c->auth_key = grpc_slice_from_static_string("authorization");
    c->auth_value = grpc_slice_from_copied_string(v);
    c->has_auth = 1;
    free(v);
  }
  *out = c;
  return 0;
}

void rpc_client_free(rpc_client *c) {
  if (!c) return;
  if (c->ch) grpc_channel_destroy(c->ch);
  if (c->has_auth) {
    grpc_slice_unref(c->auth_key);
    grpc_slice_unref(c->auth_value);
  }
  uv_mutex_destroy(&c->mu);
  free(c);
  grpc_shutdown();
}

int rpc_client_wait_ready(rpc_client *c, double timeout_s) {
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  gpr_timespec end = rpc__deadline(timeout_s);
  int ready = 0, tag = 0;
  for (;;) {
    grpc_connectivity_state s = grpc_channel_check_connectivity_state(c->ch, 1);
    if (s == GRPC_CHANNEL_READY) {
      ready = 1;
      break;
    }
    if (s == GRPC_CHANNEL_SHUTDOWN) break;
    grpc_channel_watch_connectivity_state(c->ch, s, end, cq, &tag);
    grpc_event ev = grpc_completion_queue_pluck(cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (!ev.success) break; /* the deadline came with the state unchanged */
  }
  grpc_completion_queue_shutdown(cq);
  grpc_completion_queue_destroy(cq);
  return ready;
}

/* What one blocking call needs, kept together so every path cleans up alike. */
typedef struct rpc__ccall {
  grpc_completion_queue *cq;
  grpc_call *call;
  grpc_metadata auth;
  grpc_metadata_array initial, trailing;
  grpc_status_code code;
  grpc_slice details;
  grpc_byte_buffer *resp;
} rpc__ccall;

static void rpc__status_set(rpc_status *st, grpc_status_code code, const char *msg) {
  if (!st) return;
  st->code = code;
  snprintf(st->message, sizeof st->message, "%s", msg);
}

static int rpc__ccall_start(rpc_client *cl, rpc__ccall *k, const char *method, double timeout_s) {
  memset(k, 0, sizeof *k);
  k->cq = grpc_completion_queue_create_for_pluck(NULL);
  grpc_slice m = grpc_slice_from_copied_string(method);
  k->call = grpc_channel_create_call(cl->ch, NULL, GRPC_PROPAGATE_DEFAULTS, k->cq, m, NULL,
                                     rpc__deadline(timeout_s), NULL);
  grpc_slice_unref(m);
  grpc_metadata_array_init(&k->initial);
  grpc_metadata_array_init(&k->trailing);
  k->details = grpc_empty_slice();
  if (cl->has_auth) {
    k->auth.key = cl->auth_key;
    k->auth.value = cl->auth_value;
  }
  return k->call ? 0 : -1;
}

static grpc_event rpc__pluck(rpc__ccall *k, void *tag) {
  return grpc_completion_queue_pluck(k->cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
}

static void rpc__ccall_end(rpc__ccall *k, rpc_status *st) {
  if (st) {
    char *d = grpc_slice_to_c_string(k->details);
    rpc__status_set(st, k->code, d);
    gpr_free(d);
  }
  if (k->resp) grpc_byte_buffer_destroy(k->resp);
  grpc_slice_unref(k->details);
  grpc_metadata_array_destroy(&k->initial);
  grpc_metadata_array_destroy(&k->trailing);
  if (k->call) grpc_call_unref(k->call);
  grpc_completion_queue_shutdown(k->cq);
  grpc_completion_queue_destroy(k->cq);
}

/* Sends the request and half-closes; `all` adds the receive side of a unary
 * call to the same batch. */
static grpc_call_error rpc__ccall_send(rpc_client *cl, rpc__ccall *k, grpc_byte_buffer *req,
                                       int unary, void *tag) {
  grpc_op ops[6];
  size_t n = 0;
  memset(ops, 0, sizeof ops);
  ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[n].data.send_initial_metadata.count = cl->has_auth ? 1 : 0;
  ops[n++].data.send_initial_metadata.metadata = cl->has_auth ? &k->auth : NULL;
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n++].data.send_message.send_message = req;
  ops[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[n++].data.recv_initial_metadata.recv_initial_metadata = &k->initial;
  if (unary) {
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n++].data.recv_message.recv_message = &k->resp;
  }
  ops[n].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[n].data.recv_status_on_client.trailing_metadata = &k->trailing;
  ops[n].data.recv_status_on_client.status = &k->code;
  ops[n++].data.recv_status_on_client.status_details = &k->details;
  return grpc_call_start_batch(k->call, ops, n, tag, NULL);
}

/* One unary exchange of raw byte buffers; *resp is set on OK. */
static grpc_status_code rpc__unary(rpc_client *cl, const char *method, grpc_byte_buffer *req,
                                   double timeout_s, grpc_byte_buffer **resp, rpc_status *st) {
  rpc__ccall k;
  *resp = NULL;
  if (rpc__ccall_start(cl, &k, method, timeout_s) < 0) {
    k.code = GRPC_STATUS_INTERNAL;
    k.details = grpc_slice_from_static_string("cannot create call");
  } else if (rpc__ccall_send(cl, &k, req, 1, &k) != GRPC_CALL_OK) {
    k.code = GRPC_STATUS_INTERNAL;
    k.details = grpc_slice_from_static_string("cannot start call");
  } else {
    rpc__pluck(&k, &k);
    if (k.code == GRPC_STATUS_OK && !k.resp) {
      k.code = GRPC_STATUS_INTERNAL;
      grpc_slice_unref(k.details);
      k.details = grpc_slice_from_static_string("no response message");
    }
  }
  grpc_status_code code = k.code;
  if (code == GRPC_STATUS_OK) {
    *resp = k.resp;
    k.resp = NULL;
  }
  rpc__ccall_end(&k, st);
  return code;
}

grpc_status_code rpc_client_call(rpc_client *c, const char *method, const ProtobufCMessage *req,
                                 const ProtobufCMessageDescriptor *resp_desc, double timeout_s,
                                 ProtobufCMessage **resp, rpc_status *st) {
  grpc_byte_buffer *out = NULL, *in = rpc__encode(req);
  *resp = NULL;
  grpc_status_code code = rpc__unary(c, method, in, timeout_s, &out, st);
  grpc_byte_buffer_destroy(in);
  if (code != GRPC_STATUS_OK) return code;
  *resp = rpc__decode(out, resp_desc);
  grpc_byte_buffer_destroy(out);
  if (!*resp) {
    rpc__status_set(st, GRPC_STATUS_INTERNAL, "cannot decode the response");
    if (st) snprintf(st->message, sizeof st->message, "cannot decode %s", resp_desc->name);
    return GRPC_STATUS_INTERNAL;
  }
  return GRPC_STATUS_OK;
}

grpc_status_code rpc_client_call_raw(rpc_client *c, const char *method, const void *req,
                                     size_t len, double timeout_s, uint8_t **resp,
                                     size_t *resp_len, rpc_status *st) {
  grpc_slice sl = grpc_slice_from_copied_buffer(req, len);
  grpc_byte_buffer *out = NULL, *in = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  *resp = NULL;
  *resp_len = 0;
  grpc_status_code code = rpc__unary(c, method, in, timeout_s, &out, st);
  grpc_byte_buffer_destroy(in);
  if (code != GRPC_STATUS_OK) return code;
  int rc = rpc__flatten(out, resp, resp_len);
  grpc_byte_buffer_destroy(out);
  if (rc < 0) {
    rpc__status_set(st, GRPC_STATUS_INTERNAL, "cannot read the response");
    return GRPC_STATUS_INTERNAL;
  }
  return GRPC_STATUS_OK;
}

static int rpc__stream_open(rpc_client *c, rpc__open *o) {
  uv_mutex_lock(&c->mu);
  int cancelled = c->streams_cancelled;
  if (!cancelled) {
    o->next = c->streams;
    c->streams = o;
  }
  uv_mutex_unlock(&c->mu);
  return cancelled ? -1 : 0;
}

static void rpc__stream_close(rpc_client *c, rpc__open *o) {
  uv_mutex_lock(&c->mu);
  for (rpc__open **p = &c->streams; *p; p = &(*p)->next)
    if (*p == o) {
      *p = o->next;
      break;
    }
  uv_mutex_unlock(&c->mu);
}

/* The status batch (tag k) completes once the stream is over; messages are
 * read one at a time with their own tag. */
grpc_status_code rpc_client_stream(rpc_client *c, const char *method,
                                   const ProtobufCMessage *req,
                                   const ProtobufCMessageDescriptor *resp_desc, double timeout_s,
                                   int (*on_message)(ProtobufCMessage *m, void *ud), void *ud,
                                   rpc_status *st) {
  rpc__ccall k;
  rpc__open o = {0};
  int tag_msg = 0;
  if (rpc__ccall_start(c, &k, method, timeout_s) < 0) {
    k.code = GRPC_STATUS_INTERNAL;
    k.details = grpc_slice_from_static_string("cannot create call");
    rpc__ccall_end(&k, st);
    return GRPC_STATUS_INTERNAL;
  }
  o.call = k.call;
  if (rpc__stream_open(c, &o) < 0) {
    k.code = GRPC_STATUS_CANCELLED;
    k.details = grpc_slice_from_static_string("client is shutting down");
    rpc__ccall_end(&k, st);
    return GRPC_STATUS_CANCELLED;
  }
  grpc_byte_buffer *in = rpc__encode(req);
  grpc_call_error err = rpc__ccall_send(c, &k, in, 0, &k);
  grpc_byte_buffer_destroy(in);
  if (err != GRPC_CALL_OK) {
    rpc__stream_close(c, &o);
    k.code = GRPC_STATUS_INTERNAL;
    k.details = grpc_slice_from_static_string("cannot start call");
    rpc__ccall_end(&k, st);
    return GRPC_STATUS_INTERNAL;
  }
  int local_error = 0;
  for (;;) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &k.resp;
    if (grpc_call_start_batch(k.call, &op, 1, &tag_msg, NULL) != GRPC_CALL_OK) break;
    grpc_event ev = rpc__pluck(&k, &tag_msg);
    if (!ev.success || !k.resp) break; /* end of stream (or failure): status says */
    ProtobufCMessage *m = rpc__decode(k.resp, resp_desc);
    grpc_byte_buffer_destroy(k.resp);
    k.resp = NULL;
    if (!m) {
      local_error = 1;
      grpc_call_cancel(k.call, NULL);
      break;
    }
    if (on_message(m, ud) != 0) {
      grpc_call_cancel(k.call, NULL);
      break;
    }
  }
  rpc__pluck(&k, &k);
  rpc__stream_close(c, &o);
  grpc_status_code code = k.code;
  if (local_error) {
    code = GRPC_STATUS_INTERNAL;
    grpc_slice_unref(k.details);
    k.details = grpc_slice_from_copied_string("cannot decode a stream message");
    k.code = code;
  }
  rpc__ccall_end(&k, st);
  return code;
}

static void rpc__cancel_open(rpc_client *c, int and_later) {
  uv_mutex_lock(&c->mu);
  if (and_later) c->streams_cancelled = 1;
  for (rpc__open *o = c->streams; o; o = o->next) grpc_call_cancel(o->call, NULL);
  uv_mutex_unlock(&c->mu);
}

void rpc_client_cancel_streams(rpc_client *c) { rpc__cancel_open(c, 1); }
void rpc_client_interrupt_streams(rpc_client *c) { rpc__cancel_open(c, 0); }

/* ---- one-way streams ------------------------------------------------------------- */

/* Each stream has a pluck completion queue and a reader thread of its own.
 * The reader plucks the stream's initial metadata, then its answers, then
 * its status; a sender plucks its own write, so a write never waits for the
 * reader (which may be running a callback that itself waits to send). A
 * stream that ended stays on `dead` until a thread other than its reader
 * joins it: the next open, or rpc_oneway_free. */
#define RPC__ONEWAY_MD_KEY "rlorch-oneway" /* the server's mark of an open stream */
#define RPC__ONEWAY_STATUS_WAIT_S 1.0     /* for the status of a stream a write found over */

enum { RPC__MD_WAIT = 0, RPC__MD_OPEN, RPC__MD_REFUSED };

typedef struct rpc__ostream {
  struct rpc_oneway *p;
  grpc_completion_queue *cq;
  grpc_call *call;
  rpc__open open; /* in the client's list while the status is to come */
  grpc_metadata auth;
  grpc_metadata_array initial, trailing;
  grpc_status_code code;
  grpc_slice details;
  grpc_byte_buffer *answer;
  int t_md, t_status, t_recv, t_write, t_close; /* tags: their addresses */
  uv_thread_t reader;
  int reader_started;
  /* Under p->mu: */
  int md;          /* RPC__MD_* */
  int over;        /* the status arrived (in st) */
  int reader_done; /* the reader ran its last callback */
  int open_waiter; /* a sender waits for it to open: that sender reports a refusal */
  rpc_status st;
  /* Under p->send_mu: */
  uint64_t sent; /* messages gRPC took: the last sequence number */
  int close_started;
  struct rpc__ostream *next; /* p->dead */
} rpc__ostream;

struct rpc_oneway {
  rpc_client *cl;
  char *method;
  rpc_oneway_opts o;
  uv_mutex_t send_mu; /* one sender at a time: gRPC takes one write in flight */
  uv_mutex_t mu;      /* the streams' state below and in rpc__ostream */
  uv_cond_t cv;
  rpc__ostream *cur;  /* the stream sends go to (under send_mu) */
  rpc__ostream *dead; /* ended, its reader not yet joined */
  int freeing;
};

static grpc_event rpc__opluck(rpc__ostream *o, void *tag, gpr_timespec deadline) {
  return grpc_completion_queue_pluck(o->cq, tag, deadline, NULL);
}

static int rpc__md_has(const grpc_metadata_array *md, const char *key) {
  for (size_t i = 0; i < md->count; i++)
    if (!grpc_slice_str_cmp(md->metadata[i].key, key)) return 1;
  return 0;
}

/* Waits on p->cv until `deadline` (rpc__now seconds); 0 once it passed. */
static int rpc__owait(rpc_oneway *p, double deadline) {
  double left = deadline - rpc__now();
  if (left <= 0) return 0;
  uv_cond_timedwait(&p->cv, &p->mu, (uint64_t)(left * 1e9) + 1);
  return 1;
}

static void rpc__on_answer(rpc__ostream *o, grpc_byte_buffer *bb, int *bad) {
  rpc_oneway *p = o->p;
  Rlorch__Rpc__V1__CallFailure *f =
      (Rlorch__Rpc__V1__CallFailure *)rpc__decode(bb, &rlorch__rpc__v1__call_failure__descriptor);
  if (!f || f->code == GRPC_STATUS_OK) { /* not an answer of ours: the stream is of no use */
    if (f) protobuf_c_message_free_unpacked(&f->base, NULL);
    *bad = 1;
    grpc_call_cancel(o->call, NULL);
    return;
  }
  rpc_status st;
  st.code = (grpc_status_code)f->code;
  snprintf(st.message, sizeof st.message, "%s", f->message ? f->message : "");
  uint64_t seq = f->sequence;
  protobuf_c_message_free_unpacked(&f->base, NULL);
  if (p->o.on_failed) p->o.on_failed(seq, &st, p->o.ud);
}

static void rpc__oreader(void *arg) {
  rpc__ostream *o = arg;
  rpc_oneway *p = o->p;
  grpc_event ev = rpc__opluck(o, &o->t_md, gpr_inf_future(GPR_CLOCK_REALTIME));
  int open = ev.success && rpc__md_has(&o->initial, RPC__ONEWAY_MD_KEY);
  uv_mutex_lock(&p->mu);
  o->md = open ? RPC__MD_OPEN : RPC__MD_REFUSED;
  uv_cond_broadcast(&p->cv);
  uv_mutex_unlock(&p->mu);
  int bad = 0;
  while (open && !bad) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &o->answer;
    if (grpc_call_start_batch(o->call, &op, 1, &o->t_recv, NULL) != GRPC_CALL_OK) {
      grpc_call_cancel(o->call, NULL);
      break;
    }
    ev = rpc__opluck(o, &o->t_recv, gpr_inf_future(GPR_CLOCK_REALTIME));
    if (!ev.success || !o->answer) break; /* the stream is over: the status says how */
    rpc__on_answer(o, o->answer, &bad);
    grpc_byte_buffer_destroy(o->answer);
    o->answer = NULL;
  }
  rpc__opluck(o, &o->t_status, gpr_inf_future(GPR_CLOCK_REALTIME));
  rpc__stream_close(p->cl, &o->open);
  rpc_status st;
  if (bad) {
    rpc__status_set(&st, GRPC_STATUS_INTERNAL, "cannot decode an answer of the one-way stream");
  } else {
    char *d = grpc_slice_to_c_string(o->details);
    rpc__status_set(&st, o->code, d);
    gpr_free(d);
  }
  uv_mutex_lock(&p->mu);
  o->st = st;
  o->over = 1;
  /* A stream refused as it opened is reported by the send that waits for
   * it; one that ended after, or by rpc_oneway_free, is not. */
  int tell = !p->freeing && !o->open_waiter && p->o.on_broken;
  uv_cond_broadcast(&p->cv);
  uv_mutex_unlock(&p->mu);
  if (tell) p->o.on_broken(&st, p->o.ud);
  uv_mutex_lock(&p->mu);
  o->reader_done = 1;
  uv_cond_broadcast(&p->cv);
  uv_mutex_unlock(&p->mu);
}

/* Joins the reader (never from itself) and frees the stream. */
static void rpc__ostream_free(rpc__ostream *o) {
  if (o->reader_started) uv_thread_join(&o->reader);
  if (o->close_started) rpc__opluck(o, &o->t_close, gpr_inf_future(GPR_CLOCK_REALTIME));
  if (o->answer) grpc_byte_buffer_destroy(o->answer);
  grpc_slice_unref(o->details);
  grpc_metadata_array_destroy(&o->initial);
  grpc_metadata_array_destroy(&o->trailing);
  if (o->call) grpc_call_unref(o->call);
  grpc_completion_queue_shutdown(o->cq);
  grpc_completion_queue_destroy(o->cq);
  free(o);
}

/* Frees the ended streams whose reader finished, but not the calling
 * thread's own (a callback that sends): a later call frees that one. Under
 * send_mu. */
static void rpc__oneway_reap(rpc_oneway *p) {
  uv_thread_t self = uv_thread_self();
  rpc__ostream **pp = &p->dead;
  while (*pp) {
    rpc__ostream *o = *pp;
    uv_mutex_lock(&p->mu);
    int done = o->reader_done;
    uv_mutex_unlock(&p->mu);
    if (done && !(o->reader_started && uv_thread_equal(&o->reader, &self))) {
      *pp = o->next;
      rpc__ostream_free(o);
    } else {
      pp = &o->next;
    }
  }
}

/* Creates the call, starts its first batch and status and its reader. NULL
 * with *st set when it cannot. Under send_mu. */
static rpc__ostream *rpc__ostream_new(rpc_oneway *p, rpc_status *st) {
  rpc_client *cl = p->cl;
  rpc__ostream *o = calloc(1, sizeof *o);
  if (!o) {
    rpc__status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
  }
  o->p = p;
  o->cq = grpc_completion_queue_create_for_pluck(NULL);
  grpc_metadata_array_init(&o->initial);
  grpc_metadata_array_init(&o->trailing);
  o->details = grpc_empty_slice();
  grpc_slice m = grpc_slice_from_copied_string(p->method);
  o->call = grpc_channel_create_call(cl->ch, NULL, GRPC_PROPAGATE_DEFAULTS, o->cq, m, NULL,
                                     gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  grpc_slice_unref(m);
  if (!o->call) {
    rpc__status_set(st, GRPC_STATUS_INTERNAL, "cannot create call");
    rpc__ostream_free(o);
    return NULL;
  }
  o->open.call = o->call;
  if (rpc__stream_open(cl, &o->open) < 0) {
    rpc__status_set(st, GRPC_STATUS_CANCELLED, "client is shutting down");
    rpc__ostream_free(o);
    return NULL;
  }
  if (cl->has_auth) {
    o->auth.key = cl->auth_key;
    o->auth.value = cl->auth_value;
  }
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[0].data.send_initial_metadata.count = cl->has_auth ? 1 : 0;
  ops[0].data.send_initial_metadata.metadata = cl->has_auth ? &o->auth : NULL;
  ops[1].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[1].data.recv_initial_metadata.recv_initial_metadata = &o->initial;
  grpc_op sop;
  memset(&sop, 0, sizeof sop);
  sop.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  sop.data.recv_status_on_client.trailing_metadata = &o->trailing;
  sop.data.recv_status_on_client.status = &o->code;
  sop.data.recv_status_on_client.status_details = &o->details;
  int md_started = grpc_call_start_batch(o->call, ops, 2, &o->t_md, NULL) == GRPC_CALL_OK;
  int status_started =
      md_started && grpc_call_start_batch(o->call, &sop, 1, &o->t_status, NULL) == GRPC_CALL_OK;
  /* Set before the reader runs: it may see the status before the sender
   * waits for it. */
  o->open_waiter = 1;
  if (status_started && uv_thread_create(&o->reader, rpc__oreader, o) == 0) {
    o->reader_started = 1;
    return o;
  }
  /* What was started completes once the call is cancelled. */
  grpc_call_cancel(o->call, NULL);
  if (md_started) rpc__opluck(o, &o->t_md, gpr_inf_future(GPR_CLOCK_REALTIME));
  if (status_started) rpc__opluck(o, &o->t_status, gpr_inf_future(GPR_CLOCK_REALTIME));
  rpc__stream_close(cl, &o->open);
  rpc__status_set(st, GRPC_STATUS_INTERNAL,
                  status_started ? "cannot start the stream's reader" : "cannot start call");
  rpc__ostream_free(o);
  return NULL;
}

/* The stream a send goes to: the open one, or a new one once it opened
 * (its initial metadata came, marked by the server). NULL with *st set when
 * none opened by `deadline`. Under send_mu. */
static rpc__ostream *rpc__oneway_stream(rpc_oneway *p, double deadline, rpc_status *st) {
  if (p->cur) {
    uv_mutex_lock(&p->mu);
    int over = p->cur->over;
    uv_mutex_unlock(&p->mu);
    if (!over) return p->cur;
    p->cur->next = p->dead;
    p->dead = p->cur;
    p->cur = NULL;
  }
  rpc__oneway_reap(p);
  rpc__ostream *o = rpc__ostream_new(p, st);
  if (!o) return NULL;
  uv_mutex_lock(&p->mu);
  while (o->md == RPC__MD_WAIT && !o->over && rpc__owait(p, deadline)) {
  }
  /* Refused: the status follows the initial metadata. */
  while (o->md == RPC__MD_REFUSED && !o->over && rpc__owait(p, deadline)) {
  }
  int md = o->md, over = o->over;
  rpc_status ost = o->st;
  if (md == RPC__MD_OPEN && !over) {
    o->open_waiter = 0;
    uv_mutex_unlock(&p->mu);
    p->cur = o;
    return o;
  }
  if (!over) o->open_waiter = 0; /* cancelled below: on_broken tells */
  uv_mutex_unlock(&p->mu);
  if (!over) {
    grpc_call_cancel(o->call, NULL);
    rpc__status_set(st, GRPC_STATUS_DEADLINE_EXCEEDED, "the one-way stream did not open in time");
  } else if (ost.code == GRPC_STATUS_OK) { /* not a server of ours */
    rpc__status_set(st, GRPC_STATUS_UNIMPLEMENTED, "the server did not open a one-way stream");
  } else {
    *st = ost;
  }
  o->next = p->dead;
  p->dead = o;
  return NULL;
}

int rpc_oneway_new(rpc_client *c, const rpc_oneway_opts *o, rpc_oneway **out, char *err,
                   size_t errlen) {
  *out = NULL;
  if (!c || !o || !o->method || o->method[0] != '/') {
    snprintf(err, errlen, "a one-way stream needs a client and a method \"/pkg.Service/Name\"");
    return -1;
  }
  rpc_oneway *p = calloc(1, sizeof *p);
  if (!p || !(p->method = strdup(o->method))) {
    free(p);
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  p->cl = c;
  p->o = *o;
  p->o.method = p->method;
  uv_mutex_init(&p->send_mu);
  uv_mutex_init(&p->mu);
  uv_cond_init(&p->cv);
  *out = p;
  return 0;
}

/* The write failed: the stream is over. Its status (waited for briefly)
 * says why. */
static void rpc__oneway_write_failed(rpc_oneway *p, rpc__ostream *o, rpc_status *st) {
  double until = rpc__now() + RPC__ONEWAY_STATUS_WAIT_S;
  uv_mutex_lock(&p->mu);
  while (!o->over && rpc__owait(p, until)) {
  }
  int over = o->over;
  rpc_status ost = o->st;
  uv_mutex_unlock(&p->mu);
  if (over && ost.code != GRPC_STATUS_OK)
    *st = ost;
  else
    rpc__status_set(st, GRPC_STATUS_UNAVAILABLE, "stream ended");
}

uint64_t rpc_oneway_send(rpc_oneway *p, const ProtobufCMessage *req, double timeout_s,
                         rpc_status *st) {
  rpc_status dummy;
  if (!st) st = &dummy;
  double deadline = rpc__now() + (timeout_s > 0 ? timeout_s : 0);
  uv_mutex_lock(&p->send_mu);
  uv_mutex_lock(&p->mu);
  int freeing = p->freeing;
  uv_mutex_unlock(&p->mu);
  if (freeing) {
    uv_mutex_unlock(&p->send_mu);
    rpc__status_set(st, GRPC_STATUS_CANCELLED, "the one-way stream is being freed");
    return 0;
  }
  rpc__ostream *o = rpc__oneway_stream(p, deadline, st);
  if (!o) {
    uv_mutex_unlock(&p->send_mu);
    return 0;
  }
  grpc_byte_buffer *bb = rpc__encode(req);
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_MESSAGE;
  op.data.send_message.send_message = bb;
  uint64_t seq = 0;
  if (grpc_call_start_batch(o->call, &op, 1, &o->t_write, NULL) != GRPC_CALL_OK) {
    grpc_call_cancel(o->call, NULL); /* the stream is of no use: on_broken tells */
    rpc__status_set(st, GRPC_STATUS_INTERNAL, "cannot start a write");
  } else {
    double left = deadline - rpc__now();
    grpc_event ev = rpc__opluck(o, &o->t_write, rpc__deadline(left > 0 ? left : 1e-6));
    if (ev.type == GRPC_QUEUE_TIMEOUT) {
      grpc_call_cancel(o->call, NULL);
      rpc__opluck(o, &o->t_write, gpr_inf_future(GPR_CLOCK_REALTIME));
      rpc__status_set(st, GRPC_STATUS_DEADLINE_EXCEEDED,
                      "the one-way stream did not take the message in time");
    } else if (!ev.success) {
      rpc__oneway_write_failed(p, o, st);
    } else {
      seq = ++o->sent;
    }
  }
  grpc_byte_buffer_destroy(bb);
  uv_mutex_unlock(&p->send_mu);
  return seq;
}

void rpc_oneway_free(rpc_oneway *p, double wait_s) {
  if (!p) return;
  double until = rpc__now() + (wait_s > 0 ? wait_s : 0);
  uv_mutex_lock(&p->send_mu);
  uv_mutex_lock(&p->mu);
  p->freeing = 1; /* sends fail from now on, also from callbacks */
  uv_mutex_unlock(&p->mu);
  rpc__ostream *o = p->cur;
  p->cur = NULL;
  if (o) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    o->close_started = grpc_call_start_batch(o->call, &op, 1, &o->t_close, NULL) == GRPC_CALL_OK;
  }
  /* Not held while waiting: a callback that sends must get to fail. */
  uv_mutex_unlock(&p->send_mu);
  if (o) {
    uv_mutex_lock(&p->mu);
    while (!o->over && rpc__owait(p, until)) {
    }
    uv_mutex_unlock(&p->mu);
    grpc_call_cancel(o->call, NULL);
    rpc__ostream_free(o);
  }
  for (rpc__ostream *d = p->dead, *nx; d; d = nx) {
    nx = d->next;
    rpc__ostream_free(d);
  }
  uv_cond_destroy(&p->cv);
  uv_mutex_destroy(&p->mu);
  uv_mutex_destroy(&p->send_mu);
  free(p->method);
  free(p);
}

/* Clients of every kind (ctl, agents) read their bearer token the same way. */
/* The one reader of bearer-token files, for the server and every client, so
 * a file that authenticates a client also configures the server. The message
 * names the path, not the flag or variable: the caller prefixes where the path
 * came from. */
int rpc_token_read(const char *path, char *buf, size_t len, char *err, size_t errlen) {
  if (len < 2) {
    snprintf(err, errlen, "\"%s\": no room for a token", path);
    return -1;
  }
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "cannot read \"%s\": %s", path, strerror(errno));
    return -1;
  }
  size_t n = fread(buf, 1, len - 1, f);
  int bad = ferror(f);
  int big = !bad && n == len - 1 && fgetc(f) != EOF;
  bad = bad || ferror(f);
  fclose(f);
  buf[n] = 0;
  if (bad) {
    snprintf(err, errlen, "cannot read \"%s\": %s", path, strerror(errno ? errno : EIO));
    return -1;
  }
  if (big) {
    snprintf(err, errlen, "\"%s\" is larger than %zu bytes", path, len - 2);
    return -1;
  }
  if (memchr(buf, 0, n)) {
    snprintf(err, errlen, "\"%s\" holds a NUL byte", path);
    return -1;
  }
  while (n > 0 && isspace((unsigned char)buf[n - 1])) buf[--n] = 0;
  size_t s = 0;
  while (buf[s] && isspace((unsigned char)buf[s])) s++;
  memmove(buf, buf + s, n - s + 1);
  if (!buf[0]) {
    snprintf(err, errlen, "\"%s\" is empty", path);
    return -1;
  }
  return 0;
}
