/* Synthetic rollouts: draws from lognormal or normal, real sleeps. */
#include "workers/agent/agent_rollout.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

void agent_rollout_cfg_defaults(agent_rollout_cfg *cfg) {
  cfg->dist = AGENT_DIST_LOGNORMAL;
  cfg->tokens_mean = 256;
  cfg->tokens_std = 64;
  cfg->latency_ms_mean = 2;
  cfg->latency_ms_std = 0.5;
}

int agent_dist_parse(const char *s, agent_dist *out) {
  if (!strcmp(s, "lognormal")) *out = AGENT_DIST_LOGNORMAL;
  else if (!strcmp(s, "normal")) *out = AGENT_DIST_NORMAL;
  else return -1;
  return 0;
}

int agent_rollout_cfg_check(const agent_rollout_cfg *cfg, char *err, size_t errlen) {
  const char *bad = NULL;
  if (cfg->dist != AGENT_DIST_LOGNORMAL && cfg->dist != AGENT_DIST_NORMAL) bad = "--distribution";
  else if (!(cfg->tokens_mean >= 1 && cfg->tokens_mean <= 1e9)) bad = "--tokens-mean";
  else if (!(cfg->tokens_std >= 0 && cfg->tokens_std <= 1e9)) bad = "--tokens-std";
  else if (!(cfg->latency_ms_mean >= 0 && cfg->latency_ms_mean <= 3.6e6)) bad = "--latency-ms-mean";
  else if (!(cfg->latency_ms_std >= 0 && cfg->latency_ms_std <= 3.6e6)) bad = "--latency-ms-std";
  if (!bad) return 0;
  snprintf(err, errlen, "%s: out of range (tokens mean >= 1, stds >= 0, latency mean >= 0)", bad);
  return -1;
}

static uint64_t agent__splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static inline uint64_t agent__rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t agent__next(agent_rollout_gen *g) {
  uint64_t *s = g->state;
  uint64_t r = agent__rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = agent__rotl(s[3], 45);
  return r;
}

/* Uniform in (0, 1]: never 0, so log() is finite. */
static double agent__uniform(agent_rollout_gen *g) {
  return ((double)(agent__next(g) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

static double agent__std_normal(agent_rollout_gen *g) {
  double u1 = agent__uniform(g), u2 = agent__uniform(g);
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* A draw with the given mean and standard deviation of the result itself. */
static double agent__draw(agent_rollout_gen *g, double mean, double std) {
  double z = agent__std_normal(g);
  if (g->cfg.dist == AGENT_DIST_NORMAL || mean <= 0) return mean + std * z;
  double s2 = log1p((std * std) / (mean * mean));
  return exp(log(mean) - s2 / 2 + sqrt(s2) * z);
}

void agent_rollout_gen_init(agent_rollout_gen *g, const agent_rollout_cfg *cfg, uint64_t seed) {
  g->cfg = *cfg;
  uint64_t x = seed;
  for (int i = 0; i < 4; i++) g->state[i] = agent__splitmix64(&x);
  g->counter = 0;
}

void agent_rollout_draw(agent_rollout_gen *g, uint32_t rank, uint64_t policy_version,
                        agent_rollout *out) {
  double tokens = agent__draw(g, g->cfg.tokens_mean, g->cfg.tokens_std);
  double ms = agent__draw(g, g->cfg.latency_ms_mean, g->cfg.latency_ms_std);
  tokens = tokens < 1 ? 1 : (tokens > 4e9 ? 4e9 : tokens);
  ms = ms < 0 ? 0 : ms;
  g->counter++;
  out->id = ((uint64_t)(rank & 0xffffffu) << 40) | (g->counter & ((UINT64_C(1) << 40) - 1));
  out->policy_version = policy_version;
  out->tokens = (uint32_t)llround(tokens);
  out->latency_s = ms / 1000.0;
  out->seconds = 0;
}

static double agent__mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void agent__sleep(double s) {
  if (s <= 0) return;
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

size_t agent_rollout_run(agent_rollout_gen *g, uint32_t rank, uint64_t policy_version,
                         agent_rollout *out, size_t count, int (*stop)(void *ud), void *ud) {
  size_t made = 0;
  for (; made < count; made++) {
    if (stop && stop(ud)) break;
    agent_rollout_draw(g, rank, policy_version, &out[made]);
    double t0 = agent__mono();
    agent__sleep(out[made].latency_s);
    out[made].seconds = agent__mono() - t0;
  }
  return made;
}
