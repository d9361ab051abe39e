/* Structured logs: one line per event on stderr, logfmt or JSON.
 *
 * Callers pass the fields as logfmt text ("addr=%s code=%d msg=\"%s\"");
 * in JSON mode the line is re-emitted as one JSON object. The configuration
 * is set once at start-up by main and only read afterwards. */
#ifndef RLORCH_LOG_H
#define RLORCH_LOG_H

#include <stdarg.h>

typedef enum { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_OFF } log_level;
typedef enum { LOG_FORMAT_LOGFMT = 0, LOG_FORMAT_JSON } log_format;

/* Sets the threshold, the format and the component name ("serve", "trainer"...). */
void log_setup(log_level min, log_format fmt, const char *component);
/* Parses "debug", "info", "warn", "error", "off"; returns 0 or -1. */
int log_level_parse(const char *s, log_level *out);
/* Parses "logfmt" or "json"; returns 0 or -1. */
int log_format_parse(const char *s, log_format *out);
const char *log_level_name(log_level l);
int log_enabled(log_level l);

/* Writes one event. `fields` is a printf format producing logfmt pairs; may be NULL. */
void log_write(log_level l, const char *event, const char *fields, ...)
    __attribute__((format(printf, 3, 4)));
void log_vwrite(log_level l, const char *event, const char *fields, va_list ap);

#define log_debug(ev, ...) log_write(LOG_DEBUG, ev, __VA_ARGS__)
#define log_info(ev, ...) log_write(LOG_INFO, ev, __VA_ARGS__)
#define log_warn(ev, ...) log_write(LOG_WARN, ev, __VA_ARGS__)
#define log_error(ev, ...) log_write(LOG_ERROR, ev, __VA_ARGS__)

#endif
