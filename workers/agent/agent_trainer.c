/* `rlorch trainer`: fp32 master weights of a preset, a real AdamW step per
 * train command, the sending side of the broadcast.
 *
 * A program on the public API (include/rlorch/rlorch.h), like any trainer
 * that embeds librlorch: the library registers it with the tensors it sends,
 * holds the command stream, fetches each step's batch, takes the checksum it
 * reports and executes every broadcast from those tensors. What is the
 * agent's own is the computation (the weights, the optimizer, the
 * checkpoint), its signals and its exit status: 0 stopped on purpose, 1 a
 * failure.
 *
 * With the optimizer on the CPU (--offload params+optimizer) and the bf16
 * shadow on, the tensors the manifest describes, the library sends and the
 * checksum covers are the shadow: bf16 storage (pinned when a GPU is used)
 * that the AdamW step writes as it updates each weight. The fp32 master and
 * the optimizer state are the optimizer's alone and stay in pageable memory.
 *
 * With --checkpoint-dir the trainer writes its checkpoint (agent_ckpt.h)
 * after every --checkpoint-every-th step, before it reports the step, and
 * starts from it when it finds one (a group's rank only from its own rank's,
 * with the same ranges: agent_ckpt.h): the version it then registers with is
 * the checkpoint's (options.held_run_id/held_version), so a resumed run
 * carries on as after an orchestrator restart (docs/RELIABILITY.md says what
 * each case gives).
 *
 * With --ranks N (N > 1) the process is rank --rank R of a sharded trainer:
 * of every preset tensor it holds only elements [R*E/N, (R+1)*E/N), in host
 * memory of its own, each the value a lone trainer holds there, and its
 * AdamW step runs per element with a lone trainer's element indices, so
 * the ranks together hold, step after step, what one trainer would. The
 * part lives where a lone trainer's weights would (--device, --offload: on
 * the GPU, pinned or pageable host memory; no bf16 shadow). The library
 * registers the parts (options.shards), fetches the rank's share of each
 * batch and sends its part of each broadcast. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "rlorch/rlorch.h"
#include "workers/agent/agent.h"
#include "workers/agent/agent_adamw.h"
#include "workers/agent/agent_ckpt.h"
#include "workers/agent/agent_core.h"
#include "workers/agent/agent_log.h"
#include "workers/agent/agent_weights.h"
#include "workers/bcast/bcast_preset.h"

#ifdef RLORCH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

_Static_assert((int)RLORCH_OFFLOAD_NONE == (int)AGENT_OFFLOAD_NONE &&
                   (int)RLORCH_OFFLOAD_PARAMS == (int)AGENT_OFFLOAD_PARAMS &&
                   (int)RLORCH_OFFLOAD_PARAMS_OPTIMIZER == (int)AGENT_OFFLOAD_PARAMS_OPTIMIZER,
               "offload values are the same in both APIs");

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
  rlorch_tensor *pub;        /* send, as the library takes them */
  /* A rank of a trainer group (--ranks N > 1): t holds this rank's part of
   * each tensor (shard_offset, shard_elems), in memory of its own (not
   * storage), and first[i] is the index of t[i]'s first element in the
   * whole model, so the synthetic gradient, seeded per element, is a lone
   * trainer's. pub_shards is the parts as the library takes them. */
  uint64_t *first;
  rlorch_shard *pub_shards;
  float *m, *v; /* optimizer state, total elements each */
  agent_adamw_span *spans;
  uint64_t total;
  uint64_t steps; /* optimizer steps taken: the bias-correction count */
  agent_adamw_hparams hp;
  uint64_t checksum; /* of send at start, for trainer_ready */
  agent_ckpt ckpt; /* with --checkpoint-dir: what it reads and writes */
  rlorch_worker *w;
} agent__trainer;

/* A rank's part of a tensor lives where the trainer's weights live
 * (trainer__placement): on its GPU, in pinned or in pageable host memory. */
static void trainer__shard_free(bcast_tensor *t) {
#ifdef RLORCH_HAVE_CUDA
  if (t->residency == BCAST_RES_GPU) cudaFree(t->data);
  else if (t->residency == BCAST_RES_HOST_PINNED) cudaFreeHost(t->data);
  else free(t->data);
#else
  free(t->data);
#endif
  t->data = NULL;
}

/* Moves the host values `host` of t's part to t's residency; `host` is then
 * t's data or freed. -1 with err when the memory cannot be had. */
static int trainer__shard_place(bcast_tensor *t, float *host, char *err, size_t errlen) {
  size_t bytes = (size_t)bcast_tensor_held(t) * sizeof *host;
  if (t->residency == BCAST_RES_HOST_PAGEABLE) {
    t->data = host;
    return 0;
  }
#ifdef RLORCH_HAVE_CUDA
  void *d = NULL;
  cudaError_t e = t->residency == BCAST_RES_GPU ? cudaMalloc(&d, bytes) : cudaMallocHost(&d, bytes);
  if (e == cudaSuccess)
    e = t->residency == BCAST_RES_GPU ? cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice)
                                      : (memcpy(d, host, bytes), cudaSuccess);
  free(host);
  if (e != cudaSuccess) {
    if (d) t->residency == BCAST_RES_GPU ? cudaFree(d) : cudaFreeHost(d);
    snprintf(err, errlen, "tensor %s: %zu bytes %s: %s", t->name, bytes,
             t->residency == BCAST_RES_GPU ? "on the GPU" : "of pinned host memory",
             cudaGetErrorString(e));
    return -1;
  }
  t->data = d;
  return 0;
#else
  free(host);
  snprintf(err, errlen, "tensor %s: %zu bytes off pageable memory need a build with CUDA", t->name,
           bytes);
  return -1;
#endif
}

static void trainer__free(agent__trainer *tr) {
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
  free(tr->pub);
  free(tr->pub_shards);
  if (tr->first)
    for (size_t i = 0; i < tr->n; i++) trainer__shard_free(&tr->t[i]);
  free(tr->first);
  bcast_storage_free(tr->shadow_storage);
  free(tr->shadow);
  bcast_storage_free(tr->storage);
  free(tr->t);
}

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
    uint64_t e = bcast_tensor_held(&tr->t[i]);
    tr->spans[i] = (agent_adamw_span){tr->t[i].data, tr->m + off, tr->v + off, e,
                                      tr->first ? tr->first[i] : off,
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
  if (tr->opt_gpu || tr->o.offload != AGENT_OFFLOAD_PARAMS_OPTIMIZER || !tr->o.bf16_shadow ||
      tr->first)
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
                          .m = tr->m, .v = tr->v, .state_on_gpu = tr->opt_gpu, .total = tr->total,
                          .rank = tr->o.trainer_rank, .ranks = tr->o.trainer_ranks};
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


/* After step `version - 1` of run `run_id`: the checkpoint, when one is due.
 * A failure is fatal: a trainer that said it keeps checkpoints and cannot
 * would otherwise lose the run at its next restart without anyone knowing. */
static int trainer__checkpoint(agent__trainer *tr, const char *run_id, uint64_t version,
                               char *err, size_t errlen) {
  if (!tr->o.checkpoint_dir || tr->steps % tr->o.checkpoint_every != 0) return 0;
  tr->ckpt.steps = tr->steps;
  tr->ckpt.policy_version = version;
  if (strlen(run_id) >= sizeof tr->ckpt.run_id) {
    snprintf(err, errlen, "checkpoint: run id \"%s\" is longer than %zu bytes", run_id,
             sizeof tr->ckpt.run_id - 1);
    return -1;
  }
  snprintf(tr->ckpt.run_id, sizeof tr->ckpt.run_id, "%s", run_id);
  double t0 = agent_now();
  if (agent_ckpt_save(tr->o.checkpoint_dir, &tr->ckpt, err, errlen)) return -1;
  agent_log_info("checkpoint_saved", "policy_version=%llu optimizer_steps=%llu seconds=%.3f",
                 (unsigned long long)version, (unsigned long long)tr->steps, agent_now() - t0);
  return 0;
}

/* A group's rank R of N: of every tensor of E elements, elements
 * [R*E/N, (R+1)*E/N) (dim-0 contiguous in row-major order; a rank whose
 * range of a small tensor is empty leaves that tensor out), each holding
 * the value a lone trainer's storage holds there (bcast_preset_value), where
 * the trainer keeps its weights: only the part is allocated. */
static int trainer__shard(agent__trainer *tr, char *err, size_t errlen) {
  uint64_t R = tr->o.trainer_rank, N = tr->o.trainer_ranks;
  tr->first = calloc(tr->n ? tr->n : 1, sizeof *tr->first);
  if (!tr->first) {
    snprintf(err, errlen, "no memory");
    return -1;
  }
  size_t k = 0;
  uint64_t base = 0;
  for (size_t i = 0; i < tr->n; i++) {
    uint64_t e = bcast_tensor_elems(&tr->t[i]);
    uint64_t lo = (uint64_t)((unsigned __int128)e * R / N);
    uint64_t hi = (uint64_t)((unsigned __int128)e * (R + 1) / N);
    if (hi > lo) {
      bcast_tensor t = tr->t[i];
      t.shard_offset = lo;
      t.shard_elems = hi - lo;
      float *d = malloc((size_t)(hi - lo) * sizeof *d);
      if (!d) {
        snprintf(err, errlen, "tensor %s: no memory for %llu elements", t.name,
                 (unsigned long long)(hi - lo));
        tr->n = k; /* what is allocated so far is freed */
        return -1;
      }
      for (uint64_t j = lo; j < hi; j++) d[j - lo] = bcast_preset_value(tr->o.seed, (uint32_t)i, j);
      if (trainer__shard_place(&t, d, err, errlen)) {
        tr->n = k;
        return -1;
      }
      tr->first[k] = base + lo;
      tr->t[k++] = t;
    }
    base += e;
  }
  tr->n = k;
  return 0;
}

/* The weights, the optimizer state, the checkpoint if any, and the tensors
 * the library is to send, as rlorch_tensor. */
static int trainer__setup(agent__trainer *tr, char *err, size_t errlen) {
  bcast_preset_opts po = {.storage_dtype = BCAST_DTYPE_FP32, .wire_dtype = BCAST_DTYPE_BF16,
                          .residency = tr->residency, .device = tr->device,
                          .max_layers = tr->o.max_layers};
  bcast_err be = {0};
  if (bcast_preset_manifest(tr->o.preset, &po, &tr->t, &tr->n, &be)) {
    snprintf(err, errlen, "--preset %s: %s", tr->o.preset, be.msg);
    return -1;
  }
  if (tr->o.trainer_ranks > 1) {
    if (trainer__shard(tr, err, errlen)) return -1;
  } else if (bcast_storage_alloc(tr->t, tr->n, BCAST_FILL_SENDER, tr->o.seed, &tr->storage, &be)) {
    snprintf(err, errlen, "master weights: %s", be.msg);
    return -1;
  }
  for (size_t i = 0; i < tr->n; i++) tr->total += bcast_tensor_held(&tr->t[i]);
  if (trainer__alloc_shadow(tr, err, errlen)) return -1;
  if (trainer__alloc_optimizer(tr, err, errlen)) return -1;
  if (trainer__restore(tr, err, errlen)) return -1;
  if (tr->shadow && agent_adamw_shadow_cpu(tr->spans, tr->n, tr->o.threads) != 0)
    agent_log_warn("adamw_threads", "msg=\"could not start every thread; the shadow was "
                   "written on fewer\"");
  tr->send = tr->shadow ? tr->shadow : tr->t;
  if (agent_weights_checksum(tr->send, tr->n, AGENT_WEIGHTS_STORAGE, &tr->checksum, err, errlen))
    return -1;
  tr->pub = calloc(tr->n ? tr->n : 1, sizeof *tr->pub);
  if (tr->first) tr->pub_shards = calloc(tr->n ? tr->n : 1, sizeof *tr->pub_shards);
  if (!tr->pub || (tr->first && !tr->pub_shards)) {
    snprintf(err, errlen, "no memory");
    return -1;
  }
  for (size_t i = 0; i < tr->n; i++) {
    const bcast_tensor *s = &tr->send[i];
    tr->pub[i] = (rlorch_tensor){.name = s->name, .layer = s->layer,
                                 .storage_dtype = (rlorch_dtype)s->storage_dtype,
                                 .wire_dtype = (rlorch_dtype)s->wire_dtype, .ndim = s->ndim,
                                 .shape = s->shape, .residency = (rlorch_residency)s->residency,
                                 .device = s->device, .data = s->data};
    if (tr->pub_shards)
      tr->pub_shards[i] = (rlorch_shard){.element_offset = s->shard_offset,
                                         .element_count = s->shard_elems};
  }
  return 0;
}

/* The worker: its tensors, the manifest's model and offload, what a
 * restored checkpoint holds, and the agent's own logging (options.log NULL:
 * the library's events go through agent_log as the agent's do). */
static int trainer__create(agent__trainer *tr, char *err, size_t errlen) {
  rlorch_options ro;
  rlorch_options_init(&ro, sizeof ro, RLORCH_ROLE_TRAINER);
  ro.orchestrator = tr->o.orchestrator;
  ro.name = tr->o.name;
  /* The CLI hands the token itself; a bare agent_opts may name a file. */
  if (tr->o.token && tr->o.token[0]) ro.token = tr->o.token;
  else if (!tr->o.token) ro.token_file = tr->o.token_file;
  ro.tls_ca_file = tr->o.tls_ca_file;
  ro.tls_cert_file = tr->o.tls_client_cert_file;
  ro.tls_key_file = tr->o.tls_client_key_file;
  ro.device = tr->device;
  ro.data_listen = tr->o.data_listen;
  ro.node = tr->o.node;
  ro.nics = tr->o.nics;
  ro.nic_gbits = tr->o.nic_gbits;
  /* An agent waits for its orchestrator as long as it takes (a signal ends
   * the wait): it is started by a supervisor, possibly before the server. */
  ro.connect_timeout_s = INFINITY;
  ro.tensors = tr->pub;
  ro.ntensors = tr->n;
  ro.shards = tr->pub_shards;
  ro.trainer_rank = tr->o.trainer_rank;
  ro.trainer_ranks = tr->o.trainer_ranks;
  ro.model = tr->o.preset;
  ro.offload = (rlorch_offload)tr->o.offload;
  if (tr->ckpt.run_id[0]) {
    ro.held_run_id = tr->ckpt.run_id;
    ro.held_version = tr->ckpt.policy_version;
  }
  rlorch_error e;
  if (rlorch_create(&ro, &tr->w, &e) != RLORCH_OK) {
    snprintf(err, errlen, "%s", e.message);
    return -1;
  }
  const char *addr = rlorch_data_address(tr->w);
  agent_log_info("trainer_ready",
           "preset=%s tensors=%zu params=%llu offload=%s weights=%s optimizer=%s "
           "bf16_shadow=%s device=%d gpu=\"%s\" data_address=%s checksum=%016llx rank=%u ranks=%u",
           tr->o.preset, tr->n, (unsigned long long)tr->total, agent_offload_name(tr->o.offload),
           trainer__residency_name(tr->residency), tr->opt_gpu ? "gpu" : "cpu",
           tr->shadow ? trainer__residency_name(tr->shadow[0].residency) : "off", tr->device,
           tr->device >= 0 ? tr->caps.gpu_name : "", addr ? addr : "",
           (unsigned long long)tr->checksum, tr->o.trainer_rank,
           tr->o.trainer_ranks ? tr->o.trainer_ranks : 1);
  return 0;
}

/* SIGINT and SIGTERM stop the worker (agent_signals), also while it waits
 * for its first registration. */
static void trainer__on_signal(void *w) { rlorch_stop(w); }

/* ---- the steps -------------------------------------------------------------- */

/* A step the trainer cannot take: reported on it, which stops the worker
 * (the orchestrator redoes the step when a trainer attaches). 1: exit 1. */
static int trainer__fail(agent__trainer *tr, const rlorch_command *cmd, const char *why) {
  agent_log_error("fatal", "step=%llu reason=\"%s\"", (unsigned long long)cmd->train.step, why);
  rlorch_error e;
  if (rlorch_report_error(tr->w, cmd, why, &e) != RLORCH_OK)
    agent_log_debug("step_not_reported", "step=%llu reason=\"%s\"",
                    (unsigned long long)cmd->train.step, e.message);
  return 1;
}

/* One train command: 0 to go on, 1 for a fatal error (exit 1). A worker that
 * stops meanwhile (a signal, a shutdown) goes on to rlorch_next, which says
 * so. */
static int trainer__train(agent__trainer *tr, const rlorch_command *cmd) {
  char err[512];
  rlorch_error e;
  /* The synthetic gradient comes from the seed; the batch is still fetched
   * and checked, so what a real trainer would get is tested end to end. From
   * the fetch until the report the library holds registration: after an
   * orchestrator restart it registers with the version this step makes. */
  rlorch_batch *b = NULL;
  rlorch_status rc = rlorch_fetch_batch(tr->w, cmd, &b, &e);
  if (rc == RLORCH_E_REFUSED) { /* the orchestrator no longer holds it: skip the step */
    rlorch_error e2;
    if (rlorch_report_error(tr->w, cmd, e.message, &e2) != RLORCH_OK)
      agent_log_debug("step_not_reported", "step=%llu reason=\"%s\"",
                      (unsigned long long)cmd->train.step, e2.message);
    return 0;
  }
  if (rc == RLORCH_E_STOPPED) return 0;
  if (rc != RLORCH_OK) return trainer__fail(tr, cmd, e.message);
  rlorch_batch_free(b);
  double t0 = agent_now();
  agent_adamw_coef c;
  if (agent_adamw_coef_for_step(&tr->hp, tr->steps + 1, cmd->train.seed, &c))
    return trainer__fail(tr, cmd, "AdamW hyperparameters out of range");
  tr->steps++;
  if (tr->opt_gpu) {
    if (agent_adamw_gpu(&c, tr->spans, tr->n, err, sizeof err)) return trainer__fail(tr, cmd, err);
  } else if (agent_adamw_cpu(&c, tr->spans, tr->n, tr->o.threads) != 0) {
    agent_log_warn("adamw_threads", "msg=\"could not start every thread; the step ran on fewer\"");
  }
  double train_s = agent_now() - t0;
  /* Written before the report: once the orchestrator has the step, a
   * trainer restarted from its checkpoint must hold it too. */
  if (trainer__checkpoint(tr, cmd->run_id, cmd->train.step + 1, err, sizeof err))
    return trainer__fail(tr, cmd, err);
  /* The library takes the checksum, logs step_done and sends StepDone. */
  rc = rlorch_report_step(tr->w, cmd, train_s, &e);
  if (rc == RLORCH_OK || rc == RLORCH_E_STOPPED) return 0;
  if (rc == RLORCH_E_INVALID) { /* the checksum failed: the worker stopped */
    agent_log_error("fatal", "step=%llu reason=\"%s\"", (unsigned long long)cmd->train.step,
                    e.message);
    return 1;
  }
  /* Refused or unreachable: the report is dropped (logged by the library),
   * as the orchestrator no longer waits for it; the worker goes on. */
  agent_log_debug("step_report_dropped", "step=%llu reason=\"%s\"",
                  (unsigned long long)cmd->train.step, e.message);
  return 0;
}

/* Commands until the worker stops: the exit status. */
static int trainer__loop(agent__trainer *tr) {
  for (;;) {
    rlorch_command *cmd = NULL;
    rlorch_error e;
    rlorch_status rc = rlorch_next(tr->w, -1, &cmd, &e);
    if (rc == RLORCH_E_STOPPED) break;
    if (rc != RLORCH_OK) {
      agent_log_error("fatal", "reason=\"%s\"", e.message);
      return 1;
    }
    int status = -1;
    if (cmd->kind == RLORCH_CMD_TRAIN) {
      if (trainer__train(tr, cmd)) status = 1;
    } else if (cmd->kind == RLORCH_CMD_SHUTDOWN) {
      status = 0; /* the library logged it */
    }
    rlorch_command_free(cmd);
    if (status >= 0) return status;
  }
  rlorch_error e;
  if (rlorch_stop_status(tr->w, &e) == RLORCH_OK) return 0;
  agent_log_error("fatal", "reason=\"%s\"", e.message);
  return 1;
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
    agent_log_info("exit", "status=1");
    return 1;
  }
#ifdef RLORCH_HAVE_CUDA
  if (tr.device >= 0) cudaSetDevice(tr.device); /* the optimizer's device */
#endif
  bcast_caps_select_device(&tr.caps, tr.device);
  agent_log_devices(&tr.caps, tr.device);
  agent_adamw_defaults(&tr.hp);
  trainer__placement(&tr);
  agent_signals sig = {0};
  int status = 1;
  if (trainer__setup(&tr, err, sizeof err) || trainer__create(&tr, err, sizeof err)) {
    agent_log_error("fatal", "reason=\"%s\"", err);
    goto out;
  }
  if (agent_signals_start(&sig, trainer__on_signal, tr.w)) {
    agent_log_error("fatal", "reason=\"cannot start the signal thread\"");
    goto out;
  }
  rlorch_error e;
  rlorch_status rc = rlorch_start(tr.w, &e);
  if (rc == RLORCH_OK) {
    status = trainer__loop(&tr);
  } else if (rc == RLORCH_E_STOPPED && rlorch_stop_status(tr.w, NULL) == RLORCH_OK) {
    status = 0; /* stopped before it registered: a signal */
  } else {
    agent_log_error("fatal", "reason=\"%s\"", e.message);
  }
out:
  agent_signals_stop(&sig); /* before rlorch_free: no stop of a freed worker */
  rlorch_free(tr.w);
  trainer__free(&tr);
  agent_log_info("exit", "status=%d", status);
  return status;
}
