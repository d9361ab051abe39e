/* Entry points of the program's subcommands; main() dispatches on argv[1].
 * Each returns the process exit status: 0 ok, 1 runtime failure, 2 usage or
 * configuration error. */
#ifndef RLORCH_COMMANDS_H
#define RLORCH_COMMANDS_H

int cmd_serve(int argc, char **argv);
int cmd_ctl(int argc, char **argv);
int cmd_trainer(int argc, char **argv);
int cmd_inference(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_version(int argc, char **argv);

#endif
