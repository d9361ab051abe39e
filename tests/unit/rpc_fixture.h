/* Shared fixture of the rpc unit tests: a server on 127.0.0.1:0 runs on a uv
 * loop in its own thread, the test thread is the client. The handlers are
 * fakes of the control API (rlorch.v1 messages):
 *   GetRun:   run ids "r..." answer a Run; "hold" waits until cancelled (then
 *             counts the cancel); "precondition" fails FAILED_PRECONDITION;
 *             anything else is NOT_FOUND.
 *   StartRun: echoes the spec in a Run "run-1"; its precheck refuses a spec
 *             with synthetic prompts before decoding (RESOURCE_EXHAUSTED).
 *   WatchRun: sends events 1..from_step (seq i, unix_ms 10 i), stopping at
 *             a refused send (counted); run "open" then stays open until
 *             cancelled, any other run ends OK. Runs "paced", "paced-big"
 *             (each event carrying a Run of FX_BIG_BYTES) and "paced-lazy"
 *             send one event at a time from the writable callback and end OK
 *             after the last; "paced-lazy" leaves a cancelled stream open
 *             until fx_finish_lazy ends it (a handler that ends it later).
 *   ReportStream (one-way, ReportRequest in): worker_id "n<k>" succeeds
 *             (k counted in order), "f<k>" fails FAILED_PRECONDITION
 *             "refused f<k>", "keep" keeps the message call open (its cancel
 *             callback counts, without ending it) until fx_end_kept;
 *             "keepc" keeps it and ends it CANCELLED from its cancel
 *             callback. Its precheck refuses "precheck" (PERMISSION_DENIED).
 * One test at a time per process (ctest runs each program with --jobs 1). */
#ifndef RLORCH_TEST_RPC_FIXTURE_H
#define RLORCH_TEST_RPC_FIXTURE_H

#include <pthread.h>

#include "grpc/health/v1/health.pb-c.h"
#include "rlorch/v1/control.pb-c.h"
#include "rlorch/v1/worker.pb-c.h"
#include "rpc/rpc.h"

#define GETRUN "/rlorch.v1.Control/GetRun"
#define STARTRUN "/rlorch.v1.Control/StartRun"
#define WATCHRUN "/rlorch.v1.Control/WatchRun"
#define CHECK "/grpc.health.v1.Health/Check"
#define WATCH "/grpc.health.v1.Health/Watch"
#define REPORTSTREAM "/rlorch.v1.Worker/ReportStream"

typedef struct hook_rec {
  char method[64];
  grpc_status_code code;
} hook_rec;

#define FX_BIG_BYTES (64 << 10)
#define FX_PACERS 8
#define FX_KEPT 256

/* One paced stream's state; kept until fx_stop, so that a writable callback
 * after its end is seen rather than a use after free. */
typedef struct fx_pacer {
  struct fx *f;
  int64_t next, last;
  int big, lazy;
  int over; /* finished or cancelled */
  rpc_call *cancelled; /* lazy: the cancelled call, not yet ended */
} fx_pacer;

typedef struct fx {
  uv_loop_t loop;
  uv_thread_t th;
  rpc_server *s;
  uv_async_t cmd;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  void (*cmd_fn)(struct fx *, void *);
  void *cmd_arg;
  int cmd_done;
  int cancels;     /* on_cancel callbacks seen */
  int done_called; /* shutdown done() ran */
  int stream_open; /* an "open" WatchRun stream is held */
  int sends_refused; /* WatchRun sends that rpc_call_send refused */
  int paced_sent;         /* events the paced streams sent */
  int writable_calls;     /* writable callbacks */
  int writable_backlog;   /* of them, run while a message was still unsent */
  int writable_after_end; /* of them, run for a stream finished or cancelled */
  fx_pacer pacers[FX_PACERS];
  int npacers;
  /* ReportStream */
  int reports;       /* message calls the handler got */
  int reports_ok;    /* of them "n<k>" */
  int64_t report_last; /* the last k of "n<k>" */
  int report_out_of_order;
  int report_api_bad; /* a message call answered the call API unlike its contract */
  rpc_call *kept[FX_KEPT];
  int nkept;         /* kept message calls not yet ended */
  int kept_total;
  int msg_cancels;   /* cancel callbacks of message calls */
  int kept_end_rc[FX_KEPT]; /* fx_end_kept: what ending each returned */
  int nkept_end;
  hook_rec hooks[16384];
  int nhooks;
  char target[64];
} fx;

/* The one fixture of the running test. */
extern fx F;

/* Starts the server with these options (hook and handlers are set here,
 * listen too unless given); start() with the defaults. */
void fx_start_opts(rpc_server_opts o);
void fx_start(void);
/* Graceful shutdown from the loop thread; asserts done() ran once and the
 * loop ran dry, then frees everything. */
void fx_stop(void);
/* Runs fn on the loop thread and waits for it. */
void fx_on_loop(void (*fn)(fx *, void *), void *arg);
/* rpc__test_fail_batches on the loop thread: the next `skip` batches go
 * through, the `fail` after them are refused. */
void fx_fail_batches(int skip, int fail);
/* Calls the hook saw for this method with this status. */
int fx_hook_count(const char *method, grpc_status_code code);
/* Waits until *v >= want (read under F.mu) or about 5 s pass; returns *v. */
int fx_wait_for(int *v, int want);

rpc_client *fx_client(const char *token);
grpc_status_code fx_getrun(rpc_client *c, const char *id, double timeout, rpc_status *st,
                           Rlorch__V1__Run **out);

/* A WatchRun stream read on a thread of its own (or inline). */
typedef struct fx_streamer {
  rpc_client *c;
  const char *run_id;
  int64_t n;
  int got;
  uint64_t last_seq;
  int out_of_order;
  grpc_status_code code;
  rpc_status st;
} fx_streamer;
void fx_stream_thread(void *arg); /* arg: fx_streamer */

/* A Health.Watch stream that stops after stop_at messages. */
typedef struct fx_watcher {
  rpc_client *c;
  const char *svc;
  int statuses[8];
  int n;
  int stop_at;
  grpc_status_code code;
} fx_watcher;
void fx_watch_thread(void *arg); /* arg: fx_watcher */

/* Ends the kept ReportStream message calls (OK, or failing with code), on
 * the loop thread; their return values go to F.kept_end_rc. */
void fx_end_kept(grpc_status_code code);

/* Ends the cancelled "paced-lazy" streams, on the loop thread. */
void fx_finish_lazy(void);

grpc_status_code fx_health_check(rpc_client *c, const char *svc, int *status, rpc_status *st);

typedef struct fx_health_arg {
  const char *svc;
  int status;
} fx_health_arg;
void fx_do_set_health(fx *f, void *arg); /* for fx_on_loop; arg: fx_health_arg */

#endif
