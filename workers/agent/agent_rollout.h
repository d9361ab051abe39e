/* agent_rollout: the synthetic generator of the inference agent. It answers a
 * rollout request as an engine would, without a model: `count` completions
 * of the request's prompt (one group), each ended by a stop token, the
 * drawn length (the engine's end of sequence) or max_tokens.
 *
 * - Lengths and latencies come from a configured distribution (lognormal, or
 *   normal) and the latencies are slept for real by the caller: this is the
 *   benchmark load.
 * - Everything a completion holds is a function of (prompt, sampling seed,
 *   completion index in the group, policy version): the same request to the
 *   same weights samples the same way, as a seeded engine does. A request
 *   without a seed (0) gets one from the generator's own seed and the request
 *   id. Greedy requests (temperature 0) give every completion of the group the
 *   same tokens, each with log-probability 0.
 * - A completion capped by max_tokens is a prefix of the one without the cap.
 * - Rewards come from a hook the embedding program provides (agent_reward_fn),
 *   by default from agent_reward_default.
 *
 * Ids are (rank << 40) | counter, unique for a rank across the process's life. */
#ifndef RLORCH_AGENT_ROLLOUT_H
#define RLORCH_AGENT_ROLLOUT_H

#include <stddef.h>
#include <stdint.h>

typedef enum { AGENT_DIST_LOGNORMAL = 1, AGENT_DIST_NORMAL = 2 } agent_dist;

#define AGENT_VOCAB_DEFAULT 32000u
/* Longest completion: a completion's ids are held in memory while its
 * request is served (the reward code reads them), 8 bytes a token. */
#define AGENT_TOKENS_MAX (1u << 24)

typedef struct agent_rollout_cfg {
  agent_dist dist;
  double tokens_mean, tokens_std;         /* drawn lengths in [1, AGENT_TOKENS_MAX] */
  double latency_ms_mean, latency_ms_std; /* latency >= 0 */
  uint32_t vocab_size;                    /* completion ids are below it; >= 2 */
} agent_rollout_cfg;

/* 256 tokens (std 64), 2 ms (std 0.5), lognormal, vocab 32000: small so tests
 * run fast. */
void agent_rollout_cfg_defaults(agent_rollout_cfg *cfg);
/* 0, or -1 with the offending field named in err. */
int agent_rollout_cfg_check(const agent_rollout_cfg *cfg, char *err, size_t errlen);
/* "lognormal" / "normal" -> dist; -1 when unknown. */
int agent_dist_parse(const char *s, agent_dist *out);

/* Why a completion ended; values equal rlorch.v1.FinishReason. */
typedef enum { AGENT_FINISH_STOP = 1, AGENT_FINISH_LENGTH = 2 } agent_finish;

/* How to sample (rlorch.v1.SamplingParams); top_p and top_k do not change a
 * synthetic completion and are left out. */
typedef struct agent_sampling {
  double temperature;              /* 0 (or below, or NaN): greedy */
  uint32_t max_tokens;             /* most completion tokens; 0: no cap */
  const uint32_t *stop_token_ids;  /* generation stops after any of them */
  size_t nstop;
  uint64_t seed;                   /* 0: the generator chooses */
} agent_sampling;

/* A request without SamplingParams: temperature 1, no cap, no stop token, no seed. */
void agent_sampling_defaults(agent_sampling *s);

/* One rollout request: a group of `count` completions of one prompt. Every
 * pointer is borrowed for the duration of the call it is passed to. */
typedef struct agent_request {
  uint64_t request_id;
  uint64_t group_id;
  uint32_t count;
  const uint32_t *prompt_token_ids; /* empty: an empty context */
  size_t n_prompt;
  const uint8_t *prompt_metadata;   /* the prompt source's metadata, opaque */
  size_t n_metadata;
  agent_sampling sampling;
} agent_request;

/* ---- rewards: the hook of the embedding program ------------------------------------------- */

#define AGENT_REWARDS_MAX 16 /* rewards one completion may carry */

/* What the reward code sees of one completion; every pointer is valid for
 * the duration of the call only. */
typedef struct agent_reward_input {
  const uint32_t *prompt_token_ids;
  size_t n_prompt;
  const uint32_t *completion_token_ids; /* the stop token included, when one ended it */
  const float *completion_logprobs;     /* one per completion token */
  size_t n_completion;                  /* >= 1 */
  const uint8_t *prompt_metadata;       /* e.g. a reference answer */
  size_t n_metadata;
  agent_finish finish_reason;
  uint64_t request_id;
  uint64_t group_id;
  uint32_t index;                       /* within the group, < group_size */
  uint32_t group_size;
  uint64_t policy_version;
  uint32_t vocab_size;                  /* completion ids are below it */
} agent_reward_input;

/* Scores one completion: writes 1 to `cap` finite rewards into rewards[],
 * their number into *n, and returns 0; or returns non-zero with a message in
 * err (a failed verifier, say). It is called on the generator threads, up to
 * --concurrency at once, so it must be thread-safe; `ud` is the pointer
 * installed with it. A failure, a count out of [1, cap] or a reward that is
 * not finite fails the whole request (agent_group_reward). */
typedef int (*agent_reward_fn)(void *ud, const agent_reward_input *in, double *rewards,
                               size_t cap, size_t *n, char *err, size_t errlen);

/* The built-in reward: one value, the fraction of completion tokens whose id
 * is below vocab_size / 2 (in [0, 1]; deterministic from the tokens). */
int agent_reward_default(void *ud, const agent_reward_input *in, double *rewards, size_t cap,
                         size_t *n, char *err, size_t errlen);

/* ---- the generator ------------------------------------------------------------------------ */

typedef struct agent_completion {
  uint64_t id;
  uint32_t index;          /* within the group */
  uint32_t *token_ids;     /* ntokens of them, below vocab_size */
  float *logprobs;         /* one per token, finite, <= 0 */
  uint32_t ntokens;        /* >= 1 */
  agent_finish finish;
  double rewards[AGENT_REWARDS_MAX];
  size_t nrewards;         /* 0 until agent_group_reward */
  double latency_s;        /* drawn */
  double seconds;          /* measured by whoever sleeps the latency (0 until then) */
} agent_completion;

/* The answer to one request; owned by the caller: agent_group_free. */
typedef struct agent_group {
  uint64_t request_id;
  uint64_t group_id;
  uint64_t policy_version; /* held when generation started */
  agent_completion *c;
  uint32_t n;              /* the request's count */
} agent_group;

typedef struct agent_rollout_gen {
  agent_rollout_cfg cfg;
  uint64_t seed;           /* for requests without a sampling seed */
  agent_reward_fn reward;  /* never NULL after init */
  void *reward_ud;
  uint64_t counter;        /* rollout ids; shared by the generator threads (atomic builtins) */
} agent_rollout_gen;

/* reward NULL: agent_reward_default. Ids are counted from 1 for every rank. */
void agent_rollout_gen_init(agent_rollout_gen *g, const agent_rollout_cfg *cfg, uint64_t seed,
                            agent_reward_fn reward, void *reward_ud);
/* Generates rq's group with policy `version` (tokens, logprobs, finish
 * reasons, drawn latencies; no sleep, no reward). Thread-safe on one g.
 * rank < 2^24. 0, or -1 with err filled (no memory) and *out empty. */
int agent_group_generate(agent_rollout_gen *g, const agent_request *rq, uint32_t rank,
                         uint64_t version, agent_group *out, char *err, size_t errlen);
/* Scores every completion with the generator's reward hook. 0, or -1 with err
 * naming the completion and the hook's message; then no completion should be
 * sent (rewards of a group are compared with each other). */
int agent_group_reward(const agent_rollout_gen *g, const agent_request *rq, agent_group *grp,
                       char *err, size_t errlen);
void agent_group_free(agent_group *grp); /* empties it; NULL is fine */

#endif
