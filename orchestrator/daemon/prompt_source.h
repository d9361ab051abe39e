/* The prompts of a run (rlorch.v1.PromptSource): the orchestrator owns them
 * and draws the next one whenever it dispatches a request, so every rollout of
 * that request answers it.
 *
 * Two sources:
 * - synthetic: made-up prompts, prompt i derived from (seed, i) alone
 *   (splitmix64), so the same seed gives the same prompts on every run and
 *   machine. Defaults (a field left 0, or no source in the spec at all):
 *   16 tokens, vocab 32000, seed 0. It never wraps: its epoch stays 0.
 * - jsonl_path: a JSONL file, one object a line,
 *     {"prompt_token_ids": [ids...], "metadata": "text"}
 *   ("metadata" optional, other keys ignored, blank lines skipped), read one
 *   line at a time (a data set may be larger than memory) and again from the
 *   top at its end, which counts an epoch.
 *
 * Errors are one line: open's name the spec's field first
 * ("prompts.jsonl_path: data.jsonl:3: prompt_token_ids: empty",
 * "prompts.synthetic.vocab_size: ..."), so StartRun can refuse the spec with
 * them; a bad line met later by prompt_source_next reads "PATH:LINE: KEY: ..."
 * and ends the run. Loop thread only: a source is used by one thread. */
#ifndef RLORCH_DAEMON_PROMPT_SOURCE_H
#define RLORCH_DAEMON_PROMPT_SOURCE_H

#include <stddef.h>
#include <stdint.h>

#include "rlorch/v1/control.pb-c.h"

#define PROMPT_SOURCE_SYNTHETIC_TOKENS 16
#define PROMPT_SOURCE_SYNTHETIC_VOCAB 32000u

/* One prompt, owned by the caller after prompt_source_next: prompt_free. */
typedef struct prompt {
  uint32_t *token_ids;
  size_t ntokens;     /* >= 1 */
  uint8_t *metadata;  /* the line's "metadata", unchanged; NULL when none or empty */
  size_t nmetadata;
  uint64_t index;     /* prompts drawn before this one (0-based, across epochs) */
} prompt;

typedef struct prompt_source prompt_source;

/* spec NULL or with no source set: synthetic with the defaults.
 * max_prompt_tokens: most tokens of one prompt (a longer one is an error);
 * 0 for no limit. A JSONL file must open and its first prompt parse. On
 * failure *out is NULL and err says why. */
int prompt_source_open(const Rlorch__V1__PromptSource *spec, uint32_t max_prompt_tokens,
                       prompt_source **out, char *err, size_t errlen);
/* The next prompt into *out (which is overwritten, not freed). 0, or -1 with
 * err filled and *out empty: the line at fault (PATH:LINE: KEY: ...), a read
 * error, a file that no longer holds any prompt, or no memory. */
int prompt_source_next(prompt_source *ps, prompt *out, char *err, size_t errlen);
void prompt_free(prompt *p); /* frees what p holds and empties it; NULL is fine */
void prompt_source_close(prompt_source *ps); /* NULL is fine */

/* Times the source went back to its top (0 for synthetic). */
uint64_t prompt_source_epoch(const prompt_source *ps);
/* Prompts drawn so far (skipped ones included). */
uint64_t prompt_source_drawn(const prompt_source *ps);
/* Draws and drops the next n prompts, as a resumed run does with those its
 * committed steps had drawn (reading a file's lines: time in n). 0, or -1
 * with err filled as by prompt_source_next. */
int prompt_source_skip(prompt_source *ps, uint64_t n, char *err, size_t errlen);
/* For logs: "jsonl:PATH (N lines read)" or "synthetic (16 tokens, vocab 32000,
 * seed S)". Valid until the next call on ps. */
const char *prompt_source_describe(const prompt_source *ps);

#endif
