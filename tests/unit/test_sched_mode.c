/* sched_choose_mode as a table: every policy against every kind of
 * participants and manifest; the conversions of daemon/sched_pb. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/daemon/sched_pb.h"
#include "rlorch/v1/broadcast.pb-c.h"

#define GPU_OK {.cuda_devices = 1, .nccl = 1}
#define NO_NCCL {.cuda_devices = 1, .nccl = 0}
#define NO_CUDA {.cuda_devices = 0, .nccl = 1}
/* Colocation: GPU "a" and "b" of host "h1", and a GPU "a" of another host. */
#define ON_A {.cuda_devices = 1, .nccl = 1, .gpu_uuid = "GPU-a", .host_id = "h1"}
#define ON_A_NO_NCCL {.cuda_devices = 1, .nccl = 0, .gpu_uuid = "GPU-a", .host_id = "h1"}
#define ON_B {.cuda_devices = 1, .nccl = 1, .gpu_uuid = "GPU-b", .host_id = "h1"}
#define ON_A_ELSEWHERE {.cuda_devices = 1, .nccl = 1, .gpu_uuid = "GPU-a", .host_id = "h2"}
#define NO_GPU_H1 {.cuda_devices = 0, .nccl = 1, .host_id = "h1"}
/* A trainer group of two ranks on GPU "a"; receivers holding part of the model. */
#define RANK_A(r) {.cuda_devices = 1, .nccl = 1, .gpu_uuid = "GPU-a", .host_id = "h1", \
                   .trainer_rank = (r), .trainer_ranks = 2}
#define PART {.cuda_devices = 1, .nccl = 1, .holds_part = 1}
#define PART_ON_A {.cuda_devices = 1, .nccl = 1, .gpu_uuid = "GPU-a", .host_id = "h1", \
                   .holds_part = 1}

static const sched_offload ALL_GPU = {.gpu_tensors = 8, .gpu_bytes = 800};
static const sched_offload MIXED = {.gpu_tensors = 6, .pinned_tensors = 1, .pageable_tensors = 1,
                                    .gpu_bytes = 600, .pinned_bytes = 100, .pageable_bytes = 100};
static const sched_offload HOST_ONLY = {.pinned_tensors = 8, .pinned_bytes = 800};
static const sched_offload EMPTY = {0};

typedef struct row {
  const char *what;
  sched_mode policy;
  sched_caps caps[3]; /* trainer, inference-1, inference-2 */
  const sched_offload *off;
  int rc;
  sched_mode mode;
  const char *reason; /* substring the reason must contain */
} row;

static const row ROWS[] = {
    {"auto, all on GPU", SCHED_MODE_AUTO, {GPU_OK, GPU_OK, GPU_OK}, &ALL_GPU, SCHED_OK,
     SCHED_MODE_DIRECT, "all 8 tensors on GPU"},
    {"auto, mixed residency", SCHED_MODE_AUTO, {GPU_OK, GPU_OK, GPU_OK}, &MIXED, SCHED_OK,
     SCHED_MODE_STAGED, "2 of 8 tensors host-resident (1 pinned, 1 pageable, 200 bytes)"},
    {"auto, host only", SCHED_MODE_AUTO, {GPU_OK, GPU_OK, GPU_OK}, &HOST_ONLY, SCHED_OK,
     SCHED_MODE_STAGED, "8 of 8 tensors host-resident"},
    {"auto, NCCL missing on one worker", SCHED_MODE_AUTO, {GPU_OK, GPU_OK, NO_NCCL}, &ALL_GPU,
     SCHED_OK, SCHED_MODE_HOST, "NCCL missing on inference-2"},
    {"auto, CUDA missing on the trainer", SCHED_MODE_AUTO, {NO_CUDA, GPU_OK, GPU_OK}, &MIXED,
     SCHED_OK, SCHED_MODE_HOST, "CUDA missing on trainer"},
    {"auto, several missing", SCHED_MODE_AUTO, {GPU_OK, NO_CUDA, NO_NCCL}, &ALL_GPU, SCHED_OK,
     SCHED_MODE_HOST, "CUDA missing on inference-1 (and 1 more)"},
    {"direct override", SCHED_MODE_DIRECT, {GPU_OK, GPU_OK, GPU_OK}, &ALL_GPU, SCHED_OK,
     SCHED_MODE_DIRECT, "operator override: direct"},
    {"staged override, all on GPU", SCHED_MODE_STAGED, {GPU_OK, GPU_OK, GPU_OK}, &ALL_GPU,
     SCHED_OK, SCHED_MODE_STAGED, "operator override: staged"},
    {"host override, all capable", SCHED_MODE_HOST, {GPU_OK, GPU_OK, GPU_OK}, &ALL_GPU, SCHED_OK,
     SCHED_MODE_HOST, "operator override: host"},
    {"host override, nothing capable", SCHED_MODE_HOST, {NO_CUDA, NO_CUDA, NO_CUDA}, &HOST_ONLY,
     SCHED_OK, SCHED_MODE_HOST, "operator override: host"},
    {"direct override without NCCL", SCHED_MODE_DIRECT, {GPU_OK, NO_NCCL, GPU_OK}, &ALL_GPU,
     SCHED_ENOTSUP, SCHED_MODE_DIRECT, "NCCL missing on inference-1"},
    {"staged override without CUDA", SCHED_MODE_STAGED, {GPU_OK, GPU_OK, NO_CUDA}, &MIXED,
     SCHED_ENOTSUP, SCHED_MODE_STAGED, "CUDA missing on inference-2"},
    {"direct override with host tensors", SCHED_MODE_DIRECT, {GPU_OK, GPU_OK, GPU_OK}, &MIXED,
     SCHED_ENOTSUP, SCHED_MODE_DIRECT, "2 of 8 tensors are host-resident"},
    {"empty manifest", SCHED_MODE_AUTO, {GPU_OK, GPU_OK, GPU_OK}, &EMPTY, SCHED_EINVAL,
     SCHED_MODE_AUTO, "no tensors"},
    {"no manifest", SCHED_MODE_AUTO, {GPU_OK, GPU_OK, GPU_OK}, NULL, SCHED_EINVAL,
     SCHED_MODE_AUTO, "no tensors"},
    /* colocation */
    {"auto, every receiver on the trainer's GPU", SCHED_MODE_AUTO, {ON_A, ON_A, ON_A}, &MIXED,
     SCHED_OK, SCHED_MODE_COLOCATED, "all 2 receivers share the trainer's GPU GPU-a"},
    {"auto, colocated needs no NCCL", SCHED_MODE_AUTO, {ON_A_NO_NCCL, ON_A_NO_NCCL, ON_A},
     &ALL_GPU, SCHED_OK, SCHED_MODE_COLOCATED, "share the trainer's GPU"},
    {"auto, partly colocated: host, both named", SCHED_MODE_AUTO, {ON_A, ON_A, ON_B}, &ALL_GPU,
     SCHED_OK, SCHED_MODE_HOST,
     "trainer and inference-1 share GPU GPU-a, but inference-2 is on GPU-b: NCCL needs a GPU "
     "per rank"},
    {"auto, two receivers share a GPU", SCHED_MODE_AUTO, {ON_A, ON_B, ON_B}, &ALL_GPU, SCHED_OK,
     SCHED_MODE_HOST, "inference-1 and inference-2 share GPU GPU-b"},
    {"auto, same UUID on another host is not colocated", SCHED_MODE_AUTO,
     {ON_A, ON_A_ELSEWHERE, ON_B}, &ALL_GPU, SCHED_OK, SCHED_MODE_DIRECT, "all 8 tensors on GPU"},
    {"colocated override", SCHED_MODE_COLOCATED, {ON_A, ON_A, ON_A}, &HOST_ONLY, SCHED_OK,
     SCHED_MODE_COLOCATED, "operator override: colocated (all 2 receivers on GPU GPU-a)"},
    {"colocated override, partly colocated", SCHED_MODE_COLOCATED, {ON_A, ON_A, ON_B}, &ALL_GPU,
     SCHED_ENOTSUP, SCHED_MODE_COLOCATED,
     "needs every receiver on the trainer's GPU GPU-a: inference-2 is on GPU-b"},
    {"colocated override, a receiver without a GPU", SCHED_MODE_COLOCATED,
     {ON_A, NO_GPU_H1, ON_B}, &ALL_GPU, SCHED_ENOTSUP, SCHED_MODE_COLOCATED,
     "inference-1 reports no GPU, inference-2 is on GPU-b"},
    {"colocated override, another host", SCHED_MODE_COLOCATED, {ON_A, ON_A, ON_A_ELSEWHERE},
     &ALL_GPU, SCHED_ENOTSUP, SCHED_MODE_COLOCATED, "inference-2 is on another host"},
    {"colocated override, trainer without a GPU", SCHED_MODE_COLOCATED, {NO_GPU_H1, ON_A, ON_A},
     &ALL_GPU, SCHED_ENOTSUP, SCHED_MODE_COLOCATED, "trainer reports no GPU UUID"},
    {"colocated override, capabilities without UUIDs", SCHED_MODE_COLOCATED,
     {GPU_OK, GPU_OK, GPU_OK}, &ALL_GPU, SCHED_ENOTSUP, SCHED_MODE_COLOCATED,
     "trainer reports no GPU UUID or host id"},
    {"direct override, two ranks on one GPU", SCHED_MODE_DIRECT, {ON_A, ON_A, ON_B}, &ALL_GPU,
     SCHED_ENOTSUP, SCHED_MODE_DIRECT,
     "operator override direct needs a GPU per participant (NCCL): trainer and inference-1 share "
     "GPU GPU-a"},
    {"staged override, two ranks on one GPU", SCHED_MODE_STAGED, {ON_A, ON_A, ON_A}, &MIXED,
     SCHED_ENOTSUP, SCHED_MODE_STAGED, "needs a GPU per participant"},
    {"host override, colocated participants", SCHED_MODE_HOST, {ON_A, ON_A, ON_A}, &ALL_GPU,
     SCHED_OK, SCHED_MODE_HOST, "operator override: host"},
    {"auto, a group and its receiver on one GPU", SCHED_MODE_AUTO, {RANK_A(0), RANK_A(1), ON_A},
     &HOST_ONLY, SCHED_OK, SCHED_MODE_COLOCATED, "2 trainer ranks and all 1 receivers share GPU GPU-a"},
    {"auto, a group and a receiver elsewhere", SCHED_MODE_AUTO, {RANK_A(0), RANK_A(1), ON_B},
     &HOST_ONLY, SCHED_OK, SCHED_MODE_HOST, "2 trainer ranks: several sources run on the host"},
    {"colocated override, a group and a receiver elsewhere", SCHED_MODE_COLOCATED,
     {RANK_A(0), RANK_A(1), ON_B}, &HOST_ONLY, SCHED_ENOTSUP, SCHED_MODE_COLOCATED,
     "cannot run 2 trainer ranks: inference-2 does not share trainer's GPU"},
    {"colocated override, a group on one GPU", SCHED_MODE_COLOCATED, {RANK_A(0), RANK_A(1), ON_A},
     &HOST_ONLY, SCHED_OK, SCHED_MODE_COLOCATED, "operator override: colocated; 2 trainer ranks"},
    {"staged override, a group", SCHED_MODE_STAGED, {RANK_A(0), RANK_A(1), ON_A}, &HOST_ONLY,
     SCHED_ENOTSUP, SCHED_MODE_STAGED, "several sources run on the host transport, or colocated"},
    {"auto, a receiver holding part of the model", SCHED_MODE_AUTO, {GPU_OK, GPU_OK, PART},
     &ALL_GPU, SCHED_OK, SCHED_MODE_HOST, "inference-2 holds part of the model: receivers' parts "
     "run on the host transport"},
    {"auto, a part on the trainer's GPU is not colocated", SCHED_MODE_AUTO, {ON_A, ON_A, PART_ON_A},
     &ALL_GPU, SCHED_OK, SCHED_MODE_HOST, "inference-2 holds part of the model"},
    {"auto, a group with a part receiver", SCHED_MODE_AUTO, {RANK_A(0), RANK_A(1), PART_ON_A},
     &HOST_ONLY, SCHED_OK, SCHED_MODE_HOST, "holds part of the model"},
    {"direct override, a part receiver", SCHED_MODE_DIRECT, {GPU_OK, GPU_OK, PART}, &ALL_GPU,
     SCHED_ENOTSUP, SCHED_MODE_DIRECT, "operator override direct cannot serve inference-2, which "
     "holds part of the model"},
    {"host override, a part receiver", SCHED_MODE_HOST, {GPU_OK, PART, GPU_OK}, &ALL_GPU, SCHED_OK,
     SCHED_MODE_HOST, "operator override: host; inference-1 holds part"},
    {"unknown policy", (sched_mode)9, {GPU_OK, GPU_OK, GPU_OK}, &ALL_GPU, SCHED_EINVAL,
     (sched_mode)9, "unknown broadcast policy 9"},
};

Test(sched_mode, table) {
  static const char *names[3] = {"trainer", "inference-1", "inference-2"};
  for (size_t i = 0; i < sizeof ROWS / sizeof ROWS[0]; i++) {
    const row *r = &ROWS[i];
    sched_participant p[3];
    for (int k = 0; k < 3; k++) p[k] = (sched_participant){.name = names[k], .caps = r->caps[k]};
    sched_mode m = 0;
    char reason[SCHED_TEXT_MAX] = "unset";
    int rc = sched_choose_mode(r->policy, p, 3, r->off, &m, reason, sizeof reason);
    cr_expect_eq(rc, r->rc, "%s: rc %d, want %d (%s)", r->what, rc, r->rc, reason);
    cr_expect_eq(m, r->mode, "%s: mode %s, want %s", r->what, sched_mode_name(m),
                 sched_mode_name(r->mode));
    cr_expect(strstr(reason, r->reason), "%s: reason \"%s\" lacks \"%s\"", r->what, reason,
              r->reason);
  }
}

/* With a run's worth of participants the pair named as sharing a GPU is the
 * one a comparison of every pair finds first (smallest i, then j): random
 * placements over a few GPUs of two hosts, some naming no GPU. */
Test(sched_mode, the_shared_gpu_named_among_thousands_is_the_first_pair) {
  enum { N = 3000 };
  static sched_participant p[N];
  static char names[N][16];
  srand(7);
  for (int round = 0; round < 20; round++) {
    int gpus = 2000 + rand() % 2000; /* few or no repeats up to many */
    for (int k = 0; k < N; k++) {
      snprintf(names[k], sizeof names[k], "w%d", k);
      sched_caps c = {.cuda_devices = 1, .nccl = 1};
      if (rand() % 10) {
        int g = rand() % gpus;
        snprintf(c.gpu_uuid, sizeof c.gpu_uuid, "GPU-%d", g / 2);
        snprintf(c.host_id, sizeof c.host_id, "h%d", g % 2);
      }
      p[k] = (sched_participant){.name = names[k], .caps = c};
    }
    snprintf(p[0].caps.gpu_uuid, sizeof p[0].caps.gpu_uuid, "GPU-trainer"); /* alone */
    snprintf(p[0].caps.host_id, sizeof p[0].caps.host_id, "h0");
    char want[SCHED_TEXT_MAX] = "";
    for (int i = 0; i < N && !want[0]; i++)
      for (int j = i + 1; j < N && !want[0]; j++)
        if (p[i].caps.gpu_uuid[0] && p[i].caps.host_id[0] &&
            !strcmp(p[i].caps.gpu_uuid, p[j].caps.gpu_uuid) &&
            !strcmp(p[i].caps.host_id, p[j].caps.host_id))
          snprintf(want, sizeof want, "%s and %s share GPU %s,", p[i].name, p[j].name,
                   p[i].caps.gpu_uuid);
    cr_assert(want[0], "round %d: some GPU is shared", round);
    sched_mode m = 0;
    char reason[SCHED_TEXT_MAX] = "";
    cr_assert_eq(sched_choose_mode(SCHED_MODE_AUTO, p, N, &ALL_GPU, &m, reason, sizeof reason),
                 SCHED_OK);
    cr_assert_eq(m, SCHED_MODE_HOST, "round %d: %s", round, reason);
    cr_assert(!strncmp(reason, want, strlen(want)), "round %d: \"%s\", want \"%s\"", round,
              reason, want);
  }
}

Test(sched_mode, no_participants_and_short_reason_buffer) {
  sched_mode m;
  char reason[8];
  cr_assert_eq(sched_choose_mode(SCHED_MODE_AUTO, NULL, 0, &ALL_GPU, &m, reason, sizeof reason),
               SCHED_EINVAL);
  cr_assert_eq(strlen(reason), sizeof reason - 1, "truncated, still terminated");
  sched_participant p = {.name = NULL, .caps = GPU_OK};
  cr_assert_eq(sched_choose_mode(SCHED_MODE_AUTO, &p, 1, &ALL_GPU, &m, NULL, 0), SCHED_OK);
  cr_assert_eq(m, SCHED_MODE_DIRECT);
}

Test(sched_mode, colocated_override_with_the_trainer_alone) {
  sched_participant p = {.name = "trainer", .caps = ON_A};
  sched_mode m;
  char reason[SCHED_TEXT_MAX];
  cr_assert_eq(sched_choose_mode(SCHED_MODE_COLOCATED, &p, 1, &ALL_GPU, &m, reason, sizeof reason),
               SCHED_ENOTSUP);
  cr_assert(strstr(reason, "needs at least one receiver"), "%s", reason);
  cr_assert_eq(sched_choose_mode(SCHED_MODE_AUTO, &p, 1, &ALL_GPU, &m, reason, sizeof reason),
               SCHED_OK);
  cr_assert_eq(m, SCHED_MODE_DIRECT, "no receivers: nothing to colocate with");
}

Test(sched_mode, names_parse_back) {
  cr_assert_str_eq(sched_mode_name(SCHED_MODE_COLOCATED), "colocated");
  for (int m = SCHED_MODE_AUTO; m <= SCHED_MODE_COLOCATED; m++) {
    sched_mode back;
    cr_assert_eq(sched_mode_parse(sched_mode_name((sched_mode)m), &back), SCHED_OK);
    cr_assert_eq(back, (sched_mode)m);
  }
  sched_mode x;
  cr_assert_eq(sched_mode_parse("nccl", &x), SCHED_EINVAL);
  cr_assert_eq(sched_mode_parse(NULL, &x), SCHED_EINVAL);
  cr_assert_str_eq(sched_run_state_name(SCHED_RUN_SUCCEEDED), "succeeded");
  cr_assert_str_eq(sched_strerror(SCHED_ENOTSUP), "mode not supported by the participants");
}

Test(sched_record, converts_to_protobuf_and_round_trips) {
  sched_step_record r = {.run_id = "r9", .step = 4, .mode = SCHED_MODE_STAGED,
                         .mode_reason = "2 of 8 tensors host-resident", .transport = "nccl",
                         .pcie_bytes = 10, .wire_bytes = 20, .h2d_seconds = 0.5,
                         .total_seconds = 2, .exposed_staging_seconds = 0.25,
                         .exposed_measured = 1, .gbps = 1e-8, .rollouts_used = 64,
                         .rollouts_dropped = 3, .step_seconds = 4, .staging_share = 0.0625,
                         .policy_version = 5, .buckets = 7, .finished_unix_ms = 123,
                         .weights_verified = 1, .receivers = 2};
  Rlorch__V1__StepRecord pb = RLORCH__V1__STEP_RECORD__INIT;
  sched_pb_step_record_to_pb(&r, &pb);
  uint8_t buf[1024];
  size_t len = rlorch__v1__step_record__pack(&pb, buf);
  cr_assert_lt(len, sizeof buf);
  Rlorch__V1__StepRecord *back = rlorch__v1__step_record__unpack(NULL, len, buf);
  cr_assert_not_null(back);
  cr_assert_str_eq(back->run_id, "r9");
  cr_assert_eq(back->step, 4);
  cr_assert_eq(back->mode, RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_STAGED);
  cr_assert_str_eq(back->mode_reason, r.mode_reason);
  cr_assert_str_eq(back->transport, "nccl");
  cr_assert_eq(back->rollouts_dropped, 3);
  cr_assert_float_eq(back->staging_share, 0.0625, 1e-15);
  cr_assert_eq(back->policy_version, 5);
  cr_assert(back->exposed_measured);
  cr_assert(back->weights_verified);
  cr_assert_eq(back->receivers, 2);
  cr_assert_eq(back->finished_unix_ms, 123);
  rlorch__v1__step_record__free_unpacked(back, NULL);
}

Test(sched_pb, enums_convert_both_ways_and_refuse_unknown_values) {
  static const struct {
    sched_mode s;
    Rlorch__V1__BroadcastMode pb;
  } modes[] = {{SCHED_MODE_AUTO, RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_AUTO},
               {SCHED_MODE_DIRECT, RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_DIRECT},
               {SCHED_MODE_STAGED, RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_STAGED},
               {SCHED_MODE_HOST, RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_HOST},
               {SCHED_MODE_COLOCATED, RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_COLOCATED}};
  for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
    sched_mode back = (sched_mode)0;
    cr_assert_eq(sched_pb_mode_to_pb(modes[i].s), modes[i].pb);
    cr_assert_eq(sched_pb_mode_from_pb(modes[i].pb, &back), 0);
    cr_assert_eq(back, modes[i].s);
  }
  sched_mode m = SCHED_MODE_HOST;
  cr_assert_eq(sched_pb_mode_from_pb(RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_UNSPECIFIED, &m),
               -1);
  cr_assert_eq(sched_pb_mode_from_pb((Rlorch__V1__BroadcastMode)99, &m), -1);
  cr_assert_eq(m, SCHED_MODE_HOST, "untouched on refusal");
  cr_assert_eq(sched_pb_mode_to_pb((sched_mode)0),
               RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_UNSPECIFIED);

  bcast_mode bm;
  cr_assert_eq(sched_pb_bcast_mode(SCHED_MODE_STAGED, &bm), 0);
  cr_assert_eq(bm, BCAST_MODE_STAGED);
  cr_assert_eq(sched_pb_bcast_mode(SCHED_MODE_AUTO, &bm), -1, "a plan is never auto");
  cr_assert_eq(sched_pb_bcast_mode(SCHED_MODE_COLOCATED, &bm), 0);
  cr_assert_eq(bm, BCAST_MODE_COLOCATED);

  cr_assert_eq(sched_pb_run_state_to_pb(SCHED_RUN_FAILED), RLORCH__V1__RUN_STATE__RUN_STATE_FAILED);
  cr_assert_eq(sched_pb_run_state_to_pb(SCHED_RUN_PENDING),
               RLORCH__V1__RUN_STATE__RUN_STATE_PENDING);
  cr_assert_eq(sched_pb_run_state_to_pb((sched_run_state)42),
               RLORCH__V1__RUN_STATE__RUN_STATE_UNSPECIFIED);
  cr_assert_eq(sched_pb_worker_state_to_pb(SCHED_WORKER_LOST),
               RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST);
  cr_assert_eq(sched_pb_worker_state_to_pb((sched_worker_state)0),
               RLORCH__V1__WORKER_STATE__WORKER_STATE_UNSPECIFIED);

  sched_role role = SCHED_ROLE_TRAINER;
  cr_assert_eq(sched_pb_role_from_pb(RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE, &role), 0);
  cr_assert_eq(role, SCHED_ROLE_INFERENCE);
  cr_assert_eq(sched_pb_role_from_pb(RLORCH__V1__WORKER_ROLE__WORKER_ROLE_UNSPECIFIED, &role), -1);
  cr_assert_eq(sched_pb_role_to_pb(SCHED_ROLE_TRAINER), RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER);
}

Test(sched_pb, messages_convert) {
  Rlorch__V1__Capabilities caps = RLORCH__V1__CAPABILITIES__INIT;
  caps.cuda_devices = 2;
  caps.nccl_version = "2.28.3";
  caps.pinned_limit_bytes = 1 << 20;
  sched_caps sc;
  sched_pb_caps(&caps, &sc);
  cr_assert_eq(sc.cuda_devices, 2);
  cr_assert(sc.nccl);
  cr_assert_eq(sc.pinned_limit_bytes, 1 << 20);
  cr_assert_str_eq(sc.gpu_uuid, "", "no UUID reported: none");
  caps.gpu_uuid = "GPU-12345678-abcd-ef01-2345-6789abcdef01";
  caps.host_id = "3b0c7a2e-1111-2222-3333-444455556666";
  sched_pb_caps(&caps, &sc);
  cr_assert_str_eq(sc.gpu_uuid, caps.gpu_uuid);
  cr_assert_str_eq(sc.host_id, caps.host_id);
  caps.nccl_version = "";
  sched_pb_caps(&caps, &sc);
  cr_assert_not(sc.nccl, "an empty NCCL version is no NCCL");
  sched_pb_caps(NULL, &sc);
  cr_assert_eq(sc.cuda_devices, 0);

  uint64_t shape[] = {4, 8};
  Rlorch__V1__TensorSpec t[3];
  Rlorch__V1__TensorSpec *tp[3];
  for (int i = 0; i < 3; i++) {
    rlorch__v1__tensor_spec__init(&t[i]);
    t[i].shape = shape;
    t[i].n_shape = 2;
    tp[i] = &t[i];
  }
  t[0].storage_dtype = RLORCH__V1__DTYPE__DTYPE_FP32;
  t[0].residency = RLORCH__V1__RESIDENCY__RESIDENCY_GPU;
  t[1].storage_dtype = RLORCH__V1__DTYPE__DTYPE_BF16;
  t[1].residency = RLORCH__V1__RESIDENCY__RESIDENCY_HOST_PINNED;
  t[2].storage_dtype = RLORCH__V1__DTYPE__DTYPE_BF16;
  t[2].residency = RLORCH__V1__RESIDENCY__RESIDENCY_HOST_PAGEABLE;
  Rlorch__V1__WeightManifest man = RLORCH__V1__WEIGHT_MANIFEST__INIT;
  man.tensors = tp;
  man.n_tensors = 3;
  sched_offload off;
  sched_pb_offload(&man, &off);
  cr_assert_eq(off.gpu_tensors, 1);
  cr_assert_eq(off.gpu_bytes, 32 * 4);
  cr_assert_eq(off.pinned_tensors, 1);
  cr_assert_eq(off.pinned_bytes, 32 * 2);
  cr_assert_eq(off.pageable_tensors, 1);
  sched_pb_offload(NULL, &off);
  cr_assert_eq(off.gpu_tensors + off.pinned_tensors + off.pageable_tensors, 0);

  Rlorch__V1__StepRecord rec = RLORCH__V1__STEP_RECORD__INIT;
  rec.transport = "host-tcp";
  rec.wire_bytes = 99;
  rec.buckets = 3;
  Rlorch__V1__BroadcastDone done = RLORCH__V1__BROADCAST_DONE__INIT;
  done.weights_checksum = 5;
  done.record = &rec;
  sched_bcast_report rep;
  sched_pb_bcast_report(&done, &rep);
  cr_assert_str_eq(rep.transport, "host-tcp");
  cr_assert_eq(rep.wire_bytes, 99);
  cr_assert_eq(rep.buckets, 3);
  cr_assert_eq(rep.weights_checksum, 5);
  done.record = NULL;
  sched_pb_bcast_report(&done, &rep);
  cr_assert_eq(rep.weights_checksum, 5, "a receiver sends only its checksum");
  cr_assert_eq(rep.wire_bytes, 0);
}
