/* Logging of the agent library. The library writes no output of its own: the
 * program that hosts it installs one callback before starting an agent (as
 * SQLite's SQLITE_CONFIG_LOG does), and every event goes through it. Without a
 * callback events are dropped. */
#ifndef RLORCH_AGENT_LOG_H
#define RLORCH_AGENT_LOG_H

#include <stdarg.h>

typedef enum {
  AGENT_LOG_DEBUG = 0,
  AGENT_LOG_INFO = 1,
  AGENT_LOG_WARN = 2,
  AGENT_LOG_ERROR = 3
} agent_log_level;

/* One event: a name and its fields as a printf format producing logfmt pairs
 * ("addr=%s code=%d"), or NULL. Called from any of the agent's threads. */
typedef void agent_log_fn(void *ud, agent_log_level level, const char *event, const char *fields,
                          va_list ap);

/* Installs the callback and the lowest level passed to it. Call once, before
 * any agent starts; not thread-safe with respect to logging threads. */
void agent_log_config(agent_log_fn *fn, void *ud, agent_log_level min);

void agent_log(agent_log_level level, const char *event, const char *fields, ...)
    __attribute__((format(printf, 3, 4)));

#define agent_log_debug(ev, ...) agent_log(AGENT_LOG_DEBUG, ev, __VA_ARGS__)
#define agent_log_info(ev, ...) agent_log(AGENT_LOG_INFO, ev, __VA_ARGS__)
#define agent_log_warn(ev, ...) agent_log(AGENT_LOG_WARN, ev, __VA_ARGS__)
#define agent_log_error(ev, ...) agent_log(AGENT_LOG_ERROR, ev, __VA_ARGS__)

#endif
