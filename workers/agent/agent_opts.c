/* The agents' settings: defaults and the checks that involve several fields.
 * Parsing them from flags or the environment is the hosting program's job. */
#include "workers/agent/agent_opts.h"

#include <stdio.h>
#include <string.h>

const char *agent_offload_name(agent_offload o) {
  switch (o) {
  case AGENT_OFFLOAD_NONE: return "none";
  case AGENT_OFFLOAD_PARAMS: return "params";
  case AGENT_OFFLOAD_PARAMS_OPTIMIZER: return "params+optimizer";
  }
  return "?";
}

void agent_opts_defaults(agent_role role, agent_opts *o) {
  memset(o, 0, sizeof *o);
  o->role = role;
  o->preset = "100m";
  o->offload = AGENT_OFFLOAD_NONE;
  o->device = -1;
  o->seed = 1;
  o->bf16_shadow = 1;
  o->checkpoint_every = 1;
  agent_rollout_cfg_defaults(&o->rollout);
  o->concurrency = 8; /* the orchestrator's default max_requests_per_worker */
}

int agent_opts_check(const agent_opts *o, char *err, size_t errlen) {
  if (!o->orchestrator) {
    snprintf(err, errlen, "--orchestrator is required");
    return -1;
  }
  if (!o->tls_client_cert_file != !o->tls_client_key_file) {
    snprintf(err, errlen, "%s is set without %s (give both or neither)",
             o->tls_client_cert_file ? "--tls-client-cert" : "--tls-client-key",
             o->tls_client_cert_file ? "--tls-client-key" : "--tls-client-cert");
    return -1;
  }
  if (o->trainer_rank >= (o->trainer_ranks ? o->trainer_ranks : 1)) {
    snprintf(err, errlen, "--rank: %u is not below --ranks %u%s", o->trainer_rank, o->trainer_ranks,
             o->trainer_ranks ? "" : " (0: a lone trainer, rank 0)");
    return -1;
  }
  if (o->role == AGENT_ROLE_INFERENCE && agent_rollout_cfg_check(&o->rollout, err, errlen))
    return -1;
  if (o->role == AGENT_ROLE_INFERENCE && (o->concurrency < 1 || o->concurrency > 1024)) {
    snprintf(err, errlen, "--concurrency: %u out of range [1, 1024]", o->concurrency);
    return -1;
  }
  return 0;
}
