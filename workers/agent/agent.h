/* The worker agents: a trainer or an inference engine of rlorch's own, driven
 * by the orchestrator's worker API. The hosting program fills agent_opts (an
 * inference agent's rewards may come from its own code: agent_opts.reward),
 * installs a log callback (agent_log.h) and calls one of these; each returns
 * 0 after a shutdown command or SIGTERM/SIGINT, 1 after a fatal error (logged). */
#ifndef RLORCH_AGENT_H
#define RLORCH_AGENT_H

#include "workers/agent/agent_log.h"
#include "workers/agent/agent_opts.h"

int agent_trainer_run(const agent_opts *o);
int agent_inference_run(const agent_opts *o);

#endif
