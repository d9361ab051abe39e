/* Conversions between the broadcast engine's structs and the rlorch.v1
 * protobuf messages (schemas/rlorch/v1/broadcast.proto).
 *
 * Messages made here (bcast_*_to_pb) are heap trees built by this module:
 * release them with bcast_pb_free() (never with protobuf-c's
 * *__free_unpacked).  Messages from protobuf-c's *__unpack stay the caller's.
 * Everything from_pb returns is validated; a plan whose hash does not match
 * its contents is refused with BCAST_EMISMATCH. */
#ifndef RLORCH_BCAST_PB_H
#define RLORCH_BCAST_PB_H

#include "rlorch/v1/broadcast.pb-c.h"
#include "workers/bcast/bcast.h"

#ifdef __cplusplus
extern "C" {
#endif

int bcast_plan_to_pb(const bcast_plan *p, Rlorch__V1__BroadcastPlan **out, bcast_err *err);
int bcast_plan_from_pb(const Rlorch__V1__BroadcastPlan *m, bcast_plan **out, bcast_err *err);

/* The manifest's tensors (data pointers are not carried; from_pb leaves them
 * NULL).  *out from from_pb is one malloc'd array: free() it. */
int bcast_manifest_to_pb(const bcast_tensor *t, size_t n, Rlorch__V1__WeightManifest **out,
                         bcast_err *err);
int bcast_manifest_from_pb(const Rlorch__V1__WeightManifest *m, bcast_tensor **out, size_t *n,
                           bcast_err *err);
/* The manifest's rules (bcast_manifest_check) on the message itself, without
 * converting it, plus its own fields: a preset longer than 63 bytes or an
 * unknown offload is refused.  from_pb applies them with the engine's bounds. */
int bcast_manifest_check_pb(const Rlorch__V1__WeightManifest *m, const bcast_manifest_limits *lim,
                            bcast_err *err);
/* The same rules on a list of specs (a plan's tensors). */
int bcast__specs_check(Rlorch__V1__TensorSpec *const *specs, size_t n,
                       const bcast_manifest_limits *lim, bcast_err *err);

/* Fills the broadcast fields of a step record (mode, transport, bytes,
 * seconds, exposed staging, GB/s, buckets, bucket_timings) and leaves the
 * others (run_id, step, train and rollout fields, ...) as they were.  The
 * bucket timings are allocated: release with bcast_pb_step_record_clear(). */
int bcast_stats_to_step_record(const bcast_stats *s, Rlorch__V1__StepRecord *rec, bcast_err *err);
void bcast_pb_step_record_clear(Rlorch__V1__StepRecord *rec);

/* Frees a message made by bcast_plan_to_pb or bcast_manifest_to_pb. */
void bcast_pb_free(ProtobufCMessage *m);

/* Convenience: wire bytes.  pack returns a malloc'd buffer; unpack validates
 * like from_pb. */
int bcast_plan_pack(const bcast_plan *p, uint8_t **buf, size_t *len, bcast_err *err);
int bcast_plan_unpack(const uint8_t *buf, size_t len, bcast_plan **out, bcast_err *err);

#ifdef __cplusplus
}
#endif
#endif
