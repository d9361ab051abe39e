/* rlorch: one program, one subcommand per role. */
#include <stdio.h>
#include <string.h>

#include "bench/bench.h"
#include "orchestrator/cli/commands.h"
#include "orchestrator/daemon/serve.h"

static const struct {
  const char *name;
  int (*fn)(int, char **);
  const char *help;
} commands[] = {
    {"serve", serve_main, "run the orchestrator daemon"},
    {"ctl", cmd_ctl, "call the control API"},
    {"trainer", cmd_trainer, "run a trainer worker agent"},
    {"inference", cmd_inference, "run an inference worker agent"},
    {"run", cmd_run, "run orchestrator and workers on this machine with defaults"},
    {"bench", bench_main, "run a benchmark (rlorch bench --help)"},
    {"sim", cmd_sim, "simulate a cluster: scheduler, planner and cost model at scale"},
    {"version", cmd_version, "print the version, what was built in and what this machine offers"},
};

static void usage(FILE *f) {
  fprintf(f, "usage: rlorch COMMAND [ARGS...]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
  fprintf(f, "\n`rlorch COMMAND --help` describes each command's flags.\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(argv[1], "--version")) return cmd_version(1, argv + 1);
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "rlorch: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
