/* `rlorch bench adamw`: what the bf16 shadow costs the CPU optimizer step.
 *
 * The trainer with --offload params+optimizer runs AdamW on the CPU and, with
 * the shadow, writes the bf16 copy of every weight in the same loop. Without
 * it, someone has to cast the fp32 weights afterwards: the engine on the GPU
 * after copying 4 bytes per parameter, or the CPU in a separate pass that
 * reads the weights again. Measured in one run, on the same arrays and the
 * same threads:
 *   step without the shadow  agent_adamw_cpu, spans without shadow
 *   step with the shadow     agent_adamw_cpu, spans with one
 *   separate cast pass       bcast_cast_cpu (the engine's vectorised CPU
 *                            cast) over the weights into a bf16 buffer, each
 *                            thread its share: the pass the shadow replaces
 * Each is the median of --reps runs after a warm-up of each (which also
 * faults the pages in), in wall seconds and in CPU seconds of the process
 * (all its threads): on a shared machine the wall clock also counts the time
 * other processes had the cores, the CPU clock does not. After the timed
 * runs, one more step with the shadow and a cast pass of the weights it
 * wrote, untimed: the cast's output must equal the shadow bit for bit; the
 * bench checks that and fails otherwise. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "orchestrator/common/opt.h"
#include "workers/agent/agent_adamw.h"
#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_preset.h"

extern char **environ;

typedef struct ba_args {
  uint64_t params;
  char *preset; /* owned: opt_free; NULL: --params in one span */
  uint32_t max_layers; /* with a preset: 0 = all decoder layers */
  int threads; /* 0: one per online CPU */
  uint32_t reps;
  bool json;
} ba_args;

#define BAA(m, ctype) OPT_OFF(ba_args, m, ctype)
static const opt_field ba__fields[] = {
    {.name = "params", .flag = "--params", .type = OPT_U64, .off = BAA(params, uint64_t),
     .min = 1, .max = 1e11, .metavar = "N", .help = "parameters (fp32 weights) to update"},
    {.name = "preset", .flag = "--preset", .type = OPT_STR, .off = BAA(preset, char *),
     .metavar = "P", .help = "instead of --params: a model preset's, one span per tensor as the "
     "trainer has them: 100m, 1b, 4b, 8b", .dflt = "none"},
    {.name = "layers", .flag = "--layers", .type = OPT_U32, .off = BAA(max_layers, uint32_t),
     .min = 0, .max = 1 << 20, .metavar = "N",
     .help = "with --preset: keep only the first N decoder layers", .dflt = "0: all"},
    {.name = "threads", .flag = "--threads", .type = OPT_I32, .off = BAA(threads, int), .min = 0,
     .max = 1024, .metavar = "N", .help = "CPU threads of the step and of the cast pass",
     .dflt = "0: one per core"},
    {.name = "reps", .flag = "--reps", .type = OPT_U32, .off = BAA(reps, uint32_t), .min = 1,
     .max = 1000, .metavar = "N", .help = "timed runs of each after one warm-up"},
    {.name = "json", .flag = "--json", .type = OPT_SWITCH, .off = BAA(json, bool),
     .help = "one JSON object instead of text"},
};

static const opt_cmd ba__cmd = {
    .name = "bench adamw",
    .about = "The CPU AdamW step of a params+optimizer trainer without and with the bf16\n"
             "shadow written in the same pass, against a separate fp32 -> bf16 cast pass\n"
             "over the same weights (the engine's CPU cast, the same threads), all measured\n"
             "in this run. 16 bytes of host memory per parameter.",
    .fields = ba__fields,
    .nfields = sizeof ba__fields / sizeof ba__fields[0],
};

/* ---- the separate pass ----------------------------------------------------------- */

typedef struct ba_cast_job {
  uint16_t *dst;
  const float *src;
  size_t n;
} ba_cast_job;

static void *ba_cast_run(void *arg) {
  ba_cast_job *j = arg;
  bcast_cast_cpu(j->dst, BCAST_DTYPE_BF16, j->src, BCAST_DTYPE_FP32, j->n);
  return NULL;
}

/* The weights cast into dst by `threads` threads, split as the step splits
 * (whole 64-element units), threads started per pass as the step starts its. */
static int ba_cast_pass(uint16_t *dst, const float *src, uint64_t n, int threads) {
  ba_cast_job jobs[1024];
  pthread_t tid[1024];
  int started[1024] = {0};
  uint64_t units = (n + 63) / 64, per = units / (uint64_t)threads,
           extra = units % (uint64_t)threads, at = 0;
  for (int t = 0; t < threads; t++) {
    uint64_t end = at + (per + ((uint64_t)t < extra ? 1 : 0)) * 64;
    if (end > n) end = n;
    jobs[t] = (ba_cast_job){dst + at, src + at, (size_t)(end - at)};
    at = end;
  }
  for (int t = 1; t < threads; t++)
    started[t] = pthread_create(&tid[t], NULL, ba_cast_run, &jobs[t]) == 0;
  ba_cast_run(&jobs[0]);
  int rc = 0;
  for (int t = 1; t < threads; t++) {
    if (started[t]) {
      pthread_join(tid[t], NULL);
    } else {
      ba_cast_run(&jobs[t]);
      rc = -1;
    }
  }
  return rc;
}

/* ---- the run --------------------------------------------------------------------- */

/* One timing in both clocks. */
typedef struct ba_time {
  double wall, cpu;
} ba_time;

static ba_time ba_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (ba_time){bench_now(), (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9};
}

typedef struct ba_result {
  ba_time plain, shadow, cast; /* medians, each clock on its own */
  int threads;
  int equal;                        /* the last shadow equals the last cast pass */
  uint64_t first_diff;
} ba_result;

static double ba_median(double *v, size_t n) {
  bench_sort(v, n);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int ba_run(const ba_args *a, ba_result *r) {
  uint64_t n = a->params;
  bcast_tensor *tensors = NULL;
  agent_adamw_span *plain = NULL, *with = NULL;
  size_t nspans = 0;
  int threads = a->threads;
  if (threads <= 0) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    threads = online > 0 ? (int)online : 1;
  }
  if (threads > 1024) threads = 1024; /* as agent_adamw_cpu */
  if ((uint64_t)threads > (n + 63) / 64) threads = (int)((n + 63) / 64);
  r->threads = threads;
  float *p = malloc(n * sizeof *p), *m = calloc(n, sizeof *m), *v = calloc(n, sizeof *v);
  uint16_t *shadow = malloc(n * sizeof *shadow), *cast = malloc(n * sizeof *cast);
  /* Samples: [what][clock][rep], what = plain, shadow, cast; clock = wall, cpu. */
  double *t = calloc(6 * (size_t)a->reps, sizeof(double));
  int rc = -1;
  if (!p || !m || !v || !shadow || !cast || !t) {
    fprintf(stderr, "rlorch bench adamw: no memory for %llu parameters (16 bytes each)\n",
            (unsigned long long)n);
    goto out;
  }
  /* Weights of the size a model's are (|w| < 1/16), not zero: the step's
   * arithmetic is the same for any finite value, and the cast sees real
   * mantissas. */
  for (uint64_t i = 0; i < n; i++) p[i] = agent_adamw_grad(7, i) * 8;
  /* One span per tensor, laid out one after another as the trainer's global
   * indices are; without a preset the whole range is one span. */
  nspans = 1;
  if (a->preset) {
    bcast_preset_opts po = {.max_layers = a->max_layers};
    bcast_err be = {0};
    if (bcast_preset_manifest(a->preset, &po, &tensors, &nspans, &be)) {
      fprintf(stderr, "rlorch bench adamw: --preset %s: %s\n", a->preset, be.msg);
      goto out;
    }
  }
  plain = calloc(nspans, sizeof *plain);
  with = calloc(nspans, sizeof *with);
  if (!plain || !with) {
    fprintf(stderr, "rlorch bench adamw: no memory\n");
    goto out;
  }
  for (size_t i = 0, off = 0; i < nspans; i++) {
    uint64_t e = tensors ? bcast_tensor_elems(&tensors[i]) : n;
    plain[i] = (agent_adamw_span){p + off, m + off, v + off, e, off, NULL};
    with[i] = plain[i];
    with[i].shadow = shadow + off;
    off += e;
  }
  agent_adamw_hparams hp;
  agent_adamw_defaults(&hp);
  uint64_t step = 0;
  /* Warm-up, then the three interleaved so drift (clock, neighbours on a
   * shared machine) falls on all of them alike; the two steps swap places
   * from one rep to the next, so neither always finds the caches as the
   * other left them. The cast pass comes last, after a step, as a separate
   * pass would. */
  for (uint32_t k = 0; k <= a->reps; k++) {
    agent_adamw_coef c1, c2;
    step += 2;
    if (agent_adamw_coef_for_step(&hp, step - 1, step - 1, &c1) ||
        agent_adamw_coef_for_step(&hp, step, step, &c2)) {
      fprintf(stderr, "rlorch bench adamw: AdamW hyperparameters out of range\n");
      goto out;
    }
    int swap = k % 2;
    ba_time at[4];
    at[0] = ba_now();
    if (agent_adamw_cpu(&c1, swap ? with : plain, nspans, threads)) goto threads_failed;
    at[1] = ba_now();
    if (agent_adamw_cpu(&c2, swap ? plain : with, nspans, threads)) goto threads_failed;
    at[2] = ba_now();
    if (ba_cast_pass(cast, p, n, threads)) goto threads_failed;
    at[3] = ba_now();
    if (k == 0) continue;
    int slot[3] = {swap ? 1 : 0, swap ? 0 : 1, 2}; /* plain, shadow, cast: which interval */
    for (int w = 0; w < 3; w++) {
      t[(2 * w) * a->reps + k - 1] = at[slot[w] + 1].wall - at[slot[w]].wall;
      t[(2 * w + 1) * a->reps + k - 1] = at[slot[w] + 1].cpu - at[slot[w]].cpu;
    }
  }
  ba_time *med[3] = {&r->plain, &r->shadow, &r->cast};
  for (int w = 0; w < 3; w++) {
    med[w]->wall = ba_median(t + (2 * w) * a->reps, a->reps);
    med[w]->cpu = ba_median(t + (2 * w + 1) * a->reps, a->reps);
  }
  /* The check, untimed: one more step with the shadow, then the cast of the
   * weights it wrote. */
  {
    agent_adamw_coef c;
    if (agent_adamw_coef_for_step(&hp, step + 1, step + 1, &c)) goto out;
    if (agent_adamw_cpu(&c, with, nspans, threads) || ba_cast_pass(cast, p, n, threads))
      goto threads_failed;
  }
  r->equal = memcmp(shadow, cast, n * sizeof *cast) == 0;
  for (r->first_diff = 0; !r->equal && shadow[r->first_diff] == cast[r->first_diff];)
    r->first_diff++;
  rc = 0;
  goto out;
threads_failed:
  fprintf(stderr, "rlorch bench adamw: could not start %d threads\n", threads);
out:
  free(p);
  free(m);
  free(v);
  free(shadow);
  free(cast);
  free(t);
  free(plain);
  free(with);
  free(tensors);
  return rc;
}

/* The figures of one clock. */
typedef struct ba_fig {
  double plain, shadow, cast;
  double extra;        /* shadow - plain */
  double vs_plain;     /* shadow / plain */
  double vs_cast;      /* extra / cast: the shadow's cost against the pass it replaces */
  double two_pass;     /* plain + cast */
  double two_vs_shadow;
} ba_fig;

static ba_fig ba_fig_of(double plain, double shadow, double cast) {
  ba_fig f = {plain, shadow, cast, shadow - plain, shadow / plain, 0, plain + cast, 0};
  f.vs_cast = f.extra / cast;
  f.two_vs_shadow = f.two_pass / shadow;
  return f;
}

static void ba_report(const ba_args *a, const ba_result *r) {
  double n = (double)a->params;
  ba_fig w = ba_fig_of(r->plain.wall, r->shadow.wall, r->cast.wall);
  ba_fig c = ba_fig_of(r->plain.cpu, r->shadow.cpu, r->cast.cpu);
  if (a->json) {
    printf("{\"bench\":\"adamw\",\"preset\":\"%s\",\"params\":%llu,\"threads\":%d,"
           "\"reps\":%u,",
           a->preset ? a->preset : "", (unsigned long long)a->params, r->threads, a->reps);
    const ba_fig *f[2] = {&w, &c};
    const char *clock[2] = {"wall", "cpu"};
    for (int k = 0; k < 2; k++)
      printf("\"%s\":{\"step_plain_s\":%.6f,\"step_shadow_s\":%.6f,\"cast_pass_s\":%.6f,"
             "\"shadow_extra_s\":%.6f,\"ratio_shadow_plain\":%.4f,\"ratio_extra_cast\":%.4f,"
             "\"ratio_two_pass_shadow\":%.4f},",
             clock[k], f[k]->plain, f[k]->shadow, f[k]->cast, f[k]->extra, f[k]->vs_plain,
             f[k]->vs_cast, f[k]->two_vs_shadow);
    printf("\"shadow_equals_cast\":%s}\n", r->equal ? "true" : "false");
    return;
  }
  printf("adamw %.1f M params%s%s, %d threads, %u reps (medians after a warm-up)\n", n / 1e6,
         a->preset ? ", preset " : "", a->preset ? a->preset : "", r->threads, a->reps);
  printf("                        wall s    cpu s\n");
  printf("  step without shadow   %.4f   %.4f\n", w.plain, c.plain);
  printf("  step with shadow      %.4f   %.4f   (%.3fx, %.3fx the step without)\n", w.shadow,
         c.shadow, w.vs_plain, c.vs_plain);
  printf("  separate cast pass    %.4f   %.4f   (fp32 -> bf16 by bcast_cast_cpu, the same "
         "threads)\n",
         w.cast, c.cast);
  printf("  the shadow's cost     %+.4f  %+.4f  (%.3fx, %.3fx the separate pass)\n", w.extra,
         c.extra, w.vs_cast, c.vs_cast);
  printf("  step + separate pass  %.4f   %.4f   (%.3fx, %.3fx the step with shadow)\n",
         w.two_pass, c.two_pass, w.two_vs_shadow, c.two_vs_shadow);
  if (r->equal)
    printf("  the shadow equals the engine's cast of the same weights, bit for bit\n");
  else
    printf("  the shadow DIFFERS from the engine's cast at element %llu\n",
           (unsigned long long)r->first_diff);
}

/* Fills a from the flags and the RLORCH_* environment. Returns -1 to run, or
 * the exit status: 0 after --help, 2 for a bad setting, 1 out of memory (the
 * message printed). Release a with opt_free on every path. */
static int ba_parse(int argc, char **argv, ba_args *a) {
  static const ba_args defaults = {.params = 100000000, .threads = 0, .reps = 5};
  *a = defaults;
  if (opt_own(&ba__cmd, a) != 0) {
    fprintf(stderr, "rlorch %s: out of memory\n", ba__cmd.name);
    return 1;
  }
  opt_state st;
  int rc = opt_parse_main(&ba__cmd, a, &defaults, argc, argv, environ, &st);
  if (rc >= 0) return rc;
  if (!a->preset && opt_is_set(&st, "layers")) {
    opt_fail(&st, opt_origin(&st, "layers"), "needs --preset");
    fprintf(stderr, "%s\n", st.err);
    return 2;
  }
  if (a->preset) {
    const bcast_preset *pr = bcast_preset_find(a->preset);
    if (!pr || opt_is_set(&st, "params")) {
      if (!pr)
        opt_fail(&st, opt_origin(&st, "preset"), "unknown preset \"%s\" (want 100m, 1b, 4b, 8b)",
                 a->preset);
      else
        opt_fail(&st, opt_origin(&st, "preset"), "give %s or --preset, not both",
                 opt_origin(&st, "params"));
      fprintf(stderr, "%s\n", st.err);
      return 2;
    }
    bcast_preset_opts po = {.max_layers = a->max_layers};
    a->params = bcast_preset_params(pr, &po);
  }
  return -1;
}

int bench_adamw(int argc, char **argv) {
  ba_args a;
  int rc = ba_parse(argc, argv, &a);
  if (rc < 0) {
    ba_result r;
    memset(&r, 0, sizeof r);
    rc = ba_run(&a, &r) ? 1 : 0;
    if (!rc) {
      ba_report(&a, &r);
      rc = r.equal ? 0 : 1;
    }
  }
  opt_free(&ba__cmd, &a);
  return rc;
}
