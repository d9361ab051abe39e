/* agent_ckpt: the trainer's own checkpoint, so that a trainer process that
 * restarts resumes the run where its weights were instead of failing it.
 *
 * One file, DIR/trainer.ckpt, replaced atomically (written to a temporary
 * file, fsynced, renamed over the old one, the directory fsynced): a crash
 * at any moment leaves either the previous checkpoint or the new one, never
 * a torn one. It holds what the trainer cannot get back from anyone: the
 * fp32 master weights, the AdamW moments m and v, the optimizer step count,
 * and the run and policy version those weights are, and which trainer they
 * belong to: a trainer group's rank keeps only its part of each tensor, and
 * parts of equal size would otherwise load into another rank without a
 * complaint. The bf16 shadow and the checksum are derived again on load.
 * Layout (little endian), format 2:
 *   "RLCK" u32 format, u64 total elements, u64 tensors, u64 optimizer steps,
 *   u64 policy version, run id[64], preset[32], u32 layers, u32 rank, u32
 *   ranks (1: a lone trainer), then per tensor u32 name length, name, u64
 *   elements of the whole tensor, u64 first element held, u64 elements held
 *   (a lone trainer's: 0 and the whole); then the weights of every tensor in
 *   order, m, v (fp32); then XXH3-64 of every byte before it.
 * Format 1 (no rank, per tensor only the elements held) is still read, as a
 * lone trainer's: a group's rank refuses it, since nothing in it says whose
 * part it is.
 * A file that does not match the trainer (another rank or group size,
 * preset, layer count, tensor list or element ranges) or whose digest is
 * wrong is refused with a message naming what the file holds and what the
 * trainer has: the trainer then exits rather than train from it. */
#ifndef RLORCH_AGENT_CKPT_H
#define RLORCH_AGENT_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "workers/bcast/bcast.h"

typedef struct agent_ckpt {
  const char *preset;
  uint32_t layers;
  const bcast_tensor *t; /* fp32 master weights: host or device memory (t[i].residency) */
  size_t n;
  float *m, *v;          /* total elements each */
  int state_on_gpu;      /* m and v are device memory of the current device */
  uint64_t total;
  /* Whose weights: rank `rank` of a group of `ranks` (0 or 1: a lone
   * trainer); t[i].shard_offset and the elements held are its ranges. */
  uint32_t rank, ranks;
  /* What the weights are: written by save, read back by load. */
  uint64_t steps;
  uint64_t policy_version;
  char run_id[64];
} agent_ckpt;

/* Writes c to DIR/trainer.ckpt atomically (mode 0600). 0, or -1 with err. */
int agent_ckpt_save(const char *dir, const agent_ckpt *c, char *err, size_t errlen);
/* Reads DIR/trainer.ckpt into c's buffers and fills steps, policy_version and
 * run_id. 1: no checkpoint there (c untouched); 0: loaded; -1: refused or
 * unreadable, with err (c's buffers may have been written). */
int agent_ckpt_load(const char *dir, agent_ckpt *c, char *err, size_t errlen);

#endif
