/* The Control API (rlorch.v1.Control): what operators and tooling call.
 * Handlers validate, then use the runner, the worker table, the store and the
 * watch hub of the orch each method's `ud` points to. */
#ifndef RLORCH_DAEMON_CONTROL_API_H
#define RLORCH_DAEMON_CONTROL_API_H

#include <stddef.h>

#include "rlorch/v1/control.pb-c.h"
#include "rpc/rpc.h"

extern const rpc_method control_api_methods[];
extern const size_t control_api_nmethods;

/* STOPPED, SUCCEEDED or FAILED: nothing more will happen to the run. */
int control_api_run_is_final(Rlorch__V1__RunState s);

#endif
