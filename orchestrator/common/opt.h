/* opt: the one flag and configuration mechanism of every rlorch command.
 *
 * A command describes its settings as a table of fields over its own struct
 * (name, flag, type, offset, range, metavar, help). opt_parse fills the struct
 * in one order, lowest first:
 *   defaults (whatever the struct holds before the call)
 *   < YAML file (--config FILE or RLORCH_CONFIG; only commands with OPT_CMD_CONFIG)
 *   < environment (RLORCH_ + the upper-cased name: RLORCH_LOG_LEVEL, ...)
 *   < flags ("--flag value" or "--flag=value")
 * and records where each value came from. Every message has one shape,
 *   rlorch CMD: ORIGIN: MESSAGE
 * where ORIGIN is the flag (--listen), the variable (RLORCH_LISTEN) or the
 * file, line and key (rlorch.yaml:3: listen). opt_usage prints one --help
 * layout for every command from the same table, so they cannot drift apart.
 *
 * Unknown RLORCH_* variables are ignored: one environment serves several
 * commands. Unknown flags and unknown YAML keys are errors. An empty variable
 * clears an optional path; for other types it is an error.
 *
 * Fields whose flags include OPT_ARG are positional arguments, filled in table
 * order from the words that are not flags ("--" ends the flags).
 *
 * No global state: each parse is independent (tests parse many times). */
#ifndef RLORCH_OPT_H
#define RLORCH_OPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
  OPT_STR = 1, /* char *, non-empty */
  OPT_PATH,    /* char *, optional: an empty value or YAML null clears it */
  OPT_ADDR,    /* char *, HOST:PORT or [V6]:PORT, port 0..65535 */
  OPT_TARGET,  /* char *, what a gRPC client dials: an OPT_ADDR, or dns:, unix:,
                * unix-abstract:, ipv4: or ipv6: and a non-empty rest */
  OPT_ENUM,    /* an int-sized enum, by the name table `names` */
  OPT_U32,     /* uint32_t */
  OPT_I32,     /* int32_t or int */
  OPT_U64,     /* uint64_t */
  OPT_I64,     /* int64_t */
  OPT_BYTES,   /* uint64_t with an optional KiB, MiB or GiB suffix */
  OPT_DOUBLE,  /* double, finite */
  OPT_SWITCH,  /* bool: a flag without value; true|false in YAML and the environment */
} opt_type;

/* Field flags. */
enum {
  OPT_REQUIRED = 1u << 0,  /* must be set by some source */
  OPT_NO_ENV = 1u << 1,    /* no environment variable (actions such as --print-config) */
  OPT_NO_FILE = 1u << 2,   /* not a YAML key */
  OPT_ARG = 1u << 3,       /* positional argument; required unless OPT_OPTIONAL */
  OPT_OPTIONAL = 1u << 4,  /* with OPT_ARG: may be left out */
  OPT_GT_MIN = 1u << 5,    /* numbers: min itself is out of range */
};

/* Command flags. */
enum {
  OPT_CMD_CONFIG = 1u << 0,     /* offers --config FILE and RLORCH_CONFIG */
  OPT_CMD_SUBCOMMAND = 1u << 1, /* stops at the first word that is not a flag (opt_state.rest) */
};

/* Tables end with {NULL, 0}. A value may have several names: the first is
 * the one --help, messages and opt_enum_name use, the others are aliases. */
typedef struct opt_name {
  const char *name;
  int value;
} opt_name;

typedef struct opt_field {
  const char *name;     /* YAML key; RLORCH_ + upper-case name is the variable */
  const char *flag;     /* "--listen", or NULL for file and environment only */
  opt_type type;
  size_t off;           /* OPT_OFF(struct, member, C type) */
  double min, max;      /* numbers: inclusive range; both 0: the type's range */
  const opt_name *names; /* OPT_ENUM */
  const char *metavar;  /* ADDR, N, FILE, ...; for OPT_ARG the word in the usage line */
  const char *help;
  unsigned flags;
  const char *env;      /* the variable when not RLORCH_<NAME>, or NULL */
  const char *env_old;  /* a former name still read when `env` is unset, or NULL */
  const char *alias;    /* a second flag, or NULL */
  const char *dflt;     /* the default as --help shows it, when the value cannot say it */
} opt_field;

/* offsetof that also checks the member's size against the C type the field's
 * opt_type stores, so a table cannot point a uint64 setter at a uint32. */
#define OPT_OFF(T, m, ctype) \
  (offsetof(T, m) + 0 * sizeof(char[sizeof(((T *)0)->m) == sizeof(ctype) ? 1 : -1]))

typedef struct opt_cmd {
  const char *name;     /* "serve", "ctl start-run": usage line and message prefix */
  const char *about;    /* description paragraph, or NULL */
  const opt_field *fields;
  size_t nfields;       /* at most OPT_MAX_FIELDS */
  unsigned flags;       /* OPT_CMD_* */
  const char *footer;   /* text printed after everything else, or NULL */
} opt_cmd;

#define OPT_MAX_FIELDS 64
#define OPT_ORIGIN_LEN 256

/* The outcome of one parse. Holds no resources: nothing to free. */
typedef struct opt_state {
  const opt_cmd *cmd;
  bool help;               /* --help or -h: print opt_usage, exit 0 */
  int rest;                /* OPT_CMD_SUBCOMMAND: argv index of the command word, or argc */
  const char *config_file; /* --config / RLORCH_CONFIG, or NULL; points into argv or envp */
  char origin[OPT_MAX_FIELDS][OPT_ORIGIN_LEN]; /* per field: "" while the default */
  char err[1024];          /* "rlorch CMD: ORIGIN: MESSAGE" after a failure */
} opt_state;

/* Makes every string field of obj an owned copy (defaults may be literals).
 * 0, or -1 when out of memory: the copies made so far are kept and the other
 * string fields are NULL, so opt_free is right on both paths. Two fields that
 * share one member would be copied twice: give a member one string field. */
int opt_own(const opt_cmd *cmd, void *obj);

/* Parses argv (argv[0] is skipped) and envp ("NAME=value", NULL-terminated;
 * NULL for none) into obj, whose string fields must be owned (opt_own) or
 * NULL. Flags are checked for syntax before the file is read, and --help
 * returns at once, leaving obj as it was. Returns 0 (check st->help), or -1
 * with st->err set. On both paths release obj's strings with opt_free. */
int opt_parse(const opt_cmd *cmd, void *obj, int argc, char **argv, char **envp, opt_state *st);

/* Formats "rlorch CMD: ORIGIN: MESSAGE" into st->err, for checks a command
 * makes after parsing. Returns -1. */
int opt_fail(opt_state *st, const char *origin, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Where the setting called name came from: the flag, variable or file:line:
 * key, or when it holds its default the flag (or, without one, the name). */
const char *opt_origin(const opt_state *st, const char *name);
/* Whether some source set it. */
bool opt_is_set(const opt_state *st, const char *name);

/* The environment variable of a field, into buf (empty when it has none). */
void opt_env_name(const opt_field *f, char *buf, size_t len);

/* --help: usage line, description, flags with metavar and default (taken from
 * defaults, a struct holding the defaults), then every setting's variable. */
void opt_usage(const opt_cmd *cmd, const void *defaults, FILE *f);

/* A command's entry point in one call: opt_parse, then the error on stderr
 * (returns 2) or the usage on stdout (returns 0); -1 when the command should
 * go on with obj filled. */
int opt_parse_main(const opt_cmd *cmd, void *obj, const void *defaults, int argc, char **argv,
                   char **envp, opt_state *st);

/* Frees obj's string fields and sets them to NULL. */
void opt_free(const opt_cmd *cmd, void *obj);

/* Splits "host:port" or "[v6]:port" (host without the brackets); the host is
 * a name, an IPv4 or an IPv6 address, port 0..65535 (0: pick one). Returns 0,
 * or -1 when malformed or when the host does not fit in hl bytes. */
int opt_parse_addr(const char *s, char *host, size_t hl, int *port);

/* Whether s is an OPT_TARGET: HOST:PORT as opt_parse_addr takes it, or one of
 * the name schemes gRPC resolves by itself followed by something other than
 * slashes ("dns:///svc:7070", "unix:/run/rlorch.sock", "ipv4:10.0.0.1:7070"),
 * without control characters. The rest is the scheme's to judge when the
 * channel connects. */
bool opt_is_target(const char *s);

/* Name tables shared by the commands: log_level and log_format (log.h). */
extern const opt_name opt_log_level_names[];  /* debug|info|warn|error|off */
extern const opt_name opt_log_format_names[]; /* logfmt|json */

/* Name of value in an opt_name table, or NULL. */
const char *opt_enum_name(const opt_name *names, int value);

#endif
