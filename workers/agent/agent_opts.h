/* agent_opts: command-line flags of `rlorch trainer` and `rlorch inference`,
 * parsed once into a typed struct. Strings point into argv. */
#ifndef RLORCH_AGENT_OPTS_H
#define RLORCH_AGENT_OPTS_H

#include <stddef.h>

#include "orchestrator/log.h"
#include "workers/agent/agent_rollout.h"

typedef enum { AGENT_ROLE_TRAINER = 1, AGENT_ROLE_INFERENCE = 2 } agent_role;

/* Values equal rlorch.v1.Offload. */
typedef enum {
  AGENT_OFFLOAD_NONE = 1,             /* master weights and optimizer on GPU */
  AGENT_OFFLOAD_PARAMS = 2,           /* master weights in host memory, optimizer on GPU */
  AGENT_OFFLOAD_PARAMS_OPTIMIZER = 3  /* both in host memory, optimizer on CPU */
} agent_offload;

typedef struct agent_opts {
  agent_role role;
  const char *orchestrator; /* required */
  const char *token_file;
  const char *name;         /* NULL: host name and pid */
  const char *preset;       /* trainer: "100m" by default */
  uint32_t max_layers;      /* trainer: 0 = all decoder layers */
  agent_offload offload;
  int device;               /* -1: none */
  int device_set;           /* 0: pick (0 when a GPU exists, else -1) */
  const char *data_listen;  /* trainer: host-transport listen address */
  int threads;              /* CPU optimizer threads; 0: one per core */
  uint64_t seed;            /* initial weights / rollout rng */
  int seed_set;
  agent_rollout_cfg rollout;
  log_level log_level;
  log_format log_format;
  int help;
} agent_opts;

/* Returns 0, 1 when --help was given (usage to print), or -1 with a message
 * naming the flag in err (exit status 2). */
int agent_opts_parse(agent_role role, int argc, char **argv, agent_opts *o, char *err,
                     size_t errlen);
const char *agent_offload_name(agent_offload o); /* "none", "params", "params+optimizer" */
/* The usage text of a role. */
const char *agent_opts_usage(agent_role role);

#endif
