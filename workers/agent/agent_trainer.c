/* `rlorch trainer`: fp32 master weights of a preset, a real AdamW step per
 * train command, the sending side of the broadcast.
 *
 * With the optimizer on the CPU (--offload params+optimizer) and the bf16
 * shadow on, the tensors the manifest describes, the engine sends and the
 * checksum covers are the shadow: bf16 storage (pinned when a GPU is used)
 * that the AdamW step writes as it updates each weight. The fp32 master and
 * the optimizer state are the optimizer's alone and stay in pageable memory.
 *
 * With --checkpoint-dir the trainer writes its checkpoint (agent_ckpt.h)
 * after every --checkpoint-every-th step, before it reports the step, and
 * starts from it when it finds one: the version it then registers with is
 * the checkpoint's, so a resumed run carries on as after an orchestrator
 * restart (docs/RELIABILITY.md says what each case gives). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "workers/agent/agent_log.h"
#include "workers/agent/agent.h"
#include "workers/agent/agent_adamw.h"
#include "workers/agent/agent_batch.h"
#include "workers/agent/agent_ckpt.h"
#include "workers/agent/agent_core.h"
#include "workers/agent/agent_pb.h"
#include "workers/agent/agent_weights.h"
#include "workers/agent/agent_xfer.h"
#include "workers/bcast/bcast_preset.h"

#ifdef RLORCH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

typedef struct agent__trainer {
  agent_opts o;
  bcast_caps caps;
  int device;
  bcast_residency residency; /* of the master weights */
  int opt_gpu;               /* optimizer state and step on the GPU */
  bcast_tensor *t;           /* fp32 master weights */
  size_t n;
  bcast_storage *storage;
  bcast_tensor *shadow;      /* bf16 shadow of t, or NULL */
  bcast_storage *shadow_storage;
  const bcast_tensor *send;  /* what the manifest describes: shadow, else t */
  float *m, *v; /* optimizer state, total elements each */
  agent_adamw_span *spans;
  uint64_t total;
  uint64_t steps; /* optimizer steps taken: the bias-correction count */
  agent_adamw_hparams hp;
  uint64_t checksum;
  agent_xfer xfer;
  agent_ckpt ckpt; /* with --checkpoint-dir: what it reads and writes */
  Rlorch__V1__WeightManifest *manifest;
  Rlorch__V1__Capabilities caps_pb;
  Rlorch__V1__RegisterRequest reg;
} agent__trainer;

static void trainer__free(agent__trainer *tr) {
  agent_xfer_free(&tr->xfer);
#ifdef RLORCH_HAVE_CUDA
  if (tr->opt_gpu) {
    cudaFree(tr->m);
    cudaFree(tr->v);
    tr->m = tr->v = NULL;
  }
#endif
  free(tr->m);
  free(tr->v);
  free(tr->spans);
  bcast_storage_free(tr->shadow_storage);
  free(tr->shadow);
  bcast_storage_free(tr->storage);
  free(tr->t);
  agent_pb_manifest_free(tr->manifest);
}

/* Where weights and optimizer live for --offload on this machine. */
static void trainer__placement(agent__trainer *tr) {
  int gpu = tr->device >= 0;
  switch (tr->o.offload) {
  case AGENT_OFFLOAD_NONE:
    tr->residency = gpu ? BCAST_RES_GPU : BCAST_RES_HOST_PAGEABLE;
    tr->opt_gpu = gpu;
    break;
  case AGENT_OFFLOAD_PARAMS:
    tr->residency = gpu ? BCAST_RES_HOST_PINNED : BCAST_RES_HOST_PAGEABLE;
    tr->opt_gpu = gpu;
    break;
  case AGENT_OFFLOAD_PARAMS_OPTIMIZER:
    /* With the shadow, the engine never reads the master: pinning it would
     * only take page-locked memory from the machine. */
    tr->residency = gpu && !tr->o.bf16_shadow ? BCAST_RES_HOST_PINNED : BCAST_RES_HOST_PAGEABLE;
    tr->opt_gpu = 0;
    break;
  }
  if (!gpu)
    agent_log_warn("no_gpu", "offload=%s msg=\"no GPU: master weights and optimizer state in host "
             "memory, optimizer on CPU; manifest says host-pageable\"",
             agent_offload_name(tr->o.offload));
}

static int trainer__alloc_optimizer(agent__trainer *tr, char *err, size_t errlen) {
  size_t bytes = (size_t)tr->total * sizeof(float);
  if (tr->opt_gpu) {
#ifdef RLORCH_HAVE_CUDA
    cudaError_t e = cudaMalloc((void **)&tr->m, bytes ? bytes : 4);
    if (e == cudaSuccess) e = cudaMalloc((void **)&tr->v, bytes ? bytes : 4);
    if (e == cudaSuccess) e = cudaMemset(tr->m, 0, bytes);
    if (e == cudaSuccess) e = cudaMemset(tr->v, 0, bytes);
    if (e != cudaSuccess) {
      snprintf(err, errlen, "optimizer state: 2 x %zu bytes on GPU %d: %s", bytes, tr->device,
               cudaGetErrorString(e));
      return -1;
    }
#endif
  } else {
    tr->m = calloc(tr->total ? tr->total : 1, sizeof(float));
    tr->v = calloc(tr->total ? tr->total : 1, sizeof(float));
    if (!tr->m || !tr->v) {
      snprintf(err, errlen, "optimizer state: 2 x %zu bytes of host memory", bytes);
      return -1;
    }
  }
  tr->spans = calloc(tr->n ? tr->n : 1, sizeof *tr->spans);
  if (!tr->spans) {
    snprintf(err, errlen, "no memory");
    return -1;
  }
  uint64_t off = 0;
  for (size_t i = 0; i < tr->n; i++) {
    uint64_t e = bcast_tensor_elems(&tr->t[i]);
    tr->spans[i] = (agent_adamw_span){tr->t[i].data, tr->m + off, tr->v + off, e, off,
                                      tr->shadow ? tr->shadow[i].data : NULL};
    off += e;
  }
  return 0;
}

static const char *trainer__residency_name(bcast_residency r) {
  return r == BCAST_RES_GPU ? "gpu" : r == BCAST_RES_HOST_PINNED ? "host-pinned" : "host-pageable";
}

/* The bf16 shadow when the optimizer runs on the CPU and the setting asks for
 * it: one bf16 tensor per master tensor, same names and shapes, storage in the
 * wire dtype, pinned when a GPU will read it. Filled from the master before
 * the first checksum (agent_adamw_shadow_cpu), then by every step. */
static int trainer__alloc_shadow(agent__trainer *tr, char *err, size_t errlen) {
  if (tr->opt_gpu || tr->o.offload != AGENT_OFFLOAD_PARAMS_OPTIMIZER || !tr->o.bf16_shadow)
    return 0;
  tr->shadow = calloc(tr->n ? tr->n : 1, sizeof *tr->shadow);
  if (!tr->shadow) {
    snprintf(err, errlen, "no memory");
    return -1;
  }
  for (size_t i = 0; i < tr->n; i++) {
    tr->shadow[i] = tr->t[i];
    tr->shadow[i].data = NULL;
    tr->shadow[i].storage_dtype = BCAST_DTYPE_BF16;
    tr->shadow[i].wire_dtype = BCAST_DTYPE_BF16;
    tr->shadow[i].residency = tr->device >= 0 ? BCAST_RES_HOST_PINNED : BCAST_RES_HOST_PAGEABLE;
  }
  bcast_err be = {0};
  /* The receiver role allocates the wire dtype (bf16 here) and zeroes it. */
  if (bcast_storage_alloc(tr->shadow, tr->n, BCAST_FILL_RECEIVER, 0, &tr->shadow_storage, &be)) {
    snprintf(err, errlen, "bf16 shadow: %s", be.msg);
    return -1;
  }
  return 0;
}

static int trainer__bind(void *ud, const bcast_plan *p, bcast_tensor **local, size_t *n,
                         bcast_err *err) {
  agent__trainer *tr = ud;
  int rc = bcast_plan_check_local(p, tr->send, tr->n, 1, err);
  if (rc) return rc;
  *local = (bcast_tensor *)tr->send; /* the engine only reads a sender's tensors */
  *n = tr->n;
  return 0;
}

static int trainer__done(void *ud, const bcast_plan *p, int ok, uint64_t *checksum, char *err,
                         size_t errlen) {
  agent__trainer *tr = ud;
  (void)p, (void)ok, (void)err, (void)errlen;
  *checksum = tr->checksum; /* weights have not changed since the step */
  return 0;
}

/* With --checkpoint-dir: the checkpoint there, if any, replaces the seeded
 * weights and the zero optimizer state (the shadow and the checksum are
 * derived afterwards, as for fresh weights). */
static int trainer__restore(agent__trainer *tr, char *err, size_t errlen) {
  if (!tr->o.checkpoint_dir) return 0;
  if (mkdir(tr->o.checkpoint_dir, 0700) != 0 && errno != EEXIST) {
    snprintf(err, errlen, "--checkpoint-dir %s: %s", tr->o.checkpoint_dir, strerror(errno));
    return -1;
  }
  tr->ckpt = (agent_ckpt){.preset = tr->o.preset, .layers = tr->o.max_layers, .t = tr->t, .n = tr->n,
                          .m = tr->m, .v = tr->v, .state_on_gpu = tr->opt_gpu, .total = tr->total};
  double t0 = agent_now();
  int rc = agent_ckpt_load(tr->o.checkpoint_dir, &tr->ckpt, err, errlen);
  if (rc < 0) return -1;
  if (rc > 0) {
    agent_log_info("checkpoint_none", "dir=%s msg=\"no checkpoint yet: starting from the seeded "
                   "weights\"", tr->o.checkpoint_dir);
    return 0;
  }
  tr->steps = tr->ckpt.steps;
  agent_log_info("checkpoint_restored", "dir=%s run=%s policy_version=%llu optimizer_steps=%llu "
                 "seconds=%.3f", tr->o.checkpoint_dir, tr->ckpt.run_id[0] ? tr->ckpt.run_id : "none",
                 (unsigned long long)tr->ckpt.policy_version, (unsigned long long)tr->ckpt.steps,
                 agent_now() - t0);
  return 0;
}

/* After step `version - 1` of the run: the checkpoint, when one is due. A
 * failure is fatal: a trainer that said it keeps checkpoints and cannot would
 * otherwise lose the run at its next restart without anyone knowing. */
static int trainer__checkpoint(agent__trainer *tr, agent *a, uint64_t version) {
  if (!tr->o.checkpoint_dir || tr->steps % tr->o.checkpoint_every != 0) return 0;
  tr->ckpt.steps = tr->steps;
  tr->ckpt.policy_version = version;
  agent_held_run(a, tr->ckpt.run_id, sizeof tr->ckpt.run_id);
  char err[512];
  double t0 = agent_now();
  if (agent_ckpt_save(tr->o.checkpoint_dir, &tr->ckpt, err, sizeof err)) {
    agent_log_error("fatal", "reason=\"%s\"", err);
    return -1;
  }
  agent_log_info("checkpoint_saved", "policy_version=%llu optimizer_steps=%llu seconds=%.3f",
                 (unsigned long long)version, (unsigned long long)tr->steps, agent_now() - t0);
  return 0;
}

static int trainer__setup(agent__trainer *tr, char *err, size_t errlen) {
  bcast_preset_opts po = {.storage_dtype = BCAST_DTYPE_FP32, .wire_dtype = BCAST_DTYPE_BF16,
                          .residency = tr->residency, .device = tr->device,
                          .max_layers = tr->o.max_layers};
  bcast_err be = {0};
  if (bcast_preset_manifest(tr->o.preset, &po, &tr->t, &tr->n, &be)) {
    snprintf(err, errlen, "--preset %s: %s", tr->o.preset, be.msg);
    return -1;
  }
  for (size_t i = 0; i < tr->n; i++) tr->total += bcast_tensor_elems(&tr->t[i]);
  if (bcast_storage_alloc(tr->t, tr->n, BCAST_FILL_SENDER, tr->o.seed, &tr->storage, &be)) {
    snprintf(err, errlen, "master weights: %s", be.msg);
    return -1;
  }
  if (trainer__alloc_shadow(tr, err, errlen)) return -1;
  if (trainer__alloc_optimizer(tr, err, errlen)) return -1;
  if (trainer__restore(tr, err, errlen)) return -1;
  if (tr->shadow && agent_adamw_shadow_cpu(tr->spans, tr->n, tr->o.threads) != 0)
    agent_log_warn("adamw_threads", "msg=\"could not start every thread; the shadow was "
                   "written on fewer\"");
  tr->send = tr->shadow ? tr->shadow : tr->t;
  if (agent_weights_checksum(tr->send, tr->n, AGENT_WEIGHTS_STORAGE, &tr->checksum, err, errlen))
    return -1;
  tr->manifest = agent_pb_manifest(tr->send, tr->n, tr->o.preset, (int)tr->o.offload);
  if (!tr->manifest) {
    snprintf(err, errlen, "no memory");
    return -1;
  }
  if (agent_xfer_init(&tr->xfer, 1, tr->device, tr->o.data_listen, trainer__bind, trainer__done,
                      tr, err, errlen))
    return -1;
  agent_log_info("trainer_ready",
           "preset=%s tensors=%zu params=%llu offload=%s weights=%s optimizer=%s "
           "bf16_shadow=%s device=%d gpu=\"%s\" data_address=%s checksum=%016llx",
           tr->o.preset, tr->n, (unsigned long long)tr->total, agent_offload_name(tr->o.offload),
           trainer__residency_name(tr->residency), tr->opt_gpu ? "gpu" : "cpu",
           tr->shadow ? trainer__residency_name(tr->shadow[0].residency) : "off", tr->device,
           tr->device >= 0 ? tr->caps.gpu_name : "",
           agent_xfer_data_address(&tr->xfer), (unsigned long long)tr->checksum);
  return 0;
}

static int trainer__train(agent__trainer *tr, agent *a, const Rlorch__V1__TrainStep *ts) {
  char err[512];
  agent_adamw_coef c;
  /* The synthetic gradient comes from the seed; the batch is still fetched
   * and checked, so what a real trainer would get is tested end to end. */
  int fetched = agent_batch_fetch(a, ts, NULL, err, sizeof err);
  if (fetched != 0) return fetched < 0 ? -1 : 0;
  /* From here the version held changes: a registration (after an orchestrator
   * restart) waits until it says the new one, or the orchestrator would plan
   * a catch-up of weights this step is about to replace. */
  agent_hold_registration(a, 1);
  double t0 = agent_now();
  if (agent_adamw_coef_for_step(&tr->hp, tr->steps + 1, ts->seed, &c)) {
    agent_log_error("fatal", "reason=\"AdamW hyperparameters out of range\"");
    agent_hold_registration(a, 0);
    return -1;
  }
  tr->steps++;
  if (tr->opt_gpu) {
    if (agent_adamw_gpu(&c, tr->spans, tr->n, err, sizeof err)) {
      agent_log_error("fatal", "step=%llu reason=\"%s\"", (unsigned long long)ts->step, err);
      agent_hold_registration(a, 0);
      return -1;
    }
  } else if (agent_adamw_cpu(&c, tr->spans, tr->n, tr->o.threads) != 0) {
    agent_log_warn("adamw_threads", "msg=\"could not start every thread; the step ran on fewer\"");
  }
  double train_s = agent_now() - t0;
  double c0 = agent_now();
  if (agent_weights_checksum(tr->send, tr->n, AGENT_WEIGHTS_STORAGE, &tr->checksum, err,
                             sizeof err)) {
    agent_log_error("fatal", "step=%llu reason=\"%s\"", (unsigned long long)ts->step, err);
    agent_hold_registration(a, 0);
    return -1;
  }
  double checksum_s = agent_now() - c0;
  Rlorch__V1__StepDone d = RLORCH__V1__STEP_DONE__INIT;
  d.step = ts->step;
  d.train_seconds = train_s;
  d.manifest = tr->manifest;
  d.weights_checksum = tr->checksum;
  uint8_t id[128];
  if (ts->want_nccl_id) {
    bcast_err be = {0};
    if (tr->caps.nccl_built && tr->device >= 0 &&
        bcast_engine_nccl_id(agent_xfer_engine(&tr->xfer), id, &be) == 0) {
      d.nccl_unique_id.data = id;
      d.nccl_unique_id.len = sizeof id;
    } else {
      agent_log_warn("nccl_id_unavailable", "step=%llu reason=\"%s\"", (unsigned long long)ts->step,
               be.msg[0] ? be.msg : "no NCCL or no GPU here");
    }
  }
  if (trainer__checkpoint(tr, a, ts->step + 1)) {
    agent_hold_registration(a, 0);
    return -1;
  }
  agent_set_policy_version(a, ts->step + 1);
  agent_hold_registration(a, 0);
  agent_log_info("step_done", "step=%llu train_s=%.4f checksum_s=%.4f optimizer=%s checksum=%016llx",
           (unsigned long long)ts->step, train_s, checksum_s, tr->opt_gpu ? "gpu" : "cpu",
           (unsigned long long)tr->checksum);
  Rlorch__V1__ReportRequest req = RLORCH__V1__REPORT_REQUEST__INIT;
  req.kind_case = RLORCH__V1__REPORT_REQUEST__KIND_STEP_DONE;
  req.step_done = &d;
  agent_report(a, &req);
  return 0;
}

static int trainer__command(agent *a, const Rlorch__V1__Command *cmd, void *ud) {
  agent__trainer *tr = ud;
  switch (cmd->kind_case) {
  case RLORCH__V1__COMMAND__KIND_TRAIN: return trainer__train(tr, a, cmd->train);
  case RLORCH__V1__COMMAND__KIND_PLAN: agent_xfer_on_plan(&tr->xfer, a, cmd); return 0;
  case RLORCH__V1__COMMAND__KIND_TRIGGER: agent_xfer_on_trigger(&tr->xfer, a, cmd); return 0;
  case RLORCH__V1__COMMAND__KIND_ABORT: agent_xfer_on_abort(&tr->xfer, cmd); return 0;
  case RLORCH__V1__COMMAND__KIND_SHUTDOWN:
    agent_log_info("shutdown", "reason=\"%s\"", cmd->shutdown->reason ? cmd->shutdown->reason : "");
    return 1;
  case RLORCH__V1__COMMAND__KIND_ROLLOUT:
    agent_log_warn("command_ignored", "kind=rollout reason=\"a trainer makes no rollouts\"");
    return 0;
  default:
    agent_log_warn("command_ignored", "kind=%d reason=\"unknown command\"", (int)cmd->kind_case);
    return 0;
  }
}

int agent_trainer_run(const agent_opts *o) {
  agent__trainer tr;
  memset(&tr, 0, sizeof tr);
  tr.o = *o;
  agent_block_signals();
  char err[1024];
  bcast_caps_probe(&tr.caps);
  if (agent_pick_device(&tr.o, &tr.caps, &tr.device, err, sizeof err)) {
    agent_log_error("fatal", "reason=\"%s\"", err);
    return 1;
  }
#ifdef RLORCH_HAVE_CUDA
  if (tr.device >= 0) cudaSetDevice(tr.device); /* the command thread's device */
#endif
  bcast_caps_select_device(&tr.caps, tr.device);
  agent_log_devices(&tr.caps, tr.device);
  agent_adamw_defaults(&tr.hp);
  trainer__placement(&tr);
  agent *a = NULL;
  int status = 1;
  if (trainer__setup(&tr, err, sizeof err)) {
    agent_log_error("fatal", "reason=\"%s\"", err);
    goto out;
  }
  rlorch__v1__register_request__init(&tr.reg);
  agent_caps_to_pb(&tr.caps, tr.device, &tr.caps_pb);
  tr.reg.role = RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER;
  tr.reg.capabilities = &tr.caps_pb;
  tr.reg.manifest = tr.manifest;
  tr.reg.data_address = (char *)agent_xfer_data_address(&tr.xfer);
  if (agent_new(&tr.o, &tr.reg, trainer__command, &tr, &a, err, sizeof err)) {
    agent_log_error("fatal", "reason=\"%s\"", err);
    goto out;
  }
  agent_set_abort_fn(a, agent_xfer_abort_hook, &tr.xfer);
  if (tr.ckpt.policy_version || tr.ckpt.run_id[0]) agent_set_holds(a, tr.ckpt.run_id, tr.ckpt.policy_version);
  status = agent_run(a);
out:
  agent_free(a);
  trainer__free(&tr);
  agent_log_info("exit", "status=%d", status);
  return status;
}
