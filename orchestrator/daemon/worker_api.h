/* The Worker API (rlorch.v1.Worker): Register, Attach, Report. Handlers
 * decode and answer; the worker table and the runner of the orch each
 * method's `ud` points to do the rest. */
#ifndef RLORCH_DAEMON_WORKER_API_H
#define RLORCH_DAEMON_WORKER_API_H

#include <stddef.h>

#include "rpc/rpc.h"

extern const rpc_method worker_api_methods[];
extern const size_t worker_api_nmethods;

#endif
