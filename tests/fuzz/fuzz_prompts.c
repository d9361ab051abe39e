/* Fuzz target: the JSONL prompt source (orchestrator/daemon/prompt_source.c),
 * the input being the file a run's prompts.jsonl_path names.
 *
 * The source is opened (which parses the first prompt, as StartRun does) and
 * drawn from as the runner draws, past the end of the file so that it goes
 * round again, until the first error, which ends a run. Every prompt drawn
 * holds 1..max_prompt_tokens token ids, prompts are numbered in order, and
 * the epoch only grows. */
#include "fuzz_util.h"

#include "orchestrator/daemon/prompt_source.h"
#include "rlorch/v1/control.pb-c.h"

#define MAX_TOKENS 64 /* small, so that inputs of a few KiB reach the limit */

static fuzz_file in;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  fuzz_file_init(&in, "prompts.jsonl");
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_file_set(&in, data, size);
  Rlorch__V1__PromptSource spec = RLORCH__V1__PROMPT_SOURCE__INIT;
  spec.source_case = RLORCH__V1__PROMPT_SOURCE__SOURCE_JSONL_PATH;
  spec.jsonl_path = in.path;
  prompt_source *ps = NULL;
  char err[1024] = "";
  if (prompt_source_open(&spec, MAX_TOKENS, &ps, err, sizeof err) != 0) {
    FUZZ_CHECK(!ps, "a source after a failed open");
    FUZZ_CHECK(!strncmp(err, "prompts.jsonl_path: ", 20), "error without its field: '%s'", err);
    return 0;
  }
  /* Enough draws to go round a file of short lines twice. */
  size_t lines = 1;
  for (size_t i = 0; i < size; i++) lines += data[i] == '\n';
  size_t draws = 2 * lines + 2 < 256 ? 2 * lines + 2 : 256;
  uint64_t epoch = 0;
  for (size_t i = 0; i < draws; i++) {
    prompt p;
    if (prompt_source_next(ps, &p, err, sizeof err) != 0) {
      FUZZ_CHECK(!p.token_ids && !p.metadata && err[0], "failed draw left a prompt or no reason");
      FUZZ_CHECK(i > 0, "the prompt parsed by open was lost");
      break;
    }
    FUZZ_CHECK(p.ntokens >= 1 && p.ntokens <= MAX_TOKENS && p.token_ids, "%zu tokens", p.ntokens);
    FUZZ_CHECK(p.index == i, "prompt %zu numbered %llu", i, (unsigned long long)p.index);
    FUZZ_CHECK(!p.nmetadata == !p.metadata, "metadata of %zu bytes at %p", p.nmetadata,
               (void *)p.metadata);
    FUZZ_CHECK(prompt_source_epoch(ps) >= epoch, "epoch went back");
    epoch = prompt_source_epoch(ps);
    FUZZ_CHECK(prompt_source_describe(ps)[0], "no description");
    prompt_free(&p);
  }
  prompt_source_close(ps);
  return 0;
}
