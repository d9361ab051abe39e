/* Configuration loading: one table of fields drives the YAML file, the
 * environment, the flags, the printer and the usage text, so they cannot drift
 * apart. Each value is converted and checked when it is set, with the place it
 * came from; checks that involve several fields or the file system run once
 * after merging. YAML is read with libyaml's event parser, which gives the
 * line of every key. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "orchestrator/daemon/config.h"

typedef enum {
  CONFIG__STR,    /* non-empty string */
  CONFIG__PATH,   /* optional path: may be null */
  CONFIG__ADDR,   /* HOST:PORT */
  CONFIG__LEVEL,  /* log_level */
  CONFIG__FORMAT, /* log_format */
  CONFIG__POLICY, /* broadcast mode */
  CONFIG__U32,
  CONFIG__U64,
  CONFIG__BYTES, /* uint64 with an optional KiB/MiB/GiB suffix */
  CONFIG__DOUBLE,
} config__type;

typedef struct {
  const char *name; /* YAML key; RLORCH_ + upper-case is the variable */
  const char *flag; /* command-line flag, or NULL */
  config__type type;
  size_t off;
  double min, max; /* numbers: inclusive range */
  const char *arg, *help;
} config__field;

#define CONFIG__F(n, fl, t, mn, mx, a, h) {#n, fl, t, offsetof(config, n), mn, mx, a, h}
static const config__field config__fields[] = {
    CONFIG__F(listen, "--listen", CONFIG__ADDR, 0, 0, "ADDR", "gRPC address, HOST:PORT"),
    CONFIG__F(metrics_listen, "--metrics-listen", CONFIG__ADDR, 0, 0, "ADDR",
              "HTTP address for /metrics, /healthz, /readyz"),
    CONFIG__F(data_dir, "--data-dir", CONFIG__STR, 0, 0, "DIR", "directory of the SQLite database"),
    CONFIG__F(token_file, "--token-file", CONFIG__PATH, 0, 0, "FILE",
              "file holding the bearer token clients must send"),
    CONFIG__F(tls_cert_file, "--tls-cert", CONFIG__PATH, 0, 0, "FILE", "PEM certificate chain"),
    CONFIG__F(tls_key_file, "--tls-key", CONFIG__PATH, 0, 0, "FILE", "PEM private key"),
    CONFIG__F(log_level, "--log-level", CONFIG__LEVEL, 0, 0, "LEVEL", "debug|info|warn|error|off"),
    CONFIG__F(log_format, "--log-format", CONFIG__FORMAT, 0, 0, "FMT", "logfmt|json"),
    CONFIG__F(max_message_bytes, NULL, CONFIG__BYTES, 1024, 2147483647.0, "BYTES",
              "largest gRPC message"),
    CONFIG__F(shutdown_grace_s, NULL, CONFIG__DOUBLE, 0, 3600, "SECONDS",
              "time given to in-flight work on shutdown"),
    CONFIG__F(heartbeat_interval_ms, NULL, CONFIG__U32, 10, 600000, "MS",
              "interval of worker heartbeats"),
    CONFIG__F(worker_timeout_ms, NULL, CONFIG__U32, 10, 3600000, "MS",
              "a worker without heartbeat for this long is lost"),
    CONFIG__F(http_timeout_ms, NULL, CONFIG__U32, 10, 3600000, "MS",
              "deadline of one HTTP request; slower clients are closed"),
    CONFIG__F(http_max_connections, NULL, CONFIG__U32, 1, 65536, "N", "open HTTP connections at most"),
    CONFIG__F(default_policy, NULL, CONFIG__POLICY, 0, 0, "MODE", "auto|direct|staged|host"),
    CONFIG__F(max_async_level, NULL, CONFIG__U32, 0, 64, "N", "off-policy bound of a run"),
    CONFIG__F(rollouts_per_step, NULL, CONFIG__U32, 1, 1000000, "N", "rollouts in a training batch"),
    CONFIG__F(staging_budget_bytes, NULL, CONFIG__BYTES, 1048576.0, 1099511627776.0, "BYTES",
              "staging memory budget per bucket"),
};
#define CONFIG__N (sizeof config__fields / sizeof config__fields[0])

/* Where each field's value came from, for messages. */
typedef struct {
  char origin[CONFIG__N][320];
  char *err;
  size_t errlen;
} config__ctx;

static int config__fail(config__ctx *x, const char *where, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int config__fail(config__ctx *x, const char *where, const char *fmt, ...) {
  if (!x->err || !x->errlen) return -1;
  int n = snprintf(x->err, x->errlen, "config: %s: ", where);
  if (n >= 0 && (size_t)n < x->errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->err + n, x->errlen - (size_t)n, fmt, ap);
    va_end(ap);
  }
  return -1;
}

#define CONFIG__AT(c, f, T) ((T *)((char *)(c) + (f)->off))

void config_defaults(config *c) {
  memset(c, 0, sizeof *c);
  c->listen = strdup("127.0.0.1:7070");
  c->metrics_listen = strdup("127.0.0.1:9464");
  c->data_dir = strdup("rlorch-data");
  c->log_level = LOG_INFO;
  c->log_format = LOG_FORMAT_LOGFMT;
  c->max_message_bytes = 4u << 20;
  c->shutdown_grace_s = 5.0;
  c->heartbeat_interval_ms = 1000;
  c->worker_timeout_ms = 5000;
  c->http_timeout_ms = 5000;
  c->http_max_connections = 256;
  c->default_policy = RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_AUTO;
  c->max_async_level = 1;
  c->rollouts_per_step = 8;
  c->staging_budget_bytes = 256u << 20;
}

void config_free(config *c) {
  if (!c) return;
  free(c->config_file);
  for (size_t i = 0; i < CONFIG__N; i++) {
    config__type t = config__fields[i].type;
    if (t == CONFIG__STR || t == CONFIG__PATH || t == CONFIG__ADDR) {
      char **p = CONFIG__AT(c, &config__fields[i], char *);
      free(*p);
      *p = NULL;
    }
  }
  free(c->token);
  c->token = NULL;
  c->config_file = NULL;
}

static const struct {
  const char *name;
  Rlorch__V1__BroadcastMode mode;
} config__policies[] = {
    {"auto", RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_AUTO},
    {"direct", RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_DIRECT},
    {"staged", RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_STAGED},
    {"host", RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_HOST},
};

int config_policy_parse(const char *s, Rlorch__V1__BroadcastMode *out) {
  for (size_t i = 0; s && i < sizeof config__policies / sizeof config__policies[0]; i++)
    if (!strcmp(s, config__policies[i].name)) return *out = config__policies[i].mode, 0;
  return -1;
}

const char *config_policy_name(Rlorch__V1__BroadcastMode m) {
  for (size_t i = 0; i < sizeof config__policies / sizeof config__policies[0]; i++)
    if (config__policies[i].mode == m) return config__policies[i].name;
  return "unspecified";
}

int config_parse_addr(const char *s, char *host, size_t hl, int *port) {
  if (!s) return -1;
  const char *h = s, *colon;
  size_t n;
  if (*s == '[') {
    const char *end = strchr(s, ']');
    if (!end || end[1] != ':') return -1;
    h = s + 1;
    n = (size_t)(end - h);
    colon = end + 1;
    char tmp[INET6_ADDRSTRLEN];
    struct in6_addr a6;
    if (n == 0 || n >= sizeof tmp) return -1;
    memcpy(tmp, h, n);
    tmp[n] = 0;
    if (inet_pton(AF_INET6, tmp, &a6) != 1) return -1;
  } else {
    colon = strchr(s, ':');
    if (!colon || strchr(colon + 1, ':')) return -1; /* bare IPv6 needs brackets */
    n = (size_t)(colon - s);
    if (n == 0) return -1;
    for (size_t i = 0; i < n; i++)
      if (!isalnum((unsigned char)h[i]) && h[i] != '.' && h[i] != '-' && h[i] != '_') return -1;
  }
  const char *p = colon + 1;
  size_t digits = strspn(p, "0123456789");
  if (digits == 0 || digits > 5 || p[digits]) return -1;
  long v = strtol(p, NULL, 10);
  if (v > 65535) return -1;
  if (n + 1 > hl) return -1;
  if (host) {
    memcpy(host, h, n);
    host[n] = 0;
  }
  if (port) *port = (int)v;
  return 0;
}

/* ---- converting one value ---------------------------------------------------- */

static int config__uint(config__ctx *x, const char *where, const config__field *f, const char *v,
                        uint64_t *out) {
  const char *want = f->type == CONFIG__BYTES ? "a byte count" : "an integer";
  if (!isdigit((unsigned char)v[0])) return config__fail(x, where, "not %s: \"%s\"", want, v);
  errno = 0;
  char *end;
  unsigned long long n = strtoull(v, &end, 10);
  if (errno == ERANGE) return config__fail(x, where, "out of range: \"%s\"", v);
  uint64_t mul = 1;
  if (f->type == CONFIG__BYTES && *end) {
    if (!strcmp(end, "KiB")) mul = 1ull << 10;
    else if (!strcmp(end, "MiB")) mul = 1ull << 20;
    else if (!strcmp(end, "GiB")) mul = 1ull << 30;
    else return config__fail(x, where, "not a byte count: \"%s\" (suffixes: KiB, MiB, GiB)", v);
  } else if (*end) {
    return config__fail(x, where, "not an integer: \"%s\"", v);
  }
  if (n > UINT64_MAX / mul) return config__fail(x, where, "out of range: \"%s\"", v);
  n *= mul;
  if ((double)n < f->min || (double)n > f->max)
    return config__fail(x, where, "%s out of range [%.0f, %.0f]", v, f->min, f->max);
  *out = n;
  return 0;
}

static int config__double(config__ctx *x, const char *where, const config__field *f,
                          const char *v, double *out) {
  char *end;
  errno = 0;
  double d = strtod(v, &end);
  if (end == v || *end || errno == ERANGE || !isfinite(d))
    return config__fail(x, where, "not a number: \"%s\"", v);
  if (!(d > f->min) || d > f->max)
    return config__fail(x, where, "%s out of range (%g, %g]", v, f->min, f->max);
  *out = d;
  return 0;
}

static int config__replace(char **slot, const char *v) {
  char *s = v ? strdup(v) : NULL;
  if (v && !s) return -1;
  free(*slot);
  *slot = s;
  return 0;
}

/* Sets field f from text v (NULL: an explicit null). `where` names the source. */
static int config__set(config *c, config__ctx *x, const config__field *f, const char *v,
                       const char *where) {
  size_t idx = (size_t)(f - config__fields);
  if (!v && f->type != CONFIG__PATH) return config__fail(x, where, "missing value");
  if (v && !*v && f->type != CONFIG__PATH) return config__fail(x, where, "empty value");
  if (v && !*v) v = NULL; /* an empty path clears it */
  uint64_t u = 0;
  switch (f->type) {
    case CONFIG__ADDR: {
      char host[256];
      int port;
      if (config_parse_addr(v, host, sizeof host, &port) != 0)
        return config__fail(x, where, "invalid address \"%s\" (want HOST:PORT)", v);
    } /* fall through */
    case CONFIG__STR:
    case CONFIG__PATH:
      if (config__replace(CONFIG__AT(c, f, char *), v) != 0)
        return config__fail(x, where, "out of memory");
      break;
    case CONFIG__LEVEL:
      if (log_level_parse(v, CONFIG__AT(c, f, log_level)) != 0)
        return config__fail(x, where, "invalid value \"%s\" (want debug|info|warn|error|off)", v);
      break;
    case CONFIG__FORMAT:
      if (log_format_parse(v, CONFIG__AT(c, f, log_format)) != 0)
        return config__fail(x, where, "invalid value \"%s\" (want logfmt|json)", v);
      break;
    case CONFIG__POLICY:
      if (config_policy_parse(v, CONFIG__AT(c, f, Rlorch__V1__BroadcastMode)) != 0)
        return config__fail(x, where, "invalid value \"%s\" (want auto|direct|staged|host)", v);
      break;
    case CONFIG__U32:
      if (config__uint(x, where, f, v, &u) != 0) return -1;
      *CONFIG__AT(c, f, uint32_t) = (uint32_t)u;
      break;
    case CONFIG__U64:
    case CONFIG__BYTES:
      if (config__uint(x, where, f, v, &u) != 0) return -1;
      *CONFIG__AT(c, f, uint64_t) = u;
      break;
    case CONFIG__DOUBLE:
      if (config__double(x, where, f, v, CONFIG__AT(c, f, double)) != 0) return -1;
      break;
  }
  snprintf(x->origin[idx], sizeof x->origin[idx], "%s", where);
  return 0;
}

static const config__field *config__by_name(const char *name) {
  for (size_t i = 0; i < CONFIG__N; i++)
    if (!strcmp(config__fields[i].name, name)) return &config__fields[i];
  return NULL;
}

static int config__is_numeric(config__type t) {
  return t == CONFIG__U32 || t == CONFIG__U64 || t == CONFIG__BYTES || t == CONFIG__DOUBLE;
}

/* ---- YAML file ----------------------------------------------------------------- */

static const char *config__event_kind(yaml_event_type_t t) {
  switch (t) {
    case YAML_MAPPING_START_EVENT: return "a mapping";
    case YAML_SEQUENCE_START_EVENT: return "a sequence";
    case YAML_ALIAS_EVENT: return "an alias";
    default: return "something else";
  }
}

static int config__yaml_null(const yaml_event_t *ev) {
  const char *v = (const char *)ev->data.scalar.value;
  if (ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return 0;
  return !*v || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") || !strcmp(v, "NULL");
}

/* Applies one key: value pair whose value event is ev. */
static int config__yaml_pair(config *c, config__ctx *x, const char *file, const char *key,
                             size_t key_line, const yaml_event_t *ev, unsigned *seen) {
  char where[320];
  snprintf(where, sizeof where, "%s:%zu: %s", file, key_line, key);
  const config__field *f = config__by_name(key);
  if (!f) {
    snprintf(where, sizeof where, "%s:%zu", file, key_line);
    return config__fail(x, where, "unknown key \"%s\"", key);
  }
  size_t idx = (size_t)(f - config__fields);
  if (seen[idx]) return config__fail(x, where, "duplicate key (first on line %u)", seen[idx]);
  seen[idx] = (unsigned)key_line;
  if (ev->type != YAML_SCALAR_EVENT)
    return config__fail(x, where, "wrong type: want a scalar, got %s", config__event_kind(ev->type));
  const char *v = (const char *)ev->data.scalar.value;
  if (config__yaml_null(ev)) v = NULL;
  else if (config__is_numeric(f->type) && ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
    return config__fail(x, where, "wrong type: want a number, got the quoted string \"%s\"", v);
  return config__set(c, x, f, v, where);
}

/* Walks the event stream: one document holding one mapping of scalars. */
static int config__yaml_events(config *c, config__ctx *x, const char *file, yaml_parser_t *p) {
  yaml_event_t ev;
  char key[128] = "";
  size_t key_line = 0;
  int depth = 0, docs = 0, rc = 0, have_key = 0;
  unsigned seen[CONFIG__N] = {0};
  char where[320];
  for (;;) {
    if (!yaml_parser_parse(p, &ev)) {
      snprintf(where, sizeof where, "%s:%zu", file, p->problem_mark.line + 1);
      return config__fail(x, where, "YAML syntax error: %s", p->problem ? p->problem : "unknown");
    }
    size_t line = ev.start_mark.line + 1;
    snprintf(where, sizeof where, "%s:%zu", file, line);
    switch (ev.type) {
      case YAML_STREAM_END_EVENT:
        yaml_event_delete(&ev);
        return rc;
      case YAML_DOCUMENT_START_EVENT:
        if (++docs > 1) rc = config__fail(x, where, "more than one YAML document");
        break;
      case YAML_MAPPING_START_EVENT:
        if (depth == 0) {
          depth = 1;
          break;
        }
        __attribute__((fallthrough)); /* a mapping as a key or a value */
      case YAML_SEQUENCE_START_EVENT:
      case YAML_ALIAS_EVENT:
      case YAML_SCALAR_EVENT:
        if (depth == 0) {
          if (ev.type == YAML_SCALAR_EVENT && config__yaml_null(&ev)) break; /* empty file */
          rc = config__fail(x, where, "want a mapping of settings, got %s",
                            ev.type == YAML_SCALAR_EVENT ? "a scalar" : config__event_kind(ev.type));
        } else if (!have_key) {
          if (ev.type != YAML_SCALAR_EVENT) {
            rc = config__fail(x, where, "keys must be plain names");
          } else {
            snprintf(key, sizeof key, "%s", (const char *)ev.data.scalar.value);
            key_line = line;
            have_key = 1;
          }
        } else {
          rc = config__yaml_pair(c, x, file, key, key_line, &ev, seen);
          have_key = 0;
        }
        break;
      default:
        break;
    }
    yaml_event_delete(&ev);
    if (rc) return rc;
  }
}

static int config__load_file(config *c, config__ctx *x, const char *file) {
  FILE *fp = fopen(file, "rb");
  if (!fp) return config__fail(x, file, "cannot open: %s", strerror(errno));
  yaml_parser_t p;
  if (!yaml_parser_initialize(&p)) {
    fclose(fp);
    return config__fail(x, file, "out of memory");
  }
  yaml_parser_set_input_file(&p, fp);
  int rc = config__yaml_events(c, x, file, &p);
  yaml_parser_delete(&p);
  fclose(fp);
  return rc;
}

/* ---- environment and flags ----------------------------------------------------- */

static const char *config__getenv(char **envp, const char *name) {
  size_t n = strlen(name);
  const char *found = NULL;
  for (size_t i = 0; envp && envp[i]; i++)
    if (!strncmp(envp[i], name, n) && envp[i][n] == '=') found = envp[i] + n + 1;
  return found;
}

static void config__env_name(const config__field *f, char *out, size_t n) {
  size_t i = snprintf(out, n, "RLORCH_");
  for (const char *p = f->name; *p && i + 1 < n; p++) out[i++] = (char)toupper((unsigned char)*p);
  out[i < n ? i : n - 1] = 0;
}

static int config__load_env(config *c, config__ctx *x, char **envp) {
  char name[64];
  for (size_t i = 0; i < CONFIG__N; i++) {
    config__env_name(&config__fields[i], name, sizeof name);
    const char *v = config__getenv(envp, name);
    if (v && config__set(c, x, &config__fields[i], v, name) != 0) return -1;
  }
  return 0;
}

typedef struct {
  const config__field *f; /* NULL for --config */
  const char *flag, *value;
} config__flag;

/* Pass over argv: syntax only, so a bad flag is reported before the file is read. */
static int config__scan_flags(config *c, config__ctx *x, int argc, char **argv, config__flag *out,
                              size_t *nout, const char **file) {
  static const config__field config_flag = {"config", "--config", CONFIG__PATH, 0, 0, 0, "FILE",
                                            "YAML configuration file"};
  *nout = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      c->help = true;
      continue;
    }
    if (!strcmp(a, "--print-config")) {
      c->print_config = true;
      continue;
    }
    if (strncmp(a, "--", 2) != 0)
      return config__fail(x, "arguments", "unexpected argument \"%s\"", a);
    const char *eq = strchr(a, '=');
    size_t n = eq ? (size_t)(eq - a) : strlen(a);
    const config__field *f = NULL;
    if (n == strlen(config_flag.flag) && !strncmp(a, config_flag.flag, n)) f = &config_flag;
    for (size_t k = 0; !f && k < CONFIG__N; k++) {
      const char *fl = config__fields[k].flag;
      if (fl && strlen(fl) == n && !strncmp(a, fl, n)) f = &config__fields[k];
    }
    if (!f) {
      char name[64];
      snprintf(name, sizeof name, "%.*s", (int)(n < 60 ? n : 60), a);
      return config__fail(x, name, "unknown flag (see --help)");
    }
    const char *v = eq ? eq + 1 : NULL;
    if (!eq) {
      if (i + 1 >= argc || !strncmp(argv[i + 1], "--", 2))
        return config__fail(x, f->flag, "missing value");
      v = argv[++i];
    }
    if (!*v) return config__fail(x, f->flag, "missing value");
    if (f == &config_flag) *file = v;
    else out[(*nout)++] = (config__flag){f, f->flag, v};
  }
  return 0;
}

/* ---- checks across fields ------------------------------------------------------ */

static const char *config__origin(const config__ctx *x, const char *name) {
  const config__field *f = config__by_name(name);
  const char *o = x->origin[f - config__fields];
  return *o ? o : name;
}

static int config__read_token(config *c, config__ctx *x) {
  const char *where = config__origin(x, "token_file");
  FILE *fp = fopen(c->token_file, "rb");
  if (!fp) return config__fail(x, where, "cannot read \"%s\": %s", c->token_file, strerror(errno));
  char buf[4097];
  size_t n = fread(buf, 1, sizeof buf, fp);
  int bad = ferror(fp);
  fclose(fp);
  if (bad) return config__fail(x, where, "cannot read \"%s\"", c->token_file);
  if (n == sizeof buf) return config__fail(x, where, "\"%s\" is larger than 4096 bytes", c->token_file);
  while (n && isspace((unsigned char)buf[n - 1])) n--;
  buf[n] = 0;
  if (!n) return config__fail(x, where, "\"%s\" is empty", c->token_file);
  if (strlen(buf) != n) return config__fail(x, where, "\"%s\" holds a NUL byte", c->token_file);
  if (!(c->token = strdup(buf))) return config__fail(x, where, "out of memory");
  return 0;
}

static int config__check_readable(config__ctx *x, const char *name, const char *path) {
  FILE *fp = fopen(path, "rb");
  if (!fp)
    return config__fail(x, config__origin(x, name), "cannot read \"%s\": %s", path, strerror(errno));
  fclose(fp);
  return 0;
}

static int config__validate(config *c, config__ctx *x) {
  if (c->worker_timeout_ms <= c->heartbeat_interval_ms)
    return config__fail(x, config__origin(x, "worker_timeout_ms"),
                        "%u must exceed heartbeat_interval_ms (%u)", c->worker_timeout_ms,
                        c->heartbeat_interval_ms);
  if (!c->tls_cert_file != !c->tls_key_file) {
    const char *set = c->tls_cert_file ? "tls_cert_file" : "tls_key_file";
    const char *unset = c->tls_cert_file ? "tls_key_file" : "tls_cert_file";
    return config__fail(x, config__origin(x, set), "set without %s (give both or neither)", unset);
  }
  if (c->tls_cert_file && (config__check_readable(x, "tls_cert_file", c->tls_cert_file) ||
                           config__check_readable(x, "tls_key_file", c->tls_key_file)))
    return -1;
  if (c->token_file && config__read_token(c, x)) return -1;
  return 0;
}

int config_load(config *c, int argc, char **argv, char **envp, char *err, size_t errlen) {
  config__ctx *x = calloc(1, sizeof *x);
  if (!x) {
    snprintf(err, errlen, "config: out of memory");
    return -1;
  }
  x->err = err;
  x->errlen = errlen;
  if (err && errlen) err[0] = 0;
  config_defaults(c);
  config__flag *flags = calloc((size_t)(argc > 0 ? argc : 1), sizeof *flags);
  size_t nflags = 0;
  const char *file = config__getenv(envp, "RLORCH_CONFIG");
  int rc = -1;
  if (!flags) {
    config__fail(x, "arguments", "out of memory");
    goto done;
  }
  if (config__scan_flags(c, x, argc, argv, flags, &nflags, &file)) goto done;
  if (c->help) {
    rc = 0; /* the caller prints usage; nothing else matters */
    goto done;
  }
  if (file && *file) {
    if (config__replace(&c->config_file, file) || config__load_file(c, x, file)) goto done;
  }
  if (config__load_env(c, x, envp)) goto done;
  for (size_t i = 0; i < nflags; i++)
    if (config__set(c, x, flags[i].f, flags[i].value, flags[i].flag)) goto done;
  rc = config__validate(c, x);
done:
  free(flags);
  free(x);
  return rc;
}

/* ---- output ------------------------------------------------------------------ */

static void config__print_string(const char *s, FILE *f) {
  if (!s) {
    fputs("null", f);
    return;
  }
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
    else if (*p == '\n') fputs("\\n", f);
    else if (*p == '\t') fputs("\\t", f);
    else if (*p < 0x20 || *p == 0x7f) fprintf(f, "\\x%02x", *p);
    else fputc(*p, f);
  }
  fputc('"', f);
}

void config_print(const config *c, FILE *f) {
  fputs("# rlorch serve: effective configuration\n", f);
  for (size_t i = 0; i < CONFIG__N; i++) {
    const config__field *fl = &config__fields[i];
    const config *cc = c;
    fprintf(f, "%s: ", fl->name);
    switch (fl->type) {
      case CONFIG__STR:
      case CONFIG__PATH:
      case CONFIG__ADDR:
        config__print_string(*CONFIG__AT(cc, fl, char *const), f);
        break;
      case CONFIG__LEVEL: fputs(log_level_name(c->log_level), f); break;
      case CONFIG__FORMAT: fputs(c->log_format == LOG_FORMAT_JSON ? "json" : "logfmt", f); break;
      case CONFIG__POLICY: fputs(config_policy_name(c->default_policy), f); break;
      case CONFIG__U32: fprintf(f, "%u", *CONFIG__AT(cc, fl, const uint32_t)); break;
      case CONFIG__U64:
      case CONFIG__BYTES:
        fprintf(f, "%llu", (unsigned long long)*CONFIG__AT(cc, fl, const uint64_t));
        break;
      case CONFIG__DOUBLE: {
        double d = *CONFIG__AT(cc, fl, const double);
        char num[40];
        for (int prec = 15; prec <= 17; prec++) {
          snprintf(num, sizeof num, "%.*g", prec, d);
          if (strtod(num, NULL) == d) break;
        }
        fputs(num, f);
        break;
      }
    }
    fputc('\n', f);
  }
}

void config_usage(FILE *f) {
  fputs("usage: rlorch serve [FLAGS]\n\nflags:\n"
        "  --config FILE         YAML configuration file (keys below)\n",
        f);
  for (size_t i = 0; i < CONFIG__N; i++) {
    const config__field *fl = &config__fields[i];
    if (!fl->flag) continue;
    char left[40];
    snprintf(left, sizeof left, "%s %s", fl->flag, fl->arg);
    fprintf(f, "  %-21s %s\n", left, fl->help);
  }
  fputs("  --print-config        print the effective configuration as YAML and exit\n"
        "  --help                print this text and exit\n\n"
        "settings (YAML key / environment variable):\n",
        f);
  char env[64];
  for (size_t i = 0; i < CONFIG__N; i++) {
    config__env_name(&config__fields[i], env, sizeof env);
    fprintf(f, "  %-22s %-30s %s\n", config__fields[i].name, env, config__fields[i].help);
  }
  fputs("\nPrecedence: defaults < --config file < RLORCH_* environment < flags.\n"
        "Byte sizes take an optional KiB, MiB or GiB suffix.\n",
        f);
}
