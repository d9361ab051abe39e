/* `rlorch trainer` and `rlorch inference`: settings, logging, then the agent
 * library (workers/agent). */
#include <stdio.h>

#include "orchestrator/cli/agent_flags.h"
#include "orchestrator/cli/commands.h"
#include "orchestrator/common/log.h"
#include "workers/agent/agent.h"

extern char **environ;

_Static_assert((int)AGENT_LOG_DEBUG == (int)LOG_DEBUG && (int)AGENT_LOG_INFO == (int)LOG_INFO &&
                   (int)AGENT_LOG_WARN == (int)LOG_WARN && (int)AGENT_LOG_ERROR == (int)LOG_ERROR,
               "agent log levels map one to one onto log levels");

static void agents__log(void *ud, agent_log_level level, const char *event, const char *fields,
                        va_list ap) {
  (void)ud;
  log_vwrite((log_level)level, event, fields, ap);
}

static int agents__main(agent_role role, int argc, char **argv) {
  const char *cmd = role == AGENT_ROLE_TRAINER ? "trainer" : "inference";
  agent_flags f;
  char err[1024];
  int rc = agent_flags_parse(role, argc, argv, environ, &f, err, sizeof err);
  if (rc == 1) {
    agent_flags_usage(role, stdout);
    agent_flags_free(&f);
    return 0;
  }
  if (rc < 0) {
    fprintf(stderr, "%s\n", err);
    agent_flags_free(&f);
    return 2;
  }
  log_setup(f.log_level, f.log_format, cmd);
  agent_log_config(agents__log, NULL,
                   f.log_level > LOG_ERROR ? (agent_log_level)(AGENT_LOG_ERROR + 1)
                                               : (agent_log_level)f.log_level);
  rc = role == AGENT_ROLE_TRAINER ? agent_trainer_run(&f.opts) : agent_inference_run(&f.opts);
  agent_flags_free(&f);
  return rc;
}

int cmd_trainer(int argc, char **argv) { return agents__main(AGENT_ROLE_TRAINER, argc, argv); }
int cmd_inference(int argc, char **argv) { return agents__main(AGENT_ROLE_INFERENCE, argc, argv); }
