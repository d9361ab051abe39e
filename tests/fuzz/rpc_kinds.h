/* The message types of fuzz_rpc, in the order its first input byte picks
 * them (that byte modulo their count), shared with the seed generator. */
#ifndef RLORCH_FUZZ_RPC_KINDS_H
#define RLORCH_FUZZ_RPC_KINDS_H

#include "rlorch/v1/control.pb-c.h"
#include "rlorch/v1/worker.pb-c.h"

static const ProtobufCMessageDescriptor *const rpc_kinds[] = {
    /* Control requests */
    &rlorch__v1__run_spec__descriptor,
    &rlorch__v1__stop_run_request__descriptor,
    &rlorch__v1__get_run_request__descriptor,
    &rlorch__v1__list_runs_request__descriptor,
    &rlorch__v1__list_workers_request__descriptor,
    &rlorch__v1__watch_run_request__descriptor,
    &rlorch__v1__set_broadcast_policy_request__descriptor,
    /* Worker requests */
    &rlorch__v1__register_request__descriptor,
    &rlorch__v1__attach_request__descriptor,
    &rlorch__v1__report_request__descriptor,
    &rlorch__v1__fetch_batch_request__descriptor,
    /* What clients decode: the agents' commands and batches, ctl's answers */
    &rlorch__v1__command__descriptor,
    &rlorch__v1__batch_chunk__descriptor,
    &rlorch__v1__run_event__descriptor,
    &rlorch__v1__list_workers_response__descriptor,
};
#define RPC_NKINDS (sizeof rpc_kinds / sizeof rpc_kinds[0])

#endif
