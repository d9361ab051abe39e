/* Model-shaped manifests and their storage. */
#include "workers/bcast/bcast_preset.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "workers/bcast/bcast_gpu.cuh"
#include "workers/bcast/bcast_internal.h"

#ifdef RLORCH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* Shapes of common open models: 100m for CI, 1b like Llama 3.2 1B, 4b and 8b
 * like Qwen3 4B/8B (the 4B ties its embedding and lm_head). */
static const bcast_preset presets[] = {
    {"100m", 768, 12, 2048, 32000, 12, 4, 64, 1},
    {"1b", 2048, 16, 8192, 128256, 32, 8, 64, 1},
    {"4b", 2560, 36, 9728, 151936, 32, 8, 128, 1},
    {"8b", 4096, 36, 12288, 151936, 32, 8, 128, 0},
};
static const char *const preset_names[] = {"100m", "1b", "4b", "8b", NULL};

const bcast_preset *bcast_preset_find(const char *name) {
  if (!name) return NULL;
  for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
    if (!strcmp(presets[i].name, name)) return &presets[i];
  return NULL;
}

const char *const *bcast_preset_names(void) { return preset_names; }

static uint32_t layers_of(const bcast_preset *p, const bcast_preset_opts *o) {
  return (o && o->max_layers && o->max_layers < p->layers) ? o->max_layers : p->layers;
}

enum { PER_LAYER = 9 };

size_t bcast_preset_tensor_count(const bcast_preset *p, const bcast_preset_opts *o) {
  if (!p) return 0;
  return 1 + (size_t)layers_of(p, o) * PER_LAYER + 1 + (p->tied_embeddings ? 0 : 1);
}

/* Appends one tensor; the cursor never passes cap (checked by the caller). */
static void put(bcast_tensor *t, const char *name, uint32_t layer, uint64_t d0, uint64_t d1,
                const bcast_preset_opts *o) {
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->layer = layer;
  t->storage_dtype = o->storage_dtype;
  t->wire_dtype = o->wire_dtype;
  t->ndim = d1 ? 2 : 1;
  t->shape[0] = d0;
  t->shape[1] = d1;
  t->residency = o->residency;
  t->device = o->device;
}

static bcast_preset_opts defaults(const bcast_preset_opts *o) {
  bcast_preset_opts d = {0};
  if (o) d = *o;
  if (!d.storage_dtype) d.storage_dtype = BCAST_DTYPE_FP32;
  if (!d.wire_dtype) d.wire_dtype = BCAST_DTYPE_BF16;
  if (!d.residency) d.residency = BCAST_RES_HOST_PINNED;
  return d;
}

uint64_t bcast_preset_params(const bcast_preset *p, const bcast_preset_opts *o) {
  if (!p) return 0;
  uint64_t h = p->hidden, q = (uint64_t)p->q_heads * p->head_dim,
           kv = (uint64_t)p->kv_heads * p->head_dim;
  uint64_t layer = h * q * 2 + h * kv * 2 + 3 * h * p->mlp + 2 * h;
  uint64_t emb = (uint64_t)p->vocab * h;
  return emb * (p->tied_embeddings ? 1 : 2) + layer * layers_of(p, o) + h;
}

int bcast_preset_fill(const bcast_preset *p, const bcast_preset_opts *opts, bcast_tensor *out,
                      size_t cap, size_t *n, bcast_err *err) {
  if (!p || !out || !n) return bcast__fail(err, BCAST_EINVAL, "preset fill: NULL argument");
  size_t need = bcast_preset_tensor_count(p, opts);
  if (cap < need)
    return bcast__fail(err, BCAST_EINVAL, "preset %s: array holds %zu tensors, needs %zu", p->name,
                       cap, need);
  bcast_preset_opts o = defaults(opts);
  if (!bcast_dtype_size(o.storage_dtype) || !bcast_dtype_size(o.wire_dtype))
    return bcast__fail(err, BCAST_EINVAL, "preset %s: unknown storage or wire dtype", p->name);
  uint64_t h = p->hidden, q = (uint64_t)p->q_heads * p->head_dim,
           kv = (uint64_t)p->kv_heads * p->head_dim;
  uint32_t L = layers_of(p, &o);
  size_t k = 0;
  char nm[BCAST_NAME_MAX];
  put(&out[k++], "model.embed_tokens.weight", 0, p->vocab, h, &o);
  for (uint32_t l = 0; l < L; l++) {
    static const char *const names[PER_LAYER] = {
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
        "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
        "mlp.down_proj",    "input_layernorm",  "post_attention_layernorm"};
    const uint64_t d0[PER_LAYER] = {q, kv, kv, h, p->mlp, p->mlp, h, h, h};
    const uint64_t d1[PER_LAYER] = {h, h, h, q, h, h, p->mlp, 0, 0};
    for (int j = 0; j < PER_LAYER; j++) {
      snprintf(nm, sizeof nm, "model.layers.%u.%s.weight", l, names[j]);
      put(&out[k++], nm, l + 1, d0[j], d1[j], &o);
    }
  }
  put(&out[k++], "model.norm.weight", L + 1, h, 0, &o);
  if (!p->tied_embeddings) put(&out[k++], "lm_head.weight", L + 1, p->vocab, h, &o);
  *n = k;
  return BCAST_OK;
}

int bcast_preset_manifest(const char *name, const bcast_preset_opts *o, bcast_tensor **out,
                          size_t *n, bcast_err *err) {
  if (!out || !n) return bcast__fail(err, BCAST_EINVAL, "preset manifest: NULL argument");
  *out = NULL;
  *n = 0;
  const bcast_preset *p = bcast_preset_find(name);
  if (!p)
    return bcast__fail(err, BCAST_EINVAL, "unknown preset '%s' (known: 100m, 1b, 4b, 8b)",
                       name ? name : "(null)");
  size_t cap = bcast_preset_tensor_count(p, o);
  bcast_tensor *t = calloc(cap, sizeof *t);
  if (!t) return bcast__fail(err, BCAST_ENOMEM, "preset %s: no memory for %zu tensors", name, cap);
  int rc = bcast_preset_fill(p, o, t, cap, n, err);
  if (rc) {
    free(t);
    return rc;
  }
  *out = t;
  return BCAST_OK;
}

float bcast_preset_value(uint64_t seed, uint32_t index, uint64_t i) {
  return bcast__fill_value(seed, index, i);
}

/* ---- storage --------------------------------------------------------------- */
struct bcast_storage {
  bcast_tensor *tensors; /* the caller's array: pointers are cleared on free */
  size_t n;
  uint64_t bytes;
};

/* Finite normal values only reach these, so plain round to nearest even on the
 * bits is the reference cast. */
static uint16_t rne_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static uint16_t rne_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  int32_t e = (int32_t)((u >> 23) & 0xFF) - 127 + 15;
  uint32_t m = u & 0x7FFFFFu;
  if ((u & 0x7FFFFFFFu) == 0) return (uint16_t)sign;
  if (e >= 31) return (uint16_t)(sign | 0x7C00u);
  if (e <= 0) { /* subnormal half */
    if (e < -10) return (uint16_t)sign;
    m |= 0x800000u;
    uint32_t shift = (uint32_t)(14 - e);
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t r = ((uint32_t)e << 10) | (m >> 13), rem = m & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) r++;
  return (uint16_t)(sign | r);
}

typedef struct fill_job {
  const bcast_tensor *t;
  uint32_t index;
  uint64_t seed, from, to;
} fill_job;

static void fill_host_range(const fill_job *j) {
  const bcast_tensor *t = j->t;
  for (uint64_t i = j->from; i < j->to; i++) {
    float v = bcast__fill_value(j->seed, j->index, i);
    switch (t->storage_dtype) {
    case BCAST_DTYPE_FP32: ((float *)t->data)[i] = v; break;
    case BCAST_DTYPE_BF16: ((uint16_t *)t->data)[i] = rne_bf16(v); break;
    case BCAST_DTYPE_FP16: ((uint16_t *)t->data)[i] = rne_f16(v); break;
    default: ((uint16_t *)t->data)[i] = (uint16_t)(bcast__mix64(j->seed ^ i) & 0xFFFF); break;
    }
  }
}

typedef struct fill_pool {
  fill_job *jobs;
  size_t njobs;
  size_t next;
  pthread_mutex_t mu;
} fill_pool;

static void *fill_worker(void *arg) {
  fill_pool *p = arg;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    size_t k = p->next < p->njobs ? p->next++ : p->njobs;
    pthread_mutex_unlock(&p->mu);
    if (k == p->njobs) return NULL;
    fill_host_range(&p->jobs[k]);
  }
}

/* Host tensors are cut into 16M-element chunks filled by a few threads: an 8B
 * model's fp32 weights are 32 GB. */
static int fill_host(bcast_tensor *t, size_t n, const uint32_t *idx, size_t nh, uint64_t seed,
                     bcast_err *err) {
  const uint64_t chunk = 1u << 24;
  size_t njobs = 0;
  for (size_t k = 0; k < nh; k++) njobs += (bcast_tensor_elems(&t[idx[k]]) + chunk - 1) / chunk;
  if (!njobs) return BCAST_OK;
  fill_pool pool = {.jobs = calloc(njobs, sizeof(fill_job)), .njobs = njobs};
  if (!pool.jobs) return bcast__fail(err, BCAST_ENOMEM, "storage: no memory for fill jobs");
  size_t j = 0;
  for (size_t k = 0; k < nh; k++) {
    uint64_t e = bcast_tensor_elems(&t[idx[k]]);
    for (uint64_t f = 0; f < e; f += chunk)
      pool.jobs[j++] = (fill_job){&t[idx[k]], idx[k], seed, f, f + chunk < e ? f + chunk : e};
  }
  (void)n;
  pthread_mutex_init(&pool.mu, NULL);
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int nthr = ncpu > 32 ? 32 : ncpu < 1 ? 1 : (int)ncpu;
  pthread_t th[32];
  int started = 0;
  for (int i = 1; i < nthr; i++)
    if (pthread_create(&th[started], NULL, fill_worker, &pool) == 0) started++;
  fill_worker(&pool);
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  pthread_mutex_destroy(&pool.mu);
  free(pool.jobs);
  return BCAST_OK;
}

static void release_one(bcast_tensor *t) {
  if (!t->data) return;
#ifdef RLORCH_HAVE_CUDA
  if (t->residency == BCAST_RES_GPU) {
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(t->device);
    cudaFree(t->data);
    cudaSetDevice(prev);
  } else if (t->residency == BCAST_RES_HOST_PINNED) {
    cudaFreeHost(t->data);
  } else {
    free(t->data);
  }
#else
  free(t->data);
#endif
  t->data = NULL;
}

static int alloc_one(bcast_tensor *t, size_t bytes, bcast_err *err) {
  size_t sz = bytes ? bytes : 1;
  switch (t->residency) {
  case BCAST_RES_GPU: {
#ifdef RLORCH_HAVE_CUDA
    int prev = 0;
    cudaGetDevice(&prev);
    cudaError_t ce = cudaSetDevice(t->device);
    if (ce == cudaSuccess) ce = cudaMalloc(&t->data, sz);
    cudaSetDevice(prev);
    if (ce != cudaSuccess) {
      t->data = NULL;
      return bcast__fail(err, ce == cudaErrorMemoryAllocation ? BCAST_ENOMEM : BCAST_ECUDA,
                         "storage: tensor %s: %zu bytes on GPU %d: %s", t->name, sz, t->device,
                         cudaGetErrorString(ce));
    }
    return BCAST_OK;
#else
    return bcast__fail(err, BCAST_ENOTSUP, "storage: tensor %s is GPU-resident: built without CUDA",
                       t->name);
#endif
  }
  case BCAST_RES_HOST_PINNED:
#ifdef RLORCH_HAVE_CUDA
    if (cudaHostAlloc(&t->data, sz, cudaHostAllocDefault) != cudaSuccess) {
      (void)cudaGetLastError();
      t->data = NULL;
      return bcast__fail(err, BCAST_ENOMEM, "storage: tensor %s: %zu bytes of pinned host memory",
                         t->name, sz);
    }
    return BCAST_OK;
#endif
    /* fall through: without CUDA, "pinned" memory is ordinary memory */
  case BCAST_RES_HOST_PAGEABLE:
    t->data = aligned_alloc(4096, (sz + 4095) / 4096 * 4096);
    if (!t->data)
      return bcast__fail(err, BCAST_ENOMEM, "storage: tensor %s: %zu bytes of host memory",
                         t->name, sz);
    return BCAST_OK;
  default:
    return bcast__fail(err, BCAST_EINVAL, "storage: tensor %s: unknown residency %d", t->name,
                       (int)t->residency);
  }
}

#ifdef RLORCH_HAVE_CUDA
static int fill_gpu(bcast_tensor *t, uint32_t index, bcast_fill_role role, uint64_t seed,
                    size_t bytes, bcast_err *err) {
  int prev = 0;
  cudaGetDevice(&prev);
  cudaError_t ce = cudaSetDevice(t->device);
  if (ce == cudaSuccess) {
    if (role == BCAST_FILL_RECEIVER)
      ce = cudaMemset(t->data, 0, bytes);
    else
      ce = (cudaError_t)bcast__cuda_fill(t->data, t->storage_dtype, bcast_tensor_elems(t), seed,
                                         index, NULL);
    if (ce == cudaSuccess) ce = cudaDeviceSynchronize();
  }
  cudaSetDevice(prev);
  if (ce != cudaSuccess)
    return bcast__fail(err, BCAST_ECUDA, "storage: filling tensor %s on GPU %d: %s", t->name,
                       t->device, cudaGetErrorString(ce));
  return BCAST_OK;
}
#endif

int bcast_storage_alloc(bcast_tensor *t, size_t n, bcast_fill_role role, uint64_t seed,
                        bcast_storage **out, bcast_err *err) {
  if (!out || (!t && n)) return bcast__fail(err, BCAST_EINVAL, "storage: NULL argument");
  *out = NULL;
  if (role != BCAST_FILL_SENDER && role != BCAST_FILL_RECEIVER)
    return bcast__fail(err, BCAST_EINVAL, "storage: unknown role %d", (int)role);
  bcast_storage *s = calloc(1, sizeof *s);
  uint32_t *host_idx = calloc(n ? n : 1, sizeof *host_idx);
  if (!s || !host_idx) {
    free(s);
    free(host_idx);
    return bcast__fail(err, BCAST_ENOMEM, "storage: no memory");
  }
  s->tensors = t;
  s->n = n;
  for (size_t i = 0; i < n; i++) t[i].data = NULL;
  int rc = BCAST_OK;
  size_t nh = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    bcast_dtype dt = role == BCAST_FILL_SENDER ? t[i].storage_dtype : t[i].wire_dtype;
    size_t es = bcast_dtype_size(dt);
    if (!es) {
      rc = bcast__fail(err, BCAST_EINVAL, "storage: tensor %s: unknown dtype %d", t[i].name,
                       (int)dt);
      break;
    }
    size_t bytes = (size_t)bcast_tensor_elems(&t[i]) * es;
    rc = alloc_one(&t[i], bytes, err);
    if (rc) break;
    s->bytes += bytes;
    if (t[i].residency == BCAST_RES_GPU) {
#ifdef RLORCH_HAVE_CUDA
      rc = fill_gpu(&t[i], (uint32_t)i, role, seed, bytes, err);
#endif
    } else if (role == BCAST_FILL_RECEIVER) {
      memset(t[i].data, 0, bytes);
    } else {
      host_idx[nh++] = (uint32_t)i;
    }
  }
  if (!rc) rc = fill_host(t, n, host_idx, nh, seed, err);
  free(host_idx);
  if (rc) {
    bcast_storage_free(s);
    return rc;
  }
  *out = s;
  return BCAST_OK;
}

void bcast_storage_free(bcast_storage *s) {
  if (!s) return;
  for (size_t i = 0; i < s->n; i++) release_one(&s->tensors[i]);
  free(s);
}

uint64_t bcast_storage_bytes(const bcast_storage *s) { return s ? s->bytes : 0; }

/* Rank r of N: rows [rows * r / N, rows * (r + 1) / N) of every tensor (its
 * dim-0 shard, FSDP2's), `data` pointing into the full storage at the
 * shard's first element. A tensor of fewer rows than N goes whole to rank
 * i % N. Returns the tensors rank r holds, written to out. */
size_t bcast_preset_dim0_shards(const bcast_tensor *full, size_t n, uint32_t r, uint32_t nr, bcast_tensor *out) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    const bcast_tensor *t = &full[i];
    uint64_t elems = bcast_tensor_elems(t), rows = t->shape[0], row = elems / rows, lo = 0, hi = rows;
    if (rows < nr && i % nr != r) continue;
    if (rows >= nr) {
      lo = rows * r / nr;
      hi = rows * (r + 1) / nr;
    }
    if (hi == lo) continue;
    out[k] = *t;
    out[k].shard_offset = lo * row;
    out[k].shard_elems = (hi - lo) * row == elems ? 0 : (hi - lo) * row;
    out[k].data = (uint8_t *)t->data + lo * row * bcast_dtype_size(t->storage_dtype);
    k++;
  }
  return k;
}
