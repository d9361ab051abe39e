/* agent_core: what the trainer and inference agents share, the worker
 * protocol with the orchestrator.
 *
 * Threads: the caller's thread runs agent_run and executes commands one at a
 * time, in order; an attach thread reads the Attach stream and queues
 * commands; a heartbeat thread reports liveness every heartbeat interval.
 * Signals are the host program's (agent_signals below). Either background thread
 * re-registers when the orchestrator no longer knows the worker (once per
 * loss), and every retry backs off: the agent never spins on a dead server.
 * An abort is the one command also seen ahead of the queue (agent_set_abort_fn):
 * the command it aborts may be the one executing.
 * Internal to the agents. */
#ifndef RLORCH_AGENT_CORE_H
#define RLORCH_AGENT_CORE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "rlorch/v1/worker.pb-c.h"
#include "rpc/rpc.h"
#include "workers/agent/agent_opts.h"
#include "workers/bcast/bcast.h"

typedef struct agent agent;

/* Executes one command; returns 0 to go on, 1 to leave after it (shutdown),
 * or -1 for a fatal error (already logged; the process exits 1). */
typedef int (*agent_command_fn)(agent *a, const Rlorch__V1__Command *cmd, void *ud);

/* Called on the attach thread when an AbortCommand arrives, before it is
 * queued behind the command it may abort (a broadcast that would otherwise
 * wait for a lost peer until its deadline). Must be quick and thread-safe. */
/* plan_id NULL: the orchestrator forgot this worker's registration; cancel
 * whatever broadcast is executing, since it belongs to that registration. */
typedef void (*agent_abort_fn)(const char *plan_id, void *ud);

/* Called on the heartbeat thread before each heartbeat to fill the worker's
 * own figures (Heartbeat.stats, initialised empty). Must be quick and
 * thread-safe. */
typedef void (*agent_stats_fn)(Rlorch__V1__WorkerStats *stats, void *ud);

/* Blocks SIGINT and SIGTERM in the calling thread; call first thing, before
 * any thread exists, so every later thread inherits the mask and the signal
 * thread alone receives them. */
void agent_block_signals(void);

/* The signal thread of a program that blocked SIGINT and SIGTERM
 * (agent_block_signals): it takes the first of them, logs it (event=signal)
 * and calls fn(ud) once, from its own thread. */
typedef struct agent_signals {
  pthread_t tid;
  int started;
  atomic_int done;  /* set by agent_signals_stop */
  atomic_int ended; /* the thread returned after a signal */
  void (*fn)(void *ud);
  void *ud;
} agent_signals;

/* 0, or the pthread_create error. */
int agent_signals_start(agent_signals *s, void (*fn)(void *ud), void *ud);
/* Ends and joins the thread (fn is not called after it returns): call it
 * before whatever fn touches goes. Fine on a zeroed, never started one. */
void agent_signals_stop(agent_signals *s);

/* reg: the Register request (role, capabilities, manifest, data address),
 * owned by the caller and left unchanged while the agent lives; the worker
 * name is filled in here when empty. */
int agent_new(const agent_opts *o, Rlorch__V1__RegisterRequest *reg, agent_command_fn fn,
              void *ud, agent **out, char *err, size_t errlen);
/* Registers, attaches and executes commands until shutdown, a signal or a
 * fatal error. Returns the exit status: 0, or 1 after a fatal error. */
int agent_run(agent *a);
void agent_free(agent *a);
/* Sets the abort hook; call before agent_run. */
void agent_set_abort_fn(agent *a, agent_abort_fn fn, void *ud);
/* Sets the heartbeat's stats hook; call before agent_run. */
void agent_set_stats_fn(agent *a, agent_stats_fn fn, void *ud);

/* Sends a report (worker_id is filled in here), retrying with backoff while the
 * orchestrator is unreachable. 0 when delivered; -1 when dropped (stopping, or
 * the orchestrator forgot the worker: the report is then stale anyway). */
int agent_report(agent *a, Rlorch__V1__ReportRequest *req);
/* agent_report, and when it returns -1 what the last attempt got in st (the
 * orchestrator's refusal, say; CANCELLED when the agent is stopping). */
int agent_report_status(agent *a, Rlorch__V1__ReportRequest *req, rpc_status *st);

/* Sends a report that needs no answer (a plan's ack, a broadcast's end) on
 * the one-way report stream, without waiting for the orchestrator; a
 * refusal is logged when it comes back, and a worker the orchestrator forgot
 * registers again. Where the orchestrator has no such stream, or the stream
 * cannot take the report, it goes as agent_report. */
void agent_report_nowait(agent *a, Rlorch__V1__ReportRequest *req);

/* Streams this trainer's share `rank` of `ranks` of step's batch (FetchBatch)
 * under the current worker id: on_chunk gets each message in order (it is
 * freed after) and returns non-zero to cancel. Blocks until the stream ends,
 * the deadline passes (timeout_s <= 0: none) or the agent stops (CANCELLED);
 * no retry here. Returns the status, with its message in st. */
grpc_status_code agent_fetch_batch(agent *a, uint64_t step, uint32_t rank, uint32_t ranks,
                                   double timeout_s,
                                   int (*on_chunk)(const Rlorch__V1__BatchChunk *c, void *ud),
                                   void *ud, rpc_status *st);

int agent_stopping(const agent *a);
/* Any thread: makes agent_run return after the command executing now (a
 * blocked stream or sleep wakes at once). */
void agent_stop(agent *a);
/* Any thread: 1 once a registration succeeded; 0 while none has. */
int agent_registered(const agent *a);
/* Any thread: the count of successful registrations so far. A command
 * queued under one count belongs to that registration: after the next one
 * the orchestrator has forgotten it (its request ids may name other
 * requests by then). */
uint64_t agent_registration(const agent *a);
/* The orchestrator refused the registration for good (agent_run then stops):
 * its status code, with its message in msg; GRPC_STATUS_OK when it did not. */
grpc_status_code agent_refusal(const agent *a, char *msg, size_t len);
/* The policy version this worker holds of the run of the last command it
 * executed: Register and every heartbeat say both, so that an orchestrator
 * that restarted, or had declared the worker lost, knows what it kept. A
 * command of another run starts the count again at 0 (the weights it holds
 * are that run's starting point). */
uint64_t agent_policy_version(const agent *a);
void agent_set_policy_version(agent *a, uint64_t v);
/* The run whose version the worker holds ("" before any command), and both
 * set at once: a trainer restored from its checkpoint says so before
 * agent_run, so its Register names what it holds. */
void agent_held_run(agent *a, char *run, size_t len);
void agent_set_holds(agent *a, const char *run, uint64_t v);
/* While held, the agent does not register (again): a trainer holds it while
 * its optimizer step changes the version it holds, so that what it says at
 * registration is what it holds. */
void agent_hold_registration(agent *a, int hold);
uint32_t agent_rank(const agent *a); /* rank from the last registration */
/* The high bits of this worker's rollout ids: its rank, or, for an inference
 * worker registered with rank 0 (the trainer's), a 24-bit tag derived from
 * its worker id with the top bit set, so workers never share ids. */
uint32_t agent_id_tag(const agent *a);
/* Sleeps up to `s` seconds, waking early when the agent stops. */
void agent_sleep(agent *a, double s);

/* Register's Capabilities and the storage of its topology (Topology, Nic). */
typedef struct agent_caps_pb {
  Rlorch__V1__Capabilities caps;
  Rlorch__V1__Topology topo;
  Rlorch__V1__Nic nic[BCAST_SYSTOPO_MAX_NICS];
  Rlorch__V1__Nic *nicp[BCAST_SYSTOPO_MAX_NICS];
  char *peers[BCAST_SYSTOPO_MAX_PEERS];
  char *configured[3];
} agent_caps_pb;
/* Fills out->caps, its topology included (strings point into caps, which
 * must outlive it): the GPU name, UUID and the topology's GPU fields are
 * those of `device`, as bcast_caps_select_device left them. */
void agent_caps_to_pb(const bcast_caps *caps, int device, agent_caps_pb *out);
/* Logs where the worker runs, detected and configured, in one line. */
void agent_log_topology(const bcast_systopo *t);
/* The default worker name: "host-pid" (role-prefixed). */
void agent_default_name(agent_role role, char *buf, size_t len);
/* Resolves --device against what the machine offers; -1 with a message when
 * the requested device does not exist. */
int agent_pick_device(const agent_opts *o, const bcast_caps *caps, int *device, char *err,
                      size_t errlen);
double agent_now(void); /* monotonic seconds */
/* Logs the device and transport the agent uses; the host transport loudly. */
void agent_log_devices(const bcast_caps *caps, int device);

#endif
