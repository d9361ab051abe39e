/* Synthetic completions: lengths and latencies from lognormal or normal
 * draws, token ids and logprobs from a splitmix64 stream per completion. */
#include "workers/agent/agent_rollout.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void agent_rollout_cfg_defaults(agent_rollout_cfg *cfg) {
  cfg->dist = AGENT_DIST_LOGNORMAL;
  cfg->tokens_mean = 256;
  cfg->tokens_std = 64;
  cfg->latency_ms_mean = 2;
  cfg->latency_ms_std = 0.5;
  cfg->vocab_size = AGENT_VOCAB_DEFAULT;
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
  else if (!(cfg->tokens_mean >= 1 && cfg->tokens_mean <= 1e6)) bad = "--tokens-mean";
  else if (!(cfg->tokens_std >= 0 && cfg->tokens_std <= 1e6)) bad = "--tokens-std";
  else if (!(cfg->latency_ms_mean >= 0 && cfg->latency_ms_mean <= 3.6e6)) bad = "--latency-ms-mean";
  else if (!(cfg->latency_ms_std >= 0 && cfg->latency_ms_std <= 3.6e6)) bad = "--latency-ms-std";
  if (bad) {
    snprintf(err, errlen, "%s: out of range (tokens mean in [1, 1e6], stds >= 0, latency mean >= 0)",
             bad);
    return -1;
  }
  if (cfg->vocab_size < 2) {
    snprintf(err, errlen, "--vocab-size: %u out of range (at least 2)", cfg->vocab_size);
    return -1;
  }
  return 0;
}

void agent_sampling_defaults(agent_sampling *s) {
  memset(s, 0, sizeof *s);
  s->temperature = 1.0;
}

/* ---- the random streams --------------------------------------------------------------------- */

static uint64_t agent__mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static uint64_t agent__splitmix64(uint64_t *x) { return agent__mix64(*x += 0x9E3779B97F4A7C15ull); }

/* Uniform in (0, 1]: never 0, so log() is finite. */
static double agent__uniform(uint64_t *x) {
  return ((double)(agent__splitmix64(x) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

static double agent__std_normal(uint64_t *x) {
  double u1 = agent__uniform(x), u2 = agent__uniform(x);
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* A draw with the given mean and standard deviation of the result itself. */
static double agent__draw(const agent_rollout_cfg *cfg, uint64_t *x, double mean, double std) {
  double z = agent__std_normal(x);
  if (cfg->dist == AGENT_DIST_NORMAL || mean <= 0) return mean + std * z;
  double s2 = log1p((std * std) / (mean * mean));
  return exp(log(mean) - s2 / 2 + sqrt(s2) * z);
}

/* Folds the prompt into one value; its length too, so [] and [0] differ. */
static uint64_t agent__hash_prompt(const uint32_t *ids, size_t n) {
  uint64_t h = 0x243F6A8885A308D3ull;
  for (size_t i = 0; i < n; i++) h = agent__mix64(h ^ (ids[i] + 0x9E3779B97F4A7C15ull));
  return agent__mix64(h ^ (uint64_t)n);
}

static int agent__greedy(const agent_sampling *s) { return !(s->temperature > 0); }

/* The stream every completion of rq is drawn from, before the index is mixed
 * in: (prompt, seed, policy version). */
static uint64_t agent__group_stream(const agent_rollout_gen *g, const agent_request *rq,
                                    uint64_t version) {
  /* No seed: the engine chooses, here from its own seed and the request, so
   * two requests for one prompt sample differently. */
  uint64_t seed = rq->sampling.seed ? rq->sampling.seed
                                    : agent__mix64(g->seed ^ agent__mix64(rq->request_id + 1));
  uint64_t h = agent__hash_prompt(rq->prompt_token_ids, rq->n_prompt);
  h = agent__mix64(h ^ agent__mix64(seed + 0x632BE59BD9B4E019ull));
  return agent__mix64(h ^ agent__mix64(version + 0x85EBCA77C2B2AE63ull));
}

static int agent__cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* Fills c from its stream: length, latency, then one 64-bit draw a token
 * (the id from the low half, the logprob from the high bits), so the tokens
 * do not depend on the length drawn and a cap keeps a prefix. */
static int agent__complete(const agent_rollout_gen *g, const agent_request *rq, uint64_t stream,
                           const uint32_t *stops, size_t nstop, agent_completion *c) {
  const agent_rollout_cfg *cfg = &g->cfg;
  uint64_t x = stream;
  double tokens = agent__draw(cfg, &x, cfg->tokens_mean, cfg->tokens_std);
  double ms = agent__draw(cfg, &x, cfg->latency_ms_mean, cfg->latency_ms_std);
  tokens = tokens < 1 ? 1 : (tokens > AGENT_TOKENS_MAX ? AGENT_TOKENS_MAX : tokens);
  uint32_t len = (uint32_t)llround(tokens);
  /* A completion that reaches its drawn length ends as an engine's end of
   * sequence would: STOP. */
  c->finish = AGENT_FINISH_STOP;
  if (rq->sampling.max_tokens && len > rq->sampling.max_tokens) {
    len = rq->sampling.max_tokens;
    c->finish = AGENT_FINISH_LENGTH;
  }
  c->latency_s = (ms < 0 ? 0 : ms) / 1000.0;
  c->token_ids = malloc((size_t)len * sizeof *c->token_ids);
  c->logprobs = malloc((size_t)len * sizeof *c->logprobs);
  if (!c->token_ids || !c->logprobs) return -1;
  /* Made-up log-probabilities in (-4 T, 0], T capped so they stay finite and
   * plausible; a greedy pick has probability 1 under the sampler. */
  double t = agent__greedy(&rq->sampling) ? 0 : fmin(rq->sampling.temperature, 16.0);
  for (uint32_t k = 0; k < len; k++) {
    uint64_t r = agent__splitmix64(&x);
    uint32_t id = (uint32_t)(((r & 0xffffffffu) * (uint64_t)cfg->vocab_size) >> 32);
    c->token_ids[k] = id;
    c->logprobs[k] = 0.0f - (float)(t * 4.0 * (double)(r >> 40) * (1.0 / 16777216.0));
    c->ntokens = k + 1;
    /* The stop token is part of the completion, as engines return it. */
    if (nstop && bsearch(&id, stops, nstop, sizeof *stops, agent__cmp_u32)) {
      c->finish = AGENT_FINISH_STOP;
      break;
    }
  }
  return 0;
}

void agent_rollout_gen_init(agent_rollout_gen *g, const agent_rollout_cfg *cfg, uint64_t seed,
                            agent_reward_fn reward, void *reward_ud) {
  memset(g, 0, sizeof *g);
  g->cfg = *cfg;
  g->seed = seed;
  g->reward = reward ? reward : agent_reward_default;
  g->reward_ud = reward ? reward_ud : NULL;
}

int agent_group_generate(agent_rollout_gen *g, const agent_request *rq, uint32_t rank,
                         uint64_t version, agent_group *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  out->request_id = rq->request_id;
  out->group_id = rq->group_id;
  out->policy_version = version;
  uint32_t *stops = NULL;
  size_t nstop = rq->sampling.nstop;
  if (nstop) {
    stops = malloc(nstop * sizeof *stops);
    if (!stops) goto oom;
    memcpy(stops, rq->sampling.stop_token_ids, nstop * sizeof *stops);
    qsort(stops, nstop, sizeof *stops, agent__cmp_u32);
  }
  if (rq->count) {
    out->c = calloc(rq->count, sizeof *out->c);
    if (!out->c) goto oom;
  }
  out->n = rq->count;
  uint64_t group = agent__group_stream(g, rq, version);
  int greedy = agent__greedy(&rq->sampling);
  for (uint32_t i = 0; i < out->n; i++) {
    agent_completion *c = &out->c[i];
    uint64_t n = __atomic_add_fetch(&g->counter, 1, __ATOMIC_RELAXED);
    c->id = ((uint64_t)(rank & 0xffffffu) << 40) | (n & ((UINT64_C(1) << 40) - 1));
    c->index = i;
    /* Greedy decoding has nothing to sample: every completion is the same. */
    uint64_t stream = greedy ? group : agent__mix64(group ^ agent__mix64((uint64_t)i + 1));
    if (agent__complete(g, rq, stream, stops, nstop, c)) goto oom;
  }
  free(stops);
  return 0;
oom:
  free(stops);
  snprintf(err, errlen, "no memory for a group of %u completions", rq->count);
  agent_group_free(out);
  return -1;
}

int agent_reward_default(void *ud, const agent_reward_input *in, double *rewards, size_t cap,
                         size_t *n, char *err, size_t errlen) {
  size_t low = 0;
  for (size_t k = 0; k < in->n_completion; k++) low += in->completion_token_ids[k] < in->vocab_size / 2;
  rewards[0] = in->n_completion ? (double)low / (double)in->n_completion : 0.0;
  *n = 1;
  return 0;
}

int agent_group_reward(const agent_rollout_gen *g, const agent_request *rq, agent_group *grp,
                       char *err, size_t errlen) {
  for (uint32_t i = 0; i < grp->n; i++) {
    agent_completion *c = &grp->c[i];
    agent_reward_input in = {
        .prompt_token_ids = rq->prompt_token_ids,
        .n_prompt = rq->n_prompt,
        .completion_token_ids = c->token_ids,
        .completion_logprobs = c->logprobs,
        .n_completion = c->ntokens,
        .prompt_metadata = rq->prompt_metadata,
        .n_metadata = rq->n_metadata,
        .finish_reason = c->finish,
        .request_id = grp->request_id,
        .group_id = grp->group_id,
        .index = c->index,
        .group_size = grp->n,
        .policy_version = grp->policy_version,
        .vocab_size = g->cfg.vocab_size,
    };
    char why[512] = "";
    size_t n = 0;
    c->nrewards = 0;
    int rc = g->reward(g->reward_ud, &in, c->rewards, AGENT_REWARDS_MAX, &n, why, sizeof why);
    if (rc) {
      snprintf(err, errlen, "reward hook: group %llu completion %u: %s",
               (unsigned long long)grp->group_id, i,
               why[0] ? why : "failed without a message");
      return -1;
    }
    if (n < 1 || n > AGENT_REWARDS_MAX) {
      snprintf(err, errlen, "reward hook: group %llu completion %u: %zu rewards (want 1 to %d)",
               (unsigned long long)grp->group_id, i, n, AGENT_REWARDS_MAX);
      return -1;
    }
    for (size_t k = 0; k < n; k++) {
      if (!isfinite(c->rewards[k])) {
        snprintf(err, errlen, "reward hook: group %llu completion %u: rewards[%zu] is %g, not a "
                 "finite number", (unsigned long long)grp->group_id, i, k, c->rewards[k]);
        return -1;
      }
    }
    c->nrewards = n;
  }
  return 0;
}

void agent_group_free(agent_group *grp) {
  if (!grp) return;
  for (uint32_t i = 0; grp->c && i < grp->n; i++) {
    free(grp->c[i].token_ids);
    free(grp->c[i].logprobs);
  }
  free(grp->c);
  memset(grp, 0, sizeof *grp);
}
