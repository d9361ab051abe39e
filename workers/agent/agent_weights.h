/* agent_weights: the checksum a worker reports for the weights it holds.
 *
 * Every tensor (in the given order: manifest order on the trainer, plan order
 * on receivers) is cut into segments of AGENT_WEIGHTS_SEGMENT_ELEMS elements
 * (the last one shorter); each segment's wire-dtype bytes get an XXH3-64
 * digest, and the checksum is XXH3-64 over the array of digests (64-bit,
 * little-endian, in order). Segments are independent, so several threads
 * hash a model at once; a trainer and its receivers compute the same value
 * whatever their thread counts. The bytes are produced chunk by chunk (never a
 * full copy of the model): host tensors are cast on the CPU, GPU tensors are
 * copied back through pinned bounce buffers first. */
#ifndef RLORCH_AGENT_WEIGHTS_H
#define RLORCH_AGENT_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "workers/bcast/bcast.h"

typedef enum {
  AGENT_WEIGHTS_STORAGE = 1, /* data is in storage_dtype (the sender's master copy) */
  AGENT_WEIGHTS_WIRE = 2     /* data is already in wire_dtype (a receiver's buffers) */
} agent_weights_src;

#define AGENT_WEIGHTS_SEGMENT_ELEMS (UINT64_C(1) << 22)

/* 0 and *out, or -1 with a message naming the tensor in err. */
int agent_weights_checksum(const bcast_tensor *t, size_t n, agent_weights_src src,
                           uint64_t *out, char *err, size_t errlen);

#endif
