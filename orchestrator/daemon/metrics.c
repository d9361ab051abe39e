/* Metrics registry and Prometheus text rendering. Families keep their series
 * in creation order; a series is found through an index from the hash of its
 * label values, so that setting one costs O(1) however many there are: the
 * per-worker families hold one series per worker, and the sweep sets each of
 * them, which a scan would make quadratic in the workers. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/daemon/metrics.h"
#include "orchestrator/sched/sched_map.h"

typedef enum { METRICS__COUNTER, METRICS__GAUGE, METRICS__HISTOGRAM } metrics__kind;

#define METRICS__NONE UINT32_MAX /* end of a hash chain */

typedef struct metrics__series {
  uint64_t hash;
  uint32_t next;      /* the next series of the same hash (a collision), or METRICS__NONE */
  char **values;      /* nlabels label values */
  double value;       /* counter or gauge */
  uint64_t *counts;   /* histogram: per bucket (not cumulative), nbuckets + 1 */
  double sum;
  uint64_t count;
} metrics__series;

struct metrics_family {
  metrics__kind kind;
  char *name;
  char *help;
  char **labels;
  size_t nlabels;
  double *buckets;
  size_t nbuckets;
  metrics__series *series;
  size_t nseries, capseries;
  sched_map index; /* hash -> the first series of its chain */
};

struct metrics_registry {
  struct metrics_family **fams;
  size_t n, cap;
};

metrics_registry *metrics_registry_new(void) { return calloc(1, sizeof(metrics_registry)); }

static void metrics__family_free(struct metrics_family *f) {
  for (size_t i = 0; i < f->nseries; i++) {
    for (size_t j = 0; j < f->nlabels; j++) free(f->series[i].values[j]);
    free(f->series[i].values);
    free(f->series[i].counts);
  }
  free(f->series);
  sched_map_free(&f->index);
  for (size_t j = 0; j < f->nlabels; j++) free(f->labels[j]);
  free(f->labels);
  free(f->buckets);
  free(f->name);
  free(f->help);
  free(f);
}

void metrics_registry_free(metrics_registry *r) {
  if (!r) return;
  for (size_t i = 0; i < r->n; i++) metrics__family_free(r->fams[i]);
  free(r->fams);
  free(r);
}

static void metrics__err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void metrics__err(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || !errlen) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

static int metrics__valid_name(const char *s, int colon_ok) {
  if (!s || !*s) return 0;
  for (const char *p = s; *p; p++) {
    char c = *p;
    int alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon_ok && c == ':');
    if (!alpha && !(p != s && c >= '0' && c <= '9')) return 0;
  }
  return 1;
}

static int metrics__check(metrics_registry *r, metrics__kind kind, const char *name,
                          const char *const *labels, char *err, size_t errlen) {
  if (!r) return metrics__err(err, errlen, "metrics: no registry"), -1;
  if (!name) return metrics__err(err, errlen, "metrics: name missing"), -1;
  if (!metrics__valid_name(name, 1))
    return metrics__err(err, errlen, "metrics: %s: invalid metric name", name), -1;
  if (strncmp(name, "rlorch_", 7) != 0)
    return metrics__err(err, errlen, "metrics: %s: name must start with rlorch_", name), -1;
  size_t n = strlen(name);
  int total = n >= 6 && !strcmp(name + n - 6, "_total");
  if (kind == METRICS__COUNTER && !total)
    return metrics__err(err, errlen, "metrics: %s: counter name must end in _total", name), -1;
  if (kind != METRICS__COUNTER && total)
    return metrics__err(err, errlen, "metrics: %s: only counters end in _total", name), -1;
  for (size_t i = 0; i < r->n; i++)
    if (!strcmp(r->fams[i]->name, name))
      return metrics__err(err, errlen, "metrics: %s: already registered", name), -1;
  for (size_t i = 0; labels && labels[i]; i++) {
    if (!metrics__valid_name(labels[i], 0))
      return metrics__err(err, errlen, "metrics: %s: invalid label name \"%s\"", name, labels[i]), -1;
    if (!strncmp(labels[i], "__", 2))
      return metrics__err(err, errlen, "metrics: %s: label name \"%s\" is reserved (starts with __)",
                          name, labels[i]), -1;
    if (kind == METRICS__HISTOGRAM && !strcmp(labels[i], "le"))
      return metrics__err(err, errlen, "metrics: %s: label name \"le\" is reserved in histograms",
                          name), -1;
    for (size_t j = 0; j < i; j++)
      if (!strcmp(labels[i], labels[j]))
        return metrics__err(err, errlen, "metrics: %s: duplicate label name \"%s\"", name, labels[i]), -1;
  }
  return 0;
}

static struct metrics_family *metrics__register(metrics_registry *r, metrics__kind kind,
                                                const char *name, const char *help,
                                                const char *const *labels, char *err,
                                                size_t errlen) {
  if (metrics__check(r, kind, name, labels, err, errlen) != 0) return NULL;
  struct metrics_family *f = calloc(1, sizeof *f);
  if (!f) goto nomem;
  sched_map_init(&f->index);
  f->kind = kind;
  f->name = strdup(name);
  f->help = strdup(help ? help : "");
  while (labels && labels[f->nlabels]) f->nlabels++;
  f->labels = calloc(f->nlabels + 1, sizeof(char *));
  if (!f->name || !f->help || !f->labels) goto nomem;
  for (size_t i = 0; labels && i < f->nlabels; i++) /* nlabels is 0 without labels */
    if (!(f->labels[i] = strdup(labels[i]))) goto nomem;
  if (r->n == r->cap) {
    size_t cap = r->cap ? r->cap * 2 : 16;
    void *p = realloc(r->fams, cap * sizeof *r->fams);
    if (!p) goto nomem;
    r->fams = p;
    r->cap = cap;
  }
  r->fams[r->n++] = f;
  return f;
nomem:
  if (f) metrics__family_free(f);
  metrics__err(err, errlen, "metrics: %s: out of memory", name);
  return NULL;
}

metrics_counter *metrics_counter_new(metrics_registry *r, const char *name, const char *help,
                                     const char *const *label_names, char *err, size_t errlen) {
  return metrics__register(r, METRICS__COUNTER, name, help, label_names, err, errlen);
}

metrics_gauge *metrics_gauge_new(metrics_registry *r, const char *name, const char *help,
                                 const char *const *label_names, char *err, size_t errlen) {
  return metrics__register(r, METRICS__GAUGE, name, help, label_names, err, errlen);
}

metrics_histogram *metrics_histogram_new(metrics_registry *r, const char *name, const char *help,
                                         const char *const *label_names, const double *buckets,
                                         size_t nbuckets, char *err, size_t errlen) {
  if (nbuckets && !buckets) {
    metrics__err(err, errlen, "metrics: %s: buckets missing", name ? name : "?");
    return NULL;
  }
  for (size_t i = 0; i < nbuckets; i++) {
    if (!isfinite(buckets[i])) {
      metrics__err(err, errlen, "metrics: %s: bucket %zu is not finite (+Inf is implicit)",
                   name ? name : "?", i);
      return NULL;
    }
    if (i > 0 && !(buckets[i] > buckets[i - 1])) {
      metrics__err(err, errlen, "metrics: %s: buckets must be strictly increasing (bucket %zu)",
                   name ? name : "?", i);
      return NULL;
    }
  }
  struct metrics_family *f =
      metrics__register(r, METRICS__HISTOGRAM, name, help, label_names, err, errlen);
  if (!f || !nbuckets) return f;
  f->buckets = malloc(nbuckets * sizeof(double));
  if (!f->buckets) {
    /* Registered already: leave it usable with only the +Inf bucket. */
    metrics__err(err, errlen, "metrics: %s: out of memory", name);
    return NULL;
  }
  memcpy(f->buckets, buckets, nbuckets * sizeof(double));
  f->nbuckets = nbuckets;
  return f;
}

static uint64_t metrics__hash(const char *const *values, size_t n) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < n; i++) {
    for (const unsigned char *p = (const unsigned char *)values[i]; *p; p++)
      h = (h ^ *p) * 1099511628211ULL;
    h = (h ^ 0xff) * 1099511628211ULL; /* separator: ("a","b") != ("ab","") */
  }
  return h;
}

/* The index of the series with these label values (hash h), or METRICS__NONE. */
static uint32_t metrics__find(const struct metrics_family *f, const char *const *values,
                              uint64_t h) {
  const uint32_t *head = sched_map_get(&f->index, h);
  for (uint32_t i = head ? *head : METRICS__NONE; i != METRICS__NONE; i = f->series[i].next) {
    const metrics__series *s = &f->series[i];
    size_t j = 0;
    while (j < f->nlabels && !strcmp(s->values[j], values[j])) j++;
    if (j == f->nlabels) return i;
  }
  return METRICS__NONE;
}

/* Series i heads its hash's chain, before the ones already there. Room in
 * the index was reserved. */
static void metrics__link(struct metrics_family *f, uint32_t i) {
  const uint32_t *head = sched_map_get(&f->index, f->series[i].hash);
  f->series[i].next = head ? *head : METRICS__NONE;
  (void)sched_map_put(&f->index, f->series[i].hash, i);
}

/* Finds or creates the series for these label values. */
static int metrics__series_get(struct metrics_family *f, const char *const *values,
                               metrics__series **out) {
  if (!f) return -EINVAL;
  if (f->nlabels && !values) return -EINVAL;
  for (size_t i = 0; i < f->nlabels; i++)
    if (!values[i]) return -EINVAL;
  uint64_t h = metrics__hash(values, f->nlabels);
  uint32_t at = metrics__find(f, values, h);
  if (at != METRICS__NONE) return *out = &f->series[at], 0;
  if (f->nseries >= METRICS_MAX_SERIES) return -ENOSPC;
  if (f->nseries == f->capseries) {
    size_t cap = f->capseries ? f->capseries * 2 : 4;
    void *p = realloc(f->series, cap * sizeof *f->series);
    if (!p) return -ENOMEM;
    f->series = p;
    f->capseries = cap;
  }
  /* Before the series is made: once linked it must not fail. */
  if (sched_map_reserve(&f->index, f->nseries + 1) != 0) return -ENOMEM;
  metrics__series s = {.hash = h};
  s.values = calloc(f->nlabels + 1, sizeof(char *));
  if (!s.values) return -ENOMEM;
  if (f->kind == METRICS__HISTOGRAM && !(s.counts = calloc(f->nbuckets + 1, sizeof(uint64_t))))
    goto nomem;
  for (size_t j = 0; j < f->nlabels; j++)
    if (!(s.values[j] = strdup(values[j]))) goto nomem;
  f->series[f->nseries] = s;
  metrics__link(f, (uint32_t)f->nseries);
  *out = &f->series[f->nseries++];
  return 0;
nomem:
  for (size_t j = 0; j < f->nlabels; j++) free(s.values[j]);
  free(s.values);
  free(s.counts);
  return -ENOMEM;
}

int metrics_series_remove(struct metrics_family *f, const char *const *label_values) {
  if (!f || (f->nlabels && !label_values)) return -EINVAL;
  for (size_t i = 0; i < f->nlabels; i++)
    if (!label_values[i]) return -EINVAL;
  uint64_t h = metrics__hash(label_values, f->nlabels);
  uint32_t i = metrics__find(f, label_values, h);
  if (i == METRICS__NONE) return -ENOENT;
  metrics__series *s = &f->series[i];
  for (size_t j = 0; j < f->nlabels; j++) free(s->values[j]);
  free(s->values);
  free(s->counts);
  /* Creation order is the rendering order: keep it. The series after it move
   * down one, so the index is made again, in the room it already has (series
   * go when their worker does: rarely, and a removal was O(n) before). */
  for (size_t k = 0; k < f->nseries; k++) (void)sched_map_del(&f->index, f->series[k].hash);
  memmove(s, s + 1, (f->nseries - i - 1) * sizeof *s);
  f->nseries--;
  for (size_t k = 0; k < f->nseries; k++) metrics__link(f, (uint32_t)k);
  return 0;
}

int metrics_counter_add(metrics_counter *c, const char *const *label_values, double v) {
  metrics__series *s;
  if (!c || c->kind != METRICS__COUNTER || isnan(v) || v < 0) return -EINVAL;
  int rc = metrics__series_get(c, label_values, &s);
  if (rc) return rc;
  s->value += v;
  return 0;
}

int metrics_counter_set(metrics_counter *c, const char *const *label_values, double v) {
  metrics__series *s;
  if (!c || c->kind != METRICS__COUNTER || isnan(v) || v < 0) return -EINVAL;
  int rc = metrics__series_get(c, label_values, &s);
  if (rc) return rc;
  s->value = v;
  return 0;
}

int metrics_counter_inc(metrics_counter *c, const char *const *label_values) {
  return metrics_counter_add(c, label_values, 1.0);
}

int metrics_gauge_set(metrics_gauge *g, const char *const *label_values, double v) {
  metrics__series *s;
  if (!g || g->kind != METRICS__GAUGE) return -EINVAL;
  int rc = metrics__series_get(g, label_values, &s);
  if (rc) return rc;
  s->value = v;
  return 0;
}

int metrics_gauge_add(metrics_gauge *g, const char *const *label_values, double v) {
  metrics__series *s;
  if (!g || g->kind != METRICS__GAUGE) return -EINVAL;
  int rc = metrics__series_get(g, label_values, &s);
  if (rc) return rc;
  s->value += v;
  return 0;
}

int metrics_histogram_observe(metrics_histogram *h, const char *const *label_values, double v) {
  metrics__series *s;
  if (!h || h->kind != METRICS__HISTOGRAM || isnan(v)) return -EINVAL;
  int rc = metrics__series_get(h, label_values, &s);
  if (rc) return rc;
  size_t i = 0;
  while (i < h->nbuckets && v > h->buckets[i]) i++; /* le: v <= bound */
  s->counts[i]++;
  s->count++;
  s->sum += v;
  return 0;
}

/* ---- rendering -------------------------------------------------------------- */

int metrics_format_value(double v, char *out, size_t outlen) {
  if (isnan(v)) return snprintf(out, outlen, "NaN");
  if (isinf(v)) return snprintf(out, outlen, v > 0 ? "+Inf" : "-Inf");
  /* Shortest of %.15g..%.17g that reads back exactly: 0.1 stays "0.1". */
  int n = 0;
  for (int prec = 15; prec <= 17; prec++) {
    n = snprintf(out, outlen, "%.*g", prec, v);
    if (strtod(out, NULL) == v) break;
  }
  return n;
}

typedef struct {
  char *p;
  size_t len, cap;
  int oom;
} metrics__buf;

static void metrics__put(metrics__buf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

static void metrics__puts(metrics__buf *b, const char *s) { metrics__put(b, s, strlen(s)); }

/* HELP escapes \ and newline; label values also escape ". */
static void metrics__escaped(metrics__buf *b, const char *s, int quote) {
  for (; *s; s++) {
    if (*s == '\\') metrics__puts(b, "\\\\");
    else if (*s == '\n') metrics__puts(b, "\\n");
    else if (quote && *s == '"') metrics__puts(b, "\\\"");
    else metrics__put(b, s, 1);
  }
}

static void metrics__value(metrics__buf *b, double v) {
  char num[64];
  metrics_format_value(v, num, sizeof num);
  metrics__puts(b, num);
}

/* name{labels[,le="x"]} value\n */
static void metrics__sample(metrics__buf *b, const struct metrics_family *f,
                            const metrics__series *s, const char *suffix, const char *le,
                            double v) {
  metrics__puts(b, f->name);
  metrics__puts(b, suffix);
  if (f->nlabels || le) {
    metrics__puts(b, "{");
    for (size_t j = 0; j < f->nlabels; j++) {
      if (j) metrics__puts(b, ",");
      metrics__puts(b, f->labels[j]);
      metrics__puts(b, "=\"");
      metrics__escaped(b, s->values[j], 1);
      metrics__puts(b, "\"");
    }
    if (le) {
      if (f->nlabels) metrics__puts(b, ",");
      metrics__puts(b, "le=\"");
      metrics__puts(b, le);
      metrics__puts(b, "\"");
    }
    metrics__puts(b, "}");
  }
  metrics__puts(b, " ");
  metrics__value(b, v);
  metrics__puts(b, "\n");
}

static void metrics__render_histogram(metrics__buf *b, const struct metrics_family *f,
                                      const metrics__series *s) {
  char le[64];
  uint64_t cum = 0;
  for (size_t i = 0; i < f->nbuckets; i++) {
    cum += s->counts[i];
    metrics_format_value(f->buckets[i], le, sizeof le);
    metrics__sample(b, f, s, "_bucket", le, (double)cum);
  }
  /* +Inf is the total by construction, so it always equals _count. */
  metrics__sample(b, f, s, "_bucket", "+Inf", (double)s->count);
  metrics__sample(b, f, s, "_sum", NULL, s->sum);
  metrics__sample(b, f, s, "_count", NULL, (double)s->count);
}

int metrics_render(metrics_registry *r, char **buf, size_t *len) {
  static const char *const types[] = {"counter", "gauge", "histogram"};
  metrics__buf b = {0};
  metrics__put(&b, "", 0);
  for (size_t i = 0; r && i < r->n; i++) {
    const struct metrics_family *f = r->fams[i];
    metrics__puts(&b, "# HELP ");
    metrics__puts(&b, f->name);
    metrics__puts(&b, " ");
    metrics__escaped(&b, f->help, 0);
    metrics__puts(&b, "\n# TYPE ");
    metrics__puts(&b, f->name);
    metrics__puts(&b, " ");
    metrics__puts(&b, types[f->kind]);
    metrics__puts(&b, "\n");
    for (size_t k = 0; k < f->nseries; k++) {
      if (f->kind == METRICS__HISTOGRAM) metrics__render_histogram(&b, f, &f->series[k]);
      else metrics__sample(&b, f, &f->series[k], "", NULL, f->series[k].value);
    }
  }
  if (b.oom) {
    free(b.p);
    return -ENOMEM;
  }
  *buf = b.p;
  if (len) *len = b.len;
  return 0;
}
