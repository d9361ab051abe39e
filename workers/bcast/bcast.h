/* The broadcast engine: moves a trainer's weights to every inference engine.
 *
 * Public surface of the library (rlorch_bcast). Usable without the orchestrator:
 * a trainer describes its tensors by pointer, builds a plan, and every
 * participant executes the same plan with an engine.
 *
 * Errors are negative BCAST_E* codes; functions that can fail also fill a
 * bcast_err whose message names the tensor or bucket at fault.
 * Ownership: every bcast_* object is created by a *_new or *_build function and
 * released by the matching *_free; the tensors' memory always stays the caller's. */
#ifndef RLORCH_BCAST_H
#define RLORCH_BCAST_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ------------------------------------------------------------- */
enum {
  BCAST_OK = 0,
  BCAST_EINVAL = -1,    /* invalid manifest, plan or argument */
  BCAST_ENOMEM = -2,    /* host or device allocation failed */
  BCAST_EIO = -3,       /* socket or file error */
  BCAST_ETIMEDOUT = -4, /* a deadline passed (peer missing, stalled transfer) */
  BCAST_ENOTSUP = -5,   /* mode or dtype not available in this build or on this machine */
  BCAST_ECUDA = -6,     /* CUDA runtime error */
  BCAST_ENCCL = -7,     /* NCCL error */
  BCAST_EPEER = -8,     /* a peer went away or refused the plan */
  BCAST_ECHECKSUM = -9, /* received bytes do not match the bucket checksum */
  BCAST_EMISMATCH = -10, /* participants disagree on the plan (hash) */
  BCAST_ECANCELED = -11  /* the plan was cancelled (bcast_engine_cancel) */
};
const char *bcast_strerror(int code);

typedef struct bcast_err {
  int code;
  char msg[512];
} bcast_err;

/* ---- element types, residency, modes (values equal the rlorch.v1 enums) --- */
typedef enum {
  BCAST_DTYPE_FP32 = 1,
  BCAST_DTYPE_BF16 = 2,
  BCAST_DTYPE_FP16 = 3,
  BCAST_DTYPE_U16 = 4 /* raw 16-bit integers, never cast */
} bcast_dtype;

typedef enum {
  BCAST_RES_GPU = 1,
  BCAST_RES_HOST_PINNED = 2,
  BCAST_RES_HOST_PAGEABLE = 3
} bcast_residency;

typedef enum {
  BCAST_MODE_DIRECT = 2,
  BCAST_MODE_STAGED = 3,
  BCAST_MODE_HOST = 4,
  BCAST_MODE_COLOCATED = 5 /* receivers on the sender's GPU: writes through CUDA IPC */
} bcast_mode;

size_t bcast_dtype_size(bcast_dtype d);           /* 0 for an unknown dtype */
const char *bcast_dtype_name(bcast_dtype d);      /* "fp32", "bf16", "fp16", "u16" */
const char *bcast_mode_name(bcast_mode m);        /* "direct", "staged", "host", "colocated" */
/* 1 when a plan may carry a tensor stored as `from` on the wire as `to`:
 *   fp32 -> fp32 | bf16 | fp16   (narrowing casts round to nearest even)
 *   bf16 -> bf16, fp16 -> fp16, u16 -> u16   (bytes copied as they are)
 * Everything else is refused: u16 never mixes with floats, bf16 <-> fp16 would
 * round twice, and widening (bf16/fp16 -> fp32) doubles the wire bytes for no
 * information; receivers that want fp32 widen locally (bcast_cast_cpu can). */
int bcast_cast_supported(bcast_dtype from, bcast_dtype to);

/* ---- tensors ------------------------------------------------------------ */
#define BCAST_MAX_DIMS 8
#define BCAST_NAME_MAX 128

/* A receiver's part of one tensor (see "receiver views" below). */
typedef enum { BCAST_PART_WHOLE = 0, BCAST_PART_SLICE = 1, BCAST_PART_NONE = 2 } bcast_part_kind;
typedef struct bcast_part {
  int kind;        /* bcast_part_kind */
  uint32_t dim;    /* BCAST_PART_SLICE: the dimension cut */
  uint64_t start;  /* BCAST_PART_SLICE: first index along dim */
  uint64_t count;  /* BCAST_PART_SLICE: indices along dim, >= 1 */
} bcast_part;

typedef struct bcast_tensor {
  char name[BCAST_NAME_MAX];
  uint32_t layer;
  bcast_dtype storage_dtype; /* sender: dtype of `data`; receiver: ignored */
  bcast_dtype wire_dtype;    /* dtype on the wire and in receivers' buffers */
  uint32_t ndim;
  uint64_t shape[BCAST_MAX_DIMS];
  bcast_residency residency; /* where `data` lives */
  void *data;                /* sender: storage; receiver: destination in wire dtype; may
                                be NULL when only planning */
  int device;                /* CUDA device of GPU-resident data */
  /* A sender's shard (FSDP, ZeRO): `data` holds elements [shard_offset,
   * shard_offset + shard_elems) of the full tensor, row-major, whose shape is
   * `shape`.  0/0 (or 0 and the element count) is the whole tensor.  Only a
   * host-mode sender may hold a shard; receivers and the GPU modes want
   * whole tensors, and a plan never describes a shard. */
  uint64_t shard_offset;
  uint64_t shard_elems;
  /* A receiver's part (tensor or expert parallel, see "receiver views"):
   * which part of the tensor `data` holds, dense and row-major in the part's
   * own shape. Zero (BCAST_PART_WHOLE): the whole tensor. Must equal the
   * part the plan's view gives this receiver; senders leave it zero. */
  bcast_part part;
} bcast_tensor;

/* ---- receiver views: receivers that hold part of the model ------------------
 * A tensor-parallel engine rank holds a slab of some 2-D weights (rows:
 * column-parallel, dim 0; columns: row-parallel, dim 1) and whole copies of
 * the small ones; an expert-parallel rank holds some experts' tensors whole
 * and none of the others.  A part is one of:
 *   WHOLE  every element (the default, zero);
 *   SLICE  indices [start, start + count) along dimension `dim`, every index
 *          of the other dimensions; held dense, in the full shape with
 *          shape[dim] replaced by count, row-major;
 *   NONE   nothing: the receiver does not hold the tensor (and need not
 *          list it among its local tensors).
 * A plan gives each receiver rank a view (one part per plan tensor) and
 * delivers it exactly its parts: on the host transport every source sends a
 * receiver only the bytes of its view, packed, in plan order (slice by slice
 * of every bucket, each slice restricted to the part, in increasing element
 * order). */

/* The elements of `t` (full shape) that part `pt` holds; 0 for NONE. */
uint64_t bcast_part_elems(const bcast_tensor *t, const bcast_part *pt);

/* What a receiver asks for, by tensor name: tensors it does not list are
 * received whole. */
typedef struct bcast_part_spec {
  const char *name;
  bcast_part part;
} bcast_part_spec;

typedef struct bcast_receiver_view {
  const bcast_part_spec *parts;
  size_t nparts;
} bcast_receiver_view;

/* No view: the rank holds every tensor whole (every source, and receivers
 * that asked for nothing). */
#define BCAST_VIEW_WHOLE 0xffffffffu

uint64_t bcast_tensor_elems(const bcast_tensor *t);
/* Elements `t` holds itself: shard_elems, or the whole tensor when 0. */
uint64_t bcast_tensor_held(const bcast_tensor *t);

/* ---- the rules of a manifest (bcast_manifest.c) --------------------------
 * One set of rules for every list of tensors: what a trainer registers, what
 * its step reports carry, what a plan is built from and what a received plan
 * describes.  Refused, naming the tensor by index and name and the field:
 *   - more than max_manifest_tensors tensors (checked before anything else);
 *   - a name that is empty, holds a control character, or is longer than
 *     BCAST_NAME_MAX - 1 bytes; a name two tensors share (both indices named);
 *   - a shape of no or more than BCAST_MAX_DIMS dimensions, a dimension of 0,
 *     an element count that overflows 64 bits;
 *   - an unknown storage or wire dtype, a pair with no cast
 *     (bcast_cast_supported), an unknown residency;
 *   - a size (elements times the larger of the two element sizes) that
 *     overflows or exceeds max_tensor_bytes; sizes summed over max_manifest_bytes.
 * A limit of 0 is the engine's own bound: BCAST_MAX_TENSORS tensors (plans
 * index them with 32 bits), BCAST_MAX_TENSOR_BYTES a tensor, no total. Larger
 * limits are clamped to those bounds. */
#define BCAST_MAX_TENSORS 0xffffffffull
typedef struct bcast_manifest_limits {
  uint64_t max_manifest_tensors;
  uint64_t max_tensor_bytes;
  uint64_t max_manifest_bytes;
} bcast_manifest_limits;

/* BCAST_OK, BCAST_EINVAL with the first rule broken, BCAST_ENOMEM. */
int bcast_manifest_check(const bcast_tensor *t, size_t n, const bcast_manifest_limits *lim,
                         bcast_err *err);

/* ---- shards: several source ranks, each holding part of every tensor ------
 * bcast_shards_check takes every source rank's tensor list (ranks[r], n[r]
 * tensors, as that rank describes its shards) and checks that together they
 * describe one model exactly:
 *   - each list passes bcast_manifest_check (the error is prefixed with
 *     "source rank R: "), and each tensor's range lies inside its shape;
 *   - every rank that holds part of a tensor gives it the same shape, layer,
 *     storage dtype and wire dtype; else
 *       "tensor 'W': rank A and rank B disagree on FIELD (X vs Y)"
 *     with FIELD shape, layer, storage_dtype or wire_dtype;
 *   - the ranges of all ranks tile [0, elements) exactly; else
 *       "tensor 'W': elements [X, Y) are held by no rank (gap after rank A,
 *        before rank B)"   (A is "the start", B "the end" at either edge)
 *       "tensor 'W': rank A holds [X, Y) and rank B holds [U, V): they overlap"
 * One sort of all pieces by (name, offset): n log n in the pieces, no pairwise
 * comparison of ranks.  On success *out is the global view the planner takes
 * (bcast_plan_build_sharded) and the orchestrator can keep. */
typedef struct bcast_piece {
  uint32_t rank;         /* source rank holding the range */
  uint64_t elem_offset;  /* first element of the full tensor */
  uint64_t elem_count;
} bcast_piece;

typedef struct bcast_shard_map {
  uint32_t nranks;
  bcast_tensor *tensors; /* the full tensors, in order of first appearance (rank 0's
                            order, then what later ranks add); no data, no shard */
  size_t ntensors;
  bcast_piece *pieces;   /* tensor i's pieces are pieces[first[i] .. first[i + 1]),
                            by offset */
  size_t *first;         /* ntensors + 1 entries */
  size_t npieces;
} bcast_shard_map;

/* BCAST_OK, BCAST_EINVAL naming the tensor, ranks and field or offsets,
 * BCAST_ENOMEM.  lim applies to each rank's list (NULL: the engine's bounds). */
int bcast_shards_check(const bcast_tensor *const *ranks, const size_t *n, size_t nranks,
                       const bcast_manifest_limits *lim, bcast_shard_map **out, bcast_err *err);
void bcast_shard_map_free(bcast_shard_map *m);
/* The same rules on the ranks heard from so far (absent ones with n[r] 0):
 * everything but gaps, which only the whole group can show. No map. */
int bcast_shards_check_partial(const bcast_tensor *const *ranks, const size_t *n, size_t nranks,
                               const bcast_manifest_limits *lim, bcast_err *err);

/* ---- plans -------------------------------------------------------------- */
typedef struct bcast_slice {
  uint32_t tensor;       /* index into plan->tensors */
  uint64_t elem_offset;  /* first element of the tensor in this slice */
  uint64_t elem_count;
  uint64_t bucket_offset; /* byte offset in the bucket's wire buffer */
} bcast_slice;

typedef struct bcast_bucket {
  uint32_t index;  /* also its position on the wire of its source */
  uint32_t layer;
  bcast_dtype wire_dtype;
  uint64_t bytes;
  uint32_t source_rank; /* rank that sends this bucket */
  uint32_t stage_rank;  /* rank that stages its host-resident slices */
  bcast_slice *slices;
  size_t nslices;
} bcast_bucket;

typedef enum { BCAST_CHECKSUM_NONE = 1, BCAST_CHECKSUM_XXH3_64 = 2 } bcast_checksum;

/* The plan hash (XXH3 64 over a canonical little-endian serialisation) covers
 * everything every participant must agree on to move the same bytes to the
 * same places: id, mode, world_size, root_rank, staging_budget, checksum kind,
 * policy_version, the NCCL id when present, every tensor's name, layer,
 * storage dtype (it decides the wire bits), wire dtype and shape, and every
 * bucket and slice.  It deliberately leaves out what is local or advisory:
 * residency (where the sender keeps its storage changes how, not what, it
 * sends), data pointers and devices, deadline_unix_ms, host_endpoint,
 * mode_reason, min_gbps, the source endpoints and the data-channel secret.
 * relay_from is covered only when set, so a plan without relays hashes as
 * it did before there were relays; the relay endpoints are not covered.
 * nsources is covered only when above 1, so a one-source plan hashes as it
 * did before there were several; which source sends what is covered through
 * every bucket's source_rank.  The secret stays out on
 * purpose: the hash travels in acks and triggers and is logged, and XXH3 is
 * not one-way, so nothing derived from a secret may be published.  A
 * participant that holds another secret learns it at the handshake (the root
 * does not accept it), not from the hash.  After changing a covered field,
 * recompute `hash`.
 *
 * The secret: BCAST_SECRET_BYTES random bytes (getrandom) drawn by
 * bcast_plan_build for every plan, unless the options bring their own.  The
 * host transport's handshake is a challenge-response over it (bcast_host.c),
 * so only holders of the plan can connect to the root or feed a receiver:
 * give the plan to its participants only, over an authenticated channel.
 *
 * Layout: buckets group one layer and one wire dtype; tensors keep manifest
 * order within a group, groups run by layer then wire dtype.  Every slice
 * starts at a 256-byte aligned offset (BCAST_ALIGN); the bytes between the end
 * of one slice and the next aligned offset are padding, sent as zeros, and
 * are the only "gaps" a valid plan has.  A tensor larger than the budget is
 * cut into element ranges over consecutive buckets.
 *
 * Several sources (nsources S > 1, bcast_plan_build_sharded): ranks 0..S-1
 * send, ranks S..world_size-1 receive, root_rank is 0.  A bucket carries
 * slices of its source_rank's pieces only; within a layer and wire dtype
 * each source's buckets are laid out as above, then interleaved round-robin
 * by source (source 0's first, source 1's first, ..., source 0's second,
 * ...), so that every source has a bucket to send at once.  The slices of a
 * tensor split over sources are thus not in element order across buckets;
 * validation checks that they tile the tensor, in any order. */
#define BCAST_ALIGN 256u
#define BCAST_MAX_TENSOR_BYTES (1ull << 50)

typedef struct bcast_plan {
  char id[128];
  uint64_t hash; /* bcast_plan_hash() of the covered fields (see above) */
  bcast_mode mode;
  bcast_tensor *tensors; /* descriptions only: data pointers are NULL in a plan */
  size_t ntensors;
  bcast_bucket *buckets;
  size_t nbuckets;
  uint8_t nccl_id[128];
  int has_nccl_id;
  uint32_t world_size;
  uint32_t root_rank;
  uint64_t staging_budget;   /* largest bucket, in wire bytes */
  int64_t deadline_unix_ms;  /* 0: none */
  uint64_t policy_version;
  char host_endpoint[256];   /* host mode: where the root listens */
  bcast_checksum checksum;
  char mode_reason[256];
  /* Host transport: 1 to run TLS 1.3 over every data connection once the
   * handshake authenticated it, keyed from the plan's secret (bcast_host.c),
   * so the weights are also encrypted and integrity-protected on the wire. */
  int tls;
  /* Source ranks 0..nsources-1 (0 or 1: one, the root).  Covered by the hash
   * when above 1. */
  uint32_t nsources;
  /* Receiver views (see "receiver views"): nviews distinct views, view v's
   * part of tensor i at view_parts[v * ntensors + i]; rank_view[r] (world_size
   * entries) is rank r's view or BCAST_VIEW_WHOLE (every source's).  nviews 0:
   * every receiver holds every tensor whole, view_parts and rank_view NULL.
   * Builders keep one view per distinct set of parts, in order of the first
   * rank that has it, and never make a view of all-WHOLE parts.  Covered by
   * the hash when nviews > 0 (every part and every rank's view). */
  uint32_t nviews;
  bcast_part *view_parts;
  uint32_t *rank_view;
  /* Host-transport relays (see "relays" below): world_size entries, the rank
   * each rank takes its bytes from (a source's entry is its own rank), or
   * NULL: every receiver takes from the source.  Covered by the hash when
   * not NULL. */
  uint32_t *relay_from;
  /* Fields below are not covered by the hash (see above). */
  /* With relay_from: world_size strings (malloc'd, owned by the plan), where
   * each relaying receiver listens ("host:port"), "" for every other rank. */
  char **relay_endpoints;
  /* Host mode with nsources > 1: where each source listens, nsources
   * strings (malloc'd, owned by the plan; entry 0 equals host_endpoint);
   * NULL for a one-source plan, whose source is at host_endpoint. */
  char **source_endpoints;
  uint8_t secret[32];        /* data-channel secret, BCAST_SECRET_BYTES */
  int has_secret;            /* 0: a plan from elsewhere that carried none */
  double min_gbps;           /* slowest healthy throughput, 1e9 bytes/s summed over
                                receivers (the cost model's rate over its safety
                                factor); a transfer slower than that is cut off.
                                0: none, engine timeout_s per bucket */
} bcast_plan;

#define BCAST_SECRET_BYTES 32

typedef struct bcast_plan_opts {
  const char *id;
  bcast_mode mode;
  uint64_t staging_budget; /* bytes per bucket, in wire bytes; 0: 256 MiB */
  uint32_t world_size;     /* participants, root included */
  uint32_t root_rank;
  uint64_t policy_version;
  int64_t deadline_unix_ms;
  const char *host_endpoint;
  bcast_checksum checksum;  /* 0: XXH3_64 */
  const uint8_t *secret;    /* BCAST_SECRET_BYTES, or NULL: fresh from getrandom */
  double min_gbps;          /* see bcast_plan.min_gbps; 0: none */
  int tls;                  /* see bcast_plan.tls */
  const bcast_manifest_limits *limits; /* the manifest's (bcast_manifest_check); NULL: the
                                          engine's own bounds */
  /* bcast_plan_build_sharded: each source's data address ("host:port"),
   * the map's nranks of them, or NULL (filled in later, as host_endpoint). */
  const char *const *source_endpoints;
  /* Receiver views: world_size entries indexed by rank, or NULL (every
   * receiver whole). An entry with no parts is a whole receiver; a source's
   * entry must have none. Each part is resolved against the plan's tensors by
   * name and refused, naming the rank, the tensor and the field, when the
   * name is unknown or listed twice, dim >= ndim, count 0, start + count past
   * shape[dim], or the kind is unknown. A view that leaves a receiver
   * nothing at all is refused too. */
  const bcast_receiver_view *receiver_views;
  /* Relays (bcast_plan_set_relays): world_size entries each, or NULL. */
  const uint32_t *relay_from;
  const char *const *relay_endpoints;
} bcast_plan_opts;

/* ---- relays: receivers that forward what they receive ----------------------
 * On the host transport the source's link carries one copy per receiver it
 * serves.  With relays, a receiver (one per node, say) takes the bytes from
 * the source and forwards each bucket, as soon as it has verified it, to
 * the receivers that take from it (its downstreams, on its node), which may
 * relay again (a chain or a tree).  relay_from[r] is the rank r takes from:
 * the source, or a receiver that relays; relay_endpoints[r] is where a
 * relaying receiver r listens (its engine's host_listen, reported as its
 * data address).  A downstream connects to its upstream exactly as to a
 * source (same handshake, secret, TLS), and a relay serves its downstreams
 * as a source does (same bounds on strangers and stalls).
 *
 * Supported: host mode, one source, whole receivers.  Refused with
 * BCAST_EINVAL naming the field: an entry out of range, a receiver taking
 * from itself, a source taking from anyone but itself, a cycle (a chain that
 * never reaches the source), relays in another mode, with several sources or
 * with receiver views, an endpoint missing for a relaying receiver, an
 * endpoint given to a rank no one takes from, entries that are not
 * world_size long (pb).
 *
 * What success means: a relay confirms to its upstream only once it has
 * verified every bucket and every downstream confirmed, so the source's
 * BCAST_OK means every receiver of the tree holds every bucket verified.
 * A downstream that fails (or never connects) fails its relay, whose error
 * names it and which tells its upstream why (the ACK carries the message);
 * a relay whose upstream fails tells its downstreams at once (an ABORT
 * frame with the reason, or the connection closed mid-bucket), so none
 * waits for the deadline.  Every rank reports its own stats (a relay: as a
 * receiver) and its own checksum.
 *
 * The planner's entry (the orchestrator's runner): build the plan as usual,
 * then bcast_plan_set_relays with the layout and the relays' data
 * addresses, or pass both in bcast_plan_opts; either validates the layout
 * and recomputes the hash.  relay_from NULL clears the relays. */
int bcast_plan_set_relays(bcast_plan *p, const uint32_t *relay_from, const char *const *relay_endpoints,
                          bcast_err *err);
/* One relay per node, the layout that has the source's NIC carry the model
 * once per node: node[r] names rank r's node (labels compared as strings).
 * Receivers on the source's node take from the source; on every other node
 * with two or more receivers, the first one that can relay (can_relay[r]
 * non-zero; NULL: every one can, e.g. it has a data address) takes from the
 * source and the others on that node take from it; a node where none can
 * takes from the source.  Fills relay_from (world_size entries) and
 * returns the number of relays; give the relays' data addresses to
 * bcast_plan_set_relays with it. */
uint32_t bcast_relay_layout(uint32_t world_size, uint32_t root, const char *const *node, const int *can_relay,
                            uint32_t *relay_from);
/* The rank `rank` takes its bytes from: relay_from[rank], or the root when
 * the plan has no relays (or rank is out of range). */
uint32_t bcast_plan_upstream(const bcast_plan *p, uint32_t rank);
/* Where `rank` connects to take its bytes: its upstream's relay endpoint,
 * or the source's (host_endpoint). */
const char *bcast_plan_upstream_endpoint(const bcast_plan *p, uint32_t rank);
/* Receivers that take their bytes from `rank` (its downstreams); without
 * relays, every receiver for the root and 0 for the others. */
uint32_t bcast_plan_downstreams(const bcast_plan *p, uint32_t rank);

/* Buckets per layer and per wire dtype, slices concatenated at fixed offsets,
 * split so no bucket exceeds the budget; validates the manifest first.  Draws
 * the plan's secret unless opts->secret is given (BCAST_EIO if the kernel
 * gives no randomness). */
int bcast_plan_build(const bcast_tensor *tensors, size_t n, const bcast_plan_opts *opts,
                     bcast_plan **out, bcast_err *err);
/* A plan whose sources are the map's ranks (bcast_shards_check): every piece
 * becomes slices of buckets whose source_rank is the rank holding it.  The
 * map's nranks is the plan's nsources; world_size counts the sources and the
 * receivers, root_rank must be 0.  A map of one rank holding whole tensors
 * gives the plan bcast_plan_build gives for its tensors, hash included. */
int bcast_plan_build_sharded(const bcast_shard_map *m, const bcast_plan_opts *opts,
                             bcast_plan **out, bcast_err *err);
/* Also refuses, naming them: a bad relay layout (see "relays"), nsources >= world_size, root_rank other than 0
 * with several sources, a bucket whose source_rank >= nsources, a stage rank
 * other than its source, an empty or too long source endpoint, and
 * endpoints that contradict host_endpoint. */
int bcast_plan_validate(const bcast_plan *p, bcast_err *err);
/* Rank `rank`'s part of tensor `tensor` (NULL when out of range); a static
 * WHOLE part for ranks without a view. */
const bcast_part *bcast_plan_part(const bcast_plan *p, uint32_t rank, size_t tensor);
/* The view rank `rank` holds: its index below nviews, or BCAST_VIEW_WHOLE. */
uint32_t bcast_plan_rank_view(const bcast_plan *p, uint32_t rank);
/* Wire bytes a receiver of view `view` (BCAST_VIEW_WHOLE: whole) gets from
 * source `source` (UINT32_MAX: from all of them), padding left out. */
uint64_t bcast_plan_view_bytes(const bcast_plan *p, uint32_t view, uint32_t source);
/* Where source `rank` of a host-mode plan listens ("" if the plan has none). */
const char *bcast_plan_source_endpoint(const bcast_plan *p, uint32_t rank);
/* How many sources send the plan: nsources, 1 when 0. */
int bcast_plan_sources(const bcast_plan *p);
uint64_t bcast_plan_hash(const bcast_plan *p);
void bcast_plan_free(bcast_plan *p);
uint64_t bcast_plan_wire_bytes(const bcast_plan *p);
/* A participant's local tensors must match the plan by name, shape and dtype. */
int bcast_plan_check_local(const bcast_plan *p, const bcast_tensor *local, size_t n,
                           int sender, bcast_err *err);
/* A receiver rank's local tensors against its view: every tensor whose part
 * is not NONE is there with the plan's (full) shape and wire dtype, and its
 * `part` equals the view's; NONE tensors may be absent.  What
 * bcast_engine_execute checks on a receiver of a plan with views; for a rank
 * without a view it is bcast_plan_check_local. */
int bcast_plan_check_receiver(const bcast_plan *p, uint32_t rank, const bcast_tensor *local,
                              size_t n, bcast_err *err);
/* A source rank's local tensors (whole, or shards) against the plan: each
 * tensor its buckets carry is there, by name, shape and storage dtype, and
 * holds every element range they carry; tensors it sends nothing of may be
 * absent.  What bcast_engine_execute checks on a host-mode source. */
int bcast_plan_check_source(const bcast_plan *p, uint32_t rank, const bcast_tensor *local, size_t n,
                            bcast_err *err);
/* The checksum of source rank `source`'s part of the plan (bcast_sum.c):
 * XXH3 64 streamed over the wire-dtype bytes of its slices, bucket by
 * bucket in plan order, slices in bucket order, padding left out (one
 * source: every bucket). Each slice is read from the `local` tensor of its
 * name, which must hold its range (a shard's shard_offset is honoured): in
 * the wire dtype when `wire` (a receiver after the broadcast), else in its
 * storage dtype, cast as the engine casts (a source). GPU-resident data is
 * read a chunk at a time through host memory (BCAST_ENOTSUP in a build
 * without CUDA, BCAST_ECUDA when a copy fails). The same bytes give the
 * same value on both sides, so a receiver that reports it for every source
 * proves it holds every source's part. BCAST_EINVAL naming a tensor that is
 * missing or short, BCAST_ENOMEM. */
int bcast_plan_source_checksum(const bcast_plan *p, uint32_t source, const bcast_tensor *local,
                               size_t n, int wire, uint64_t *out, bcast_err *err);
/* The same over view `view`'s parts only (BCAST_VIEW_WHOLE: the function
 * above): the bytes a receiver of that view gets from `source`, in the order
 * it gets them (each slice restricted to the part, in element order).  A
 * receiver reads its local part tensors (`wire`); a source reads its shard
 * and computes one per view of the plan, so each receiver's sum is compared
 * with its source's sum for the receiver's view. */
int bcast_plan_view_checksum(const bcast_plan *p, uint32_t source, uint32_t view,
                             const bcast_tensor *local, size_t n, int wire, uint64_t *out,
                             bcast_err *err);
/* Sets the NCCL unique id and recomputes the hash (the id is covered). */
void bcast_plan_set_nccl_id(bcast_plan *p, const uint8_t id[128]);
/* Deep copy (tensors, buckets, slices); NULL when out of memory. */
bcast_plan *bcast_plan_dup(const bcast_plan *p);

/* ---- cost model: how long a plan may take (bcast_cost.c) ------------------
 * Every wait on a plan is bounded by what its bytes cost at the slowest rate
 * its mode is expected to give, times a safety factor, plus slack:
 *
 *   rate        = gbps[mode], or the rate measured for the mode when lower
 *   wire_s      = wire_bytes * fanout / (rate * 1e9)
 *                 fanout: the receivers in host mode (the root's link carries
 *                 one copy per receiver), 1 in the NCCL modes (pipelined)
 *   broadcast_s = safety * wire_s + slack_s + detect_s
 *   ack_s       = safety * wire_bytes / (prepare_gbps * 1e9) + slack_s + detect_s
 *   min_gbps    = rate / safety  (the engine cuts off a slower transfer)
 *
 * detect_s is how long the orchestrator takes to declare a silent
 * participant lost (its worker timeout): no deadline passes before a hung
 * participant is lost, so its step is re-planned without it instead of the
 * run failing on a timeout.  A measured rate only ever lowers the rate used
 * (lengthens deadlines): a fast step must not make the next one's jitter
 * fatal. */
typedef struct bcast_cost_model {
  double gbps[BCAST_MODE_COLOCATED + 1]; /* expected floor per mode (index: bcast_mode), GB/s
                                           (1e9 B/s) */
  double prepare_gbps; /* receivers preparing a plan (receive buffers), GB/s */
  double safety;       /* >= 1 */
  double slack_s;      /* fixed costs: commands, connections, first touches */
  double detect_s;     /* time to declare a silent participant lost */
} bcast_cost_model;

typedef struct bcast_cost {
  double rate_gbps;    /* the rate used */
  int measured;        /* 1: the measured rate was lower than the model's */
  double wire_s;       /* expected time on the wire at that rate */
  double ack_s, broadcast_s;
  double min_gbps;
} bcast_cost;

/* host 0.5 GB/s (the root's TCP egress: a quarter of 10 GbE, a third of what
 * loopback gives), staged 5 GB/s (a tenth of the measured pinned PCIe floor),
 * direct 10 GB/s (one 100 Gb/s link between nodes; NVLink gives far more),
 * prepare 2 GB/s (receive buffers touched for the first time, one core),
 * safety 4, slack 2 s, detect 5 s (the daemon's default worker timeout). */
void bcast_cost_model_default(bcast_cost_model *m);
/* The bounds of one plan: `receivers` excludes the root; measured_gbps is the
 * rate a previous broadcast in this mode achieved in the same sense as
 * gbps[mode] (summed over receivers in host mode), 0 for none.
 * BCAST_EINVAL names the bad field of the model or argument. */
int bcast_cost_estimate(const bcast_cost_model *m, bcast_mode mode, uint64_t wire_bytes,
                        uint32_t receivers, double measured_gbps, bcast_cost *out, bcast_err *err);

/* ---- where a worker runs (bcast_systopo.c) ---------------------------------
 * What Capabilities.topology reports: the node, the NUMA node, the GPU's PCI
 * bus id and NVLink peers, the node's NICs. Detected from sysfs (under a
 * root a test may point at a fake tree) and, for the GPU, CUDA and NVML
 * (loaded at run time); configured where the system cannot say (a node name
 * shared by the containers of one machine, a NIC's shaped rate). */
#define BCAST_SYSTOPO_NODE_MAX 128    /* bytes of a node name, NUL included */
#define BCAST_SYSTOPO_MAX_NICS 32     /* NICs listed; more are counted in the note */
#define BCAST_SYSTOPO_MAX_PEERS 64    /* NVLink peers listed */
#define BCAST_SYSTOPO_MAX_GBITS 10000 /* the fastest NIC one may configure, Gb/s */

/* Topology fields set by configuration (bcast_systopo.configured). */
enum {
  BCAST_SYSTOPO_CONF_NODE = 1u << 0,     /* "node" */
  BCAST_SYSTOPO_CONF_NICS = 1u << 1,     /* "nics": the list replaced */
  BCAST_SYSTOPO_CONF_NIC_GBITS = 1u << 2 /* "nics.gbits": the detected NICs' speed set */
};

typedef struct bcast_systopo_nic {
  char name[32];  /* interface name */
  double gbits;   /* Gb/s (1e9 bits/s); 0: unknown */
  int numa_node;  /* -1: unknown */
  int rdma;       /* an InfiniBand or RoCE device */
  uint32_t mtu;   /* bytes; 0: unknown */
} bcast_systopo_nic;

typedef struct bcast_systopo {
  char node[BCAST_SYSTOPO_NODE_MAX]; /* default: the host id */
  int numa_node;                     /* the GPU's, else the CPUs'; -1: unknown */
  int gpu_numa_node, cpu_numa_node;  /* what numa_node is chosen from */
  char gpu_pci_bus_id[32];           /* "0000:3b:00.0"; "" without a GPU */
  uint32_t nvlinks;                  /* active NVLink links of the GPU */
  uint32_t n_nvlink_peers;
  char nvlink_peers[BCAST_SYSTOPO_MAX_PEERS][48]; /* GPU UUIDs */
  uint32_t n_nics;
  bcast_systopo_nic nics[BCAST_SYSTOPO_MAX_NICS];
  unsigned configured;               /* BCAST_SYSTOPO_CONF_* */
  double h2d_gbps;                   /* the GPU's pinned host-to-device GB/s, measured; 0: not */
  char note[256];                    /* what the node's probe could not tell, in words */
  char gpu_note[256];                /* the same of the GPU's (bcast_systopo_set_gpu resets it) */
} bcast_systopo;

/* What a worker's settings say instead of the system. Zero fields: detected.
 * nics needs nic_gbits (the configured NICs' speed); nic_gbits alone sets
 * the speed of every detected NIC. */
typedef struct bcast_systopo_config {
  const char *node; /* NULL: detected; else 1..BCAST_SYSTOPO_NODE_MAX-1 bytes */
  uint32_t nics;    /* 0: detected; else 1..BCAST_SYSTOPO_MAX_NICS NICs "nic0", ... */
  double nic_gbits; /* 0: detected; else in (0, BCAST_SYSTOPO_MAX_GBITS] */
} bcast_systopo_config;

/* Reads the node's NICs and the CPUs' NUMA node under sysfs_root ("/sys"),
 * names the node host_id; no GPU yet. Never fails: what cannot be read is
 * unknown, and the note says so. */
void bcast_systopo_probe(const char *sysfs_root, const char *host_id, bcast_systopo *t);
/* The worker's GPU: its PCI bus id (any case, a 4- or 8-digit domain; NULL or
 * "" for none) and that device's NUMA node under sysfs_root. Clears the
 * NVLink fields (bcast_caps_select_device fills them) and the measured
 * h2d_gbps (bcast_systopo_measure_h2d). */
void bcast_systopo_set_gpu(bcast_systopo *t, const char *sysfs_root, const char *pci_bus_id);
/* NVLink: the active links of t's GPU and which of the other visible GPUs
 * (n of them: PCI bus ids and UUIDs) it reaches over them, from NVML opened
 * at run time (dlopen "libnvidia-ml.so.1"). Without a GPU nothing; without
 * NVML, none known and the note says so. */
void bcast_systopo_set_nvlink(bcast_systopo *t, const char *const *bus_ids,
                              const char *const *uuids, size_t n);
/* The GPU's pinned host-to-device rate into t->h2d_gbps, measured once with
 * bcast_floor_h2d (BCAST_SYSTOPO_H2D_BYTES, best of BCAST_SYSTOPO_H2D_REPS):
 * tens of milliseconds at start. Device -1: nothing (0). A measurement that
 * cannot be made leaves 0 and says why in t->gpu_note. */
#define BCAST_SYSTOPO_H2D_BYTES (64ull << 20)
#define BCAST_SYSTOPO_H2D_REPS 5
void bcast_systopo_measure_h2d(bcast_systopo *t, int device);
/* BCAST_OK, or BCAST_EINVAL naming the bad setting in err and in *field
 * ("node", "nics", "nic_gbits": the caller's names for them differ). */
int bcast_systopo_config_check(const bcast_systopo_config *c, const char **field, bcast_err *err);
/* Checks c and applies it to t, recording what it set in t->configured. */
int bcast_systopo_configure(bcast_systopo *t, const bcast_systopo_config *c, const char **field,
                            bcast_err *err);
/* The names of t->configured's fields, for Capabilities.topology.configured:
 * up to 3 into names; returns how many. */
size_t bcast_systopo_configured_names(unsigned configured, const char *names[3]);
/* NICs grouped by speed, fastest first: "2x100G", "1x400G+1x25G", "1x?"
 * (unknown speed), "-" for none. */
const char *bcast_systopo_nic_summary(const double *gbits, size_t n, char *buf, size_t len);
/* Adds a remark about the GPU to t->gpu_note ("; " between remarks). */
void bcast_systopo_gpu_note(bcast_systopo *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The whole topology as logfmt fields, for the worker's start-up line. */
const char *bcast_systopo_describe(const bcast_systopo *t, char *buf, size_t len);

/* ---- capabilities --------------------------------------------------------- */
typedef struct bcast_caps {
  int cuda_built, nccl_built;   /* compiled in */
  int cuda_devices;             /* visible at run time (0 without a driver) */
  char cuda_version[32];        /* runtime version, "" without CUDA */
  char driver_version[32];
  char nccl_version[32];        /* "2.28.9", "" without NCCL */
  char gpu_name[128];           /* of device 0, or of the device bcast_caps_select_device chose */
  char gpu_uuid[48];            /* "GPU-xxxxxxxx-...", as nvidia-smi -L; "" without a device */
  char host_id[64];             /* this machine: its boot id, else its host name */
  uint64_t pinned_limit_bytes;  /* RLIMIT_MEMLOCK or physical memory */
  int cpu_threads;
  int cpu_avx2, cpu_avx512;     /* vector units the host casts use */
  char note[256];               /* why a mode is unavailable, in words */
  bcast_systopo topo;           /* where it runs: probed, then configured by the worker */
} bcast_caps;

void bcast_caps_probe(bcast_caps *caps);
/* Points gpu_name, gpu_uuid and the topology's GPU fields (bus id, NUMA
 * node, NVLink peers among the other visible GPUs) at `device` (the one a
 * worker uses); device -1, or one that is not visible, empties them.
 * Colocation is decided on gpu_uuid and host_id. */
void bcast_caps_select_device(bcast_caps *caps, int device);
/* 1 when the mode can run here; else 0 and a reason in `why`. */
int bcast_mode_available(const bcast_caps *caps, bcast_mode m, char *why, size_t whylen);

/* ---- timing --------------------------------------------------------------- */
typedef struct bcast_bucket_timing {
  uint32_t bucket;
  double h2d_s, cast_s, wire_s;
} bcast_bucket_timing;

typedef struct bcast_stats {
  bcast_mode mode;
  const char *transport;     /* "nccl", "host-tcp", "host-tls", "cuda-ipc" (static string) */
  uint64_t pcie_bytes;       /* host-to-device bytes */
  uint64_t wire_bytes;
  double h2d_s, cast_s, wire_s; /* sums over buckets of each stage */
  double total_s;            /* wall time of the whole broadcast */
  double wire_alone_s;       /* broadcast-alone time for the same bytes */
  int exposed_measured;      /* 1: wire_alone_s measured; 0: modelled */
  double exposed_s;          /* total_s - wire_alone_s, clamped at 0 */
  double gbps;               /* wire_bytes / total_s / 1e9 */
  uint32_t nbuckets;
  bcast_bucket_timing *buckets; /* nbuckets entries, owned; bcast_stats_free() */
  uint32_t refused_connections; /* host root: connections closed unauthenticated
                                   (wrong proof, silent past the handshake bound,
                                   evicted, malformed); they cost the plan nothing */
} bcast_stats;

void bcast_stats_free(bcast_stats *s);

/* ---- engine: one participant ---------------------------------------------- */
typedef struct bcast_engine bcast_engine;

typedef struct bcast_engine_opts {
  uint32_t rank;
  int device;              /* CUDA device, -1 for none */
  uint32_t staging_buffers; /* >= 2; 0: 3 */
  double timeout_s;        /* connect and per-bucket deadline; 0: 60 */
  const char *host_listen; /* host mode: where the root, or a receiver that relays, listens:
                              "127.0.0.1:0" etc. */
} bcast_engine_opts;

int bcast_engine_new(const bcast_engine_opts *o, bcast_engine **out, bcast_err *err);
void bcast_engine_free(bcast_engine *e);
/* Host mode root, or a receiver that may relay: the address actually bound
 * ("127.0.0.1:41234"); NULL for an engine opened without host_listen. */
const char *bcast_engine_data_address(const bcast_engine *e);
/* NCCL root: makes the unique id to put into the plan. */
int bcast_engine_nccl_id(bcast_engine *e, uint8_t id[128], bcast_err *err);
/* Executes the plan: the sender reads `local` (storage dtype), receivers write
 * `local` (wire dtype). Blocks until done, failed, or the deadline passed.
 * Host mode: the root (rank == root_rank) needs opts.host_listen; its listening
 * socket serves plan after plan.  Receivers connect to plan->host_endpoint
 * anew for each plan and present (plan id, hash, rank); a different plan is
 * refused on both sides with BCAST_EMISMATCH.  The root returns once every
 * receiver confirmed the last bucket.  With relays (see "relays") a
 * receiver connects to its upstream instead (bcast_plan_upstream_endpoint),
 * and a receiver that relays needs opts.host_listen too (BCAST_EINVAL
 * naming it otherwise); every receiver's confirmation still reaches the
 * root, through the relays' own.  Every wait is bounded by timeout_s
 * (connect, each bucket) and by plan->deadline_unix_ms.  Stats: wire_bytes
 * counts the plan's bytes once (what each receiver gets); on the root cast_s
 * is cast + checksum, on receivers verify + scatter; exposed_s = total_s -
 * wire_s (measured).  transport is "host-tcp" in host mode.
 * Several sources (bcast_plan.nsources > 1, host and colocated mode; colocated
 * below): in host mode each source rank
 * (rank < nsources, each with its own host_listen) sends only its buckets,
 * from `local` tensors that may be shards (bcast_tensor.shard_offset), to
 * every receiver; each receiver connects to every source
 * (bcast_plan_source_endpoint) and takes their streams at once, then
 * confirms to every source only once all of them are in, so a source that
 * returns OK knows every receiver holds the whole plan.  A failure of one
 * stream ends the others at once and is reported as "source rank R: ...".
 * A source's stats count its own buckets and bytes; a receiver's count
 * every bucket, and its wire_alone_s is the longest stream's wire time (the
 * streams overlap, so wire_s, the sum over buckets, can exceed total_s). */
int bcast_engine_execute(bcast_engine *e, const bcast_plan *p, const bcast_tensor *local,
                         size_t n, bcast_stats *stats, bcast_err *err);
/* Cancels plan `plan_id` on this engine; the one call that may come from
 * another thread while bcast_engine_execute runs. An execution of that plan in
 * progress returns BCAST_ECANCELED at its next wait (host mode: every socket
 * wait; GPU modes: only before they start); a later execution of it returns
 * BCAST_ECANCELED at once. A host-mode root closes its receivers' connections
 * and, for its next plans, ignores receivers that still present the cancelled
 * one: they are leftovers of the abandoned plan, not peers of the new one.
 * Only the latest cancelled id is kept. 0, or BCAST_EINVAL. */
int bcast_engine_cancel(bcast_engine *e, const char *plan_id);

/* ---- colocated mode: receivers on the sender's GPU ------------------------------
 * Every receiver of a BCAST_MODE_COLOCATED plan exports where its tensors
 * live; the sender imports every receiver's export, then all execute the plan.
 * The sender's copies and cast kernels write straight into receiver memory
 * (CUDA IPC; pointers as they are for a receiver in the sender's process);
 * receivers copy nothing and hold one copy of their weights.
 *
 * Receiver: call after binding its buffers and before acknowledging the plan;
 * the bytes (malloc'd, free() them) go to the sender through the control
 * plane (PlanAck.colocated_export). Its tensors must be cudaMalloc memory on
 * the engine's device in the wire dtype; the handles are made once per layout
 * and made again only when the buffers or the plan's tensors change. Each
 * export clears this receiver's done words, one per source rank of the plan.
 * Sender: imports one export per receiver rank (a different process or this
 * one), before bcast_engine_execute. Mappings are kept while a receiver's
 * export stays the same, closed when it changes, when an executed plan no
 * longer has that receiver, and by bcast_engine_free. An export made on
 * another GPU or host is refused (BCAST_ENOTSUP, naming both); one for another
 * plan hash with BCAST_EMISMATCH, one with another number of done words than
 * the plan's sources with BCAST_EINVAL.
 * Several sources (nsources S > 1, bcast_plan_build_sharded): every source
 * rank 0..S-1 is a sender that imports every receiver's export and executes
 * with its own `local` tensors, whole or shards (bcast_tensor.shard_offset;
 * host or GPU resident), staging and writing only its own buckets' slices;
 * the sources run at once. Its stats count its own buckets and bytes.
 * Ordering: a source's execute waits on the host until every write of its
 * buckets is done, then sets its own done word in each receiver (a token of
 * the plan hash and its rank) and waits for that; a receiver's execute
 * returns once every source's done word holds that source's token. A
 * receiver is thus told the version is complete only after every write of
 * every source into it; a source that never writes makes it time out naming
 * that source rank. */
int bcast_engine_coloc_export(bcast_engine *e, const bcast_plan *p, const bcast_tensor *local,
                              size_t n, uint8_t **out, size_t *len, bcast_err *err);
int bcast_engine_coloc_import(bcast_engine *e, const bcast_plan *p, uint32_t rank,
                              const uint8_t *buf, size_t len, bcast_err *err);
/* Receiver allocations the sender has mapped now (for tests and leak checks). */
size_t bcast_engine_coloc_mappings(const bcast_engine *e);

/* ---- floors: what the hardware gives without the engine (bcast_floor.c) ---
 * For benchmarks that put the engine's step time beside the bound it works
 * against, measured in the same run (the bound moves from machine to machine).
 * Both need CUDA (and NCCL) in the build and the devices at run time:
 * BCAST_ENOTSUP with the reason otherwise; BCAST_EINVAL for a bad argument or
 * a device index outside those visible.  They allocate what they time and free
 * it before returning, and leave the calling thread's current device as it was. */

/* Pinned host-to-device bandwidth of `device` in GB/s (1e9 bytes/s): one
 * cudaMemcpyAsync of `bytes` from pinned host memory on the default stream,
 * timed with CUDA events; one warm-up copy, then the best of `reps`. */
int bcast_floor_h2d(int device, uint64_t bytes, int reps, double *gbps, bcast_err *err);

/* Device-to-device copy bandwidth of `device` in GB/s, one way (bytes copied
 * per second; the memory moves twice that, read plus write): one
 * cudaMemcpyAsync of `bytes` between two allocations, timed with CUDA events;
 * one warm-up copy, then the best of `reps`. The floor of colocated mode with
 * the master on the GPU. */
int bcast_floor_d2d(int device, uint64_t bytes, int reps, double *gbps, bcast_err *err);

/* Broadcast alone: `bytes` as one buffer from devices[0] to the other ndev - 1
 * devices, all driven by this process (ncclCommInitAll, one ncclBroadcast per
 * device in one group).  Host wall time from the launch until every device's
 * stream finished; one warm-up, then the median of `reps` in *seconds. */
int bcast_floor_broadcast(const int *devices, int ndev, uint64_t bytes, int reps, double *seconds,
                          bcast_err *err);

/* ---- CPU casts (round to nearest even; NaN, inf, subnormals as the reference) */
uint16_t bcast_f32_to_bf16(float f);
uint16_t bcast_f32_to_f16(float f);
float bcast_bf16_to_f32(uint16_t h);
float bcast_f16_to_f32(uint16_t h);
/* Vectorised where the CPU allows; dst and src must not overlap. */
int bcast_cast_cpu(void *dst, bcast_dtype dst_dtype, const void *src, bcast_dtype src_dtype,
                   size_t n);
uint64_t bcast_checksum64(const void *buf, size_t n); /* XXH3 64 */

#ifdef __cplusplus
}
#endif
#endif
