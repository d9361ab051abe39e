/* The Control API (rlorch.v1.Control): what operators and tooling call.
 * Handlers validate, then use the runner, the worker table, the store and the
 * watch hub of the orch each method's `ud` points to. */
#ifndef RLORCH_DAEMON_CONTROL_API_H
#define RLORCH_DAEMON_CONTROL_API_H

#include <stddef.h>

#include "orchestrator/daemon/config.h"
#include "rlorch/v1/control.pb-c.h"
#include "rpc/rpc.h"

extern const rpc_method control_api_methods[];
extern const size_t control_api_nmethods;

/* STOPPED, SUCCEEDED or FAILED: nothing more will happen to the run. */
int control_api_run_is_final(Rlorch__V1__RunState s);

/* StartRun's checks of a spec, with the defaults of c filled into a copy
 * (spec itself is left as it was): 0, or -1 with a message naming the field,
 * the text StartRun answers INVALID_ARGUMENT with. A JSONL prompt source is
 * opened and its first line parsed, as StartRun does. For tests and fuzzing;
 * the handler runs the same code. */
int control_api_validate_spec(const config *c, const Rlorch__V1__RunSpec *spec, char *err,
                              size_t len);

#endif
