/* Helpers for commands that start the orchestrator as a child process
 * (`rlorch run`, `rlorch bench steploop`). */
#ifndef RLORCH_PROC_H
#define RLORCH_PROC_H

#include <stddef.h>

/* A free loopback TCP port (bind to port 0, read it back, close), or -1. */
int proc_free_port(void);
/* Path of the running executable, for re-executing subcommands; 0 or -1. */
int proc_self_exe(char *buf, size_t len);
/* Polls the gRPC health Check of `target` until SERVING or `timeout_s`
 * passes; `stop` (may be NULL) is consulted between attempts to give up
 * early. Returns 0 when serving, -1 otherwise. */
int proc_wait_serving(const char *target, double timeout_s, int (*stop)(void *), void *arg);

#endif
