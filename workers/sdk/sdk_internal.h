/* The embedding SDK's internals: a worker of include/rlorch/rlorch.h on top
 * of the agents' worker protocol (agent_core, agent_xfer, agent_batch). */
#ifndef RLORCH_SDK_INTERNAL_H
#define RLORCH_SDK_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "rlorch/rlorch.h"
#include "workers/agent/agent_core.h"
#include "workers/agent/agent_xfer.h"
#include "workers/bcast/bcast.h"

/* What the version script (rlorch.map) may export. */
#define SDK__EXPORT __attribute__((visibility("default")))

/* The worker's count of generation requests in flight (Heartbeat.stats
 * .requests_active), shared with its GENERATE commands: a command may be
 * freed after the worker, and a request freed unanswered (aborted, dropped)
 * is no longer in flight. Freed with the last of them. */
typedef struct sdk_active {
  atomic_uint refs;
  atomic_uint n;
} sdk_active;

/* A command handed to the caller: the public part first (callers hold a
 * pointer to it), then the message it points into, a copy the command owns. */
typedef struct sdk_cmd {
  rlorch_command pub;
  Rlorch__V1__Command *msg;
  double t0; /* when it was queued, for the worker's figures */
  uint64_t registration; /* agent_registration when it came */
  sdk_active *active; /* GENERATE: counted in it until settled */
  atomic_int settled;  /* GENERATE: answered, found stale or freed (no longer counted active) */
  struct sdk_cmd *next;
} sdk_cmd;

/* The options as kept: strings copied, so the caller's may go. */
typedef struct sdk_opts {
  rlorch_options o;
  char *orchestrator, *name, *token_file, *tls_ca_file, *tls_cert_file, *tls_key_file,
      *data_listen, *token, *model, *held_run_id;
} sdk_opts;

struct rlorch_worker {
  sdk_opts so;
  agent_opts ao;
  bcast_caps caps;
  int device;
  bcast_tensor *t; /* the caller's tensors, their data pointers (and parts) */
  size_t n;
  /* Inference (API 3): options.parts, names copied; what Register sends and
   * each plan's view for this worker must equal. */
  bcast_part_spec *parts;
  char **part_names;
  size_t nparts;
  Rlorch__V1__TensorPart *parts_pb, **parts_pbp; /* RegisterRequest.parts, into `parts` */
  bcast_tensor *bound; /* receiver: the plan's tensors in its order, pointing into t */
  size_t nbound, bound_cap;
  rlorch_tensor *pub_bound; /* on_bind: the plan's tensors as the caller sees them */
  int broadcasting;    /* the before callback ran, the after one is due */
  uint64_t checksum;   /* trainer: of the tensors as last reported */
  Rlorch__V1__WeightManifest *manifest; /* trainer */
  agent_caps_pb caps_pb; /* Register's capabilities, its topology's storage */
  Rlorch__V1__RegisterRequest reg;
  agent_xfer xfer;
  int xfer_ready;
  agent *a;

  pthread_mutex_t mu;  /* guards everything below */
  pthread_cond_t cond; /* a command queued, a step reported, the command thread done */
  sdk_cmd *head, *tail;
  int started;
  int thread_started;  /* cmd_tid exists, to be joined */
  int run_done;        /* agent_run returned */
  pthread_t cmd_tid;
  /* The train step the command thread waits on (trainer). */
  int train_waiting;   /* a TRAIN command is out with the caller */
  uint64_t train_step;
  int train_fetched;   /* its batch arrived: registration is held */
  int train_skip;      /* its batch was refused: the step is skipped, not failed */
  int train_fail;      /* the caller could not take it: the worker stops */
  int run_status;      /* agent_run's return: 0 stopped on purpose, 1 a fatal error */
  char bcast_id[128];  /* the plan the broadcast callbacks running now are about; "" outside them */
  char stop_msg[512];  /* why it stopped when not on purpose */

  sdk_active *active;
  atomic_uint_fast64_t rollouts_generated, tokens_generated, generate_ns;
  uint64_t rollout_counter; /* atomic builtins */
};

/* sdk_opts.c: checks and copies the options and the tensors into w (role,
 * agent options, tensors); RLORCH_OK or the failure in err. */
rlorch_status sdk_opts_take(rlorch_worker *w, const rlorch_options *o, rlorch_error *err);
void sdk_opts_free(rlorch_worker *w);

/* Fills err (may be NULL) and returns code. */
rlorch_status sdk_fail(rlorch_error *err, rlorch_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
