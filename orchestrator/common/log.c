#include "orchestrator/common/log.h"

#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* Written once by log_setup() before any other thread starts, read afterwards. */
static struct {
  log_level min;
  log_format fmt;
  char component[32];
} log_cfg = {LOG_INFO, LOG_FORMAT_LOGFMT, "rlorch"};

static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};

void log_setup(log_level min, log_format fmt, const char *component) {
  log_cfg.min = min;
  log_cfg.fmt = fmt;
  snprintf(log_cfg.component, sizeof log_cfg.component, "%s", component ? component : "rlorch");
}

int log_level_parse(const char *s, log_level *out) {
  for (int i = 0; i <= LOG_OFF; i++) {
    if (s && strcmp(s, level_names[i]) == 0) {
      *out = (log_level)i;
      return 0;
    }
  }
  if (s && strcmp(s, "warning") == 0) {
    *out = LOG_WARN;
    return 0;
  }
  return -1;
}

int log_format_parse(const char *s, log_format *out) {
  if (s && strcmp(s, "logfmt") == 0) *out = LOG_FORMAT_LOGFMT;
  else if (s && strcmp(s, "json") == 0) *out = LOG_FORMAT_JSON;
  else return -1;
  return 0;
}

const char *log_level_name(log_level l) { return (l >= 0 && l <= LOG_OFF) ? level_names[l] : "?"; }

int log_enabled(log_level l) { return l >= log_cfg.min && l != LOG_OFF; }

static void json_str(FILE *f, const char *s, size_t n) {
  fputc('"', f);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c == '\n') fputs("\\n", f);
    else if (c == '\t') fputs("\\t", f);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

/* Re-emits logfmt pairs (key=value, key="quoted \" value") as JSON members. */
static void logfmt_to_json(FILE *f, const char *p) {
  while (*p) {
    while (*p == ' ') p++;
    if (!*p) break;
    const char *k = p;
    while (*p && *p != '=' && *p != ' ') p++;
    size_t klen = (size_t)(p - k);
    char val[2048];
    size_t vlen = 0;
    if (*p == '=') {
      p++;
      if (*p == '"') {
        p++;
        while (*p && *p != '"') {
          if (*p == '\\' && p[1]) p++;
          if (vlen < sizeof val - 1) val[vlen++] = *p;
          p++;
        }
        if (*p == '"') p++;
      } else {
        while (*p && *p != ' ') {
          if (vlen < sizeof val - 1) val[vlen++] = *p;
          p++;
        }
      }
    }
    fputc(',', f);
    json_str(f, k, klen);
    fputc(':', f);
    json_str(f, val, vlen);
  }
}

void log_vwrite(log_level l, const char *event, const char *fields, va_list ap) {
  if (!log_enabled(l)) return;
  char buf[4096] = "";
  if (fields) vsnprintf(buf, sizeof buf, fields, ap);
  struct timeval tv;
  gettimeofday(&tv, NULL);
  struct tm tm;
  gmtime_r(&tv.tv_sec, &tm);
  char ts[40];
  size_t n = strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(ts + n, sizeof ts - n, ".%03ldZ", (long)(tv.tv_usec / 1000));

  /* One fputs-sized write per line keeps lines from interleaving across threads. */
  char line[8192];
  FILE *f = fmemopen(line, sizeof line, "w");
  if (!f) return;
  if (log_cfg.fmt == LOG_FORMAT_JSON) {
    fprintf(f, "{\"ts\":\"%s\",\"level\":\"%s\",\"component\":", ts, level_names[l]);
    json_str(f, log_cfg.component, strlen(log_cfg.component));
    fputs(",\"event\":", f);
    json_str(f, event, strlen(event));
    logfmt_to_json(f, buf);
    fputs("}\n", f);
  } else {
    fprintf(f, "ts=%s level=%s component=%s event=%s%s%s\n", ts, level_names[l],
            log_cfg.component, event, buf[0] ? " " : "", buf);
  }
  long len = ftell(f);
  fclose(f);
  if (len > 0) {
    if ((size_t)len >= sizeof line) { len = sizeof line - 1; line[len - 1] = '\n'; }
    ssize_t w = write(STDERR_FILENO, line, (size_t)len);
    (void)w;
  }
}

void log_write(log_level l, const char *event, const char *fields, ...) {
  va_list ap;
  va_start(ap, fields);
  log_vwrite(l, event, fields, ap);
  va_end(ap);
}
