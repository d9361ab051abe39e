/* The scheduler test fixture: a scheduler plus what a shell would have seen
 * of its actions, and the steps most tests take (register workers, answer
 * rollout requests, finish a step, reach a pending plan). Compiled into each
 * scheduler test that drives event sequences. */
#ifndef RLORCH_TESTS_SCHED_FIXTURE_H
#define RLORCH_TESTS_SCHED_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/sched/sched.h"

#define FX_TRAINER 1 /* trainer id in most tests */
#define FX_MAXQ 256

typedef struct fx {
  sched *s;
  int64_t now;
  struct {
    uint32_t worker;
    uint64_t id;
    uint32_t count;
    uint64_t group;
    uint64_t version; /* the version the scheduler believed the worker held */
  } reqs[FX_MAXQ];    /* in flight: dispatched, not answered or cancelled */
  size_t nreqs;
  size_t dispatch_log[FX_MAXQ]; /* worker ids of every DISPATCH, in order */
  uint64_t dispatch_group[FX_MAXQ]; /* and their group ids */
  size_t ndispatch;
  struct {
    uint32_t worker;
    uint64_t id, group;
    char text[SCHED_TEXT_MAX];
  } cancels[FX_MAXQ]; /* every CANCEL, in order (taken out of reqs) */
  size_t ncancel;
  int ntrain, nplan, ntrigger, nabort, ncommit;
  uint64_t train_step;
  uint64_t train_ids[64];
  size_t ntrain_ids;
  uint32_t train_ngroups;
  struct {
    uint32_t worker, rank, ranks;
    uint64_t step;
    uint64_t first_id; /* the batch's first rollout id */
  } trains[64];        /* every TRAIN, in order (the first 64) */
  uint32_t plan_sources; /* trainer_ranks of the last BUILD_PLAN */
  char plan_reason[SCHED_TEXT_MAX];
  uint32_t abort_sources; /* trainer_ranks of the last ABORT */
  sched_step_record caughtup_record;
  char plan_id[SCHED_PLAN_ID_MAX];
  sched_mode plan_mode;
  int plan_catchup;      /* the last BUILD_PLAN is a catch-up */
  uint64_t plan_version; /* and the version it publishes */
  uint32_t parts[16];
  size_t nparts;
  char abort_reason[SCHED_TEXT_MAX];
  sched_abort_reason abort_kind; /* of the last ABORT */
  char abort_plan[SCHED_PLAN_ID_MAX];
  uint32_t abort_parts[16]; /* who the last ABORT went to */
  size_t nabort_parts;
  sched_step_record records[16];
  int ncaughtup;         /* CAUGHT_UP actions */
  char caughtup_plan[SCHED_PLAN_ID_MAX];
  uint64_t caughtup_version;
  uint32_t caughtup_parts[16];
  size_t ncaughtup_parts;
  int caughtup_verified;
  sched_run_state run_state;
  char run_msg[SCHED_TEXT_MAX];
  int lost[64];
} fx;

extern const sched_caps FX_GPU;         /* CUDA and NCCL */
extern const sched_offload FX_ALL_GPU;  /* every tensor on the GPU */

/* Settings of run "r1": batch `per_step`, async bound, K, buffer cap; ack
 * timeout 1 s, broadcast timeout 5 s, heartbeats never time out. */
sched_settings fx_settings(uint32_t per_step, uint32_t async, uint32_t k, uint32_t cap);
/* A fresh scheduler at time 1000. */
void fx_start(fx *h, const sched_settings *c);
/* Takes the pending actions and records them in `h`. */
void fx_drain(fx *h);
/* Registers and attaches worker `id`, holding the published version. */
void fx_add(fx *h, uint32_t id, sched_role role, const char *name, const sched_caps *c);
/* The same, holding `version` of the run. */
void fx_add_v(fx *h, uint32_t id, sched_role role, const char *name, const sched_caps *c,
              uint64_t version);
/* Answers the oldest request in flight of `worker` (0: any) in full: its
 * count of rollouts of its group, ids rid, rid + 1, ..., of `version`. */
void fx_answer(fx *h, uint32_t worker, uint64_t rid, uint64_t version);
/* Index in h->reqs of request `id`; fails the test if it is not in flight. */
size_t fx_req(const fx *h, uint64_t id);
/* The trainer reports the step in training done, 100 ms later. */
void fx_step_done(fx *h);
/* The pending plan is built (hash 0xabc) and every participant acks it. */
void fx_build_and_ack(fx *h);
/* Every participant reports the broadcast done, 50 ms later; checksums match. */
void fx_bcast_done(fx *h);
/* fx_step_done, fx_build_and_ack, fx_bcast_done. */
void fx_finish_step(fx *h);
/* Trainer 1, inference 2 and 3, two steps; step 0 trained, its plan asked for. */
void fx_to_plan(fx *h);

#endif
