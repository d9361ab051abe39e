/* `rlorch serve`: the orchestrator daemon. Returns the exit status: 0 after a
 * graceful shutdown, 1 on a runtime failure, 2 on a configuration error. */
#ifndef RLORCH_DAEMON_SERVE_H
#define RLORCH_DAEMON_SERVE_H

int serve_main(int argc, char **argv);

#endif
