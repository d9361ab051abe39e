/* Internal seam between the engine (bcast_engine.c, host transport) and the
 * CUDA/NCCL backend (bcast_gpu*.c, *.cu). Not part of the public surface. */
#ifndef RLORCH_BCAST_INTERNAL_H
#define RLORCH_BCAST_INTERNAL_H

#include "workers/bcast/bcast.h"

#include <stdarg.h>
#include <sys/types.h>

/* Fills err (code and message) and returns the code. A macro so that the
 * caller (and the static analyser, which follows no variadic call) sees the
 * value is `code`, evaluated once: `rc = bcast__fail(...)` is never BCAST_OK
 * on any path it explores. */
void bcast__failf(bcast_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define bcast__fail(err, code, ...)                                                                \
  __extension__({                                                                                  \
    int bcast__code_ = (code);                                                                     \
    bcast__failf((err), bcast__code_, __VA_ARGS__);                                                \
    bcast__code_;                                                                                  \
  })
double bcast__now(void); /* monotonic seconds */
/* Staging time the broadcast did not hide: the wall time of the whole
 * broadcast minus the time the same bytes take on the wire alone, 0 when the
 * wire alone took as long or longer (every transport reports it this way). */
double bcast__exposed_s(double total_s, double wire_alone_s);

/* Matches a participant's local tensors to the plan by name: map[i] is the
 * index in `local` of plan tensor i (map has p->ntensors entries).  Checks
 * shape, dtype (sender: storage dtype; receiver: wire dtype) and data. */
int bcast__plan_bind(const bcast_plan *p, const bcast_tensor *local, size_t n, int sender,
                     uint32_t *map, bcast_err *err);
/* A host-mode source: binds only the tensors its own buckets carry (map[i] is
 * UINT32_MAX for the others), takes shards, and checks every slice it sends
 * lies inside what its local tensor holds. Local tensors are whole or shards
 * (bcast_tensor.shard_offset); bcast__plan_bind refuses shards. */
int bcast__plan_bind_source(const bcast_plan *p, uint32_t rank, const bcast_tensor *local, size_t n,
                            uint32_t *map, bcast_err *err);
/* bcast__plan_bind on the plan tensors `need` marks (NULL: all; the others
 * map to UINT32_MAX); shards: local tensors may be shards (a source). */
int bcast__plan_bind_some(const bcast_plan *p, const bcast_tensor *local, size_t n, int sender,
                          const uint8_t *need, int shards, uint32_t *map, bcast_err *err);
/* A receiver: the tensors its view holds (NONE ones map to UINT32_MAX), each
 * local tensor's `part` equal to the view's (bcast_view.c). */
int bcast__plan_bind_receiver(const bcast_plan *p, uint32_t rank, const bcast_tensor *local, size_t n,
                              uint32_t *map, bcast_err *err);

/* Receiver views (bcast_view.c). */
/* Resolves opts' per-rank specs into p's views (NULL: none). */
int bcast__views_set(bcast_plan *p, const bcast_receiver_view *rv, bcast_err *err);
int bcast__views_check(const bcast_plan *p, bcast_err *err);
void bcast__views_free(bcast_plan *p);
int bcast__views_dup(bcast_plan *q, const bcast_plan *p); /* BCAST_ENOMEM, or 0 */
/* View `view`'s part of tensor i; a WHOLE part for BCAST_VIEW_WHOLE. */
const bcast_part *bcast__view_part(const bcast_plan *p, uint32_t view, size_t tensor);
/* fn(ud, offset in the range, index in the dense part, count) per run of
 * elements [e0, e0 + n) of t that part pt holds, in element order; stops at
 * the first non-zero return and returns it. */
typedef int (*bcast__run_fn)(void *ud, uint64_t off, uint64_t local, uint64_t n);
int bcast__part_runs(const bcast_tensor *t, const bcast_part *pt, uint64_t e0, uint64_t n,
                     bcast__run_fn fn, void *ud);
/* Elements slice s of bucket k gives view `view`; wire bytes bucket k gives it. */
uint64_t bcast__view_bucket_elems(const bcast_plan *p, uint32_t view, size_t k, size_t s);
uint64_t bcast__view_bucket_bytes(const bcast_plan *p, uint32_t view, size_t k);

/* nsources, 1 when 0. */
uint32_t bcast__plan_nsources(const bcast_plan *p);
/* Relays (bcast_plan.c): the most receivers any one rank serves (without
 * relays, every receiver: the source's); the most hops from the source to a
 * receiver (1 without relays).  Bounds of a validated plan's waits. */
uint32_t bcast__plan_fanout(const bcast_plan *p);
uint32_t bcast__plan_depth(const bcast_plan *p);
/* Casts n elements with up to `threads` threads (1: the calling thread only). */
int bcast__cast_parallel(void *dst, bcast_dtype dst_dtype, const void *src,
                         bcast_dtype src_dtype, size_t n, int threads);

/* The x86 vector features the host casts use: the CPU has them (cpuid) and
 * the OS saves their registers (xgetbv). All 0 on other CPUs. One mechanism
 * for every compiler: __builtin_cpu_supports does not know "f16c" in clang
 * before 15. Reads the CPU each call (no cached state): a few hundred cycles
 * against a cast of a whole bucket. */
typedef struct bcast__cpu {
  int avx2, f16c, avx512f, avx512bw;
} bcast__cpu;
void bcast__cpu_probe(bcast__cpu *c);

/* Casts with one code path: 0 scalar, 1 AVX2+F16C, 2 AVX-512F (ENOTSUP when
 * the CPU lacks it); the best level this CPU offers. For tests and benches. */
int bcast__cast_level(int level, void *dst, bcast_dtype dst_dtype, const void *src,
                      bcast_dtype src_dtype, size_t n);
int bcast__cast_best_level(void);

/* Absolute monotonic deadline: now + timeout_s, capped by the plan's Unix
 * deadline when it has one (deadline_unix_ms > 0). */
double bcast__deadline(double timeout_s, int64_t deadline_unix_ms);

/* Data-channel authentication (bcast_auth.c, OpenSSL libcrypto). */
#define BCAST_NONCE_BYTES 32
#define BCAST_MAC_BYTES 32
/* n bytes from getrandom(2); 0, or -1 with errno. */
int bcast__random(void *buf, size_t n);
/* The receiver's proof: HMAC-SHA256(secret, "rlorch.bcast.hello/2" ||
 * root_nonce || rx_nonce || rank || hash || id); the root's answer uses its
 * own label with the nonces swapped.  0, or -1 (out zeroed) if libcrypto fails. */
int bcast__hello_mac(const uint8_t secret[BCAST_SECRET_BYTES], const uint8_t root_nonce[BCAST_NONCE_BYTES],
                     const uint8_t rx_nonce[BCAST_NONCE_BYTES], uint32_t rank, uint64_t hash, const char *id,
                     uint8_t out[BCAST_MAC_BYTES]);
int bcast__reply_mac(const uint8_t secret[BCAST_SECRET_BYTES], const uint8_t root_nonce[BCAST_NONCE_BYTES],
                     const uint8_t rx_nonce[BCAST_NONCE_BYTES], uint32_t rank, uint64_t hash, const char *id,
                     uint8_t out[BCAST_MAC_BYTES]);
int bcast__mac_equal(const uint8_t a[BCAST_MAC_BYTES], const uint8_t b[BCAST_MAC_BYTES]); /* constant time */
void bcast__wipe(void *p, size_t n); /* not optimised away */
/* A TLS plan's key for one connection: HMAC-SHA256(secret, "rlorch.bcast.tls/2"
 * || root_nonce || rx_nonce || rank || hash || id), BCAST_SECRET_BYTES long. */
int bcast__tls_key(const uint8_t secret[BCAST_SECRET_BYTES], const uint8_t root_nonce[BCAST_NONCE_BYTES],
                   const uint8_t rx_nonce[BCAST_NONCE_BYTES], uint32_t rank, uint64_t hash, const char *id,
                   uint8_t out[BCAST_SECRET_BYTES]);

/* One data connection of the host transport (bcast_tls.c, OpenSSL libssl):
 * a non-blocking socket, with TLS 1.3 over it once started. */
struct ssl_st;
typedef struct bcast__conn {
  int fd;
  struct ssl_st *ssl; /* NULL: plaintext */
  void *tls_key;      /* the key, until the TLS handshake is over */
} bcast__conn;
/* Starts TLS on c (the root is the server) with the connection's key; 0, or
 * -1 with the reason in why. Then bcast__conn_tls_step until it returns 1
 * (done), waiting for *want (POLLIN or POLLOUT) on c->fd while it returns 0;
 * -1: failed, why says how. */
int bcast__conn_tls_start(bcast__conn *c, int server, const uint8_t key[BCAST_SECRET_BYTES], char *why,
                          size_t whylen);
int bcast__conn_tls_step(bcast__conn *c, short *want, char *why, size_t whylen);
/* send(2) with MSG_NOSIGNAL or recv(2) on the connection, through TLS when it
 * has it: > 0 bytes moved, 0 at the peer's end, -1 with errno (EAGAIN: wait
 * for *want; EPROTO: a TLS record that does not verify). */
ssize_t bcast__conn_io(bcast__conn *c, void *buf, size_t n, int writing, short *want);
void bcast__conn_close(bcast__conn *c); /* and c->fd */

/* The receiver's HELLO as the root parses it (bcast_host.c documents the
 * layout).  bcast__hello_parse looks at the n bytes received so far: 1 when
 * more are needed (*need: the total length known so far), 0 when a whole
 * hello was parsed into *h, -1 when the bytes cannot be a hello of this
 * protocol version.  Pure, for the transport and for fuzzing. */
#define BCAST_HELLO_FIXED 56
#define BCAST_HELLO_MAX (BCAST_HELLO_FIXED + 127 + BCAST_MAC_BYTES)
typedef struct bcast__hello {
  uint32_t rank;
  uint64_t hash;
  uint8_t rx_nonce[BCAST_NONCE_BYTES];
  char id[128];
  uint8_t mac[BCAST_MAC_BYTES];
} bcast__hello;
int bcast__hello_parse(const uint8_t *b, size_t n, size_t *need, bcast__hello *h);

/* Host transport (bcast_host.c): TCP between processes, casts on the CPU.
 * The root listens on a socket the engine owns and reuses across plans;
 * receivers connect to plan->host_endpoint once per plan. `map` is the output
 * of bcast__plan_bind. */
int bcast__host_listen(const char *addr, int *fd, char *bound, size_t boundlen, bcast_err *err);
/* How one host-mode execution waits: every wait ends at timeout_s (and the
 * plan's deadline) or when cancel_fd (-1: none) turns readable, which fails
 * the plan with BCAST_ECANCELED. A root ignores receivers presenting
 * stale_id (NULL or "": none), the plan cancelled last. */
typedef struct bcast__host_io {
  double timeout_s;
  int cancel_fd;
  const char *stale_id;
} bcast__host_io;
/* A source (`rank` < the plan's sources) serves its own buckets to every
 * receiver it serves (bcast_plan_downstreams); a receiver takes every
 * source's (a stream per source), or its upstream's, and forwards them
 * when it relays. */
int bcast__host_send(int listen_fd, const bcast_plan *p, uint32_t rank, const bcast_tensor *local,
                     const uint32_t *map,
                     const bcast__host_io *io, int cast_threads, bcast_stats *stats, bcast_err *err);
/* listen_fd: the engine's listener (-1: none), which a receiver that relays
 * (bcast_plan_downstreams > 0) serves its downstreams on. */
int bcast__host_recv(int listen_fd, const bcast_plan *p, uint32_t rank, const bcast_tensor *local,
                     const uint32_t *map, const bcast__host_io *io, bcast_stats *stats, bcast_err *err);

/* GPU backend. Without CUDA in the build these return BCAST_ENOTSUP with a message. */
typedef struct bcast_gpu bcast_gpu;
void bcast__gpu_probe(bcast_caps *caps); /* fills the CUDA/NCCL fields */
/* The UUID of `device` as nvidia-smi prints it ("GPU-8-4-4-4-12 hex"); 0, or
 * BCAST_ENOTSUP / BCAST_ECUDA with `out` emptied. */
int bcast__gpu_uuid(int device, char *out, size_t len);
/* This machine's identity: /proc/sys/kernel/random/boot_id, else the host name. */
void bcast__host_id(char *out, size_t len);
int bcast__gpu_open(const bcast_engine_opts *o, bcast_gpu **out, bcast_err *err);
void bcast__gpu_close(bcast_gpu *g);
int bcast__gpu_nccl_id(bcast_gpu *g, uint8_t id[128], bcast_err *err);
/* Direct and staged modes; `rank` is the engine's rank. Every wait also ends
 * when cancel_fd (-1: none) turns readable: the communicator is then aborted
 * at once (BCAST_ECANCELED), not at the plan's deadline. */
int bcast__gpu_execute(bcast_gpu *g, const bcast_plan *p, uint32_t rank,
                       const bcast_tensor *local, size_t n, int cancel_fd, bcast_stats *stats,
                       bcast_err *err);

/* Colocated mode (bcast_coloc.c): the receivers' exports and the sender's
 * mappings of them, owned by one engine and freed before its GPU backend. */
typedef struct bcast_coloc bcast_coloc;
int bcast__coloc_new(bcast_gpu *g, bcast_coloc **out, bcast_err *err);
void bcast__coloc_free(bcast_coloc *c, bcast_gpu *g);
size_t bcast__coloc_mapped(const bcast_coloc *c); /* receiver allocations mapped now */
int bcast__coloc_export(bcast_coloc *c, bcast_gpu *g, const bcast_plan *p, uint32_t rank,
                        const bcast_tensor *local, size_t n, uint8_t **out, size_t *len,
                        bcast_err *err);
int bcast__coloc_import(bcast_coloc *c, bcast_gpu *g, const bcast_plan *p, uint32_t rank,
                        const uint8_t *buf, size_t len, bcast_err *err);
/* cancel_fd: readable means "cancel this execution" (-1: none). */
int bcast__coloc_execute(bcast_coloc *c, bcast_gpu *g, const bcast_plan *p, uint32_t rank,
                         const bcast_tensor *local, size_t n, int cancel_fd, bcast_stats *stats,
                         bcast_err *err);

/* Synchronous copy between host and the backend's device (host transport with
 * GPU-resident tensors on one side). to_device: 1 host -> device, 0 device -> host. */
int bcast__gpu_copy(bcast_gpu *g, void *dst, const void *src, size_t bytes, int to_device,
                    bcast_err *err);

#endif
