/* Conversions between the scheduler's plain types (orchestrator/sched) and
 * the rlorch.v1 protobuf messages. */
#ifndef RLORCH_DAEMON_SCHED_PB_H
#define RLORCH_DAEMON_SCHED_PB_H

#include "orchestrator/sched/sched.h"
#include "rlorch/v1/broadcast.pb-c.h"

/* Fills an initialised protobuf message from `r`. String fields point into `r`:
 * `r` must outlive `out`, and `out` must not be freed with the protobuf-c free. */
void sched_step_record_to_pb(const sched_step_record *r, Rlorch__V1__StepRecord *out);

#endif
