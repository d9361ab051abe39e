/* agent_weights: the checksum a worker reports for the weights it holds.
 *
 * XXH3-64 over the wire-dtype bytes of every tensor, concatenated in the given
 * order (manifest order on the trainer, plan order on receivers). The bytes
 * are produced chunk by chunk (never a full copy of the model): host tensors
 * are cast on the CPU, GPU tensors are copied back through a bounce buffer
 * first. The result equals bcast_checksum64 over one buffer holding every
 * tensor cast to its wire dtype. */
#ifndef RLORCH_AGENT_WEIGHTS_H
#define RLORCH_AGENT_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "workers/bcast/bcast.h"

typedef enum {
  AGENT_WEIGHTS_STORAGE = 1, /* data is in storage_dtype (the sender's master copy) */
  AGENT_WEIGHTS_WIRE = 2     /* data is already in wire_dtype (a receiver's buffers) */
} agent_weights_src;

/* 0 and *out, or -1 with a message naming the tensor in err. */
int agent_weights_checksum(const bcast_tensor *t, size_t n, agent_weights_src src,
                           uint64_t *out, char *err, size_t errlen);

#endif
