/* agent_xfer: the broadcast side of an agent, shared by both roles: keeps
 * the engine and the acknowledged plan, answers plan, trigger and abort
 * commands. Internal to the agents. */
#ifndef RLORCH_AGENT_XFER_H
#define RLORCH_AGENT_XFER_H

#include <pthread.h>

#include "workers/agent/agent_core.h"
#include "workers/bcast/bcast.h"

/* Binds the local tensors to a plan, as its rank `rank` (a receiver with a
 * view binds its parts: bcast_plan_check_receiver): 0 and *local / *n, or a
 * BCAST_E* code with the reason in err (the plan is then refused). */
typedef int (*agent_xfer_bind_fn)(void *ud, const bcast_plan *p, uint32_t rank,
                                  bcast_tensor **local, size_t *n, bcast_err *err);
/* After a broadcast: on success the receiver adopts the plan's policy
 * version. `checksum` non-NULL: also the checksum of the weights now held
 * (agent_weights_checksum over the bound tensors), which a lone trainer and
 * its whole receivers report; NULL when the plan's own sums serve (several
 * sources, a receiver's view), which agent_xfer takes itself. 0 or -1 with
 * err set. */
typedef int (*agent_xfer_done_fn)(void *ud, const bcast_plan *p, int ok, uint64_t *checksum,
                                  char *err, size_t errlen);

/* Optional: before the bound tensors are written (a receiver) or read (the
 * sender); `done` follows whatever the outcome. Right before the engine runs,
 * except on a colocated receiver: there the sender's process writes into its
 * tensors as soon as the sender has its own trigger, which may come before
 * this process handles its own, so `begin` runs before the plan's ack, and a
 * plan dropped unexecuted after it (aborted, replaced) ends with done(ok=0):
 * the sender may have written part of it. */
typedef void (*agent_xfer_begin_fn)(void *ud, const bcast_plan *p);

typedef struct agent_xfer {
  int sender;
  int device;
  char listen[256];      /* host-transport listen address (sender, or a receiver that may relay) */
  int listens;           /* the engine listens: the sender, or a receiver given an address */
  /* Guards `engine` (the pointer, not the engine) and `cancelled`: the attach
   * thread cancels through it while the command thread executes. */
  pthread_mutex_t mu;
  int mu_ready;          /* agent_xfer_init ran: mu exists */
  char cancelled[128];   /* latest plan aborted by the orchestrator */
  char running[128];     /* plan executing now, "" when none */
  bcast_engine *engine;  /* rank `rank` */
  uint32_t rank;
  bcast_plan *plan;      /* acknowledged, not yet triggered */
  bcast_tensor *local;   /* bound to `plan` */
  size_t nlocal;
  int begun;             /* begin ran for `plan`, its done not yet */
  agent_xfer_bind_fn bind;
  agent_xfer_done_fn done;
  agent_xfer_begin_fn begin; /* NULL: none; set after agent_xfer_init */
  void *ud;
} agent_xfer;

/* The sender's engine exists from the start (its data address goes into
 * Register), listening as plan rank `rank` (a trainer group's rank r is
 * source rank r of every plan), so its data address stays the one Register
 * announced; receivers create theirs on the first trigger, with its rank.
 * A receiver given `listen` (non-NULL) may relay (bcast.h, "relays"): its
 * engine listens from the start too, and keeps the address it bound (the
 * port the system chose for ":0") when a plan gives it another rank. */
int agent_xfer_init(agent_xfer *x, int sender, uint32_t rank, int device, const char *listen,
                    agent_xfer_bind_fn bind, agent_xfer_done_fn done, void *ud, char *err,
                    size_t errlen);
void agent_xfer_free(agent_xfer *x);
const char *agent_xfer_data_address(const agent_xfer *x); /* "" when none */
bcast_engine *agent_xfer_engine(agent_xfer *x);

void agent_xfer_on_plan(agent_xfer *x, agent *a, const Rlorch__V1__Command *cmd);
void agent_xfer_on_trigger(agent_xfer *x, agent *a, const Rlorch__V1__Command *cmd);
void agent_xfer_on_abort(agent_xfer *x, const Rlorch__V1__Command *cmd);
/* Any thread (the attach thread's abort hook): cancels plan `plan_id` in the
 * engine, now if it is executing, at its trigger if that is still queued. The
 * queued AbortCommand then finds nothing left to do. plan_id NULL cancels the
 * plan executing now, if any. */
void agent_xfer_cancel(agent_xfer *x, const char *plan_id);
/* agent_abort_fn adapter: ud is the agent_xfer. */
void agent_xfer_abort_hook(const char *plan_id, void *ud);

#endif
