/* Prompt sources: synthetic (splitmix64) and JSONL files (jansson). */
#include "orchestrator/daemon/prompt_source.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

struct prompt_source {
  int jsonl;                  /* 0: synthetic */
  uint32_t max_tokens;        /* 0: no limit */
  uint64_t drawn;             /* prompts handed out */
  uint64_t epoch;
  char *desc;                 /* prompt_source_describe's text */
  size_t desclen;
  /* synthetic */
  uint32_t ntokens, vocab;
  uint64_t seed;
  /* jsonl */
  char *path;
  FILE *f;
  char *line;                 /* getline's buffer: no limit on a line's length */
  size_t cap;
  uint64_t lineno;            /* line of the current pass last read, from 1 */
  uint64_t lines_read;        /* in all passes */
  uint64_t found;             /* prompts found in the current pass */
  prompt pending;             /* the first prompt, parsed by open */
  int has_pending;
};

/* ---- synthetic ------------------------------------------------------------------------------ */

static uint64_t ps__mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static uint64_t ps__splitmix64(uint64_t *x) { return ps__mix64(*x += 0x9E3779B97F4A7C15ull); }

/* Prompt i: the splitmix64 stream seeded with seed ^ mix(i + 1). The index
 * is mixed first: seeding with seed + i would make prompt i + 1 prompt i
 * shifted by one token (splitmix64 steps its state by a constant). */
static int ps__synthetic(const prompt_source *ps, prompt *out) {
  out->token_ids = malloc((size_t)ps->ntokens * sizeof *out->token_ids);
  if (!out->token_ids) return -1;
  uint64_t x = ps->seed ^ ps__mix64(ps->drawn + 1);
  for (uint32_t k = 0; k < ps->ntokens; k++) {
    uint64_t r = ps__splitmix64(&x);
    /* The high 32 bits scaled to [0, vocab): no modulo bias worth the name. */
    out->token_ids[k] = (uint32_t)(((r >> 32) * (uint64_t)ps->vocab) >> 32);
  }
  out->ntokens = ps->ntokens;
  return 0;
}

/* ---- JSONL ---------------------------------------------------------------------------------- */

static const char *ps__type_name(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "an array";
  case JSON_STRING: return "a string";
  case JSON_INTEGER: return "an integer";
  case JSON_REAL: return "a real number";
  case JSON_TRUE:
  case JSON_FALSE: return "a boolean";
  case JSON_NULL: return "null";
  }
  return "a value";
}

static int ps__blank(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
  return 1;
}

/* Parses one non-blank line into out: 0, or -1 with "PATH:LINE: ..." in err. */
static int ps__parse(const prompt_source *ps, const char *line, size_t len, prompt *out,
                     char *err, size_t errlen) {
  char at[64];
  snprintf(at, sizeof at, "%" PRIu64, ps->lineno);
  json_error_t jerr;
  /* Duplicate keys are refused: which of two prompt_token_ids was meant?
   * "\u0000" is allowed: metadata is bytes, handed on unchanged. */
  json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
  if (!root) {
    snprintf(err, errlen, "%s:%s: not JSON: %s (column %d)", ps->path, at, jerr.text, jerr.column);
    return -1;
  }
  int rc = -1;
  if (!json_is_object(root)) {
    snprintf(err, errlen, "%s:%s: %s, not a JSON object (one prompt a line: "
             "{\"prompt_token_ids\": [...], \"metadata\": \"...\"})", ps->path, at,
             ps__type_name(root));
    goto out;
  }
  json_t *ids = json_object_get(root, "prompt_token_ids");
  if (!ids) {
    snprintf(err, errlen, "%s:%s: prompt_token_ids: missing", ps->path, at);
    goto out;
  }
  if (!json_is_array(ids)) {
    snprintf(err, errlen, "%s:%s: prompt_token_ids: %s, not an array", ps->path, at,
             ps__type_name(ids));
    goto out;
  }
  size_t n = json_array_size(ids);
  if (n == 0) {
    snprintf(err, errlen, "%s:%s: prompt_token_ids: empty", ps->path, at);
    goto out;
  }
  if (ps->max_tokens && n > ps->max_tokens) {
    snprintf(err, errlen, "%s:%s: prompt_token_ids: %zu tokens is more than max_prompt_tokens (%" PRIu32 ")",
             ps->path, at, n, ps->max_tokens);
    goto out;
  }
  json_t *meta = json_object_get(root, "metadata");
  if (meta && !json_is_string(meta)) {
    snprintf(err, errlen, "%s:%s: metadata: %s, not a string", ps->path, at, ps__type_name(meta));
    goto out;
  }
  out->token_ids = malloc(n * sizeof *out->token_ids);
  if (!out->token_ids) {
    snprintf(err, errlen, "%s:%s: no memory for %zu tokens", ps->path, at, n);
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    json_t *v = json_array_get(ids, i);
    if (!json_is_integer(v)) {
      snprintf(err, errlen, "%s:%s: prompt_token_ids[%zu]: %s, not an integer", ps->path, at, i,
               ps__type_name(v));
      goto out;
    }
    json_int_t t = json_integer_value(v);
    if (t < 0 || t > (json_int_t)UINT32_MAX) {
      snprintf(err, errlen, "%s:%s: prompt_token_ids[%zu]: %" JSON_INTEGER_FORMAT
               " is not a token id (an integer in [0, 4294967295])", ps->path, at, i, t);
      goto out;
    }
    out->token_ids[i] = (uint32_t)t;
  }
  out->ntokens = n;
  size_t mlen = meta ? json_string_length(meta) : 0;
  if (mlen) {
    out->metadata = malloc(mlen);
    if (!out->metadata) {
      snprintf(err, errlen, "%s:%s: no memory for %zu bytes of metadata", ps->path, at, mlen);
      goto out;
    }
    memcpy(out->metadata, json_string_value(meta), mlen);
    out->nmetadata = mlen;
  }
  rc = 0;
out:
  if (rc) prompt_free(out);
  json_decref(root);
  return rc;
}

/* Reads lines up to the next prompt, going back to the top at the end of the
 * file (a new epoch); 0, or -1 with err filled. */
static int ps__read(prompt_source *ps, prompt *out, char *err, size_t errlen) {
  for (;;) {
    errno = 0;
    ssize_t n = getline(&ps->line, &ps->cap, ps->f);
    if (n < 0) {
      if (ferror(ps->f)) {
        int e = errno ? errno : EIO;
        clearerr(ps->f);
        snprintf(err, errlen, "%s:%" PRIu64 ": cannot read: %s", ps->path, ps->lineno + 1,
                 strerror(e));
        return -1;
      }
      /* A whole pass without a prompt: the file is empty, or it was changed
       * under the run; going round again would never end. */
      if (ps->found == 0) {
        /* Every line that is not blank is a prompt or an error. */
        if (ps->lineno == 0) snprintf(err, errlen, "%s: no prompt in the file (it is empty)", ps->path);
        else snprintf(err, errlen, "%s: no prompt in the file (%" PRIu64 " lines, all blank)",
                      ps->path, ps->lineno);
        return -1;
      }
      if (fseeko(ps->f, 0, SEEK_SET) != 0) {
        snprintf(err, errlen, "%s: cannot go back to the top: %s", ps->path, strerror(errno));
        return -1;
      }
      clearerr(ps->f);
      ps->epoch++;
      ps->lineno = 0;
      ps->found = 0;
      continue;
    }
    ps->lineno++;
    ps->lines_read++;
    if (ps__blank(ps->line, (size_t)n)) continue;
    if (ps__parse(ps, ps->line, (size_t)n, out, err, errlen)) return -1;
    ps->found++;
    return 0;
  }
}

/* ---- the source ----------------------------------------------------------------------------- */

static void ps__describe(prompt_source *ps) {
  if (ps->jsonl)
    snprintf(ps->desc, ps->desclen, "jsonl:%s (%" PRIu64 " lines read)", ps->path, ps->lines_read);
  else
    snprintf(ps->desc, ps->desclen, "synthetic (%" PRIu32 " tokens, vocab %" PRIu32 ", seed %" PRIu64 ")",
             ps->ntokens, ps->vocab, ps->seed);
}

static int ps__open_jsonl(prompt_source *ps, const char *path, char *err, size_t errlen) {
  if (!path || !path[0]) {
    snprintf(err, errlen, "prompts.jsonl_path: empty");
    return -1;
  }
  ps->jsonl = 1;
  ps->path = strdup(path);
  ps->desclen = strlen(path) + 64;
  ps->desc = malloc(ps->desclen);
  if (!ps->path || !ps->desc) {
    snprintf(err, errlen, "prompts.jsonl_path: no memory");
    return -1;
  }
  ps->f = fopen(path, "r");
  if (!ps->f) {
    snprintf(err, errlen, "prompts.jsonl_path: %s: %s", path, strerror(errno));
    return -1;
  }
  /* The file is read again from the top at its end: a pipe cannot be, and a
   * directory opens but does not read. */
  struct stat st;
  if (fstat(fileno(ps->f), &st) != 0 || !S_ISREG(st.st_mode)) {
    snprintf(err, errlen, "prompts.jsonl_path: %s: not a regular file", path);
    return -1;
  }
  char why[1024];
  if (ps__read(ps, &ps->pending, why, sizeof why)) {
    snprintf(err, errlen, "prompts.jsonl_path: %s", why);
    return -1;
  }
  ps->has_pending = 1;
  return 0;
}

static int ps__open_synthetic(prompt_source *ps, const Rlorch__V1__SyntheticPrompts *s,
                              char *err, size_t errlen) {
  ps->ntokens = s && s->prompt_tokens ? s->prompt_tokens : PROMPT_SOURCE_SYNTHETIC_TOKENS;
  ps->vocab = s && s->vocab_size ? s->vocab_size : PROMPT_SOURCE_SYNTHETIC_VOCAB;
  ps->seed = s ? s->seed : 0;
  if (ps->vocab < 2) {
    snprintf(err, errlen, "prompts.synthetic.vocab_size: %" PRIu32 " is too small (at least 2)",
             ps->vocab);
    return -1;
  }
  if (ps->max_tokens && ps->ntokens > ps->max_tokens) {
    snprintf(err, errlen, "prompts.synthetic.prompt_tokens: %" PRIu32
             " is more than max_prompt_tokens (%" PRIu32 ")", ps->ntokens, ps->max_tokens);
    return -1;
  }
  ps->desclen = 96;
  ps->desc = malloc(ps->desclen);
  if (!ps->desc) {
    snprintf(err, errlen, "prompts: no memory");
    return -1;
  }
  return 0;
}

int prompt_source_open(const Rlorch__V1__PromptSource *spec, uint32_t max_prompt_tokens,
                       prompt_source **out, char *err, size_t errlen) {
  *out = NULL;
  prompt_source *ps = calloc(1, sizeof *ps);
  if (!ps) {
    snprintf(err, errlen, "prompts: no memory");
    return -1;
  }
  ps->max_tokens = max_prompt_tokens;
  int rc;
  if (spec && spec->source_case == RLORCH__V1__PROMPT_SOURCE__SOURCE_JSONL_PATH)
    rc = ps__open_jsonl(ps, spec->jsonl_path, err, errlen);
  else
    rc = ps__open_synthetic(
        ps, spec && spec->source_case == RLORCH__V1__PROMPT_SOURCE__SOURCE_SYNTHETIC ? spec->synthetic : NULL,
        err, errlen);
  if (rc) {
    prompt_source_close(ps);
    return -1;
  }
  ps__describe(ps);
  *out = ps;
  return 0;
}

int prompt_source_next(prompt_source *ps, prompt *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (ps->has_pending) {
    *out = ps->pending;
    memset(&ps->pending, 0, sizeof ps->pending);
    ps->has_pending = 0;
  } else if (ps->jsonl) {
    int rc = ps__read(ps, out, err, errlen);
    ps__describe(ps);
    if (rc) return -1;
  } else if (ps__synthetic(ps, out)) {
    snprintf(err, errlen, "prompts: no memory for %" PRIu32 " tokens", ps->ntokens);
    return -1;
  }
  out->index = ps->drawn++;
  return 0;
}

void prompt_free(prompt *p) {
  if (!p) return;
  free(p->token_ids);
  free(p->metadata);
  memset(p, 0, sizeof *p);
}

void prompt_source_close(prompt_source *ps) {
  if (!ps) return;
  if (ps->f) fclose(ps->f);
  prompt_free(&ps->pending);
  free(ps->line);
  free(ps->path);
  free(ps->desc);
  free(ps);
}

uint64_t prompt_source_epoch(const prompt_source *ps) { return ps->epoch; }

uint64_t prompt_source_drawn(const prompt_source *ps) { return ps->drawn; }

int prompt_source_skip(prompt_source *ps, uint64_t n, char *err, size_t errlen) {
  for (uint64_t i = 0; i < n; i++) {
    prompt p;
    if (prompt_source_next(ps, &p, err, errlen) != 0) return -1;
    prompt_free(&p);
  }
  return 0;
}

const char *prompt_source_describe(const prompt_source *ps) { return ps->desc; }
