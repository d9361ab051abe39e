/* Settings of `rlorch trainer` and `rlorch inference`, parsed by opt (flags,
 * then RLORCH_* environment below them) into the agent library's settings plus
 * what the program itself needs (logging, --help). */
#ifndef RLORCH_CLI_AGENT_FLAGS_H
#define RLORCH_CLI_AGENT_FLAGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "orchestrator/common/log.h"
#include "workers/agent/agent_opts.h"

typedef struct agent_flags {
  agent_opts opts; /* its strings are owned by this struct: agent_flags_free */
  log_level log_level;
  log_format log_format;
  bool help;
  char token[AGENT_TOKEN_MAX]; /* token_file's contents, read once; opts.token points here */
} agent_flags;

/* Parses argv (argv[0] skipped) and envp ("NAME=value", NULL-terminated, or
 * NULL). Returns 0, 1 when --help was given (usage to print), or -1 with
 * "rlorch ROLE: ORIGIN: MESSAGE" in err (exit status 2). On every path release
 * o with agent_flags_free. */
int agent_flags_parse(agent_role role, int argc, char **argv, char **envp, agent_flags *o,
                      char *err, size_t errlen);
/* --help of a role. */
void agent_flags_usage(agent_role role, FILE *f);
void agent_flags_free(agent_flags *o);

#endif
