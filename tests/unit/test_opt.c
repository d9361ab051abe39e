/* opt: precedence, origins, every type's bad values, flags, positional
 * arguments, subcommands, --help and the usage layout. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "orchestrator/common/opt.h"

typedef struct t_opts {
  char *str, *path, *addr;
  int mode;
  uint32_t u32;
  int32_t i32;
  uint64_t u64, bytes;
  int64_t i64;
  double dbl;
  bool sw;
  char *target, *grpc;
  char *arg1, *arg2;
  int arg_mode;
} t_opts;

static const opt_name t_modes[] = {{"slow", 1}, {"fast", 2}, {"quick", 2}, {NULL, 0}};

#define T(m, ctype) OPT_OFF(t_opts, m, ctype)
static const opt_field t_fields[] = {
    {.name = "str", .flag = "--str", .type = OPT_STR, .off = T(str, char *), .metavar = "S",
     .help = "a string"},
    {.name = "path", .flag = "--path", .type = OPT_PATH, .off = T(path, char *), .metavar = "FILE",
     .help = "a path"},
    {.name = "addr", .flag = "--addr", .type = OPT_ADDR, .off = T(addr, char *), .metavar = "ADDR",
     .help = "an address"},
    {.name = "mode", .flag = "--mode", .type = OPT_ENUM, .off = T(mode, int), .names = t_modes,
     .metavar = "MODE", .help = "a mode"},
    {.name = "u32", .flag = "--u32", .type = OPT_U32, .off = T(u32, uint32_t), .min = 1, .max = 100,
     .metavar = "N", .help = "a small count"},
    {.name = "i32", .flag = "--i32", .type = OPT_I32, .off = T(i32, int32_t), .min = -1, .max = 7,
     .metavar = "N", .help = "a signed one"},
    {.name = "u64", .flag = "--u64", .type = OPT_U64, .off = T(u64, uint64_t), .metavar = "N",
     .help = "a big one"},
    {.name = "i64", .flag = "--i64", .type = OPT_I64, .off = T(i64, int64_t), .metavar = "N",
     .help = "a big signed one"},
    {.name = "bytes", .flag = "--bytes", .type = OPT_BYTES, .off = T(bytes, uint64_t), .min = 1024,
     .max = 1073741824.0, .metavar = "BYTES", .help = "a size"},
    {.name = "dbl", .flag = "--dbl", .type = OPT_DOUBLE, .off = T(dbl, double), .min = 0, .max = 10,
     .flags = OPT_GT_MIN, .metavar = "X", .help = "a ratio"},
    {.name = "sw", .flag = "--sw", .type = OPT_SWITCH, .off = T(sw, bool), .help = "a switch"},
    {.name = "target", .flag = "--target", .alias = "--to", .type = OPT_STR,
     .off = T(target, char *), .metavar = "T", .help = "renamed", .env_old = "RLORCH_OLD_TARGET"},
    {.name = "grpc", .flag = "--grpc", .type = OPT_TARGET, .off = T(grpc, char *),
     .metavar = "TARGET", .help = "a gRPC target"},
    {.name = "file_only", .type = OPT_U32, .off = T(u32, uint32_t), .metavar = "N",
     .help = "no flag, for the file and the environment"},
};

static const opt_cmd t_cmd = {
    .name = "test",
    .about = "A command for the tests.",
    .fields = t_fields,
    .nfields = sizeof t_fields / sizeof t_fields[0],
    .flags = OPT_CMD_CONFIG,
};

static const opt_field t_arg_fields[] = {
    {.name = "first", .type = OPT_STR, .off = T(arg1, char *), .metavar = "FIRST",
     .flags = OPT_ARG, .help = "the first argument"},
    {.name = "mode", .type = OPT_ENUM, .off = T(arg_mode, int), .names = t_modes,
     .metavar = "MODE", .flags = OPT_ARG, .help = "a typed argument"},
    {.name = "last", .type = OPT_STR, .off = T(arg2, char *), .metavar = "LAST",
     .flags = OPT_ARG | OPT_OPTIONAL, .help = "may be left out"},
    {.name = "u32", .flag = "--u32", .type = OPT_U32, .off = T(u32, uint32_t), .metavar = "N",
     .help = "a count", .flags = OPT_REQUIRED},
};

static const opt_cmd t_arg_cmd = {
    .name = "test args",
    .fields = t_arg_fields,
    .nfields = sizeof t_arg_fields / sizeof t_arg_fields[0],
};

static const opt_field t_sub_fields[] = {
    {.name = "sw", .flag = "--sw", .type = OPT_SWITCH, .off = T(sw, bool), .help = "a switch"},
};

static const opt_cmd t_sub_cmd = {
    .name = "test",
    .fields = t_sub_fields,
    .nfields = 1,
    .flags = OPT_CMD_SUBCOMMAND,
    .footer = "commands: one, two\n",
};

static char tmpdir[64];

static void setup(void) {
  snprintf(tmpdir, sizeof tmpdir, "%s/rlorch_opt_XXXXXX", P_tmpdir);
  cr_assert_not_null(mkdtemp(tmpdir));
}

static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  cr_assert_eq(system(cmd), 0);
}

TestSuite(opt, .init = setup, .fini = teardown);

static const char *write_file(const char *name, const char *text) {
  static char path[256];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fputs(text, f);
  fclose(f);
  return path;
}

static void t_defaults(t_opts *o) {
  memset(o, 0, sizeof *o);
  o->str = "default";
  o->addr = "127.0.0.1:1";
  o->mode = 1;
  o->u32 = 5;
  o->i32 = 0;
  o->bytes = 4096;
  o->dbl = 1.5;
  cr_assert_eq(opt_own(&t_cmd, o), 0);
}

#define ARGV(...) ((char *[]){"test", __VA_ARGS__, NULL})
#define ARGC(...) ((int)(sizeof((char *[]){"test", __VA_ARGS__}) / sizeof(char *)))

static int parse(const opt_cmd *cmd, t_opts *o, char **envp, int argc, char **argv, opt_state *st) {
  return opt_parse(cmd, o, argc, argv, envp, st);
}
#define PARSE(o, envp, st, ...) parse(&t_cmd, o, envp, ARGC(__VA_ARGS__), ARGV(__VA_ARGS__), st)

/* Expects a failure whose message is exactly want. */
static void expect(const opt_cmd *cmd, char **envp, int argc, char **argv, const char *want) {
  t_opts o;
  t_defaults(&o);
  opt_state st;
  cr_assert_eq(opt_parse(cmd, &o, argc, argv, envp, &st), -1, "accepted; wanted %s", want);
  cr_assert_str_eq(st.err, want);
  opt_free(cmd, &o);
  opt_free(&t_cmd, &o); /* t_defaults owned t_cmd's strings, whatever cmd is */
}
#define EXPECT(want, ...) expect(&t_cmd, NULL, ARGC(__VA_ARGS__), ARGV(__VA_ARGS__), want)
#define EXPECT_ENV(var, want)                                     \
  do {                                                            \
    char *envp_[] = {var, NULL};                                  \
    expect(&t_cmd, envp_, 1, (char *[]){"test", NULL}, want);     \
  } while (0)

Test(opt, defaults_stay_and_nothing_is_set) {
  t_opts o;
  t_defaults(&o);
  opt_state st;
  cr_assert_eq(parse(&t_cmd, &o, NULL, 1, (char *[]){"test", NULL}, &st), 0, "%s", st.err);
  cr_assert_str_eq(o.str, "default");
  cr_assert_eq(o.u32, 5);
  cr_assert_null(o.path);
  cr_assert(!st.help);
  cr_assert(!opt_is_set(&st, "str"));
  cr_assert_str_eq(opt_origin(&st, "str"), "--str", "a default's origin is the flag");
  cr_assert_str_eq(opt_origin(&st, "file_only"), "file_only", "without a flag, the name");
  opt_free(&t_cmd, &o);
  cr_assert_null(o.str);
}

Test(opt, precedence_and_origins) {
  const char *file = write_file("t.yaml", "# settings\nstr: from-file\nu32: 10\ni32: 3\nmode: fast\n"
                                          "path: /f\n");
  char cfg[300];
  snprintf(cfg, sizeof cfg, "RLORCH_CONFIG=%s", file);
  char *envp[] = {cfg, "RLORCH_U32=20", "RLORCH_I32=-1", "RLORCH_UNKNOWN=x", "OTHER=1", NULL};
  t_opts o;
  t_defaults(&o);
  opt_state st;
  cr_assert_eq(PARSE(&o, envp, &st, "--u32=30", "--dbl", "2.5"), 0, "%s", st.err);
  cr_assert_str_eq(o.str, "from-file");
  cr_assert_eq(o.mode, 2);
  cr_assert_eq(o.i32, -1, "env beats file");
  cr_assert_eq(o.u32, 30, "flag beats env");
  cr_assert_float_eq(o.dbl, 2.5, 1e-12);
  cr_assert_str_eq(st.config_file, file);
  char want[320];
  snprintf(want, sizeof want, "%s:2: str", file);
  cr_assert_str_eq(opt_origin(&st, "str"), want);
  cr_assert_str_eq(opt_origin(&st, "i32"), "RLORCH_I32");
  cr_assert_str_eq(opt_origin(&st, "u32"), "--u32");
  cr_assert(opt_is_set(&st, "path"));
  opt_free(&t_cmd, &o);
  /* --config beats RLORCH_CONFIG. */
  const char *other = write_file("other.yaml", "str: other\n");
  char other_path[256];
  snprintf(other_path, sizeof other_path, "%s", other);
  char *envp2[] = {cfg, NULL};
  t_defaults(&o);
  cr_assert_eq(PARSE(&o, envp2, &st, "--config", other_path), 0, "%s", st.err);
  cr_assert_str_eq(o.str, "other");
  opt_free(&t_cmd, &o);
}

Test(opt, every_type_from_flags) {
  t_opts o;
  t_defaults(&o);
  opt_state st;
  cr_assert_eq(PARSE(&o, NULL, &st, "--str", "s", "--path=/p", "--addr", "[::1]:0", "--mode=fast",
                     "--u32", "100", "--i32", "-1", "--u64", "18446744073709551615", "--i64",
                     "-9223372036854775808", "--bytes", "2MiB", "--dbl", "10", "--sw", "--to", "t"),
               0, "%s", st.err);
  cr_assert_str_eq(o.str, "s");
  cr_assert_str_eq(o.path, "/p");
  cr_assert_str_eq(o.addr, "[::1]:0");
  cr_assert_eq(o.mode, 2);
  cr_assert_eq(o.u32, 100);
  cr_assert_eq(o.i32, -1);
  cr_assert_eq(o.u64, UINT64_MAX);
  cr_assert_eq(o.i64, INT64_MIN);
  cr_assert_eq(o.bytes, 2u << 20);
  cr_assert_float_eq(o.dbl, 10, 1e-12);
  cr_assert(o.sw);
  cr_assert_str_eq(o.target, "t", "the alias sets the field");
  cr_assert_str_eq(opt_origin(&st, "target"), "--target", "the origin is the flag's name");
  opt_free(&t_cmd, &o);
  t_defaults(&o);
  cr_assert_eq(PARSE(&o, NULL, &st, "--sw=false", "--bytes=1GiB", "--bytes", "3KiB"), 0, "%s", st.err);
  cr_assert(!o.sw);
  cr_assert_eq(o.bytes, 3072, "the last flag wins");
  opt_free(&t_cmd, &o);
  t_defaults(&o);
  cr_assert_eq(PARSE(&o, NULL, &st, "--mode", "quick"), 0, "%s", st.err);
  cr_assert_eq(o.mode, 2, "an alias names the same value");
  opt_free(&t_cmd, &o);
}

Test(opt, bad_flag_values_name_the_flag) {
  EXPECT("rlorch test: --str: missing value", "--str");
  EXPECT("rlorch test: --str: missing value", "--str", "--u32", "3");
  EXPECT("rlorch test: --str: missing value", "--str=");
  EXPECT("rlorch test: --config: missing value", "--config");
  EXPECT("rlorch test: --addr: invalid address \"x:y:z\" (want HOST:PORT)", "--addr", "x:y:z");
  EXPECT("rlorch test: --mode: invalid value \"medium\" (want slow|fast)", "--mode", "medium");
  EXPECT("rlorch test: --u32: not an integer: \"abc\"", "--u32", "abc");
  EXPECT("rlorch test: --u32: not an integer: \"-1\"", "--u32", "-1");
  EXPECT("rlorch test: --u32: not an integer: \"2.5\"", "--u32", "2.5");
  EXPECT("rlorch test: --u32: 0 out of range [1, 100]", "--u32", "0");
  EXPECT("rlorch test: --u32: 101 out of range [1, 100]", "--u32", "101");
  EXPECT("rlorch test: --i32: -2 out of range [-1, 7]", "--i32", "-2");
  EXPECT("rlorch test: --i32: not an integer: \"--\"", "--i32=--");
  EXPECT("rlorch test: --u64: out of range: \"18446744073709551616\"", "--u64",
         "18446744073709551616");
  EXPECT("rlorch test: --i64: out of range: \"9223372036854775808\"", "--i64",
         "9223372036854775808");
  EXPECT("rlorch test: --bytes: not a byte count: \"1XB\" (suffixes: KiB, MiB, GiB)", "--bytes", "1XB");
  EXPECT("rlorch test: --bytes: 2GiB out of range [1024, 1073741824]", "--bytes", "2GiB");
  EXPECT("rlorch test: --bytes: 1 out of range [1024, 1073741824]", "--bytes", "1");
  EXPECT("rlorch test: --dbl: 0 out of range (0, 10]", "--dbl", "0");
  EXPECT("rlorch test: --dbl: not a number: \"inf\"", "--dbl", "inf");
  EXPECT("rlorch test: --dbl: not a number: \"1x\"", "--dbl", "1x");
  EXPECT("rlorch test: --sw: invalid value \"maybe\" (want true|false)", "--sw=maybe");
  EXPECT("rlorch test: --bogus: unknown flag (see --help)", "--bogus", "1");
  EXPECT("rlorch test: --bogus: unknown flag (see --help)", "--bogus=1");
  EXPECT("rlorch test: -x: unknown flag (see --help)", "-x");
  EXPECT("rlorch test: arguments: unexpected argument \"stray\"", "stray");
  EXPECT("rlorch test: --str: missing value", "--str", "");
}

Test(opt, bad_environment_names_the_variable) {
  EXPECT_ENV("RLORCH_U32=abc", "rlorch test: RLORCH_U32: not an integer: \"abc\"");
  EXPECT_ENV("RLORCH_STR=", "rlorch test: RLORCH_STR: empty value");
  EXPECT_ENV("RLORCH_ADDR=host", "rlorch test: RLORCH_ADDR: invalid address \"host\" (want HOST:PORT)");
  EXPECT_ENV("RLORCH_MODE=FAST", "rlorch test: RLORCH_MODE: invalid value \"FAST\" (want slow|fast)");
  EXPECT_ENV("RLORCH_SW=2", "rlorch test: RLORCH_SW: invalid value \"2\" (want true|false)");
  EXPECT_ENV("RLORCH_DBL=-1", "rlorch test: RLORCH_DBL: -1 out of range (0, 10]");
  EXPECT_ENV("RLORCH_FILE_ONLY=x", "rlorch test: RLORCH_FILE_ONLY: not an integer: \"x\"");
  EXPECT_ENV("RLORCH_OLD_TARGET=", "rlorch test: RLORCH_OLD_TARGET: empty value");
  EXPECT_ENV("RLORCH_CONFIG=/nonexistent/t.yaml",
             "rlorch test: /nonexistent/t.yaml: cannot open: No such file or directory");
}

Test(opt, environment_values) {
  char *envp[] = {"RLORCH_SW=true", "RLORCH_PATH=", "RLORCH_OLD_TARGET=old", NULL};
  t_opts o;
  t_defaults(&o);
  o.path = strdup("/set");
  opt_state st;
  cr_assert_eq(PARSE(&o, envp, &st, "--u32", "2"), 0, "%s", st.err);
  cr_assert(o.sw);
  cr_assert_null(o.path, "an empty variable clears an optional path");
  cr_assert_str_eq(o.target, "old", "the former name is still read");
  cr_assert_str_eq(opt_origin(&st, "target"), "RLORCH_OLD_TARGET");
  opt_free(&t_cmd, &o);
  char *both[] = {"RLORCH_OLD_TARGET=old", "RLORCH_TARGET=new", NULL};
  t_defaults(&o);
  cr_assert_eq(PARSE(&o, both, &st, "--u32", "2"), 0, "%s", st.err);
  cr_assert_str_eq(o.target, "new", "the current name wins over the former one");
  opt_free(&t_cmd, &o);
}

static void expect_yaml(const char *yaml, const char *want_tail) {
  const char *file = write_file("bad.yaml", yaml);
  char path[256];
  snprintf(path, sizeof path, "%s", file);
  t_opts o;
  t_defaults(&o);
  opt_state st;
  cr_assert_eq(PARSE(&o, NULL, &st, "--config", path), -1, "accepted:\n%s", yaml);
  char want[600];
  snprintf(want, sizeof want, "rlorch test: %s%s", path, want_tail);
  cr_assert_str_eq(st.err, want, "yaml:\n%s", yaml);
  opt_free(&t_cmd, &o);
}

Test(opt, yaml_errors_name_file_line_and_key) {
  expect_yaml("str: a\n\n\nu32: 0\n", ":4: u32: 0 out of range [1, 100]");
  expect_yaml("\nbogus: 1\n", ":2: unknown key \"bogus\"");
  expect_yaml("sw: true\nstr: a\nsw: false\n", ":3: sw: duplicate key (first on line 1)");
  expect_yaml("u32: \"5\"\n", ":1: u32: wrong type: want a number, got the quoted string \"5\"");
  expect_yaml("sw: \"yes\"\n", ":1: sw: wrong type: want a boolean, got the quoted string \"yes\"");
  expect_yaml("str: [a]\n", ":1: str: wrong type: want a scalar, got a sequence");
  expect_yaml("str:\n", ":1: str: missing value");
  expect_yaml("- a\n", ":1: want a mapping of settings, got a sequence");
  expect_yaml("str: a\n---\nstr: b\n", ":2: more than one YAML document");
  expect_yaml("target: a\nconfig: b\n", ":2: unknown key \"config\"");
}

Test(opt, yaml_values_and_null_path) {
  const char *file = write_file("ok.yaml", "path: ~\nsw: true\nfile_only: 7\nbytes: 8KiB\n");
  char path[256];
  snprintf(path, sizeof path, "%s", file);
  t_opts o;
  t_defaults(&o);
  o.path = strdup("/set");
  opt_state st;
  cr_assert_eq(PARSE(&o, NULL, &st, "--config", path), 0, "%s", st.err);
  cr_assert_null(o.path);
  cr_assert(o.sw);
  cr_assert_eq(o.u32, 7);
  cr_assert_eq(o.bytes, 8192);
  opt_free(&t_cmd, &o);
}

Test(opt, flag_syntax_is_checked_before_the_file) {
  const char *file = write_file("broken.yaml", "bogus: 1\n");
  char path[256];
  snprintf(path, sizeof path, "%s", file);
  EXPECT("rlorch test: --u32: missing value", "--config", path, "--u32");
}

Test(opt, help_returns_early_and_leaves_the_struct) {
  char *envp[] = {"RLORCH_U32=not-a-number", NULL};
  t_opts o;
  t_defaults(&o);
  opt_state st;
  cr_assert_eq(PARSE(&o, envp, &st, "--u32", "7", "--help", "--config", "/nonexistent.yaml"), 0,
               "%s", st.err);
  cr_assert(st.help);
  cr_assert_eq(o.u32, 5, "nothing was applied");
  opt_free(&t_cmd, &o);
  t_defaults(&o);
  cr_assert_eq(PARSE(&o, NULL, &st, "-h"), 0);
  cr_assert(st.help);
  opt_free(&t_cmd, &o);
}

/* The entry-point form: go on (-1), usage and exit 0, or the error and exit 2. */
Test(opt, parse_main_exit_statuses) {
  cr_redirect_stdout();
  t_opts o, d;
  t_defaults(&d);
  opt_state st;
  t_defaults(&o);
  cr_assert_eq(opt_parse_main(&t_cmd, &o, &d, ARGC("--u32", "7"), ARGV("--u32", "7"), NULL, &st),
               -1);
  cr_assert_eq(o.u32, 7);
  opt_free(&t_cmd, &o);
  t_defaults(&o);
  cr_redirect_stderr();
  cr_assert_eq(opt_parse_main(&t_cmd, &o, &d, ARGC("--u32", "x"), ARGV("--u32", "x"), NULL, &st),
               2);
  cr_assert(strstr(st.err, "--u32"), "%s", st.err);
  opt_free(&t_cmd, &o);
  t_defaults(&o);
  cr_assert_eq(opt_parse_main(&t_cmd, &o, &d, ARGC("--help"), ARGV("--help"), NULL, &st), 0);
  opt_free(&t_cmd, &o);
  opt_free(&t_cmd, &d);
  fflush(stdout);
  cr_assert_stdout_neq_str("", "the usage went to stdout");
}

static char *usage_of(const opt_cmd *cmd, const void *defaults) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  opt_usage(cmd, defaults, f);
  fclose(f);
  return text;
}

Test(opt, usage_layout) {
  t_opts d;
  t_defaults(&d);
  char *text = usage_of(&t_cmd, &d);
  const char *must[] = {
      "usage: rlorch test [FLAGS]\n\nA command for the tests.\n\nflags:\n",
      "  --config FILE ",
      "  --str S                    a string (default default)\n",
      "  --mode MODE                a mode: slow|fast (default slow)\n",
      "  --bytes BYTES              a size (default 4KiB)\n",
      "  --sw                       a switch\n",
      "  --target, --to T ",
      "  --help                     print this text and exit\n",
      "settings without a flag (YAML key and environment only):\n  file_only N ",
      "environment (variable, YAML key, flag):\n",
      "  RLORCH_STR                       str                      --str\n",
      "  RLORCH_TARGET                    target                   --target (also RLORCH_OLD_TARGET)\n",
      "  RLORCH_FILE_ONLY                 file_only                -\n",
      "Precedence: defaults < --config file < RLORCH_* environment < flags.\n",
      "KiB, MiB or GiB",
  };
  for (size_t i = 0; i < sizeof must / sizeof must[0]; i++)
    cr_assert(strstr(text, must[i]), "usage lacks \"%s\":\n%s", must[i], text);
  cr_assert(strstr(text, "--str") < strstr(text, "--mode"), "flags in table order");
  free(text);
  opt_free(&t_cmd, &d);

  text = usage_of(&t_arg_cmd, NULL);
  const char *args_must[] = {"usage: rlorch test args [FLAGS] FIRST MODE [LAST]\n",
                             "arguments:\n  FIRST ", "  MODE                       a typed argument: slow|fast\n",
                             "  --u32 N                    a count (required)\n", "RLORCH_U32 "};
  for (size_t i = 0; i < sizeof args_must / sizeof args_must[0]; i++)
    cr_assert(strstr(text, args_must[i]), "usage lacks \"%s\":\n%s", args_must[i], text);
  cr_assert_null(strstr(text, "RLORCH_FIRST"), "arguments have no variable:\n%s", text);
  cr_assert_null(strstr(text, "--config"), "no --config without OPT_CMD_CONFIG:\n%s", text);
  free(text);

  text = usage_of(&t_sub_cmd, NULL);
  cr_assert(strstr(text, "usage: rlorch test [FLAGS] COMMAND [ARGS]\n"), "%s", text);
  cr_assert(strstr(text, "\ncommands: one, two\n"), "%s", text);
  free(text);
}

Test(opt, positional_arguments) {
  t_opts o;
  opt_state st;
  memset(&o, 0, sizeof o);
  cr_assert_eq(parse(&t_arg_cmd, &o, NULL, ARGC("run-1", "--u32", "3", "fast"),
                     ARGV("run-1", "--u32", "3", "fast"), &st),
               0, "%s", st.err);
  cr_assert_str_eq(o.arg1, "run-1");
  cr_assert_eq(o.arg_mode, 2);
  cr_assert_null(o.arg2);
  cr_assert_str_eq(opt_origin(&st, "first"), "FIRST");
  opt_free(&t_arg_cmd, &o);
  memset(&o, 0, sizeof o);
  cr_assert_eq(parse(&t_arg_cmd, &o, NULL, ARGC("--u32=1", "--", "-a", "slow", "--b"),
                     ARGV("--u32=1", "--", "-a", "slow", "--b"), &st),
               0, "%s", st.err);
  cr_assert_str_eq(o.arg1, "-a", "after --, words that look like flags are arguments");
  cr_assert_str_eq(o.arg2, "--b");
  opt_free(&t_arg_cmd, &o);
  /* The required flag may come from the environment. */
  char *envp[] = {"RLORCH_U32=4", NULL};
  memset(&o, 0, sizeof o);
  cr_assert_eq(parse(&t_arg_cmd, &o, envp, ARGC("a", "slow"), ARGV("a", "slow"), &st), 0, "%s",
               st.err);
  cr_assert_eq(o.u32, 4);
  opt_free(&t_arg_cmd, &o);

  expect(&t_arg_cmd, NULL, ARGC("--u32", "1"), ARGV("--u32", "1"),
         "rlorch test args: FIRST: missing argument");
  expect(&t_arg_cmd, NULL, ARGC("a", "--u32", "1"), ARGV("a", "--u32", "1"),
         "rlorch test args: MODE: missing argument");
  expect(&t_arg_cmd, NULL, ARGC("a", "medium", "--u32", "1"), ARGV("a", "medium", "--u32", "1"),
         "rlorch test args: MODE: invalid value \"medium\" (want slow|fast)");
  expect(&t_arg_cmd, NULL, ARGC("a", "fast", "c", "d", "--u32", "1"),
         ARGV("a", "fast", "c", "d", "--u32", "1"),
         "rlorch test args: arguments: unexpected argument \"d\"");
  expect(&t_arg_cmd, NULL, ARGC("a", "fast"), ARGV("a", "fast"),
         "rlorch test args: --u32: required: set it or RLORCH_U32");
}

Test(opt, subcommand_stops_at_the_command_word) {
  t_opts o;
  opt_state st;
  memset(&o, 0, sizeof o);
  cr_assert_eq(parse(&t_sub_cmd, &o, NULL, ARGC("--sw", "one", "--bogus", "x"),
                     ARGV("--sw", "one", "--bogus", "x"), &st),
               0, "%s", st.err);
  cr_assert(o.sw);
  cr_assert_eq(st.rest, 2);
  memset(&o, 0, sizeof o);
  cr_assert_eq(parse(&t_sub_cmd, &o, NULL, ARGC("--sw"), ARGV("--sw"), &st), 0, "%s", st.err);
  cr_assert_eq(st.rest, 2, "no command word: rest is argc");
  expect(&t_sub_cmd, NULL, ARGC("--bogus", "one"), ARGV("--bogus", "one"),
         "rlorch test: --bogus: unknown flag (see --help)");
}

Test(opt, fail_formats_the_one_wording) {
  opt_state st;
  t_opts o;
  t_defaults(&o);
  cr_assert_eq(PARSE(&o, NULL, &st, "--u32", "9"), 0);
  cr_assert_eq(opt_fail(&st, opt_origin(&st, "u32"), "must be %s", "even"), -1);
  cr_assert_str_eq(st.err, "rlorch test: --u32: must be even");
  opt_free(&t_cmd, &o);
}

/* What a gRPC channel dials: HOST:PORT, or a scheme the C core resolves with
 * something after it. Everything else is refused with the flag or variable. */
Test(opt, grpc_targets) {
  const char *good[] = {"127.0.0.1:7070", "[::1]:7070", "orchestrator.svc:7070",
                        "dns:///orchestrator.svc:7070", "dns:orchestrator:7070",
                        "dns://8.8.8.8/orchestrator.svc:7070", "unix:/run/rlorch.sock",
                        "unix:///run/rlorch.sock", "unix:relative.sock", "unix-abstract:rlorch",
                        "ipv4:1.2.3.4:7070", "ipv4:1.2.3.4:7070,5.6.7.8:7070",
                        "ipv6:[::1]:7070"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    t_opts o;
    t_defaults(&o);
    opt_state st;
    cr_assert_eq(PARSE(&o, NULL, &st, "--grpc", (char *)good[i]), 0, "%s", st.err);
    cr_assert_str_eq(o.grpc, good[i], "stored as given, for grpc_channel_create");
    cr_assert(opt_is_target(good[i]), "%s", good[i]);
    opt_free(&t_cmd, &o);
    char var[128];
    snprintf(var, sizeof var, "RLORCH_GRPC=%s", good[i]);
    char *envp[] = {var, NULL};
    t_defaults(&o);
    cr_assert_eq(parse(&t_cmd, &o, envp, 1, (char *[]){"test", NULL}, &st), 0, "%s", st.err);
    cr_assert_str_eq(o.grpc, good[i]);
    cr_assert_str_eq(opt_origin(&st, "grpc"), "RLORCH_GRPC");
    opt_free(&t_cmd, &o);
  }
  const char *bad[] = {"host", "host:", ":7070", "host:70000", "::1:7070", "dns:", "dns:///",
                       "unix:", "unix://", "unix-abstract:", "ipv4:", "ipv6:", "http://h:80",
                       "DNS:///h:1", "xds:///svc", "unix:/run/a\nb", "h:1 ", " h:1"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    cr_assert(!opt_is_target(bad[i]), "accepted \"%s\"", bad[i]);
  cr_assert(!opt_is_target(""));
  cr_assert(!opt_is_target(NULL));
#define WANT_TARGET(v) \
  "invalid gRPC target \"" v "\" (want HOST:PORT, or dns:, unix:, unix-abstract:, ipv4: or ipv6: " \
  "and an address)"
  EXPECT("rlorch test: --grpc: " WANT_TARGET("nohost"), "--grpc", "nohost");
  EXPECT("rlorch test: --grpc: " WANT_TARGET("dns:///"), "--grpc=dns:///");
  EXPECT("rlorch test: --grpc: " WANT_TARGET("http://h:80"), "--grpc", "http://h:80");
  EXPECT("rlorch test: --grpc: missing value", "--grpc", "");
  EXPECT_ENV("RLORCH_GRPC=unix:", "rlorch test: RLORCH_GRPC: " WANT_TARGET("unix:"));
  EXPECT_ENV("RLORCH_GRPC=", "rlorch test: RLORCH_GRPC: empty value");
  const char *file = write_file("g.yaml", "grpc: \"ipv4:\"\n");
  char want[512];
  snprintf(want, sizeof want, "rlorch test: %s:1: grpc: %s", file, WANT_TARGET("ipv4:"));
  char path[256];
  snprintf(path, sizeof path, "%s", file);
  EXPECT(want, "--config", path);
#undef WANT_TARGET
}

Test(opt, parse_addr) {
  char h[64];
  int port = -1;
  cr_assert_eq(opt_parse_addr("[::1]:7070", h, sizeof h, &port), 0);
  cr_assert_str_eq(h, "::1");
  cr_assert_eq(port, 7070);
  cr_assert_eq(opt_parse_addr("host-1.example:0", h, sizeof h, &port), 0);
  cr_assert_eq(port, 0);
  const char *bad[] = {"host", ":1", "h:65536", "::1:1", "[zz]:1", "h:1x", ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    cr_assert_eq(opt_parse_addr(bad[i], h, sizeof h, &port), -1, "accepted \"%s\"", bad[i]);
  cr_assert_eq(opt_parse_addr(NULL, h, sizeof h, &port), -1);
}

Test(opt, enum_names) {
  cr_assert_str_eq(opt_enum_name(t_modes, 2), "fast", "the first name, not the alias");
  cr_assert_null(opt_enum_name(t_modes, 3));
  cr_assert_str_eq(opt_enum_name(opt_log_level_names, 0), "debug");
}
