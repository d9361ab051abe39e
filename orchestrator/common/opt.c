/* opt: one table of fields drives the YAML file, the environment, the flags,
 * the positional arguments and the --help text. Each value is converted and
 * range-checked when it is set, with the place it came from; checks that
 * involve several fields are the command's, through opt_fail. YAML is read
 * with libyaml's event parser, which gives the line of every key. */
#include "orchestrator/common/opt.h"

#include "orchestrator/common/log.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#define OPT__AT(obj, f, T) ((T *)((char *)(obj) + (f)->off))

static int opt__vfail(opt_state *st, const char *origin, const char *fmt, va_list ap) {
  int n = snprintf(st->err, sizeof st->err, "rlorch %s: %s: ", st->cmd ? st->cmd->name : "?",
                   origin);
  if (n >= 0 && (size_t)n < sizeof st->err)
    vsnprintf(st->err + n, sizeof st->err - (size_t)n, fmt, ap);
  return -1;
}

int opt_fail(opt_state *st, const char *origin, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  opt__vfail(st, origin, fmt, ap);
  va_end(ap);
  return -1;
}

static int opt__is_string(opt_type t) {
  return t == OPT_STR || t == OPT_PATH || t == OPT_ADDR || t == OPT_TARGET;
}

static int opt__is_number(opt_type t) {
  return t == OPT_U32 || t == OPT_I32 || t == OPT_U64 || t == OPT_I64 || t == OPT_BYTES ||
         t == OPT_DOUBLE;
}

int opt_own(const opt_cmd *cmd, void *obj) {
  int rc = 0;
  for (size_t i = 0; i < cmd->nfields; i++) {
    const opt_field *f = &cmd->fields[i];
    if (!opt__is_string(f->type)) continue;
    char **p = OPT__AT(obj, f, char *);
    /* After a failure the rest become NULL, so opt_free never frees a literal. */
    if (rc) *p = NULL;
    else if (*p && !(*p = strdup(*p))) rc = -1;
  }
  return rc;
}

void opt_free(const opt_cmd *cmd, void *obj) {
  if (!obj) return;
  for (size_t i = 0; i < cmd->nfields; i++) {
    const opt_field *f = &cmd->fields[i];
    if (!opt__is_string(f->type)) continue;
    char **p = OPT__AT(obj, f, char *);
    free(*p);
    *p = NULL;
  }
}

const opt_name opt_log_level_names[] = {
    {"debug", LOG_DEBUG}, {"info", LOG_INFO}, {"warn", LOG_WARN},
    {"error", LOG_ERROR}, {"off", LOG_OFF},   {NULL, 0}};
const opt_name opt_log_format_names[] = {
    {"logfmt", LOG_FORMAT_LOGFMT}, {"json", LOG_FORMAT_JSON}, {NULL, 0}};

const char *opt_enum_name(const opt_name *names, int value) {
  for (size_t i = 0; names && names[i].name; i++)
    if (names[i].value == value) return names[i].name;
  return NULL;
}

/* "a|b|c": the first name of each value; later ones are aliases. */
static void opt__choices(const opt_name *names, char *buf, size_t len) {
  size_t off = 0;
  buf[0] = 0;
  for (size_t i = 0; names && names[i].name && off < len; i++) {
    size_t k = 0;
    while (k < i && names[k].value != names[i].value) k++;
    if (k < i) continue;
    int n = snprintf(buf + off, len - off, "%s%s", off ? "|" : "", names[i].name);
    if (n < 0) break;
    off += (size_t)n;
  }
}

int opt_parse_addr(const char *s, char *host, size_t hl, int *port) {
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

/* The schemes of gRPC's naming document that the C core resolves without a
 * plugin; users of Kubernetes services and systemd sockets rely on them. */
static const char *const opt__target_schemes[] = {"dns:", "unix:", "unix-abstract:", "ipv4:",
                                                  "ipv6:"};

bool opt_is_target(const char *s) {
  if (!s || !*s) return false;
  /* A control character is a quoting mistake whatever the scheme. */
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    if (*p < 0x20 || *p == 0x7f) return false;
  for (size_t i = 0; i < sizeof opt__target_schemes / sizeof opt__target_schemes[0]; i++) {
    size_t n = strlen(opt__target_schemes[i]);
    if (strncmp(s, opt__target_schemes[i], n)) continue;
    const char *rest = s + n;
    rest += strspn(rest, "/"); /* "dns:///" names nothing */
    return *rest != 0;
  }
  return opt_parse_addr(s, NULL, 256, NULL) == 0;
}

/* ---- converting one value ---------------------------------------------------- */

/* The inclusive range of an integer field: its own, or the type's. */
static void opt__range(const opt_field *f, double *lo, double *hi) {
  if (f->min != 0 || f->max != 0) {
    *lo = f->min, *hi = f->max;
    return;
  }
  switch (f->type) {
    case OPT_U32: *lo = 0, *hi = UINT32_MAX; break;
    case OPT_I32: *lo = INT32_MIN, *hi = INT32_MAX; break;
    case OPT_I64: *lo = (double)INT64_MIN, *hi = (double)INT64_MAX; break;
    default: *lo = 0, *hi = (double)UINT64_MAX; break;
  }
}

static int opt__out_of_range(opt_state *st, const char *where, const opt_field *f, const char *v) {
  double lo, hi;
  opt__range(f, &lo, &hi);
  if (f->type == OPT_DOUBLE)
    return opt_fail(st, where, "%s out of range %c%g, %g]", v, f->flags & OPT_GT_MIN ? '(' : '[',
                    lo, hi);
  return opt_fail(st, where, "%s out of range %c%.0f, %.0f]", v, f->flags & OPT_GT_MIN ? '(' : '[',
                  lo, hi);
}

static int opt__in_range(const opt_field *f, double d) {
  double lo, hi;
  opt__range(f, &lo, &hi);
  if (f->flags & OPT_GT_MIN) return d > lo && d <= hi;
  return d >= lo && d <= hi;
}

static int opt__uint(opt_state *st, const char *where, const opt_field *f, const char *v,
                     uint64_t *out) {
  const char *want = f->type == OPT_BYTES ? "a byte count" : "an integer";
  if (!isdigit((unsigned char)v[0])) return opt_fail(st, where, "not %s: \"%s\"", want, v);
  errno = 0;
  char *end;
  unsigned long long n = strtoull(v, &end, 10);
  if (errno == ERANGE) return opt_fail(st, where, "out of range: \"%s\"", v);
  uint64_t mul = 1;
  if (f->type == OPT_BYTES && *end) {
    if (!strcmp(end, "KiB")) mul = 1ull << 10;
    else if (!strcmp(end, "MiB")) mul = 1ull << 20;
    else if (!strcmp(end, "GiB")) mul = 1ull << 30;
    else return opt_fail(st, where, "not a byte count: \"%s\" (suffixes: KiB, MiB, GiB)", v);
  } else if (*end) {
    return opt_fail(st, where, "not an integer: \"%s\"", v);
  }
  if (n > UINT64_MAX / mul) return opt_fail(st, where, "out of range: \"%s\"", v);
  n *= mul;
  double lo, hi;
  opt__range(f, &lo, &hi);
  /* Compare in integers where the bound is the type's own: doubles round 2^64-1. */
  if (f->type == OPT_U64 || f->type == OPT_BYTES) {
    if ((f->min != 0 || f->max != 0) && !opt__in_range(f, (double)n))
      return opt__out_of_range(st, where, f, v);
  } else if (!opt__in_range(f, (double)n)) {
    return opt__out_of_range(st, where, f, v);
  }
  *out = n;
  return 0;
}

static int opt__int(opt_state *st, const char *where, const opt_field *f, const char *v,
                    int64_t *out) {
  const char *d = v[0] == '-' ? v + 1 : v;
  if (!isdigit((unsigned char)d[0])) return opt_fail(st, where, "not an integer: \"%s\"", v);
  errno = 0;
  char *end;
  long long n = strtoll(v, &end, 10);
  if (errno == ERANGE) return opt_fail(st, where, "out of range: \"%s\"", v);
  if (*end) return opt_fail(st, where, "not an integer: \"%s\"", v);
  if (!opt__in_range(f, (double)n)) return opt__out_of_range(st, where, f, v);
  *out = n;
  return 0;
}

static int opt__double(opt_state *st, const char *where, const opt_field *f, const char *v,
                       double *out) {
  char *end;
  errno = 0;
  double d = strtod(v, &end);
  if (end == v || *end || errno == ERANGE || !isfinite(d))
    return opt_fail(st, where, "not a number: \"%s\"", v);
  if ((f->min != 0 || f->max != 0 || (f->flags & OPT_GT_MIN)) && !opt__in_range(f, d))
    return opt__out_of_range(st, where, f, v);
  *out = d;
  return 0;
}

static int opt__bool(const char *v, bool *out) {
  static const char *yes[] = {"true", "1", "yes", "on"}, *no[] = {"false", "0", "no", "off"};
  for (size_t i = 0; i < 4; i++) {
    if (!strcmp(v, yes[i])) return *out = true, 0;
    if (!strcmp(v, no[i])) return *out = false, 0;
  }
  return -1;
}

static size_t opt__index(const opt_cmd *cmd, const opt_field *f) {
  return (size_t)(f - cmd->fields);
}

/* Sets field f from text v (NULL: an explicit YAML null). `where` names the source. */
static int opt__set(opt_state *st, void *obj, const opt_field *f, const char *v,
                    const char *where) {
  if (!v && f->type != OPT_PATH) return opt_fail(st, where, "missing value");
  if (v && !*v) {
    if (f->type != OPT_PATH) return opt_fail(st, where, "empty value");
    v = NULL; /* an empty path clears it */
  }
  uint64_t u = 0;
  int64_t s = 0;
  /* Addresses are checked here and then stored like any string. */
  if (f->type == OPT_ADDR && opt_parse_addr(v, NULL, 256, NULL) != 0)
    return opt_fail(st, where, "invalid address \"%s\" (want HOST:PORT)", v);
  if (f->type == OPT_TARGET && !opt_is_target(v))
    return opt_fail(st, where,
                    "invalid gRPC target \"%s\" (want HOST:PORT, or dns:, unix:, unix-abstract:, "
                    "ipv4: or ipv6: and an address)",
                    v);
  switch (f->type) {
    case OPT_ADDR:
    case OPT_TARGET:
    case OPT_STR:
    case OPT_PATH: {
      char *copy = v ? strdup(v) : NULL;
      if (v && !copy) return opt_fail(st, where, "out of memory");
      char **slot = OPT__AT(obj, f, char *);
      free(*slot);
      *slot = copy;
      break;
    }
    case OPT_ENUM: {
      size_t i = 0;
      while (f->names[i].name && strcmp(f->names[i].name, v)) i++;
      if (!f->names[i].name) {
        char choices[256];
        opt__choices(f->names, choices, sizeof choices);
        return opt_fail(st, where, "invalid value \"%s\" (want %s)", v, choices);
      }
      *OPT__AT(obj, f, int) = f->names[i].value;
      break;
    }
    case OPT_U32:
      if (opt__uint(st, where, f, v, &u)) return -1;
      *OPT__AT(obj, f, uint32_t) = (uint32_t)u;
      break;
    case OPT_U64:
    case OPT_BYTES:
      if (opt__uint(st, where, f, v, &u)) return -1;
      *OPT__AT(obj, f, uint64_t) = u;
      break;
    case OPT_I32:
      if (opt__int(st, where, f, v, &s)) return -1;
      *OPT__AT(obj, f, int32_t) = (int32_t)s;
      break;
    case OPT_I64:
      if (opt__int(st, where, f, v, &s)) return -1;
      *OPT__AT(obj, f, int64_t) = s;
      break;
    case OPT_DOUBLE:
      if (opt__double(st, where, f, v, OPT__AT(obj, f, double))) return -1;
      break;
    case OPT_SWITCH:
      if (opt__bool(v, OPT__AT(obj, f, bool)))
        return opt_fail(st, where, "invalid value \"%s\" (want true|false)", v);
      break;
  }
  snprintf(st->origin[opt__index(st->cmd, f)], OPT_ORIGIN_LEN, "%s", where);
  return 0;
}

static const opt_field *opt__by_name(const opt_cmd *cmd, const char *name) {
  for (size_t i = 0; i < cmd->nfields; i++)
    if (!strcmp(cmd->fields[i].name, name)) return &cmd->fields[i];
  return NULL;
}

const char *opt_origin(const opt_state *st, const char *name) {
  const opt_field *f = opt__by_name(st->cmd, name);
  if (!f) return name;
  const char *o = st->origin[opt__index(st->cmd, f)];
  if (*o) return o;
  if (f->flag) return f->flag;
  return (f->flags & OPT_ARG) && f->metavar ? f->metavar : f->name;
}

bool opt_is_set(const opt_state *st, const char *name) {
  const opt_field *f = opt__by_name(st->cmd, name);
  return f && st->origin[opt__index(st->cmd, f)][0];
}

/* ---- YAML file ----------------------------------------------------------------- */

static const char *opt__event_kind(yaml_event_type_t t) {
  switch (t) {
    case YAML_MAPPING_START_EVENT: return "a mapping";
    case YAML_SEQUENCE_START_EVENT: return "a sequence";
    case YAML_ALIAS_EVENT: return "an alias";
    default: return "something else";
  }
}

static int opt__yaml_null(const yaml_event_t *ev) {
  const char *v = (const char *)ev->data.scalar.value;
  if (ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return 0;
  return !*v || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") || !strcmp(v, "NULL");
}

static int opt__in_file(const opt_field *f) { return !(f->flags & (OPT_NO_FILE | OPT_ARG)); }

/* Applies one key: value pair whose value event is ev. */
static int opt__yaml_pair(opt_state *st, void *obj, const char *file, const char *key,
                          size_t key_line, const yaml_event_t *ev, unsigned *seen) {
  char where[OPT_ORIGIN_LEN];
  snprintf(where, sizeof where, "%s:%zu: %s", file, key_line, key);
  const opt_field *f = opt__by_name(st->cmd, key);
  if (!f || !opt__in_file(f)) {
    snprintf(where, sizeof where, "%s:%zu", file, key_line);
    return opt_fail(st, where, "unknown key \"%s\"", key);
  }
  size_t idx = opt__index(st->cmd, f);
  if (seen[idx]) return opt_fail(st, where, "duplicate key (first on line %u)", seen[idx]);
  seen[idx] = (unsigned)key_line;
  if (ev->type != YAML_SCALAR_EVENT)
    return opt_fail(st, where, "wrong type: want a scalar, got %s", opt__event_kind(ev->type));
  const char *v = (const char *)ev->data.scalar.value;
  if (opt__yaml_null(ev)) v = NULL;
  else if ((opt__is_number(f->type) || f->type == OPT_SWITCH) &&
           ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
    return opt_fail(st, where, "wrong type: want a %s, got the quoted string \"%s\"",
                    f->type == OPT_SWITCH ? "boolean" : "number", v);
  return opt__set(st, obj, f, v, where);
}

/* Walks the event stream: one document holding one mapping of scalars. */
static int opt__yaml_events(opt_state *st, void *obj, const char *file, yaml_parser_t *p) {
  yaml_event_t ev;
  char key[128] = "";
  size_t key_line = 0;
  int depth = 0, docs = 0, rc = 0, have_key = 0;
  unsigned seen[OPT_MAX_FIELDS] = {0};
  char where[OPT_ORIGIN_LEN];
  for (;;) {
    if (!yaml_parser_parse(p, &ev)) {
      snprintf(where, sizeof where, "%s:%zu", file, p->problem_mark.line + 1);
      return opt_fail(st, where, "YAML syntax error: %s", p->problem ? p->problem : "unknown");
    }
    size_t line = ev.start_mark.line + 1;
    snprintf(where, sizeof where, "%s:%zu", file, line);
    switch (ev.type) {
      case YAML_STREAM_END_EVENT:
        yaml_event_delete(&ev);
        return rc;
      case YAML_DOCUMENT_START_EVENT:
        if (++docs > 1) rc = opt_fail(st, where, "more than one YAML document");
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
          if (ev.type == YAML_SCALAR_EVENT && opt__yaml_null(&ev)) break; /* empty file */
          rc = opt_fail(st, where, "want a mapping of settings, got %s",
                        ev.type == YAML_SCALAR_EVENT ? "a scalar" : opt__event_kind(ev.type));
        } else if (!have_key) {
          if (ev.type != YAML_SCALAR_EVENT) {
            rc = opt_fail(st, where, "keys must be plain names");
          } else {
            snprintf(key, sizeof key, "%s", (const char *)ev.data.scalar.value);
            key_line = line;
            have_key = 1;
          }
        } else {
          rc = opt__yaml_pair(st, obj, file, key, key_line, &ev, seen);
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

static int opt__load_file(opt_state *st, void *obj, const char *file) {
  FILE *fp = fopen(file, "rb");
  if (!fp) return opt_fail(st, file, "cannot open: %s", strerror(errno));
  yaml_parser_t p;
  if (!yaml_parser_initialize(&p)) {
    fclose(fp);
    return opt_fail(st, file, "out of memory");
  }
  yaml_parser_set_input_file(&p, fp);
  int rc = opt__yaml_events(st, obj, file, &p);
  yaml_parser_delete(&p);
  fclose(fp);
  return rc;
}

/* ---- environment ------------------------------------------------------------- */

static const char *opt__getenv(char **envp, const char *name) {
  size_t n = strlen(name);
  const char *found = NULL;
  for (size_t i = 0; envp && envp[i]; i++)
    if (!strncmp(envp[i], name, n) && envp[i][n] == '=') found = envp[i] + n + 1;
  return found;
}

void opt_env_name(const opt_field *f, char *out, size_t n) {
  if (!n) return;
  out[0] = 0;
  if (f->flags & (OPT_NO_ENV | OPT_ARG)) return;
  if (f->env) {
    snprintf(out, n, "%s", f->env);
    return;
  }
  size_t i = (size_t)snprintf(out, n, "RLORCH_");
  for (const char *p = f->name; *p && i + 1 < n; p++) out[i++] = (char)toupper((unsigned char)*p);
  out[i < n ? i : n - 1] = 0;
}

static int opt__load_env(opt_state *st, void *obj, char **envp) {
  char name[64];
  for (size_t i = 0; i < st->cmd->nfields; i++) {
    const opt_field *f = &st->cmd->fields[i];
    opt_env_name(f, name, sizeof name);
    if (!name[0]) continue;
    const char *v = opt__getenv(envp, name);
    /* The former name counts only while the current one is unset. */
    if (!v && f->env_old && (v = opt__getenv(envp, f->env_old)))
      snprintf(name, sizeof name, "%s", f->env_old);
    if (v && opt__set(st, obj, f, v, name) != 0) return -1;
  }
  return 0;
}

/* ---- flags and arguments ------------------------------------------------------- */

typedef struct {
  const opt_field *f;
  const char *origin, *value;
} opt__item;

static const opt_field *opt__by_flag(const opt_cmd *cmd, const char *a, size_t n) {
  for (size_t k = 0; k < cmd->nfields; k++) {
    const opt_field *f = &cmd->fields[k];
    if (f->flag && strlen(f->flag) == n && !strncmp(a, f->flag, n)) return f;
    if (f->alias && strlen(f->alias) == n && !strncmp(a, f->alias, n)) return f;
  }
  return NULL;
}

static const opt_field *opt__arg_field(const opt_cmd *cmd, size_t k) {
  for (size_t i = 0; i < cmd->nfields; i++)
    if ((cmd->fields[i].flags & OPT_ARG) && k-- == 0) return &cmd->fields[i];
  return NULL;
}

/* Syntax only, so a bad flag is reported before the file is read. */
static int opt__scan(opt_state *st, int argc, char **argv, opt__item *out, size_t *nout) {
  const opt_cmd *cmd = st->cmd;
  size_t nargs = 0;
  int dashdash = 0;
  *nout = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (dashdash || a[0] != '-' || !a[1]) {
      if (cmd->flags & OPT_CMD_SUBCOMMAND) {
        st->rest = i;
        return 0;
      }
      const opt_field *f = opt__arg_field(cmd, nargs++);
      if (!f) return opt_fail(st, "arguments", "unexpected argument \"%s\"", a);
      out[(*nout)++] = (opt__item){f, f->metavar, a};
      continue;
    }
    if (!strcmp(a, "--") && !(cmd->flags & OPT_CMD_SUBCOMMAND)) {
      dashdash = 1;
      continue;
    }
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      st->help = true;
      continue;
    }
    const char *eq = strchr(a, '=');
    size_t n = eq ? (size_t)(eq - a) : strlen(a);
    const opt_field *f = strncmp(a, "--", 2) ? NULL : opt__by_flag(cmd, a, n);
    int is_config = (cmd->flags & OPT_CMD_CONFIG) && n == 8 && !strncmp(a, "--config", 8);
    if (!f && !is_config) {
      char name[64];
      snprintf(name, sizeof name, "%.*s", (int)(n < 60 ? n : 60), a);
      return opt_fail(st, name, "unknown flag (see --help)");
    }
    const char *flag = is_config ? "--config" : f->flag;
    const char *v = eq ? eq + 1 : NULL;
    if (!eq && f && f->type == OPT_SWITCH) {
      v = "true";
    } else if (!eq) {
      /* "--flag --other": the value was forgotten, not "--other". */
      if (i + 1 >= argc || !strncmp(argv[i + 1], "--", 2))
        return opt_fail(st, flag, "missing value");
      v = argv[++i];
    }
    if (!*v) return opt_fail(st, flag, "missing value");
    if (is_config) st->config_file = v;
    else out[(*nout)++] = (opt__item){f, flag, v};
  }
  return 0;
}

int opt_parse(const opt_cmd *cmd, void *obj, int argc, char **argv, char **envp, opt_state *st) {
  memset(st, 0, sizeof *st);
  st->cmd = cmd;
  st->rest = argc;
  if (cmd->nfields > OPT_MAX_FIELDS) return opt_fail(st, "opt", "too many fields");
  opt__item *items = calloc((size_t)(argc > 0 ? argc : 1), sizeof *items);
  if (!items) return opt_fail(st, "arguments", "out of memory");
  size_t n = 0;
  int rc = -1;
  if (cmd->flags & OPT_CMD_CONFIG) st->config_file = opt__getenv(envp, "RLORCH_CONFIG");
  if (opt__scan(st, argc, argv, items, &n)) goto done;
  if (st->help) {
    rc = 0; /* the caller prints usage; nothing else matters */
    goto done;
  }
  if (st->config_file && !*st->config_file) st->config_file = NULL;
  if (st->config_file && opt__load_file(st, obj, st->config_file)) goto done;
  if (opt__load_env(st, obj, envp)) goto done;
  for (size_t i = 0; i < n; i++)
    if (opt__set(st, obj, items[i].f, items[i].value, items[i].origin)) goto done;
  for (size_t i = 0; i < cmd->nfields; i++) {
    const opt_field *f = &cmd->fields[i];
    if (st->origin[i][0]) continue;
    if ((f->flags & OPT_ARG) && !(f->flags & OPT_OPTIONAL)) {
      opt_fail(st, f->metavar, "missing argument");
      goto done;
    }
    if (f->flags & OPT_REQUIRED) {
      char env[64];
      opt_env_name(f, env, sizeof env);
      opt_fail(st, f->flag ? f->flag : f->name, "required%s%s", env[0] ? ": set it or " : "", env);
      goto done;
    }
  }
  rc = 0;
done:
  free(items);
  return rc;
}

/* ---- --help ------------------------------------------------------------------ */

/* The value of f in obj as text a parser accepts back; "" when there is none. */
static void opt__value(const opt_field *f, const void *obj, char *buf, size_t len) {
  buf[0] = 0;
  if (!obj) return;
  switch (f->type) {
    case OPT_STR:
    case OPT_PATH:
    case OPT_ADDR:
    case OPT_TARGET: {
      const char *s = *OPT__AT(obj, f, char *const);
      if (s) snprintf(buf, len, "%s", s);
      break;
    }
    case OPT_ENUM: {
      const char *s = opt_enum_name(f->names, *OPT__AT(obj, f, const int));
      if (s) snprintf(buf, len, "%s", s);
      break;
    }
    case OPT_U32: snprintf(buf, len, "%" PRIu32, *OPT__AT(obj, f, const uint32_t)); break;
    case OPT_I32: snprintf(buf, len, "%" PRId32, *OPT__AT(obj, f, const int32_t)); break;
    case OPT_U64: snprintf(buf, len, "%" PRIu64, *OPT__AT(obj, f, const uint64_t)); break;
    case OPT_I64: snprintf(buf, len, "%" PRId64, *OPT__AT(obj, f, const int64_t)); break;
    case OPT_BYTES: {
      uint64_t v = *OPT__AT(obj, f, const uint64_t);
      if (v && !(v % (1ull << 30))) snprintf(buf, len, "%" PRIu64 "GiB", v >> 30);
      else if (v && !(v % (1ull << 20))) snprintf(buf, len, "%" PRIu64 "MiB", v >> 20);
      else if (v && !(v % (1ull << 10))) snprintf(buf, len, "%" PRIu64 "KiB", v >> 10);
      else snprintf(buf, len, "%" PRIu64, v);
      break;
    }
    case OPT_DOUBLE: snprintf(buf, len, "%g", *OPT__AT(obj, f, const double)); break;
    case OPT_SWITCH: break; /* a switch is off unless given */
  }
}

static void opt__help_line(FILE *out, const char *left, const opt_field *f, const void *defaults) {
  char def[160];
  if (f->dflt) snprintf(def, sizeof def, "%s", f->dflt);
  else opt__value(f, defaults, def, sizeof def);
  char choices[256] = "";
  if (f->type == OPT_ENUM && f->names) opt__choices(f->names, choices, sizeof choices);
  if (strlen(left) > 26) fprintf(out, "  %s\n  %-26s", left, "");
  else fprintf(out, "  %-26s", left);
  fprintf(out, " %s", f->help ? f->help : "");
  if (choices[0]) fprintf(out, ": %s", choices);
  if (f->flags & OPT_REQUIRED) fputs(" (required)", out);
  else if (def[0]) fprintf(out, " (default %s)", def);
  fputc('\n', out);
}

void opt_usage(const opt_cmd *cmd, const void *defaults, FILE *out) {
  int have_args = 0, have_envonly = 0, have_bytes = 0, have_path = 0;
  fprintf(out, "usage: rlorch %s [FLAGS]", cmd->name);
  for (size_t i = 0; i < cmd->nfields; i++) {
    const opt_field *f = &cmd->fields[i];
    if (f->type == OPT_BYTES) have_bytes = 1;
    if (f->type == OPT_PATH && !(f->flags & OPT_ARG)) have_path = 1;
    if (!(f->flags & OPT_ARG)) {
      if (!f->flag) have_envonly = 1;
      continue;
    }
    have_args = 1;
    fprintf(out, (f->flags & OPT_OPTIONAL) ? " [%s]" : " %s", f->metavar);
  }
  if (cmd->flags & OPT_CMD_SUBCOMMAND) fputs(" COMMAND [ARGS]", out);
  fputs("\n\n", out);
  if (cmd->about) fprintf(out, "%s\n\n", cmd->about);
  if (have_args) {
    fputs("arguments:\n", out);
    for (size_t i = 0; i < cmd->nfields; i++)
      if (cmd->fields[i].flags & OPT_ARG)
        opt__help_line(out, cmd->fields[i].metavar, &cmd->fields[i], NULL);
    fputc('\n', out);
  }
  fputs("flags:\n", out);
  char left[96];
  if (cmd->flags & OPT_CMD_CONFIG)
    fprintf(out, "  %-26s YAML file of settings, keys as below (also RLORCH_CONFIG)\n",
            "--config FILE");
  for (size_t i = 0; i < cmd->nfields; i++) {
    const opt_field *f = &cmd->fields[i];
    if (!f->flag || (f->flags & OPT_ARG)) continue;
    snprintf(left, sizeof left, "%s%s%s%s%s", f->flag, f->alias ? ", " : "",
             f->alias ? f->alias : "", f->type == OPT_SWITCH ? "" : " ",
             f->type == OPT_SWITCH ? "" : (f->metavar ? f->metavar : "VALUE"));
    opt__help_line(out, left, f, defaults);
  }
  fprintf(out, "  %-26s print this text and exit\n", "--help");
  if (have_envonly) {
    fputs("\nsettings without a flag (YAML key and environment only):\n", out);
    for (size_t i = 0; i < cmd->nfields; i++) {
      const opt_field *f = &cmd->fields[i];
      if (f->flag || (f->flags & OPT_ARG)) continue;
      snprintf(left, sizeof left, "%s %s", f->name, f->metavar ? f->metavar : "VALUE");
      opt__help_line(out, left, f, defaults);
    }
  }
  int cfg = (cmd->flags & OPT_CMD_CONFIG) != 0, nenv = 0;
  char env[64];
  for (size_t i = 0; i < cmd->nfields; i++) {
    opt_env_name(&cmd->fields[i], env, sizeof env);
    nenv += env[0] != 0;
  }
  if (!nenv) {
    if (cmd->footer) fprintf(out, "\n%s", cmd->footer);
    return;
  }
  fprintf(out, "\nenvironment%s:\n", cfg ? " (variable, YAML key, flag)" : " (variable, flag)");
  for (size_t i = 0; i < cmd->nfields; i++) {
    const opt_field *f = &cmd->fields[i];
    opt_env_name(f, env, sizeof env);
    if (!env[0]) continue;
    fprintf(out, "  %-32s", env);
    if (cfg) fprintf(out, " %-24s", opt__in_file(f) ? f->name : "-");
    fprintf(out, " %s", f->flag ? f->flag : "-");
    if (f->env_old) fprintf(out, " (also %s)", f->env_old);
    fputc('\n', out);
  }
  fprintf(out, "\nPrecedence: defaults < %sRLORCH_* environment < flags.\n",
          cfg ? "--config file < " : "");
  if (have_bytes) fputs("Byte sizes take an optional KiB, MiB or GiB suffix.\n", out);
  if (have_path) fputs("An empty variable clears an optional file.\n", out);
  if (cmd->footer) fprintf(out, "\n%s", cmd->footer);
}

int opt_parse_main(const opt_cmd *cmd, void *obj, const void *defaults, int argc, char **argv,
                   char **envp, opt_state *st) {
  if (opt_parse(cmd, obj, argc, argv, envp, st) != 0) {
    fprintf(stderr, "%s\n", st->err);
    return 2;
  }
  if (st->help) {
    opt_usage(cmd, defaults, stdout);
    return 0;
  }
  return -1;
}
