/* Flags of `rlorch trainer` and `rlorch inference`, parsed into the agent
 * library's settings plus what the program itself needs (logging, --help).
 * Strings point into argv. */
#ifndef RLORCH_CLI_AGENT_FLAGS_H
#define RLORCH_CLI_AGENT_FLAGS_H

#include <stddef.h>

#include "orchestrator/common/log.h"
#include "workers/agent/agent_opts.h"

typedef struct agent_flags {
  agent_opts opts;
  log_level log_level;
  log_format log_format;
  int help;
} agent_flags;

/* Returns 0, 1 when --help was given (usage to print), or -1 with a message
 * naming the flag in err (exit status 2). */
int agent_flags_parse(agent_role role, int argc, char **argv, agent_flags *o, char *err,
                      size_t errlen);
/* The usage text of a role. */
const char *agent_flags_usage(agent_role role);

#endif
