/* parts: the parts of the model an inference worker holds (tensor or expert
 * parallel, RegisterRequest.parts) as the planner takes them, and the
 * checks Register and the planner apply to them. */
#ifndef RLORCH_DAEMON_PARTS_H
#define RLORCH_DAEMON_PARTS_H

#include <stddef.h>

#include "rlorch/v1/broadcast.pb-c.h"
#include "workers/bcast/bcast.h"

/* The request's parts as the engine's specs, pointing at the messages' names
 * (valid while they are). Refused, naming parts[i] and the field: an empty
 * or too long name, a name listed twice, an unknown kind, a slice with count
 * 0 or a dim of BCAST_MAX_DIMS or more, more than max_parts parts (0: no
 * limit). 0, or -1 with the reason in err (and *out NULL). n 0 gives NULL. */
int parts_from_pb(Rlorch__V1__TensorPart *const *parts, size_t n, size_t max_parts,
                  bcast_part_spec **out, char *err, size_t errlen);

/* The same parts against the tensors of a manifest: every name is one of
 * them, every slice lies inside its tensor's shape, and something is left
 * to receive. The engine's own rules (a plan built with this view). 0, or -1
 * with the reason in err. */
int parts_fit(const bcast_tensor *t, size_t nt, const bcast_part_spec *specs, size_t n,
              char *err, size_t errlen);

#endif
