/* Model-shaped tensor manifests for tests, benchmarks and the synthetic trainer:
 * decoder-only transformers of the usual shapes (embedding, per layer q/k/v/o
 * projections, gate/up/down MLP and two norms, final norm, lm_head unless tied).
 *
 * Layer numbering in a manifest: 0 holds the embedding, 1..L the decoder layers,
 * L+1 the final norm and the lm_head.
 *
 * Storage: bcast_storage allocates every tensor's memory of a manifest (GPU,
 * pinned or pageable host, as each tensor's residency says), sets the data
 * pointers and fills them deterministically from a seed. */
#ifndef RLORCH_BCAST_PRESET_H
#define RLORCH_BCAST_PRESET_H

#include "workers/bcast/bcast.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bcast_preset {
  const char *name; /* "100m", "1b", "4b", "8b" */
  uint32_t hidden, layers, mlp, vocab;
  uint32_t q_heads, kv_heads, head_dim;
  int tied_embeddings; /* 1: no separate lm_head */
} bcast_preset;

/* NULL when unknown. */
const bcast_preset *bcast_preset_find(const char *name);
/* NULL-terminated list of preset names, for usage messages. */
const char *const *bcast_preset_names(void);

typedef struct bcast_preset_opts {
  bcast_dtype storage_dtype; /* 0: fp32 */
  bcast_dtype wire_dtype;    /* 0: bf16 */
  bcast_residency residency; /* 0: host pinned */
  int device;                /* CUDA device of GPU-resident tensors */
  uint32_t max_layers;       /* 0: all decoder layers; else keep the first N (small tests) */
} bcast_preset_opts;

/* Number of tensors of the manifest with these options (0 for NULL). */
size_t bcast_preset_tensor_count(const bcast_preset *p, const bcast_preset_opts *o);
/* Parameters (elements) of the manifest with these options. */
uint64_t bcast_preset_params(const bcast_preset *p, const bcast_preset_opts *o);
/* Fills a caller-owned array of `cap` tensors; data pointers are NULL.
 * *n receives the tensor count. BCAST_EINVAL when cap is too small. */
int bcast_preset_fill(const bcast_preset *p, const bcast_preset_opts *o, bcast_tensor *out,
                      size_t cap, size_t *n, bcast_err *err);
/* Same, into an array allocated here (release with free()). */
int bcast_preset_manifest(const char *name, const bcast_preset_opts *o, bcast_tensor **out,
                          size_t *n, bcast_err *err);

/* ---- storage for a manifest ---------------------------------------------- */
typedef struct bcast_storage bcast_storage;

typedef enum {
  BCAST_FILL_SENDER = 1,  /* storage dtype, deterministic values from the seed */
  BCAST_FILL_RECEIVER = 2 /* wire dtype, zeroed */
} bcast_fill_role;

/* Allocates each tensor's memory by its residency (GPU tensors on t->device),
 * sets t->data and fills it. On error nothing stays allocated and every data
 * pointer is NULL again. GPU residency needs a CUDA build. */
int bcast_storage_alloc(bcast_tensor *t, size_t n, bcast_fill_role role, uint64_t seed,
                        bcast_storage **out, bcast_err *err);
/* Frees the memory and clears the data pointers of the tensors it was made for. */
void bcast_storage_free(bcast_storage *s);
uint64_t bcast_storage_bytes(const bcast_storage *s);

/* The value bcast_storage_alloc writes at element i of tensor `index`
 * (fp32; narrower storage gets its RNE cast). For checks. */
float bcast_preset_value(uint64_t seed, uint32_t index, uint64_t i);

/* Rank r of N's dim-0 shards of `full` (FSDP2's cut, for benches and
 * tests): rows [rows * r / N, (r + 1) * rows / N) of every tensor, `data`
 * pointing into the full storage at the shard's first element; a tensor of
 * fewer rows than N goes whole to rank i % N. Writes the tensors rank r
 * holds to out (n entries at most) and returns how many. */
size_t bcast_preset_dim0_shards(const bcast_tensor *full, size_t n, uint32_t r, uint32_t nr,
                                bcast_tensor *out);

#ifdef __cplusplus
}
#endif
#endif
