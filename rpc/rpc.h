/* rpc: gRPC C core driven from a libuv loop.
 *
 * Server: a thread per completion queue blocks in grpc_completion_queue_next
 * and hands (tag, ok) to the loop through a locked list and uv_async_send; every call's state lives
 * on the loop thread and every grpc_call_start_batch happens there. Handlers
 * are typed: protobuf-c in, protobuf-c out, looked up in a method table by the
 * full method name.
 *
 * Client: blocking calls (for ctl, agents and tests; safe from any thread,
 * several threads may share one client) and, optionally, calls driven from a
 * loop.
 *
 * Lifetime of a server call: the handler receives it and must end it exactly
 * once, with rpc_call_reply / rpc_call_fail (unary) or rpc_call_finish
 * (streams), now or later from the loop thread. When the client cancels, the
 * deadline passes or the server shuts down, the on_cancel callback runs once;
 * the handler then ends the call promptly (sends fail from then on). The call's
 * memory is released after it was ended and gRPC is done with it. */
#ifndef RLORCH_RPC_H
#define RLORCH_RPC_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>
#include <uv.h>

typedef struct rpc_server rpc_server;
typedef struct rpc_call rpc_call;
typedef struct rpc_client rpc_client;

/* RPC_ONEWAY_STREAM: a bidirectional stream of one-way unary calls. The
 * client sends request messages one after another without waiting; each is
 * handed to the handler as a call of its own (a message call), which the
 * handler ends exactly once, now or later, as a unary one: rpc_call_reply
 * (success, not answered: the response is dropped) or rpc_call_fail (the
 * stream carries back a rlorch.rpc.v1.CallFailure with the request's
 * sequence number, from 1, and the status). Answers go out in the order the
 * message calls end. For requests whose success needs no answer (a report),
 * at the price of a stream message instead of a call's set-up, status and
 * hand-offs.
 * - The stream sends its initial metadata as soon as it arrives (the client
 *   learns that the method exists before it sends); it carries the entry
 *   "rlorch-oneway: 1", which tells it from the initial metadata of a
 *   refusal (UNIMPLEMENTED, UNAUTHENTICATED).
 * - Auth is checked once, when the stream opens (UNAUTHENTICATED ends it).
 *   Each message is held to max_message_bytes, the precheck and the decoder;
 *   one that fails them is answered with a CallFailure and the stream goes
 *   on.
 * - The next message is read once the handler returned for the previous
 *   one; while RPC_ONEWAY_PENDING message calls are not ended, reading
 *   pauses.
 * - A message call answers rpc_call_method, rpc_call_peer, the deadline and
 *   rpc_call_server as its stream does; rpc_call_send, rpc_call_finish and
 *   rpc_call_set_writable_cb refuse it (-1, or nothing). Its cancel callback
 *   runs, once, when the stream ends before the handler ended it; nothing
 *   is answered for it then. Ending it returns 0 while its stream lives
 *   (cancelled or not) and -1 once the stream is gone: a harmless no-op
 *   (its memory stays until the handler ended it, or rpc_server_free).
 * - The client's half-close ends the stream OK once every message call
 *   ended and its answer went out. At shutdown the stream ends UNAVAILABLE.
 * - on_call_done runs for each message call (its code, arrival to end; a
 *   message refused before the handler too; one the stream's end cancelled
 *   counts CANCELLED, UNAVAILABLE at shutdown) and for the stream when it
 *   ends. */
typedef enum { RPC_UNARY = 1, RPC_SERVER_STREAM = 2, RPC_ONEWAY_STREAM = 3 } rpc_kind;
#define RPC_ONEWAY_PENDING 64

/* `req` is freed when the handler returns (protobuf_c_message_free_unpacked,
 * the default allocator): copy what outlives it, or take a sub-message out
 * of it, setting its field in req to NULL (the handler may change req until
 * it returns), and free it later with protobuf_c_message_free_unpacked(m,
 * NULL). Taking costs nothing where a copy of a large message would cost its
 * size again. */
typedef void (*rpc_handler)(rpc_call *call, const ProtobufCMessage *req, void *ud);

/* Looks at a request's bytes before they are decoded (with the method's ud),
 * so that a message too costly to decode is refused for the price of reading
 * it once: GRPC_STATUS_OK, or the status to answer with a message in err.
 * Bytes it cannot make sense of are for the decoder to refuse: return OK. */
typedef grpc_status_code (*rpc_precheck)(const uint8_t *data, size_t len, void *ud, char *err,
                                         size_t errlen);

typedef struct rpc_method {
  const char *name; /* full method name: "/rlorch.v1.Control/StartRun" */
  rpc_kind kind;
  const ProtobufCMessageDescriptor *request;
  const ProtobufCMessageDescriptor *response;
  int requires_auth; /* checked against the server's token when one is set */
  rpc_handler handler;
  void *ud;
  rpc_precheck precheck; /* NULL: none */
} rpc_method;

/* Counts, in the encoded message `data`, the fields numbered path[depth - 1]
 * of the sub-messages reached by the field numbers path[0..depth - 2] (every
 * occurrence: each entry of a repeated message field, each piece of a
 * sub-message sent in pieces; a packed repeated scalar is one).
 * Reads the bytes once and allocates nothing. Returns 0, or -1 when the bytes
 * are not a well-formed encoding along that path. */
int rpc_wire_count(const uint8_t *data, size_t len, const uint32_t *path, size_t depth,
                   uint64_t *count);

typedef struct rpc_server_opts {
  const char *listen;          /* "127.0.0.1:0", "[::]:7070" */
  size_t max_message_bytes;    /* inbound limit; 0: 4 MiB */
  const char *token;           /* bearer token; NULL or "": no auth */
  const char *tls_cert_file;   /* PEM; with tls_key_file enables TLS */
  const char *tls_key_file;
  double shutdown_grace_s;     /* in-flight unary calls get this long; 0: 5 s */
  /* Called on the loop thread when any call ends (metrics). */
  void (*on_call_done)(const char *method, grpc_status_code code, double seconds, void *ud);
  void *hook_ud;
  const char *tls_client_ca_file; /* PEM roots: with TLS on, every client must present a
                                     certificate they signed (mutual TLS); NULL: none asked */
  /* Completion queues, each drained by a thread of its own, the calls bound
   * to them in turn; 0: 1, at most 8. A gRPC built without NDEBUG (Debian's)
   * checks every completion against its queue's array of outstanding
   * operations, a linear scan, so thousands of open streams make one queue
   * slow; each queue more costs a thread hand-off on some completions. */
  int completion_queues;
} rpc_server_opts;

/* Binds, registers the methods (copied) plus grpc.health.v1.Health, and starts
 * serving on `loop`. Returns 0, or -1 with a message in err. */
int rpc_server_new(uv_loop_t *loop, const rpc_server_opts *o, const rpc_method *methods,
                   size_t n, rpc_server **out, char *err, size_t errlen);
int rpc_server_port(const rpc_server *s); /* the port actually bound */
/* Health of a service ("" is the whole server): SERVING (1) or NOT_SERVING (2).
 * Watch streams see every change. */
void rpc_server_set_health(rpc_server *s, const char *service, int status); /* loop thread */
/* Graceful: stop accepting, let unary calls finish within the grace period,
 * end open streams with UNAVAILABLE, then call done(ud) on the loop thread. */
void rpc_server_shutdown(rpc_server *s, void (*done)(void *ud), void *ud);
/* After shutdown completed (or if never started). */
void rpc_server_free(rpc_server *s);

/* ---- server calls: use on the loop thread only -------------------------- */
const char *rpc_call_method(const rpc_call *c);
const char *rpc_call_peer(const rpc_call *c);
double rpc_call_deadline_remaining(const rpc_call *c); /* seconds; INFINITY if none */
int rpc_call_cancelled(const rpc_call *c);
rpc_server *rpc_call_server(const rpc_call *c);
void rpc_call_set_cancel_cb(rpc_call *c, void (*on_cancel)(rpc_call *c, void *ud), void *ud);
int rpc_call_reply(rpc_call *c, const ProtobufCMessage *resp);
int rpc_call_fail(rpc_call *c, grpc_status_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Streams: messages go out in order. Returns 0 when the message is queued, -1
 * once the call is cancelled or ended. Queued is not delivered: a message the
 * transport refuses ends the call INTERNAL, and the next send returns -1. */
int rpc_call_send(rpc_call *c, const ProtobufCMessage *msg);
int rpc_call_finish(rpc_call *c, grpc_status_code code, const char *msg);
/* Flow control for a stream too large to encode whole: on_writable(c, ud)
 * runs on the loop thread each time a send completed and nothing the handler
 * sent is still queued or in flight, so the handler encodes its next message
 * only when the previous ones went out (a slow client slows the handler
 * instead of filling memory). It runs only after a send completes: the
 * handler sends its first message itself. It never runs once the call is
 * cancelled (on_cancel runs instead), finishing (rpc_call_finish, also from
 * inside on_writable) or ended, so the handler may free ud there. NULL stops
 * it. Note that rpc_call_send itself may run on_cancel before it returns (a
 * message the transport refuses). */
void rpc_call_set_writable_cb(rpc_call *c, void (*on_writable)(rpc_call *c, void *ud), void *ud);

/* ---- client --------------------------------------------------------------- */
typedef struct rpc_status {
  grpc_status_code code;
  char message[512];
} rpc_status;

typedef struct rpc_client_opts {
  const char *target;        /* "127.0.0.1:7070" */
  const char *token;         /* sent as "authorization: Bearer <token>" */
  const char *tls_ca_file;   /* PEM roots; enables TLS */
  size_t max_message_bytes;  /* 0: 64 MiB */
  const char *tls_cert_file; /* PEM client certificate chain, presented when the server
                                asks (mutual TLS); with tls_key_file, enables TLS too
                                (the server then verified by gRPC's default roots
                                unless tls_ca_file is set) */
  const char *tls_key_file;  /* its PEM private key */
} rpc_client_opts;

int rpc_client_new(const rpc_client_opts *o, rpc_client **out, char *err, size_t errlen);
void rpc_client_free(rpc_client *c);
/* Waits up to timeout_s for the channel to be connected, asking it to connect
 * now if it is idle or between attempts: 1 once it is, 0 when the time ran
 * out (or the channel is shut down). For a caller that retries a failed call
 * without waiting out a backoff the server may be back within. */
int rpc_client_wait_ready(rpc_client *c, double timeout_s);

/* Blocking unary call. On OK, *resp is a message to free with
 * protobuf_c_message_free_unpacked(*resp, NULL). Returns the status code. */
grpc_status_code rpc_client_call(rpc_client *c, const char *method, const ProtobufCMessage *req,
                                 const ProtobufCMessageDescriptor *resp_desc, double timeout_s,
                                 ProtobufCMessage **resp, rpc_status *st);
/* Blocking server stream: on_message gets each message (the callee frees it)
 * and returns 0 to go on or non-zero to cancel. timeout_s <= 0: no deadline. */
grpc_status_code rpc_client_stream(rpc_client *c, const char *method,
                                   const ProtobufCMessage *req,
                                   const ProtobufCMessageDescriptor *resp_desc, double timeout_s,
                                   int (*on_message)(ProtobufCMessage *m, void *ud), void *ud,
                                   rpc_status *st);
/* Cancels the open blocking streams from another thread (for shutdown); streams
 * started on this client afterwards end at once with CANCELLED. Safe to call
 * when no stream is open. */
void rpc_client_cancel_streams(rpc_client *c);
/* Cancels the blocking streams open now (they end CANCELLED) and nothing
 * else: a stream started afterwards runs as usual. For a client that must
 * re-open its streams (an agent registered again under a new id). */
void rpc_client_interrupt_streams(rpc_client *c);

/* One-way calls (RPC_ONEWAY_STREAM) on a stream of their own, opened on
 * the first send and again on the first send after it ended. Thread-safe:
 * sends from several threads go out one at a time, in the order they got
 * the stream. A thread of the stream's own (one per stream, joined by the
 * next open or rpc_oneway_free) reads the answers and runs the callbacks
 * (never with the stream's lock held: they may send, even while another
 * thread sends).
 * - on_failed: a request was refused (st: the status a unary call would
 *   have ended with). `seq` is what rpc_oneway_send returned for it.
 * - on_broken: the stream ended other than by rpc_oneway_free (st says how:
 *   UNAVAILABLE when the server went away, say); requests sent on it that
 *   no failure answered may or may not have been handled, as with a unary
 *   call whose connection broke. The next send opens a new stream. NULL:
 *   nothing to do. It does not run for a stream refused as it opened: the
 *   send that opened it returns how. */
typedef struct rpc_oneway rpc_oneway;
typedef struct rpc_oneway_opts {
  const char *method; /* "/rlorch.v1.Worker/ReportStream" */
  void (*on_failed)(uint64_t seq, const rpc_status *st, void *ud);
  void (*on_broken)(const rpc_status *st, void *ud);
  void *ud;
} rpc_oneway_opts;

int rpc_oneway_new(rpc_client *c, const rpc_oneway_opts *o, rpc_oneway **out, char *err,
                   size_t errlen);
/* Sends one request: its sequence number on the stream (>= 1) once gRPC
 * took the message, waiting at most timeout_s (for the stream to open and
 * for flow control); 0 with *st set otherwise, and the request was not sent:
 * - UNIMPLEMENTED: the server has no such method (an older server: the
 *   caller falls back to the unary call; asking again asks the server
 *   again);
 * - DEADLINE_EXCEEDED: the stream did not open or take the message in time
 *   (the stream is then cancelled: on_broken runs);
 * - anything else: the stream could not open or had ended (on_broken ran or
 *   will run for the one that ended).
 * A send after rpc_client_cancel_streams fails CANCELLED; the streams that
 * rpc_client_cancel_streams and rpc_client_interrupt_streams cancel include
 * this one's. timeout_s > 0: with less the send does not wait, and a write
 * that gRPC does not take at once cancels the stream. Sequence numbers
 * count per stream: a new stream starts again from 1. */
uint64_t rpc_oneway_send(rpc_oneway *p, const ProtobufCMessage *req, double timeout_s,
                         rpc_status *st);
/* Half-closes the open stream, waits up to wait_s for the server to end it
 * (so that the answers to what was sent still come back), then cancels it
 * and joins the reader. Callbacks do not run after it returns; sends from
 * them meanwhile fail CANCELLED. Not from a callback, nor while another
 * thread may still send. NULL: no-op. */
void rpc_oneway_free(rpc_oneway *p, double wait_s);

/* Raw bytes in and out, for tests that send what no codec would. */
grpc_status_code rpc_client_call_raw(rpc_client *c, const char *method, const void *req,
                                     size_t len, double timeout_s, uint8_t **resp,
                                     size_t *resp_len, rpc_status *st);

const char *rpc_status_name(grpc_status_code code); /* "NOT_FOUND" */

/* How every message a handler or a client receives is decoded: protobuf-c's
 * unpack, refusing too what protobuf-c reads but cannot write back in a form
 * it reads again (a field number 0). NULL when the bytes do not decode;
 * else free with protobuf_c_message_free_unpacked. */
ProtobufCMessage *rpc_unpack(const ProtobufCMessageDescriptor *desc, const uint8_t *data,
                             size_t len);

/* Reads a bearer token file into buf, trimming surrounding white space; the
 * one reader for the server and every client. 0, or -1 with a message naming
 * the path in err (the caller says which flag or variable gave it). */
int rpc_token_read(const char *path, char *buf, size_t len, char *err, size_t errlen);

#endif
