/* The zero-cost workers the orchestration benchmarks (steploop, dispatch) drive
 * a real `rlorch serve` with: one registration and the answers to broadcast
 * commands, shared so both measure the same thing. */
#ifndef RLORCH_BENCH_FAKE_H
#define RLORCH_BENCH_FAKE_H

#include <stddef.h>
#include <stdint.h>

#include "rlorch/v1/worker.pb-c.h"
#include "rpc/rpc.h"

/* Registers "trainer-INDEX" (with a one-tensor host manifest) or
 * "inference-INDEX" and writes the worker id into id. 0, or -1 with the status
 * printed on stderr after `who` (the benchmark's name). */
int bench_fake_register(rpc_client *c, int trainer, uint32_t index, char *id, size_t idlen,
                        const char *who);
/* Opens the worker's command stream and hands every command to on_command
 * (which frees it) until the stream ends; blocks, so run it on a thread. */
void bench_fake_attach(rpc_client *c, const char *worker_id,
                       int (*on_command)(ProtobufCMessage *m, void *ud), void *ud);
/* One Report call as worker_id (sets r->worker_id). 0, or -1. */
int bench_fake_report(rpc_client *c, const char *worker_id, Rlorch__V1__ReportRequest *r);
/* The step's reports that need no answer, as a worker sends them: on `ow`,
 * the worker's one-way report stream (rpc_oneway on "/rlorch.v1.Worker/
 * ReportStream"), or as Report calls when ow is NULL (or the stream did not
 * take the report). 0, or -1. */
int bench_fake_send(rpc_client *c, rpc_oneway *ow, const char *worker_id,
                    Rlorch__V1__ReportRequest *r);
/* Acks a plan at once (the hash it carries). */
int bench_fake_ack(rpc_client *c, rpc_oneway *ow, const char *worker_id,
                   const Rlorch__V1__BroadcastPlan *plan);
/* Reports a triggered broadcast done at once, with an empty record. */
int bench_fake_done(rpc_client *c, rpc_oneway *ow, const char *worker_id,
                    const Rlorch__V1__TriggerBroadcast *t);
/* A worker's report stream on c, or NULL with the reason on stderr after
 * `who`. Free with rpc_oneway_free. */
rpc_oneway *bench_fake_report_stream(rpc_client *c, const char *who);

#endif
