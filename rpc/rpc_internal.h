/* rpc internals shared by the module's files (and its unit tests). Not part
 * of the public surface: other modules include rpc/rpc.h only. */
#ifndef RLORCH_RPC_INTERNAL_H
#define RLORCH_RPC_INTERNAL_H

#include <pthread.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>

#include "rpc/rpc.h"

/* ---- start-up --------------------------------------------------------------- */
/* grpc_init, the first time also turning Abseil's mutex deadlock detection
 * off (see codec.c). 0 when it was turned off, -1 when this Abseil offers no
 * way to (it then stays as built). */
int rpc__init(void);

/* ---- codec ---------------------------------------------------------------- */
/* Packs a message into a new byte buffer (owned by the caller). */
grpc_byte_buffer *rpc__encode(const ProtobufCMessage *msg);
/* Flattens a byte buffer into malloc'd bytes; returns 0 or -1. */
int rpc__flatten(grpc_byte_buffer *bb, uint8_t **out, size_t *len);
/* Unpacks a byte buffer; NULL when the bytes are not a valid `desc`. */
ProtobufCMessage *rpc__decode(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc);
/* Constant-time check of an "authorization" metadata value against the token:
 * 0 when it is "Bearer <token>", -1 otherwise. */
int rpc__check_bearer(const char *value, size_t len, const char *token);
double rpc__now(void); /* monotonic seconds */
/* Reads a whole (PEM) file; NULL with "cannot read PATH" in err. */
char *rpc__read_pem(const char *path, char *err, size_t errlen);
gpr_timespec rpc__deadline(double timeout_s); /* monotonic; infinite when <= 0 */

/* ---- method table ------------------------------------------------------------ */
typedef struct rpc__entry {
  rpc_method m;     /* name owned (strdup) */
  void *registered; /* grpc_server_register_method handle */
  int armed;        /* calls requested and not yet arrived */
} rpc__entry;

typedef struct rpc__table {
  rpc__entry *e; /* sorted by name */
  size_t n;
} rpc__table;

/* Builds a sorted table; -1 with a message on a duplicate or malformed name. */
int rpc__table_init(rpc__table *t, const rpc_method *m, size_t n, char *err, size_t errlen);
/* Looks a method up by name (not NUL-terminated). */
rpc__entry *rpc__table_find(const rpc__table *t, const char *name, size_t len);
void rpc__table_free(rpc__table *t);

/* ---- health (health.c) ------------------------------------------------------- */
typedef struct rpc__health rpc__health;
rpc__health *rpc__health_new(void);
void rpc__health_free(rpc__health *h);
/* Adds the health methods to a method list (ud is the health state). */
void rpc__health_methods(rpc__health *h, rpc_method out[2]);
/* Declares a service as known with a status; notifies watchers on change. */
void rpc__health_set(rpc__health *h, const char *service, int status);

/* ---- test hook (server.c) ---------------------------------------------------- */
/* For unit tests only: lets the next `skip` grpc_call_start_batch calls of
 * this server through, then makes the `fail` after them fail as if gRPC had
 * refused them. gRPC refuses a batch only on a misuse of its API, so the
 * error paths behind a refused batch cannot be reached from a client; this
 * is how their tests reach them. Call it on the loop thread. */
void rpc__test_fail_batches(rpc_server *s, int skip, int fail);
/* For unit tests only: stream messages of this call still queued or in
 * flight, which the writable callback's contract says is 0 when it runs. */
size_t rpc__test_unsent(const rpc_call *c);

#endif
