/* The worker agents: entry points of `rlorch trainer` and `rlorch inference`.
 * Each returns the process exit status: 0 after a shutdown command or
 * SIGTERM/SIGINT, 1 after a fatal error (logged), 2 for bad flags. */
#ifndef RLORCH_AGENT_H
#define RLORCH_AGENT_H

int agent_trainer_main(int argc, char **argv);
int agent_inference_main(int argc, char **argv);

#endif
