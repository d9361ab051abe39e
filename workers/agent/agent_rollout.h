/* agent_rollout: the synthetic rollout generator of the inference agent.
 *
 * Each rollout draws a token count and a latency from a configured
 * distribution (lognormal, or normal), sleeps the latency for real, and is
 * tagged with the policy version the worker holds. Ids are (rank << 40) |
 * counter, unique for a rank across the process's life. */
#ifndef RLORCH_AGENT_ROLLOUT_H
#define RLORCH_AGENT_ROLLOUT_H

#include <stddef.h>
#include <stdint.h>

typedef enum { AGENT_DIST_LOGNORMAL = 1, AGENT_DIST_NORMAL = 2 } agent_dist;

typedef struct agent_rollout_cfg {
  agent_dist dist;
  double tokens_mean, tokens_std;         /* tokens >= 1 after rounding */
  double latency_ms_mean, latency_ms_std; /* latency >= 0 */
} agent_rollout_cfg;

/* 256 tokens (std 64), 2 ms (std 0.5), lognormal: small so tests run fast. */
void agent_rollout_cfg_defaults(agent_rollout_cfg *cfg);
/* 0, or -1 with the offending field named in err. */
int agent_rollout_cfg_check(const agent_rollout_cfg *cfg, char *err, size_t errlen);
/* "lognormal" / "normal" -> dist; -1 when unknown. */
int agent_dist_parse(const char *s, agent_dist *out);

typedef struct agent_rollout {
  uint64_t id;
  uint64_t policy_version;
  uint32_t tokens;
  double latency_s; /* drawn */
  double seconds;   /* measured (0 until run) */
} agent_rollout;

typedef struct agent_rollout_gen {
  agent_rollout_cfg cfg;
  uint64_t state[4]; /* xoshiro256** */
  uint64_t counter;
} agent_rollout_gen;

/* Ids are counted from 1 for every rank; rng seeded from `seed`. */
void agent_rollout_gen_init(agent_rollout_gen *g, const agent_rollout_cfg *cfg, uint64_t seed);
/* Draws one rollout (no sleep). rank < 2^24, counter < 2^40. */
void agent_rollout_draw(agent_rollout_gen *g, uint32_t rank, uint64_t policy_version,
                        agent_rollout *out);
/* Draws `count` rollouts and sleeps each one's latency, measuring it. Stops
 * early when stop(ud) returns non-zero; returns how many were made. */
size_t agent_rollout_run(agent_rollout_gen *g, uint32_t rank, uint64_t policy_version,
                         agent_rollout *out, size_t count, int (*stop)(void *ud), void *ud);

#endif
