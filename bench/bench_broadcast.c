/* `rlorch bench broadcast`: bcast_engine_execute, the call a trainer and its
 * inference workers make every step, against floors measured in the same run.
 *
 *   staged: fp32 master weights in pinned host memory on the sender, bf16 on
 *           the wire, bf16 into GPU memory on the receiver. Floor: the fp32
 *           bytes over the pinned host-to-device bandwidth (bcast_floor_h2d).
 *   direct: bf16 weights on the sender GPU. Floor: the same bf16 bytes
 *           broadcast alone as one buffer (bcast_floor_broadcast).
 *   host:   fp32 pageable host weights, bf16 over loopback TCP. Baseline: a
 *           memcpy plus a plain socket send of the same bytes.
 *           --senders N: the model cut into dim-0 shards over 1, 2, 4, ... N
 *           sender engines (a sharded trainer), --receivers engines taking
 *           every shard; baseline: one sender of the same bytes, same run.
 *           --relays N: N of the --receivers take from the sender and
 *           forward to the others; baseline: every receiver taking from
 *           the sender (the direct fan-out), same run, the two layouts
 *           stepping in turn on the same engines.
 *   colocated: sender and receiver on GPU 0, the receiver's bf16 buffers
 *           written by the sender (--master: fp32 pinned host, fp32 on the
 *           GPU, or a bf16 pinned host copy). Floors, all measured here: fp32
 *           and bf16 bytes over the pinned host-to-device bandwidth, and a
 *           device-to-device copy moving the bytes the casts read and write.
 *           --senders N: the model cut into dim-0 shards over 1, 2, 4, ... N
 *           sender engines on GPU 0 (each rank of a sharded trainer writing
 *           its own slices), --receivers engines on GPU 0; beside one sender
 *           of the same bytes and the --master's floor, same run.
 * Ranks are two engines in this process, one thread each (GPU 0 sends, GPU 1
 * receives; NCCL refuses two ranks on one GPU; colocated: both on GPU 0). Only the public headers of the
 * engine are used, so what is timed is what a user of the library gets. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench/bench.h"
#include "orchestrator/common/opt.h"
#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_preset.h"

extern char **environ;

/* ---- flags -------------------------------------------------------------------------- */

typedef struct bb_args {
  char *preset;        /* owned: opt_free */
  bcast_mode mode;
  uint32_t reps;
  uint32_t budget_mib; /* staging memory per bucket */
  uint32_t max_layers; /* 0: all */
  int master;          /* colocated: where the sender's weights live (BB_MASTER_*) */
  bool tls;            /* host: also the same plan with TLS on its data connection */
  uint32_t senders;    /* host, colocated: sharded senders, up to this many; 0: the two-rank bench */
  uint32_t receivers;  /* with --senders or --relays: receiver engines */
  uint32_t relays;     /* host: that many of the receivers relay to the others; 0: none */
  bool json;
} bb_args;

enum { BB_MASTER_HOST = 1, BB_MASTER_GPU = 2, BB_MASTER_BF16_HOST = 3 };

static const opt_name bb__masters[] = {
    {"host", BB_MASTER_HOST},
    {"gpu", BB_MASTER_GPU},
    {"bf16-host", BB_MASTER_BF16_HOST},
    {NULL, 0},
};

/* The modes that can be timed; auto is the orchestrator's choice among them. */
static const opt_name bb__modes[] = {
    {"direct", BCAST_MODE_DIRECT},
    {"staged", BCAST_MODE_STAGED},
    {"host", BCAST_MODE_HOST},
    {"colocated", BCAST_MODE_COLOCATED},
    {NULL, 0},
};

/* The names other commands use for the same meaning: RLORCH_PRESET,
 * RLORCH_LAYERS, RLORCH_JSON. */
#define BBA(m, ctype) OPT_OFF(bb_args, m, ctype)
static const opt_field bb__fields[] = {
    {.name = "preset", .flag = "--preset", .type = OPT_STR, .off = BBA(preset, char *),
     .metavar = "P", .help = "model preset: 100m, 1b, 4b, 8b"},
    {.name = "mode", .flag = "--mode", .type = OPT_ENUM, .off = BBA(mode, int), .names = bb__modes,
     .metavar = "MODE", .help = "where the weights live"},
    {.name = "reps", .flag = "--reps", .type = OPT_U32, .off = BBA(reps, uint32_t), .min = 1,
     .max = 1000, .metavar = "N", .help = "timed steps after one warm-up step"},
    {.name = "budget_mib", .flag = "--budget-mib", .type = OPT_U32,
     .off = BBA(budget_mib, uint32_t), .min = 1, .max = 1 << 20, .metavar = "M",
     .help = "staging memory per bucket, MiB"},
    {.name = "layers", .flag = "--layers", .type = OPT_U32, .off = BBA(max_layers, uint32_t),
     .min = 0, .max = 1 << 20, .metavar = "N", .help = "keep only the first N decoder layers",
     .dflt = "0: all"},
    {.name = "master", .flag = "--master", .type = OPT_ENUM, .off = BBA(master, int),
     .names = bb__masters, .metavar = "WHERE",
     .help = "colocated: the sender's weights, fp32 pinned host, fp32 on the GPU or bf16 pinned host"},
    {.name = "tls", .flag = "--tls", .type = OPT_SWITCH, .off = BBA(tls, bool),
     .help = "host: then the same plan with TLS on its data connection, against the plain one"},
    {.name = "senders", .flag = "--senders", .type = OPT_U32, .off = BBA(senders, uint32_t), .min = 0,
     .max = 16, .metavar = "N",
     .help = "host, colocated: the model in dim-0 shards over 1, 2, 4, ... N sender ranks, against one sender",
     .dflt = "0: one sender, one receiver"},
    {.name = "receivers", .flag = "--receivers", .type = OPT_U32, .off = BBA(receivers, uint32_t),
     .min = 1, .max = 16, .metavar = "R", .help = "with --senders or --relays: receiver ranks"},
    {.name = "relays", .flag = "--relays", .type = OPT_U32, .off = BBA(relays, uint32_t), .min = 0, .max = 16,
     .metavar = "N",
     .help = "host: N of the --receivers take from the sender and relay to the others (grouped round-robin), "
             "against every receiver taking from the sender, same run", .dflt = "0: none"},
    {.name = "json", .flag = "--json", .type = OPT_SWITCH, .off = BBA(json, bool),
     .help = "one JSON object instead of text"},
};

static const opt_cmd bb__cmd = {
    .name = "bench broadcast",
    .about = "One weight broadcast through bcast_engine_execute, two ranks in this process,\n"
             "against a floor measured in the same run:\n"
             "  staged  fp32 pinned host weights, bf16 to GPU 1; floor: fp32 bytes over PCIe\n"
             "  direct  bf16 weights on GPU 0; floor: the same bytes broadcast as one buffer\n"
             "  host    fp32 pageable host weights, bf16 over loopback TCP; baseline: memcpy\n"
             "          plus a plain socket send (--tls: then over TLS, against the plain engine;\n"
             "          --senders N: dim-0 shards over 1, 2, 4, ... N senders and --receivers\n"
             "          receivers, against one sender of the same bytes; --relays N: N of the\n"
             "          --receivers relay to the others, against the direct fan-out)\n"
             "  colocated  sender and receiver on GPU 0, the sender writing the receiver's bf16\n"
             "          buffers (--master host|gpu|bf16-host); floors: fp32 and bf16 pinned\n"
             "          host-to-device, device-to-device copy (--senders N: dim-0 shards over\n"
             "          1, 2, 4, ... N senders on GPU 0 into --receivers receivers, against one\n"
             "          sender and the master's floor)",
    .fields = bb__fields,
    .nfields = sizeof bb__fields / sizeof bb__fields[0],
};

/* Fills a from the flags and the RLORCH_* environment. Returns -1 to run, or
 * the exit status: 0 after --help, 2 for a bad setting, 1 out of memory (the
 * message printed). Release a with opt_free on every path. */
static int parse(int argc, char **argv, bb_args *a) {
  static const bb_args defaults = {.preset = "100m", .mode = BCAST_MODE_STAGED, .reps = 5,
                                   .budget_mib = 256, .master = BB_MASTER_HOST, .receivers = 2};
  *a = defaults;
  if (opt_own(&bb__cmd, a) != 0) {
    fprintf(stderr, "rlorch %s: out of memory\n", bb__cmd.name);
    return 1;
  }
  opt_state st;
  int rc = opt_parse_main(&bb__cmd, a, &defaults, argc, argv, environ, &st);
  if (rc >= 0) return rc;
  if (!bcast_preset_find(a->preset)) {
    opt_fail(&st, opt_origin(&st, "preset"), "unknown preset \"%s\" (want 100m, 1b, 4b, 8b)",
             a->preset);
    fprintf(stderr, "%s\n", st.err);
    return 2;
  }
  if (a->relays && (a->mode != BCAST_MODE_HOST || a->senders || a->relays > a->receivers)) {
    opt_fail(&st, opt_origin(&st, "relays"),
             a->mode != BCAST_MODE_HOST ? "relays run on the host transport (--mode host)"
             : a->senders ? "relays take one sender (no --senders)"
                          : "%u relays among %u receivers: at most one relay per receiver",
             a->relays, a->receivers);
    fprintf(stderr, "%s\n", st.err);
    return 2;
  }
  if (a->senders && a->mode != BCAST_MODE_HOST && a->mode != BCAST_MODE_COLOCATED) {
    opt_fail(&st, opt_origin(&st, "senders"),
             "sharded senders run on the host transport or colocated (--mode host|colocated)");
    fprintf(stderr, "%s\n", st.err);
    return 2;
  }
  return -1;
}

/* ---- results ------------------------------------------------------------------------ */

typedef struct bb_result {
  double h2d_gbps, d2d_gbps;                  /* colocated: measured bandwidths */
  double fp32_h2d_s, bf16_h2d_s, d2d_s;       /* colocated: the three floors */
  double floor_s, engine_s;
  double floor_gbps;
  const char *floor_name;
  uint64_t params, wire_bytes, pcie_bytes;
  bcast_stats last; /* sender's stats of the last step; owned */
  double rx_wire_s, rx_cast_s;
  uint32_t nbuckets;
  double tls_engine_s; /* host with --tls: the TLS plan's median; 0: not run */
} bb_result;

static double median(double *v, int n) {
  bench_sort(v, (size_t)n);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- ranks as threads ---------------------------------------------------------------- */

#define BB_RANKS 2

/* Ranks start only once every rank's thread exists (state 1), or leave
 * (state -1) when one could not be started. */
typedef struct bb_gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int state;
} bb_gate;

typedef struct bb_rank {
  uint32_t rank;
  bb_gate *gate;
  bcast_engine *eng;
  const bcast_plan *plan;
  const bcast_tensor *local;
  size_t n;
  int steps; /* warm-up included */
  pthread_barrier_t *bar;
  double *t_start, *t_end; /* per step */
  bcast_stats stats;       /* of the last step */
  bcast_err err;
  int rc;
} bb_rank;

/* Both ranks start each step together (barrier) and the step is what
 * bcast_engine_execute takes on each; a failed rank keeps meeting the
 * barriers so the other one is not left waiting. */
static void *rank_loop(void *arg) {
  bb_rank *r = arg;
  pthread_mutex_lock(&r->gate->mu);
  while (!r->gate->state) pthread_cond_wait(&r->gate->cv, &r->gate->mu);
  int go = r->gate->state > 0;
  pthread_mutex_unlock(&r->gate->mu);
  if (!go) return NULL;
  for (int i = 0; i < r->steps; i++) {
    pthread_barrier_wait(r->bar);
    bcast_stats_free(&r->stats);
    r->t_start[i] = bench_now();
    if (r->rc == 0) r->rc = bcast_engine_execute(r->eng, r->plan, r->local, r->n, &r->stats, &r->err);
    r->t_end[i] = bench_now();
    pthread_barrier_wait(r->bar);
  }
  return NULL;
}

/* One warm-up step, then `reps` steps of the nr ranks; *median_s is the
 * median step time, from the first rank's start to the last rank's end.
 * Rank 0 runs in the calling thread; when a thread cannot be started, the
 * ones that were leave at the gate before any step. Each rank keeps its
 * last step's stats (the caller frees them). */
static int run_group(bb_rank *rk, int nr, int reps, double *median_s) {
  int total = reps + 1, rc = 1, started = 1;
  pthread_barrier_t bar;
  bb_gate gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
  pthread_t *th = calloc((size_t)nr, sizeof *th);
  double *ts = calloc((size_t)total * 2 * (size_t)nr, sizeof(double));
  double *steps = calloc((size_t)total, sizeof(double));
  if (!th || !ts || !steps || pthread_barrier_init(&bar, NULL, (unsigned)nr)) {
    fprintf(stderr, "bench broadcast: out of memory or threads setting up the ranks\n");
    free(th);
    free(ts);
    free(steps);
    return 1;
  }
  for (int i = 0; i < nr; i++) {
    rk[i].steps = total;
    rk[i].bar = &bar;
    rk[i].gate = &gate;
    rk[i].t_start = ts + (size_t)total * (2 * (size_t)i);
    rk[i].t_end = ts + (size_t)total * (2 * (size_t)i + 1);
  }
  for (; started < nr; started++) {
    int e = pthread_create(&th[started], NULL, rank_loop, &rk[started]);
    if (e) {
      fprintf(stderr, "bench broadcast: starting the rank %u thread: %s\n", rk[started].rank, strerror(e));
      break;
    }
  }
  pthread_mutex_lock(&gate.mu);
  gate.state = started < nr ? -1 : 1;
  pthread_cond_broadcast(&gate.cv);
  pthread_mutex_unlock(&gate.mu);
  if (started < nr) {
    for (int i = 1; i < started; i++) pthread_join(th[i], NULL);
    goto out;
  }
  rank_loop(&rk[0]);
  for (int i = 1; i < nr; i++) pthread_join(th[i], NULL);
  rc = 0;
  for (int i = 0; i < nr; i++)
    if (rk[i].rc) {
      fprintf(stderr, "bench broadcast: rank %u: %s (%s)\n", rk[i].rank, rk[i].err.msg,
              bcast_strerror(rk[i].rc));
      rc = 1;
    }
  if (!rc) {
    for (int k = 1; k < total; k++) {
      double a = rk[0].t_start[k], z = rk[0].t_end[k];
      for (int i = 1; i < nr; i++) {
        if (rk[i].t_start[k] < a) a = rk[i].t_start[k];
        if (rk[i].t_end[k] > z) z = rk[i].t_end[k];
      }
      steps[k - 1] = z - a;
    }
    *median_s = median(steps, reps);
  }
out:
  pthread_barrier_destroy(&bar);
  free(th);
  free(ts);
  free(steps);
  return rc;
}

/* The two-rank bench: the sender's stats of the last step move into res. */
static int run_ranks(bb_rank rk[BB_RANKS], int reps, bb_result *res) {
  int rc = run_group(rk, BB_RANKS, reps, &res->engine_s);
  if (!rc) {
    res->last = rk[0].stats; /* moved: res owns the buckets now */
    memset(&rk[0].stats, 0, sizeof rk[0].stats);
    res->rx_wire_s = rk[1].stats.wire_s;
    res->rx_cast_s = rk[1].stats.cast_s;
  }
  for (int i = 0; i < BB_RANKS; i++) bcast_stats_free(&rk[i].stats);
  return rc;
}

/* ---- floors ----------------------------------------------------------------------------- */

/* Direct and staged need the CUDA build, NCCL and two devices: say which is missing. */
static int gpu_available(const bb_args *a) {
  bcast_caps caps;
  char why[256];
  bcast_caps_probe(&caps);
  const char *m = bcast_mode_name(a->mode);
  if (!caps.cuda_built || (!caps.nccl_built && a->mode != BCAST_MODE_COLOCATED)) {
    fprintf(stderr, "bench broadcast: --mode %s needs a build with CUDA and NCCL\n", m);
    return 0;
  }
  if (a->mode == BCAST_MODE_COLOCATED) {
    if (!bcast_mode_available(&caps, a->mode, why, sizeof why)) {
      fprintf(stderr, "bench broadcast: --mode colocated unavailable: %s\n", why);
      return 0;
    }
    return 1; /* one GPU, no NCCL */
  }
  if (caps.cuda_devices < BB_RANKS) {
    fprintf(stderr, "bench broadcast: --mode %s needs %d CUDA devices, %d visible\n", m, BB_RANKS,
            caps.cuda_devices);
    return 0;
  }
  if (!bcast_mode_available(&caps, a->mode, why, sizeof why)) {
    fprintf(stderr, "bench broadcast: --mode %s unavailable: %s\n", m, why);
    return 0;
  }
  return 1;
}

/* staged: the fp32 bytes over the pinned host-to-device bandwidth of GPU 0 (one
 * 2 GiB copy, best of 3 after a warm-up); direct: the bf16 bytes broadcast
 * GPU 0 -> GPU 1 as one buffer (median of reps after a warm-up). */
static int gpu_floor(const bb_args *a, uint64_t fp32_bytes, uint64_t bf16_bytes, bb_result *res,
                     bcast_err *err) {
  if (a->mode == BCAST_MODE_COLOCATED) {
    int rc = bcast_floor_h2d(0, (uint64_t)2 << 30, 3, &res->h2d_gbps, err);
    if (!rc) rc = bcast_floor_d2d(0, (uint64_t)2 << 30, 5, &res->d2d_gbps, err);
    if (rc) return rc;
    res->fp32_h2d_s = (double)fp32_bytes / (res->h2d_gbps * 1e9);
    res->bf16_h2d_s = (double)bf16_bytes / (res->h2d_gbps * 1e9);
    /* The GPU-resident master reads fp32 and writes bf16: a device copy that
     * moves as many bytes (read + write) copies half their sum. With a bf16
     * master the engine copies the bf16 bytes themselves. */
    uint64_t copied = a->master == BB_MASTER_GPU ? (fp32_bytes + bf16_bytes) / 2 : bf16_bytes;
    res->d2d_s = (double)copied / (res->d2d_gbps * 1e9);
    if (a->master == BB_MASTER_GPU) {
      res->floor_s = res->d2d_s;
      res->floor_gbps = res->d2d_gbps;
      res->floor_name = "d2d";
    } else {
      res->floor_s = a->master == BB_MASTER_BF16_HOST ? res->bf16_h2d_s : res->fp32_h2d_s;
      res->floor_gbps = res->h2d_gbps;
      res->floor_name = a->master == BB_MASTER_BF16_HOST ? "bf16 h2d" : "fp32 h2d";
    }
    return BCAST_OK;
  }
  if (a->mode == BCAST_MODE_STAGED) {
    int rc = bcast_floor_h2d(0, (uint64_t)2 << 30, 3, &res->floor_gbps, err);
    if (rc) return rc;
    res->floor_s = (double)fp32_bytes / (res->floor_gbps * 1e9);
    res->floor_name = "pcie";
    return BCAST_OK;
  }
  static const int devs[BB_RANKS] = {0, 1};
  int rc = bcast_floor_broadcast(devs, BB_RANKS, bf16_bytes, (int)a->reps, &res->floor_s, err);
  if (rc) return rc;
  res->floor_gbps = (double)bf16_bytes / res->floor_s / 1e9;
  res->floor_name = "wire";
  return BCAST_OK;
}

typedef struct sock_pair {
  int fd;
  char *buf;
  size_t bytes;
} sock_pair;

static void *sock_reader(void *arg) {
  sock_pair *s = arg;
  size_t got = 0;
  while (got < s->bytes) {
    ssize_t k = recv(s->fd, s->buf + got, s->bytes - got, 0);
    if (k <= 0) break;
    got += (size_t)k;
  }
  return NULL;
}

/* memcpy of the wire bytes, then a plain send over loopback TCP to a reader
 * thread: seconds, or -1 with the error printed. */
static double socket_baseline(const char *src, size_t bytes) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof sa;
  int ls = -1, c = -1, acc = -1;
  char *tmp = malloc(bytes), *dst = malloc(bytes);
  sock_pair rd = {-1, dst, bytes};
  pthread_t th;
  size_t sent = 0;
  double t0, t = -1;
  const char *what = "memory";
  if (!tmp || !dst) goto out;
  what = "listen";
  ls = socket(AF_INET, SOCK_STREAM, 0);
  if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, 1) ||
      getsockname(ls, (struct sockaddr *)&sa, &sl))
    goto out;
  what = "connect";
  c = socket(AF_INET, SOCK_STREAM, 0);
  if (c < 0 || connect(c, (struct sockaddr *)&sa, sizeof sa)) goto out;
  what = "accept";
  if ((acc = accept(ls, NULL, NULL)) < 0) goto out;
  rd.fd = acc;
  what = "reader thread";
  t0 = bench_now();
  if ((errno = pthread_create(&th, NULL, sock_reader, &rd))) goto out;
  memcpy(tmp, src, bytes);
  while (sent < bytes) {
    ssize_t k = send(c, tmp + sent, bytes - sent, MSG_NOSIGNAL);
    if (k <= 0) break;
    sent += (size_t)k;
  }
  if (sent < bytes) {
    int send_errno = errno;
    shutdown(c, SHUT_WR); /* the reader must not wait for bytes that will not come */
    pthread_join(th, NULL);
    what = "send";
    errno = send_errno;
    goto out;
  }
  pthread_join(th, NULL);
  t = bench_now() - t0;
out:
  if (t < 0) fprintf(stderr, "bench broadcast: loopback socket baseline: %s: %s\n", what, strerror(errno));
  if (acc >= 0) close(acc);
  if (c >= 0) close(c);
  if (ls >= 0) close(ls);
  free(tmp);
  free(dst);
  return t;
}

/* The largest tensor's worth of wire bytes, median of 5, scaled to the plan's wire bytes. */
static int host_baseline(const bcast_tensor *snd, size_t n, bb_result *res) {
  size_t big = 0, bi = 0;
  for (size_t i = 0; i < n; i++)
    if (bcast_tensor_elems(&snd[i]) > big) big = bcast_tensor_elems(&snd[i]), bi = i;
  size_t bytes = big * 2;
  double v[5];
  for (int r = 0; r < 5; r++)
    if ((v[r] = socket_baseline(snd[bi].data, bytes)) < 0) return 1;
  res->floor_s = median(v, 5) * (double)res->wire_bytes / (double)bytes;
  res->floor_gbps = (double)res->wire_bytes / res->floor_s / 1e9;
  res->floor_name = "memcpy+socket";
  return 0;
}

/* ---- the benchmark -------------------------------------------------------------------- */

static int bench_run(const bb_args *a, bb_result *res) {
  int gpu = a->mode != BCAST_MODE_HOST, staged = a->mode == BCAST_MODE_STAGED;
  int coloc = a->mode == BCAST_MODE_COLOCATED;
  if (gpu && !gpu_available(a)) return 1;
  bcast_preset_opts so = {.storage_dtype = BCAST_DTYPE_FP32, .wire_dtype = BCAST_DTYPE_BF16,
                          .residency = BCAST_RES_HOST_PAGEABLE, .max_layers = a->max_layers};
  if (gpu) {
    so.storage_dtype = staged ? BCAST_DTYPE_FP32 : BCAST_DTYPE_BF16;
    so.residency = staged ? BCAST_RES_HOST_PINNED : BCAST_RES_GPU;
    so.device = 0;
  }
  if (coloc) {
    so.storage_dtype = a->master == BB_MASTER_BF16_HOST ? BCAST_DTYPE_BF16 : BCAST_DTYPE_FP32;
    so.residency = a->master == BB_MASTER_GPU ? BCAST_RES_GPU : BCAST_RES_HOST_PINNED;
  }
  bcast_preset_opts ro = so;
  if (gpu) {
    ro.residency = BCAST_RES_GPU;
    ro.device = coloc ? 0 : 1;
  }
  bcast_tensor *snd = NULL, *rcv = NULL;
  size_t n = 0, m = 0;
  bcast_storage *ss = NULL, *rs = NULL;
  bcast_engine *e[BB_RANKS] = {NULL, NULL};
  bcast_plan *plan = NULL;
  bcast_err err = {0};
  int rc = 1;
  res->params = bcast_preset_params(bcast_preset_find(a->preset), &so);
  if (bcast_preset_manifest(a->preset, &so, &snd, &n, &err) ||
      bcast_preset_manifest(a->preset, &ro, &rcv, &m, &err) ||
      bcast_storage_alloc(snd, n, BCAST_FILL_SENDER, 42, &ss, &err) ||
      bcast_storage_alloc(rcv, m, BCAST_FILL_RECEIVER, 0, &rs, &err))
    goto fail;
  uint64_t fp32 = 0, bf16 = 0;
  for (size_t i = 0; i < n; i++) {
    fp32 += bcast_tensor_elems(&snd[i]) * 4;
    bf16 += bcast_tensor_elems(&snd[i]) * 2;
  }
  /* The GPU floors run before the engines exist, on idle devices. */
  if (gpu && gpu_floor(a, fp32, bf16, res, &err)) goto fail;
  for (int i = 0; i < BB_RANKS; i++) {
    bcast_engine_opts eo = {.rank = (uint32_t)i, .device = gpu ? (coloc ? 0 : i) : -1, .timeout_s = 120,
                            .host_listen = !gpu && i == 0 ? "127.0.0.1:0" : NULL};
    if (bcast_engine_new(&eo, &e[i], &err)) goto fail;
  }
  bcast_plan_opts po = {.id = gpu ? "bench" : "bench-host", .mode = a->mode, .world_size = BB_RANKS,
                        .root_rank = 0, .staging_budget = (uint64_t)a->budget_mib << 20,
                        .host_endpoint = gpu ? NULL : bcast_engine_data_address(e[0])};
  if (bcast_plan_build(snd, n, &po, &plan, &err)) goto fail;
  if (gpu && !coloc) {
    uint8_t id[128];
    if (bcast_engine_nccl_id(e[0], id, &err)) goto fail;
    bcast_plan_set_nccl_id(plan, id);
  }
  if (coloc) {
    /* What the control plane does: the receiver's export, the sender's import. */
    uint8_t *ex = NULL;
    size_t exlen = 0;
    if (bcast_engine_coloc_export(e[1], plan, rcv, m, &ex, &exlen, &err)) goto fail;
    int irc = bcast_engine_coloc_import(e[0], plan, 1, ex, exlen, &err);
    free(ex);
    if (irc) goto fail;
  }
  res->wire_bytes = bcast_plan_wire_bytes(plan);
  res->nbuckets = (uint32_t)plan->nbuckets;
  if (!gpu && host_baseline(snd, n, res)) goto out;
  bb_rank rk[BB_RANKS] = {{.rank = 0, .eng = e[0], .plan = plan, .local = snd, .n = n},
                          {.rank = 1, .eng = e[1], .plan = plan, .local = rcv, .n = m}};
  if (run_ranks(rk, (int)a->reps, res)) goto out;
  res->pcie_bytes = res->last.pcie_bytes;
  if (!gpu && a->tls) {
    /* The same plan but for TLS, on the same engines: its cost is the ratio. */
    bcast_plan *tp = NULL;
    po.id = "bench-host-tls";
    po.tls = 1;
    if (bcast_plan_build(snd, n, &po, &tp, &err)) goto fail;
    bb_result tr = *res;
    memset(&tr.last, 0, sizeof tr.last);
    rk[0].plan = rk[1].plan = tp;
    int trc = run_ranks(rk, (int)a->reps, &tr);
    bcast_plan_free(tp);
    if (trc) goto out;
    res->tls_engine_s = tr.engine_s;
    bcast_stats_free(&tr.last);
  }
  rc = 0;
  goto out;
fail:
  fprintf(stderr, "bench broadcast: %s (%s)\n", err.msg, bcast_strerror(err.code));
out:
  for (int i = 0; i < BB_RANKS; i++) bcast_engine_free(e[i]);
  bcast_plan_free(plan);
  bcast_storage_free(ss);
  bcast_storage_free(rs);
  free(snd);
  free(rcv);
  return rc;
}

/* ---- sharded senders (--senders) ----------------------------------------------------------- */

#define BB_MAX_COUNTS 8

typedef struct bb_shard_run {
  uint32_t senders;
  double engine_s;           /* median step: first rank's start to last rank's end */
  uint64_t max_source_bytes; /* the largest source's wire bytes */
} bb_shard_run;


/* One plan of `ns` sources and `nrx` receivers on fresh engines, timed. Host
 * mode: every source listens on loopback. Colocated: every engine on GPU 0,
 * each receiver's export imported by every source, as the control plane
 * hands them over. */
static int shard_run(const bb_args *a, const bcast_tensor *snd, size_t n, bcast_tensor *const *rcv, uint32_t ns,
                     bb_shard_run *out) {
  int coloc = a->mode == BCAST_MODE_COLOCATED;
  uint32_t nrx = a->receivers, world = ns + nrx;
  bcast_engine **e = calloc(world, sizeof *e);
  bcast_tensor *sh = calloc((size_t)ns * (n ? n : 1), sizeof *sh);
  const bcast_tensor **ranks = calloc(ns, sizeof *ranks);
  size_t *counts = calloc(ns, sizeof *counts);
  const char **eps = calloc(ns, sizeof *eps);
  bb_rank *rk = calloc(world, sizeof *rk);
  bcast_shard_map *map = NULL;
  bcast_plan *plan = NULL;
  bcast_err err = {0};
  int rc = 1;
  if (!e || !sh || !ranks || !counts || !eps || !rk) {
    fprintf(stderr, "bench broadcast: out of memory for %u ranks\n", world);
    goto out;
  }
  for (uint32_t i = 0; i < world; i++) {
    bcast_engine_opts eo = {.rank = i, .device = coloc ? 0 : -1, .timeout_s = 120,
                            .host_listen = !coloc && i < ns ? "127.0.0.1:0" : NULL};
    if (bcast_engine_new(&eo, &e[i], &err)) goto fail;
  }
  for (uint32_t r = 0; r < ns; r++) {
    ranks[r] = sh + (size_t)r * n;
    counts[r] = bcast_preset_dim0_shards(snd, n, r, ns, sh + (size_t)r * n);
    eps[r] = coloc ? NULL : bcast_engine_data_address(e[r]);
  }
  if (bcast_shards_check(ranks, counts, ns, NULL, &map, &err)) goto fail;
  char id[64];
  snprintf(id, sizeof id, "bench-%s-senders-%u", bcast_mode_name(a->mode), ns);
  bcast_plan_opts po = {.id = id, .mode = a->mode, .world_size = world, .root_rank = 0,
                        .staging_budget = (uint64_t)a->budget_mib << 20, .source_endpoints = coloc ? NULL : eps};
  if (bcast_plan_build_sharded(map, &po, &plan, &err)) goto fail;
  for (uint32_t i = 0; coloc && i < nrx; i++) {
    uint8_t *ex = NULL;
    size_t exlen = 0;
    if (bcast_engine_coloc_export(e[ns + i], plan, rcv[i], n, &ex, &exlen, &err)) goto fail;
    int irc = 0;
    for (uint32_t r = 0; r < ns && !irc; r++) irc = bcast_engine_coloc_import(e[r], plan, ns + i, ex, exlen, &err);
    free(ex);
    if (irc) goto fail;
  }
  out->senders = ns;
  out->max_source_bytes = 0;
  for (uint32_t r = 0; r < ns; r++) {
    uint64_t b = 0;
    for (size_t k = 0; k < plan->nbuckets; k++)
      if (plan->buckets[k].source_rank == r) b += plan->buckets[k].bytes;
    if (b > out->max_source_bytes) out->max_source_bytes = b;
  }
  for (uint32_t i = 0; i < world; i++)
    rk[i] = (bb_rank){.rank = i, .eng = e[i], .plan = plan, .local = i < ns ? ranks[i] : rcv[i - ns],
                      .n = i < ns ? counts[i] : n};
  rc = run_group(rk, (int)world, (int)a->reps, &out->engine_s);
  for (uint32_t i = 0; i < world; i++) bcast_stats_free(&rk[i].stats);
  goto out;
fail:
  fprintf(stderr, "bench broadcast: %u senders: %s (%s)\n", ns, err.msg, bcast_strerror(err.code));
out:
  for (uint32_t i = 0; e && i < world; i++) bcast_engine_free(e[i]);
  bcast_plan_free(plan);
  bcast_shard_map_free(map);
  free(e);
  free(sh);
  free(ranks);
  free(counts);
  free(eps);
  free(rk);
  return rc;
}

/* ---- relays (--relays) ---------------------------------------------------------------------- */

/* One sender and the --receivers ranks, one engine each (ranks 1..--relays
 * listening), and two plans on them: every receiver taking from the sender,
 * and ranks 1..N taking from it and relaying to the others, round-robin.
 * The two run in turn, a step of each per rep (each after a step of the
 * other: the first of each pair is its warm-up), so that a machine whose
 * load drifts weighs on both alike; *direct_s and *relay_s are medians. */
static int relay_run(const bb_args *a, const bcast_tensor *snd, size_t n, bcast_tensor *const *rcv,
                     double *direct_s, double *relay_s) {
  uint32_t world = 1 + a->receivers, nr = a->relays;
  bcast_engine **e = calloc(world, sizeof *e);
  uint32_t *from = calloc(world, sizeof *from);
  const char **eps = calloc(world, sizeof *eps);
  bb_rank *rk = calloc(world, sizeof *rk);
  double *dt = calloc(a->reps, sizeof *dt), *rt = calloc(a->reps, sizeof *rt);
  bcast_plan *plan[2] = {NULL, NULL};
  bcast_err err = {0};
  int rc = 1;
  if (!e || !from || !eps || !rk || !dt || !rt) {
    fprintf(stderr, "bench broadcast: out of memory for %u ranks\n", world);
    goto out;
  }
  for (uint32_t i = 0; i < world; i++) {
    bcast_engine_opts eo = {.rank = i, .device = -1, .timeout_s = 120,
                            .host_listen = i <= nr ? "127.0.0.1:0" : NULL};
    if (bcast_engine_new(&eo, &e[i], &err)) goto fail;
    eps[i] = i && i <= nr ? bcast_engine_data_address(e[i]) : "";
    from[i] = i <= nr ? 0 : 1 + (i - nr - 1) % nr;
  }
  for (int l = 0; l < 2; l++) {
    bcast_plan_opts po = {.id = l ? "bench-host-relays" : "bench-host-direct", .mode = BCAST_MODE_HOST,
                          .world_size = world, .root_rank = 0, .staging_budget = (uint64_t)a->budget_mib << 20,
                          .host_endpoint = bcast_engine_data_address(e[0]), .relay_from = l ? from : NULL,
                          .relay_endpoints = l ? eps : NULL};
    if (bcast_plan_build(snd, n, &po, &plan[l], &err)) goto fail;
  }
  rc = 0;
  for (uint32_t k = 0; k < a->reps && !rc; k++)
    for (int l = 0; l < 2 && !rc; l++) {
      for (uint32_t i = 0; i < world; i++)
        rk[i] = (bb_rank){.rank = i, .eng = e[i], .plan = plan[l], .local = i ? rcv[i - 1] : snd, .n = n};
      rc = run_group(rk, (int)world, 1, l ? &rt[k] : &dt[k]);
      for (uint32_t i = 0; i < world; i++) bcast_stats_free(&rk[i].stats);
    }
  if (!rc) {
    *direct_s = median(dt, (int)a->reps);
    *relay_s = median(rt, (int)a->reps);
  }
  goto out;
fail:
  fprintf(stderr, "bench broadcast: %u relays: %s (%s)\n", nr, err.msg, bcast_strerror(err.code));
out:
  for (uint32_t i = 0; e && i < world; i++) bcast_engine_free(e[i]);
  bcast_plan_free(plan[0]);
  bcast_plan_free(plan[1]);
  free(e);
  free(from);
  free(eps);
  free(rk);
  free(dt);
  free(rt);
  return rc;
}

static void report_relays(const bb_args *a, uint64_t params, uint64_t wire, double direct_s, double relay_s) {
  uint32_t rx = a->receivers, nr = a->relays;
  double ratio = relay_s / direct_s;
  if (a->json) {
    printf("{\"bench\":\"broadcast\",\"preset\":\"%s\",\"mode\":\"host\",\"reps\":%u,\"params\":%llu,"
           "\"wire_bytes\":%llu,\"receivers\":%u,\"relays\":%u,\"baseline\":\"direct fan-out\","
           "\"direct_s\":%.6f,\"relays_s\":%.6f,\"ratio\":%.4f,\"direct_source_bytes\":%llu,"
           "\"relays_source_bytes\":%llu}\n",
           a->preset, a->reps, (unsigned long long)params, (unsigned long long)wire, rx, nr, direct_s, relay_s,
           ratio, (unsigned long long)(wire * rx), (unsigned long long)(wire * nr));
    return;
  }
  printf("broadcast %s, mode host, relays: %.2f B params, %.2f GB to each of %u receivers, %u reps\n", a->preset,
         params / 1e9, wire / 1e9, rx, a->reps);
  printf("  layout            wall s    aggregate GB/s  sender's bytes  vs direct\n");
  printf("  direct fan-out    %.4f    %-14.3f  %-14.2f  1.000x\n", direct_s, (double)wire * rx / direct_s / 1e9,
         (double)wire * rx / 1e9);
  printf("  %-2u relay(s)       %.4f    %-14.3f  %-14.2f  %.3fx\n", nr, relay_s, (double)wire * rx / relay_s / 1e9,
         (double)wire * nr / 1e9, ratio);
  printf("  (aggregate: wire bytes x receivers / wall; the sender's link carries one copy per receiver it\n"
         "   serves: %u direct, %u with relays; on loopback every link shares this machine's cores and memory)\n",
         rx, nr);
}

/* The model's copies for a run of one sender and `receivers` receivers: the
 * sender's manifest and storage, and each receiver's. Freed whole by
 * copies_free, allocated or not. */
typedef struct bb_copies {
  bcast_tensor *snd, **rcv;
  bcast_storage *ss, **rs;
  size_t n;
  uint32_t receivers;
} bb_copies;

static void copies_free(bb_copies *c) {
  for (uint32_t i = 0; c->rs && i < c->receivers; i++) bcast_storage_free(c->rs[i]);
  for (uint32_t i = 0; c->rcv && i < c->receivers; i++) free(c->rcv[i]);
  bcast_storage_free(c->ss);
  free(c->snd);
  free(c->rcv);
  free(c->rs);
  memset(c, 0, sizeof *c);
}

/* Each receiver's manifest (preset options ro) and zeroed storage, and the
 * sender's storage for its manifest c->snd, filled. */
static int copies_alloc(const bb_args *a, const bcast_preset_opts *ro, bb_copies *c, bcast_err *err) {
  c->receivers = a->receivers;
  c->rcv = calloc(a->receivers, sizeof *c->rcv);
  c->rs = calloc(a->receivers, sizeof *c->rs);
  if (!c->rcv || !c->rs) {
    err->code = BCAST_ENOMEM;
    snprintf(err->msg, sizeof err->msg, "out of memory");
    return BCAST_ENOMEM;
  }
  size_t m = 0;
  int rc = bcast_storage_alloc(c->snd, c->n, BCAST_FILL_SENDER, 42, &c->ss, err);
  for (uint32_t i = 0; !rc && i < a->receivers; i++)
    rc = bcast_preset_manifest(a->preset, ro, &c->rcv[i], &m, err) ||
         bcast_storage_alloc(c->rcv[i], m, BCAST_FILL_RECEIVER, 0, &c->rs[i], err);
  return rc;
}

/* The model once in fp32 for the sender, a bf16 copy per receiver; the
 * direct fan-out and the relay layout in the same run. */
static int bench_relays(const bb_args *a) {
  bcast_preset_opts so = {.storage_dtype = BCAST_DTYPE_FP32, .wire_dtype = BCAST_DTYPE_BF16,
                          .residency = BCAST_RES_HOST_PAGEABLE, .max_layers = a->max_layers};
  bb_copies c = {0};
  bcast_err err = {0};
  double direct_s = 0, relay_s = 0;
  int rc = 1;
  if (bcast_preset_manifest(a->preset, &so, &c.snd, &c.n, &err) || copies_alloc(a, &so, &c, &err)) {
    fprintf(stderr, "bench broadcast: %s (%s)\n", err.msg, bcast_strerror(err.code));
    goto out;
  }
  uint64_t wire = 0;
  for (size_t i = 0; i < c.n; i++) wire += bcast_tensor_elems(&c.snd[i]) * 2;
  if (relay_run(a, c.snd, c.n, c.rcv, &direct_s, &relay_s)) goto out;
  report_relays(a, bcast_preset_params(bcast_preset_find(a->preset), &so), wire, direct_s, relay_s);
  rc = 0;
out:
  copies_free(&c);
  return rc;
}

/* 1, 2, 4, ... below N, then N. */
static int sender_counts(uint32_t n, uint32_t *v) {
  int k = 0;
  for (uint32_t c = 1; c < n && k < BB_MAX_COUNTS - 1; c *= 2) v[k++] = c;
  v[k++] = n;
  return k;
}

/* fl: colocated, the floor measured in the same run (NULL in host mode,
 * whose last column is the cost model's ratio instead). */
static void report_senders(const bb_args *a, uint64_t params, uint64_t wire, const bb_shard_run *runs, int k,
                           const bb_result *fl) {
  double base = runs[0].engine_s;
  uint32_t rx = a->receivers;
  const char *mode = bcast_mode_name(a->mode);
  const char *master = opt_enum_name(bb__masters, a->master);
  if (a->json) {
    printf("{\"bench\":\"broadcast\",\"preset\":\"%s\",\"mode\":\"%s\",", a->preset, mode);
    if (fl) printf("\"master\":\"%s\",", master);
    printf("\"reps\":%u,\"params\":%llu,\"wire_bytes\":%llu,\"receivers\":%u,\"baseline\":\"one sender\",",
           a->reps, (unsigned long long)params, (unsigned long long)wire, rx);
    if (fl)
      printf("\"floor\":\"%s\",\"floor_s\":%.6f,\"floor_gbps\":%.2f,", fl->floor_name, fl->floor_s,
             fl->floor_gbps);
    printf("\"runs\":[");
    for (int i = 0; i < k; i++) {
      printf("%s{\"senders\":%u,\"engine_s\":%.6f,\"gbps\":%.3f,\"ratio\":%.4f,", i ? "," : "", runs[i].senders,
             runs[i].engine_s, (double)wire * rx / runs[i].engine_s / 1e9, runs[i].engine_s / base);
      if (fl) printf("\"floor_ratio\":%.4f}", runs[i].engine_s / fl->floor_s);
      else printf("\"model_ratio\":%.4f}", (double)runs[i].max_source_bytes / (double)wire);
    }
    printf("]}\n");
    return;
  }
  if (fl)
    printf("broadcast %s, mode colocated (master %s), sharded senders on GPU 0: %.2f B params, %.2f GB to "
           "each of %u receivers, %u reps\n", a->preset, master, params / 1e9, wire / 1e9, rx, a->reps);
  else
    printf("broadcast %s, mode host, sharded senders: %.2f B params, %.2f GB to each of %u receivers, %u reps\n",
           a->preset, params / 1e9, wire / 1e9, rx, a->reps);
  if (fl) printf("  floor %-10s %.4f s  (%.1f GB/s, measured in this run)\n", fl->floor_name, fl->floor_s,
                 fl->floor_gbps);
  printf("  senders  wall s    aggregate GB/s  vs one sender  %s\n", fl ? "vs floor" : "cost model");
  for (int i = 0; i < k; i++)
    printf("  %-7u  %.4f    %-14.3f  %.3fx         %.3fx\n", runs[i].senders, runs[i].engine_s,
           (double)wire * rx / runs[i].engine_s / 1e9, runs[i].engine_s / base,
           fl ? runs[i].engine_s / fl->floor_s : (double)runs[i].max_source_bytes / (double)wire);
  if (fl)
    printf("  (aggregate: wire bytes x receivers / wall; floor: %s, every sender sharing this GPU's\n"
           "   %s)\n", a->master == BB_MASTER_GPU ? "the bytes the casts read and write plus the copies to\n"
           "   the other receivers, over the device-to-device bandwidth" : "the master's bytes over the "
           "pinned host-to-device bandwidth", a->master == BB_MASTER_GPU ? "memory" : "PCIe link");
  else
    printf("  (aggregate: wire bytes x receivers / wall; cost model: the largest source's bytes over all,\n"
           "   the wall-time ratio when each source has a link and cores of its own)\n");
}

/* The model once, in storage dtype; N dim-0 shards of it are views into it.
 * Colocated: the master where --master says (fp32 or bf16, pinned host or
 * GPU 0), the receivers' bf16 buffers on GPU 0, and the floor measured
 * first, on an idle device. */
static int bench_senders(const bb_args *a) {
  int coloc = a->mode == BCAST_MODE_COLOCATED;
  if (coloc && !gpu_available(a)) return 1;
  bcast_preset_opts so = {.storage_dtype = BCAST_DTYPE_FP32, .wire_dtype = BCAST_DTYPE_BF16,
                          .residency = BCAST_RES_HOST_PAGEABLE, .max_layers = a->max_layers};
  if (coloc) {
    so.storage_dtype = a->master == BB_MASTER_BF16_HOST ? BCAST_DTYPE_BF16 : BCAST_DTYPE_FP32;
    so.residency = a->master == BB_MASTER_GPU ? BCAST_RES_GPU : BCAST_RES_HOST_PINNED;
    so.device = 0;
  }
  bcast_preset_opts ro = so;
  if (coloc) ro.residency = BCAST_RES_GPU;
  bb_copies c = {0};
  bcast_err err = {0};
  bb_shard_run runs[BB_MAX_COUNTS];
  uint32_t counts[BB_MAX_COUNTS];
  bb_result fl;
  memset(&fl, 0, sizeof fl);
  int rc = 1, k = sender_counts(a->senders, counts);
  if (bcast_preset_manifest(a->preset, &so, &c.snd, &c.n, &err)) goto fail;
  uint64_t wire = 0, fp32 = 0;
  for (size_t i = 0; i < c.n; i++) {
    wire += bcast_tensor_elems(&c.snd[i]) * 2;
    fp32 += bcast_tensor_elems(&c.snd[i]) * 4;
  }
  if (coloc) {
    if (gpu_floor(a, fp32, wire, &fl, &err)) goto fail;
    /* Each receiver past the first costs the GPU master one device copy of
     * the wire bytes (a host master's copies do not cross PCIe). */
    if (a->master == BB_MASTER_GPU)
      fl.floor_s = ((double)(fp32 + wire) / 2 + (double)wire * (a->receivers - 1)) / (fl.d2d_gbps * 1e9);
  }
  if (copies_alloc(a, &ro, &c, &err)) goto fail;
  for (int i = 0; i < k; i++)
    if (shard_run(a, c.snd, c.n, c.rcv, counts[i], &runs[i])) goto out;
  report_senders(a, bcast_preset_params(bcast_preset_find(a->preset), &so), wire, runs, k, coloc ? &fl : NULL);
  rc = 0;
  goto out;
fail:
  fprintf(stderr, "bench broadcast: %s (%s)\n", err.msg, bcast_strerror(err.code));
out:
  copies_free(&c);
  return rc;
}

/* ---- report ------------------------------------------------------------------------------ */

/* Colocated: the engine against each floor, and the peers' figure for 4b. */
static void report_coloc(const bb_args *a, const bb_result *r) {
  const bcast_stats *s = &r->last;
  const char *master = opt_enum_name(bb__masters, a->master);
  double ratio = r->floor_s > 0 ? r->engine_s / r->floor_s : 0;
  /* Goals: host masters within 3 % of their host-to-device floor, the GPU
   * master within 3x the device copy of the bytes it reads and writes. */
  double goal = a->master == BB_MASTER_GPU ? 3.0 : 1.03;
  int is4b = !strcmp(a->preset, "4b");
  if (a->json) {
    printf("{\"bench\":\"broadcast\",\"preset\":\"%s\",\"mode\":\"colocated\",\"master\":\"%s\","
           "\"reps\":%u,\"params\":%llu,\"wire_bytes\":%llu,\"pcie_bytes\":%llu,\"buckets\":%u,"
           "\"transport\":\"%s\",\"h2d_gbps\":%.2f,\"d2d_gbps\":%.2f,\"fp32_h2d_floor_s\":%.6f,"
           "\"bf16_h2d_floor_s\":%.6f,\"d2d_floor_s\":%.6f,\"floor\":\"%s\",\"floor_s\":%.6f,"
           "\"engine_s\":%.6f,\"ratio\":%.4f,\"goal_ratio\":%.2f,\"goal_met\":%s,"
           "\"ratio_fp32_h2d\":%.4f,\"ratio_bf16_h2d\":%.4f,\"ratio_d2d\":%.4f,"
           "\"h2d_s\":%.6f,\"cast_s\":%.6f%s}\n",
           a->preset, master, a->reps, (unsigned long long)r->params,
           (unsigned long long)r->wire_bytes, (unsigned long long)r->pcie_bytes, r->nbuckets,
           s->transport ? s->transport : "", r->h2d_gbps, r->d2d_gbps, r->fp32_h2d_s, r->bf16_h2d_s,
           r->d2d_s, r->floor_name, r->floor_s, r->engine_s, ratio, goal,
           ratio <= goal ? "true" : "false", r->engine_s / r->fp32_h2d_s,
           r->engine_s / r->bf16_h2d_s, r->engine_s / r->d2d_s, s->h2d_s, s->cast_s,
           is4b ? ",\"peers_reference_s\":0.339" : "");
    return;
  }
  printf("broadcast %s, mode colocated (master %s, %s): %.2f B params, %.2f GB written in %u "
         "buckets, %u reps\n",
         a->preset, master, s->transport ? s->transport : "?", r->params / 1e9,
         r->wire_bytes / 1e9, r->nbuckets, a->reps);
  printf("  floor fp32 h2d   %.4f s  (pinned, %.1f GB/s)\n", r->fp32_h2d_s, r->h2d_gbps);
  printf("  floor bf16 h2d   %.4f s\n", r->bf16_h2d_s);
  printf("  floor d2d        %.4f s  (%.0f GB/s one way; %s)\n", r->d2d_s, r->d2d_gbps,
         a->master == BB_MASTER_GPU ? "the bytes the casts read and write" : "the bf16 bytes");
  printf("  engine           %.4f s  (median after a warm-up)\n", r->engine_s);
  printf("  ratios           %.3fx fp32 h2d, %.3fx bf16 h2d, %.3fx d2d\n",
         r->engine_s / r->fp32_h2d_s, r->engine_s / r->bf16_h2d_s, r->engine_s / r->d2d_s);
  printf("  against %-8s %.3fx (goal <= %.2fx: %s)\n", r->floor_name, ratio, goal,
         ratio <= goal ? "met" : "NOT met");
  printf("  sender stages (sums): h2d %.4f s, cast %.4f s; PCIe %.2f GB\n", s->h2d_s, s->cast_s,
         s->pcie_bytes / 1e9);
  if (is4b)
    printf("  reference: verl/slime-style colocated update (per-layer IPC buckets, receiver "
           "copies) took 0.339 s on 1 x H200 (%.2fx of it)\n",
           r->engine_s / 0.339);
}

static void report(const bb_args *a, const bb_result *r) {
  const bcast_stats *s = &r->last;
  const char *mode = bcast_mode_name(a->mode);
  double ratio = r->floor_s > 0 ? r->engine_s / r->floor_s : 0;
  int is4b = !strcmp(a->preset, "4b") && a->mode != BCAST_MODE_HOST &&
             a->mode != BCAST_MODE_COLOCATED;
  if (a->mode == BCAST_MODE_COLOCATED) {
    report_coloc(a, r);
    return;
  }
  if (a->json) {
    printf("{\"bench\":\"broadcast\",\"preset\":\"%s\",\"mode\":\"%s\",\"reps\":%u,"
           "\"params\":%llu,\"wire_bytes\":%llu,\"pcie_bytes\":%llu,\"buckets\":%u,"
           "\"floor\":\"%s\",\"floor_s\":%.6f,\"floor_gbps\":%.2f,\"engine_s\":%.6f,"
           "\"ratio\":%.4f,\"h2d_s\":%.6f,\"cast_s\":%.6f,\"wire_s\":%.6f,"
           "\"wire_alone_s\":%.6f,\"exposed_s\":%.6f,\"rx_scatter_s\":%.6f%s",
           a->preset, mode, a->reps, (unsigned long long)r->params,
           (unsigned long long)r->wire_bytes, (unsigned long long)r->pcie_bytes, r->nbuckets,
           r->floor_name, r->floor_s, r->floor_gbps, r->engine_s, ratio, s->h2d_s, s->cast_s,
           s->wire_s, s->wire_alone_s, s->exposed_s, r->rx_cast_s,
           is4b ? ",\"pytorch_reference_s\":0.331" : "");
    if (r->tls_engine_s > 0)
      printf(",\"tls_engine_s\":%.6f,\"tls_ratio_plain\":%.4f,\"tls_ratio\":%.4f", r->tls_engine_s,
             r->tls_engine_s / r->engine_s, r->floor_s > 0 ? r->tls_engine_s / r->floor_s : 0);
    printf("}\n");
    return;
  }
  printf("broadcast %s, mode %s: %.2f B params, %.2f GB on the wire in %u buckets, %u reps\n",
         a->preset, mode, r->params / 1e9, r->wire_bytes / 1e9, r->nbuckets, a->reps);
  printf("  %-16s %.4f s  (%.1f GB/s)\n", r->floor_name, r->floor_s, r->floor_gbps);
  printf("  %-16s %.4f s  (median after a warm-up)\n", "engine", r->engine_s);
  printf("  %-16s %.3fx\n", "ratio", ratio);
  if (r->tls_engine_s > 0)
    printf("  %-16s %.4f s  (%.3fx the plain engine, %.3fx %s)\n", "engine, TLS", r->tls_engine_s,
           r->tls_engine_s / r->engine_s, r->floor_s > 0 ? r->tls_engine_s / r->floor_s : 0,
           r->floor_name);
  if (a->mode != BCAST_MODE_HOST) {
    printf("  sender stages (sums): h2d %.4f s, cast %.4f s, wire %.4f s; PCIe %.2f GB\n",
           s->h2d_s, s->cast_s, s->wire_s, s->pcie_bytes / 1e9);
    printf("  receiver: wire %.4f s, scatter %.4f s\n", r->rx_wire_s, r->rx_cast_s);
    printf("  broadcast alone (same buckets, measured) %.4f s; exposed staging %.4f s\n",
           s->wire_alone_s, s->exposed_s);
  }
  if (is4b) printf("  reference: PyTorch per-tensor pinned copies + GPU cast + per-layer "
                   "broadcast took 0.331 s on the same machine type (%.2fx of it)\n",
                   r->engine_s / 0.331);
}

int bench_broadcast(int argc, char **argv) {
  bb_args a;
  int rc = parse(argc, argv, &a);
  if (rc < 0 && a.relays) {
    rc = bench_relays(&a);
  } else if (rc < 0 && a.senders) {
    rc = bench_senders(&a);
  } else if (rc < 0) {
    bb_result res;
    memset(&res, 0, sizeof res);
    rc = bench_run(&a, &res) ? 1 : 0;
    if (!rc) report(&a, &res);
    bcast_stats_free(&res.last);
  }
  opt_free(&bb__cmd, &a);
  return rc;
}
