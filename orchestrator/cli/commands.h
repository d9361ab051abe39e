/* Entry points of the command-line tools; main() dispatches on argv[1]
 * (serve and bench come from their own libraries).
 * Each returns the process exit status: 0 ok, 1 runtime failure, 2 usage or
 * configuration error. */
#ifndef RLORCH_COMMANDS_H
#define RLORCH_COMMANDS_H

int cmd_ctl(int argc, char **argv);
int cmd_trainer(int argc, char **argv);
int cmd_inference(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_version(int argc, char **argv);
int cmd_sim(int argc, char **argv);

#endif
