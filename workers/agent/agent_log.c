#include "workers/agent/agent_log.h"

#include <stddef.h>

/* Set once by the hosting program before any agent thread exists, read-only after. */
static agent_log_fn *agent__log_fn;
static void *agent__log_ud;
static agent_log_level agent__log_min = AGENT_LOG_INFO;

void agent_log_config(agent_log_fn *fn, void *ud, agent_log_level min) {
  agent__log_fn = fn;
  agent__log_ud = ud;
  agent__log_min = min;
}

void agent_log(agent_log_level level, const char *event, const char *fields, ...) {
  if (!agent__log_fn || level < agent__log_min) return;
  va_list ap;
  va_start(ap, fields);
  agent__log_fn(agent__log_ud, level, event, fields, ap);
  va_end(ap);
}
