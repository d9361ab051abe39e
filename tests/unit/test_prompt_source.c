/* Prompt sources: synthetic determinism and range, JSONL prompts with their
 * metadata, wrap-around and epochs, every refused input with its message, and
 * lines longer than any fixed buffer. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/daemon/prompt_source.h"

static char tmpdir[64];

static void setup(void) {
  snprintf(tmpdir, sizeof tmpdir, "%s/rlorch_ps_XXXXXX", P_tmpdir);
  cr_assert_not_null(mkdtemp(tmpdir));
}

static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  cr_assert_eq(system(cmd), 0);
}

TestSuite(prompt_source, .init = setup, .fini = teardown);

/* Writes text to tmpdir/prompts.jsonl; returns the path in a static buffer. */
static const char *write_file(const char *text) {
  static char path[256];
  snprintf(path, sizeof path, "%s/prompts.jsonl", tmpdir);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fputs(text, f);
  fclose(f);
  return path;
}

static Rlorch__V1__PromptSource jsonl_spec(const char *path) {
  Rlorch__V1__PromptSource s = RLORCH__V1__PROMPT_SOURCE__INIT;
  s.source_case = RLORCH__V1__PROMPT_SOURCE__SOURCE_JSONL_PATH;
  s.jsonl_path = (char *)path;
  return s;
}

static prompt_source *open_ok(const Rlorch__V1__PromptSource *spec, uint32_t max_tokens) {
  prompt_source *ps = NULL;
  char err[1024] = "";
  cr_assert_eq(prompt_source_open(spec, max_tokens, &ps, err, sizeof err), 0, "%s", err);
  cr_assert_not_null(ps);
  return ps;
}

static void next_ok(prompt_source *ps, prompt *p) {
  char err[1024] = "";
  cr_assert_eq(prompt_source_next(ps, p, err, sizeof err), 0, "%s", err);
}

static void expect_tokens(const prompt *p, const uint32_t *want, size_t n) {
  cr_assert_eq(p->ntokens, n, "%zu tokens, want %zu", p->ntokens, n);
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(p->token_ids[i], want[i], "token %zu: %u, want %u", i, p->token_ids[i], want[i]);
}

/* ---- synthetic ------------------------------------------------------------------------------ */

Test(prompt_source, no_spec_is_synthetic_with_the_defaults) {
  prompt_source *ps = open_ok(NULL, 0);
  cr_assert_str_eq(prompt_source_describe(ps), "synthetic (16 tokens, vocab 32000, seed 0)");
  /* A spec with an empty oneof and one with zeroed fields mean the same. */
  Rlorch__V1__PromptSource empty = RLORCH__V1__PROMPT_SOURCE__INIT;
  Rlorch__V1__SyntheticPrompts zero = RLORCH__V1__SYNTHETIC_PROMPTS__INIT;
  Rlorch__V1__PromptSource synth = RLORCH__V1__PROMPT_SOURCE__INIT;
  synth.source_case = RLORCH__V1__PROMPT_SOURCE__SOURCE_SYNTHETIC;
  synth.synthetic = &zero;
  prompt_source *b = open_ok(&empty, 0), *c = open_ok(&synth, 0);
  cr_assert_str_eq(prompt_source_describe(c), prompt_source_describe(ps));
  for (uint64_t i = 0; i < 50; i++) {
    prompt p, q, r;
    next_ok(ps, &p);
    next_ok(b, &q);
    next_ok(c, &r);
    cr_assert_eq(p.index, i);
    cr_assert_eq(p.ntokens, 16u);
    cr_assert_null(p.metadata);
    cr_assert_eq(p.nmetadata, 0u);
    expect_tokens(&q, p.token_ids, p.ntokens);
    expect_tokens(&r, p.token_ids, p.ntokens);
    for (size_t k = 0; k < p.ntokens; k++) cr_assert_lt(p.token_ids[k], 32000u);
    prompt_free(&p);
    prompt_free(&q);
    prompt_free(&r);
  }
  cr_assert_eq(prompt_source_epoch(ps), 0u, "synthetic prompts never wrap");
  prompt_source_close(ps);
  prompt_source_close(b);
  prompt_source_close(c);
}

static void draw_synthetic(uint32_t tokens, uint32_t vocab, uint64_t seed, size_t count,
                           uint32_t *out) {
  Rlorch__V1__SyntheticPrompts s = RLORCH__V1__SYNTHETIC_PROMPTS__INIT;
  s.prompt_tokens = tokens;
  s.vocab_size = vocab;
  s.seed = seed;
  Rlorch__V1__PromptSource spec = RLORCH__V1__PROMPT_SOURCE__INIT;
  spec.source_case = RLORCH__V1__PROMPT_SOURCE__SOURCE_SYNTHETIC;
  spec.synthetic = &s;
  prompt_source *ps = open_ok(&spec, 0);
  for (size_t i = 0; i < count; i++) {
    prompt p;
    next_ok(ps, &p);
    cr_assert_eq(p.ntokens, tokens);
    memcpy(out + i * tokens, p.token_ids, tokens * sizeof *out);
    prompt_free(&p);
  }
  prompt_source_close(ps);
}

Test(prompt_source, synthetic_is_a_function_of_the_seed) {
  enum { T = 8, N = 200 };
  static uint32_t a[T * N], b[T * N], c[T * N];
  draw_synthetic(T, 1000, 42, N, a);
  draw_synthetic(T, 1000, 42, N, b);
  draw_synthetic(T, 1000, 43, N, c);
  cr_assert_eq(memcmp(a, b, sizeof a), 0, "the same seed gives the same prompts");
  cr_assert_neq(memcmp(a, c, sizeof a), 0, "another seed gives other prompts");
  /* Prompts differ from each other, and none is its predecessor shifted by a
   * token (the flaw of seeding one stream with seed + index). */
  for (size_t i = 1; i < N; i++) {
    cr_assert_neq(memcmp(a + i * T, a + (i - 1) * T, T * sizeof *a), 0, "prompt %zu repeats", i);
    cr_assert_neq(memcmp(a + i * T, a + (i - 1) * T + 1, (T - 1) * sizeof *a), 0,
                  "prompt %zu is prompt %zu shifted", i, i - 1);
  }
  Rlorch__V1__SyntheticPrompts s = RLORCH__V1__SYNTHETIC_PROMPTS__INIT;
  s.prompt_tokens = T;
  s.vocab_size = 1000;
  s.seed = 42;
  Rlorch__V1__PromptSource spec = RLORCH__V1__PROMPT_SOURCE__INIT;
  spec.source_case = RLORCH__V1__PROMPT_SOURCE__SOURCE_SYNTHETIC;
  spec.synthetic = &s;
  prompt_source *ps = open_ok(&spec, 0);
  cr_assert_str_eq(prompt_source_describe(ps), "synthetic (8 tokens, vocab 1000, seed 42)");
  prompt_source_close(ps);
}

Test(prompt_source, synthetic_ids_cover_the_vocabulary_evenly) {
  enum { T = 100, N = 100, V = 10 };
  static uint32_t ids[T * N];
  draw_synthetic(T, V, 7, N, ids);
  size_t seen[V] = {0};
  for (size_t i = 0; i < T * N; i++) {
    cr_assert_lt(ids[i], (uint32_t)V);
    seen[ids[i]]++;
  }
  for (int v = 0; v < V; v++)
    cr_assert(seen[v] > 900 && seen[v] < 1100, "id %d drawn %zu times of 10000", v, seen[v]);
  /* The smallest vocabulary: both ids occur. */
  static uint32_t two[T];
  draw_synthetic(T, 2, 1, 1, two);
  size_t ones = 0;
  for (size_t i = 0; i < T; i++) {
    cr_assert_lt(two[i], 2u);
    ones += two[i];
  }
  cr_assert(ones > 0 && ones < T, "%zu ones of %d", ones, T);
}

static void expect_open_error(const Rlorch__V1__PromptSource *spec, uint32_t max_tokens,
                              const char *want) {
  prompt_source *ps = (prompt_source *)1;
  char err[1024] = "";
  cr_assert_eq(prompt_source_open(spec, max_tokens, &ps, err, sizeof err), -1, "accepted");
  cr_assert_null(ps);
  cr_assert_str_eq(err, want);
}

Test(prompt_source, synthetic_settings_are_checked) {
  Rlorch__V1__SyntheticPrompts s = RLORCH__V1__SYNTHETIC_PROMPTS__INIT;
  Rlorch__V1__PromptSource spec = RLORCH__V1__PROMPT_SOURCE__INIT;
  spec.source_case = RLORCH__V1__PROMPT_SOURCE__SOURCE_SYNTHETIC;
  spec.synthetic = &s;
  s.vocab_size = 1;
  expect_open_error(&spec, 0, "prompts.synthetic.vocab_size: 1 is too small (at least 2)");
  s.vocab_size = 2;
  s.prompt_tokens = 20;
  expect_open_error(&spec, 16,
                    "prompts.synthetic.prompt_tokens: 20 is more than max_prompt_tokens (16)");
  s.prompt_tokens = 0; /* the default, 16, fits */
  prompt_source_close(open_ok(&spec, 16));
}

/* ---- JSONL ---------------------------------------------------------------------------------- */

Test(prompt_source, jsonl_prompts_with_metadata_wrap_around) {
  const char *path = write_file("{\"prompt_token_ids\": [1, 2, 3], \"metadata\": \"answer: 42\"}\n"
                                "\n"
                                "   \t\r\n"
                                "{\"id\": \"p2\", \"prompt_token_ids\": [4294967295], \"extra\": [1, {}]}\n"
                                "{\"metadata\": \"a\\u0000b\", \"prompt_token_ids\": [0, 7]}");
  Rlorch__V1__PromptSource spec = jsonl_spec(path);
  prompt_source *ps = open_ok(&spec, 3);
  char want[512];
  snprintf(want, sizeof want, "jsonl:%s (1 lines read)", path);
  cr_assert_str_eq(prompt_source_describe(ps), want, "open read the first prompt only");
  static const uint32_t p0[] = {1, 2, 3}, p1[] = {4294967295u}, p2[] = {0, 7};
  for (uint64_t i = 0; i < 7; i++) {
    prompt p;
    next_ok(ps, &p);
    cr_assert_eq(p.index, i);
    cr_assert_eq(prompt_source_epoch(ps), i / 3, "prompt %llu: epoch %llu",
                 (unsigned long long)i, (unsigned long long)prompt_source_epoch(ps));
    switch (i % 3) {
    case 0:
      expect_tokens(&p, p0, 3);
      cr_assert_eq(p.nmetadata, 10u);
      cr_assert_eq(memcmp(p.metadata, "answer: 42", 10), 0);
      break;
    case 1:
      expect_tokens(&p, p1, 1);
      cr_assert_null(p.metadata, "no metadata key: none");
      cr_assert_eq(p.nmetadata, 0u);
      break;
    case 2:
      expect_tokens(&p, p2, 2);
      cr_assert_eq(p.nmetadata, 3u, "metadata is bytes, a NUL included");
      cr_assert_eq(memcmp(p.metadata, "a\0b", 3), 0);
      break;
    }
    prompt_free(&p);
  }
  cr_assert_eq(prompt_source_epoch(ps), 2u);
  snprintf(want, sizeof want, "jsonl:%s (11 lines read)", path);
  cr_assert_str_eq(prompt_source_describe(ps), want);
  prompt_source_close(ps);
}

/* A resumed run skips what its committed steps drew: it goes on where the
 * source was, epochs included, rather than starting it over. */
Test(prompt_source, skipping_goes_on_where_a_run_was) {
  const char *path = write_file("{\"prompt_token_ids\": [1]}\n{\"prompt_token_ids\": [2]}\n"
                                "{\"prompt_token_ids\": [3]}\n");
  Rlorch__V1__PromptSource spec = jsonl_spec(path);
  prompt_source *ps = open_ok(&spec, 0);
  char err[1024] = "";
  cr_assert_eq(prompt_source_skip(ps, 4, err, sizeof err), 0, "%s", err);
  cr_assert_eq(prompt_source_drawn(ps), 4);
  cr_assert_eq(prompt_source_epoch(ps), 1);
  prompt p;
  next_ok(ps, &p);
  cr_assert_eq(p.index, 4);
  expect_tokens(&p, (const uint32_t[]){2}, 1);
  prompt_free(&p);
  prompt_source_close(ps);
  /* Synthetic: prompt i is prompt i, skipped to or drawn. */
  Rlorch__V1__PromptSource syn = RLORCH__V1__PROMPT_SOURCE__INIT;
  prompt_source *a = open_ok(&syn, 0), *b = open_ok(&syn, 0);
  prompt pa, pb;
  for (int i = 0; i < 5; i++) {
    next_ok(a, &pa);
    prompt_free(&pa);
  }
  cr_assert_eq(prompt_source_skip(b, 5, err, sizeof err), 0, "%s", err);
  next_ok(a, &pa);
  next_ok(b, &pb);
  cr_assert_eq(pa.index, pb.index);
  expect_tokens(&pb, pa.token_ids, pa.ntokens);
  prompt_free(&pa);
  prompt_free(&pb);
  prompt_source_close(a);
  prompt_source_close(b);
}

Test(prompt_source, a_line_longer_than_64_kib) {
  enum { N = 20000 }; /* "31999, " a token: about 140 KB on one line */
  size_t cap = 64 + N * 8;
  char *text = malloc(cap + 64);
  size_t off = (size_t)sprintf(text, "{\"metadata\": \"long\", \"prompt_token_ids\": [");
  for (int i = 0; i < N; i++) off += (size_t)sprintf(text + off, "%s%d", i ? ", " : "", 31999 - i);
  off += (size_t)sprintf(text + off, "]}\n{\"prompt_token_ids\": [5]}\n");
  cr_assert_gt(off, (size_t)65536 + 65536);
  Rlorch__V1__PromptSource spec = jsonl_spec(write_file(text));
  free(text);
  prompt_source *ps = open_ok(&spec, 0);
  prompt p;
  next_ok(ps, &p);
  cr_assert_eq(p.ntokens, (size_t)N);
  for (int i = 0; i < N; i++) cr_assert_eq(p.token_ids[i], (uint32_t)(31999 - i));
  cr_assert_eq(p.nmetadata, 4u);
  prompt_free(&p);
  next_ok(ps, &p);
  cr_assert_eq(p.ntokens, 1u, "the line after the long one is read whole");
  cr_assert_eq(p.token_ids[0], 5u);
  prompt_free(&p);
  prompt_source_close(ps);
}

/* The file's first line is `line`: open refuses it with
 * "prompts.jsonl_path: PATH:LINE: <want>". */
static void expect_line_error(const char *text, uint32_t max_tokens, const char *want) {
  const char *path = write_file(text);
  Rlorch__V1__PromptSource spec = jsonl_spec(path);
  char full[1024];
  snprintf(full, sizeof full, "prompts.jsonl_path: %s:%s", path, want);
  expect_open_error(&spec, max_tokens, full);
}

Test(prompt_source, each_bad_line_is_named_with_its_line_and_key) {
  expect_line_error("{\"prompt_token_ids\": [1, 2}\n", 0,
                    "1: not JSON: ']' expected near '}' (column 27)");
  expect_line_error("\n\nnot json\n", 0,
                    "3: not JSON: '[' or '{' expected near 'not' (column 3)");
  expect_line_error("{\"prompt_token_ids\": [1]} {\"prompt_token_ids\": [2]}\n", 0,
                    "1: not JSON: end of file expected near '{' (column 27)");
  expect_line_error("{\"prompt_token_ids\": [1], \"prompt_token_ids\": [2]}\n", 0,
                    "1: not JSON: duplicate object key near '\"prompt_token_ids\"' (column 44)");
  expect_line_error("[1, 2, 3]\n", 0,
                    "1: an array, not a JSON object (one prompt a line: "
                    "{\"prompt_token_ids\": [...], \"metadata\": \"...\"})");
  expect_line_error("{\"tokens\": [1]}\n", 0, "1: prompt_token_ids: missing");
  expect_line_error("{\"prompt_token_ids\": \"1 2\"}\n", 0,
                    "1: prompt_token_ids: a string, not an array");
  expect_line_error("{\"prompt_token_ids\": []}\n", 0, "1: prompt_token_ids: empty");
  expect_line_error("{\"prompt_token_ids\": [1, \"2\"]}\n", 0,
                    "1: prompt_token_ids[1]: a string, not an integer");
  expect_line_error("{\"prompt_token_ids\": [1, 2.0]}\n", 0,
                    "1: prompt_token_ids[1]: a real number, not an integer");
  expect_line_error("{\"prompt_token_ids\": [-1]}\n", 0,
                    "1: prompt_token_ids[0]: -1 is not a token id (an integer in [0, 4294967295])");
  expect_line_error("{\"prompt_token_ids\": [0, 4294967296]}\n", 0,
                    "1: prompt_token_ids[1]: 4294967296 is not a token id (an integer in [0, 4294967295])");
  expect_line_error("{\"prompt_token_ids\": [1, 2, 3, 4]}\n", 3,
                    "1: prompt_token_ids: 4 tokens is more than max_prompt_tokens (3)");
  expect_line_error("{\"prompt_token_ids\": [1], \"metadata\": {\"answer\": 1}}\n", 0,
                    "1: metadata: an object, not a string");
  expect_line_error("{\"prompt_token_ids\": [1], \"metadata\": null}\n", 0,
                    "1: metadata: null, not a string");
}

Test(prompt_source, files_that_hold_no_prompt) {
  char want[512];
  const char *path = write_file("");
  Rlorch__V1__PromptSource spec = jsonl_spec(path);
  snprintf(want, sizeof want, "prompts.jsonl_path: %s: no prompt in the file (it is empty)", path);
  expect_open_error(&spec, 0, want);
  write_file("\n  \n\n");
  snprintf(want, sizeof want, "prompts.jsonl_path: %s: no prompt in the file (3 lines, all blank)",
           path);
  expect_open_error(&spec, 0, want);
  char missing[256];
  snprintf(missing, sizeof missing, "%s/nope.jsonl", tmpdir);
  spec = jsonl_spec(missing);
  snprintf(want, sizeof want, "prompts.jsonl_path: %s: No such file or directory", missing);
  expect_open_error(&spec, 0, want);
  spec = jsonl_spec(tmpdir);
  snprintf(want, sizeof want, "prompts.jsonl_path: %s: not a regular file", tmpdir);
  expect_open_error(&spec, 0, want);
  spec = jsonl_spec("");
  expect_open_error(&spec, 0, "prompts.jsonl_path: empty");
}

Test(prompt_source, a_bad_line_later_is_returned_by_next) {
  const char *path = write_file("{\"prompt_token_ids\": [1]}\n"
                                "{\"prompt_token_ids\": [2]}\n"
                                "\n"
                                "{\"prompt_token_ids\": [3, -4]}\n");
  Rlorch__V1__PromptSource spec = jsonl_spec(path);
  prompt_source *ps = open_ok(&spec, 0);
  prompt p;
  next_ok(ps, &p);
  prompt_free(&p);
  next_ok(ps, &p);
  prompt_free(&p);
  char err[1024] = "", want[512];
  memset(&p, 0xff, sizeof p);
  cr_assert_eq(prompt_source_next(ps, &p, err, sizeof err), -1);
  snprintf(want, sizeof want,
           "%s:4: prompt_token_ids[1]: -4 is not a token id (an integer in [0, 4294967295])", path);
  cr_assert_str_eq(err, want);
  cr_assert_null(p.token_ids, "nothing to free after an error");
  cr_assert_eq(p.ntokens, 0u);
  prompt_source_close(ps);
}

Test(prompt_source, a_file_emptied_under_the_run) {
  const char *path = write_file("{\"prompt_token_ids\": [1]}\n{\"prompt_token_ids\": [2]}\n");
  Rlorch__V1__PromptSource spec = jsonl_spec(path);
  prompt_source *ps = open_ok(&spec, 0);
  write_file(""); /* truncated in place: the source's descriptor sees it */
  prompt p;
  next_ok(ps, &p); /* the one open parsed */
  cr_assert_eq(p.token_ids[0], 1u);
  prompt_free(&p);
  /* What stdio had buffered before the truncation may still come; going back
   * to the top then finds nothing, and the source says so instead of looping. */
  char err[1024] = "", want[512];
  int rc = 0, draws = 0;
  while (rc == 0 && draws++ < 4) {
    rc = prompt_source_next(ps, &p, err, sizeof err);
    prompt_free(&p);
  }
  cr_assert_eq(rc, -1, "a pass without a prompt ends the source");
  snprintf(want, sizeof want, "%s: no prompt in the file (it is empty)", path);
  cr_assert_str_eq(err, want);
  prompt_source_close(ps);
}

Test(prompt_source, free_and_close_take_null) {
  prompt_free(NULL);
  prompt_source_close(NULL);
  prompt p = {0};
  prompt_free(&p);
  cr_assert_null(p.token_ids);
}
