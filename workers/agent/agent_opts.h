/* agent_opts: the settings of a trainer or inference agent, filled by the
 * hosting program (rlorch's own flags, or an embedding application). Strings
 * are borrowed: they must outlive the agent. */
#ifndef RLORCH_AGENT_OPTS_H
#define RLORCH_AGENT_OPTS_H

#include <stddef.h>

#include "workers/agent/agent_log.h"
#include "workers/agent/agent_rollout.h"

typedef enum { AGENT_ROLE_TRAINER = 1, AGENT_ROLE_INFERENCE = 2 } agent_role;

/* Values equal rlorch.v1.Offload. */
typedef enum {
  AGENT_OFFLOAD_NONE = 1,             /* master weights and optimizer on GPU */
  AGENT_OFFLOAD_PARAMS = 2,           /* master weights in host memory, optimizer on GPU */
  AGENT_OFFLOAD_PARAMS_OPTIMIZER = 3  /* both in host memory, optimizer on CPU */
} agent_offload;

#define AGENT_TOKEN_MAX 1024 /* bytes of a bearer token, NUL included */

typedef struct agent_opts {
  agent_role role;
  const char *orchestrator; /* required */
  const char *token_file;   /* read at start when token is NULL */
  const char *token;        /* the bearer token itself (< AGENT_TOKEN_MAX bytes), or NULL */
  const char *name;         /* NULL: host name and pid */
  const char *preset;       /* trainer (inference with tp_size > 1): "100m" by default */
  uint32_t max_layers;      /* the same: 0 = all decoder layers */
  agent_offload offload;
  int device;               /* -1: none */
  int device_set;           /* 0: pick (0 when a GPU exists, else -1) */
  const char *data_listen;  /* host-transport listen address: a trainer's (NULL: 127.0.0.1:0), or an
                               inference worker's that may relay to others (NULL: none) */
  int threads;              /* CPU optimizer threads; 0: one per core */
  /* Trainer with AGENT_OFFLOAD_PARAMS_OPTIMIZER: 1 (the default) to send a
   * bf16 shadow that the CPU step writes in the same pass as the update
   * (pinned when a GPU is used) instead of casting the fp32 master weights
   * while sending: half the bytes to stage, the same bytes on the wire. The
   * fp32 master then stays in pageable memory. 0: send the fp32 master. */
  int bf16_shadow;
  /* Trainer: a directory for its own checkpoint (agent_ckpt.h), written after
   * every checkpoint_every-th optimizer step and read at start; NULL: none. */
  const char *checkpoint_dir;
  uint32_t checkpoint_every; /* >= 1; default 1 */
  /* Trainer of a group of trainer_ranks ranks (one process each): this
   * process is rank trainer_rank and holds that rank's dim-0-contiguous
   * element range of every tensor (agent_trainer.c). 0 or 1 ranks: alone. */
  uint32_t trainer_rank;
  uint32_t trainer_ranks;
  uint64_t seed;            /* initial weights / rollout rng */
  int seed_set;
  agent_rollout_cfg rollout;
  uint32_t concurrency;     /* inference: rollout requests served at once, >= 1 */
  /* Inference: 1 to receive every broadcast into a second set of buffers and
   * swap them in once the version is whole, so generation goes on from the
   * previous version meanwhile and a failed broadcast leaves it intact (twice
   * the weights' memory). 0 (the default): one set, written in place;
   * generation waits while a broadcast writes it, and after a failed one the
   * agent serves no rollout until a broadcast succeeds. */
  int double_buffer;
  /* Inference: rank tp_rank of a tensor-parallel engine of tp_size ranks
   * (one process each; 0 or 1: every tensor whole). The rank registers the
   * parts it holds of the model `preset` (max_layers decoder layers, as the
   * trainer's): every 2-D tensor cut into tp_size near-equal slices (the
   * first len % tp_size one index longer), along dim 0 for the even ones of
   * the 2-D tensors in the model's order and dim 1 for the odd ones (as
   * column- then row-parallel layers), every 1-D tensor whole. */
  uint32_t tp_rank;
  uint32_t tp_size;
  /* Inference: scores each completion (agent_rollout.h says how, and what a
   * failure does); NULL for agent_reward_default. Called on the generator
   * threads with reward_ud, up to `concurrency` calls at once. This is where
   * an embedding program attaches its own reward code. */
  agent_reward_fn reward;
  void *reward_ud;
  /* TLS to the orchestrator: PEM roots to verify it by (turns TLS on), and a
   * client certificate and its key for an orchestrator that asks for one
   * (both or neither; they turn TLS on too). NULL: plaintext. */
  const char *tls_ca_file;
  const char *tls_client_cert_file;
  const char *tls_client_key_file;
  /* Where the worker runs, where the system cannot say it (bcast.h,
   * bcast_systopo_config): the node's name (NULL: the machine's host id),
   * and its NICs: nics of nic_gbits Gb/s each instead of those detected,
   * or nic_gbits alone for the speed of every detected one (0: detected). */
  const char *node;
  uint32_t nics;
  double nic_gbits;
} agent_opts;

/* Fills every field with its default for role. */
void agent_opts_defaults(agent_role role, agent_opts *o);
/* Checks what involves several fields; -1 with a message naming the flag. */
int agent_opts_check(const agent_opts *o, char *err, size_t errlen);
const char *agent_offload_name(agent_offload o); /* "none", "params", "params+optimizer" */

#endif
