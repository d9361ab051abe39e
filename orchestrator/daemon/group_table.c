/* The run's open groups: a sorted array, appended at its end. */
#include "orchestrator/daemon/group_table.h"

#include <stdlib.h>
#include <string.h>

struct group_table {
  group_entry *v;
  size_t n, cap;
};

group_table *group_table_new(void) { return calloc(1, sizeof(group_table)); }

void group_table_free(group_table *t) {
  if (!t) return;
  for (size_t i = 0; i < t->n; i++) prompt_free(&t->v[i].prompt);
  free(t->v);
  free(t);
}

int group_table_add(group_table *t, uint64_t id, prompt *p, int64_t now_ms) {
  if (t->n && t->v[t->n - 1].id >= id) return -1;
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 64;
    group_entry *v = realloc(t->v, cap * sizeof *v);
    if (!v) return -1;
    t->v = v;
    t->cap = cap;
  }
  t->v[t->n++] = (group_entry){.id = id, .prompt = *p, .dispatched_ms = now_ms};
  memset(p, 0, sizeof *p);
  return 0;
}

static int group_table__find(const uint64_t *v, size_t n, uint64_t id) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (v[mid] < id) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && v[lo] == id;
}

group_entry *group_table_get(group_table *t, uint64_t id) {
  size_t lo = 0, hi = t->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (t->v[mid].id < id) lo = mid + 1;
    else hi = mid;
  }
  return lo < t->n && t->v[lo].id == id ? &t->v[lo] : NULL;
}

void group_table_retain(group_table *t, const uint64_t *open, size_t n) {
  size_t j = 0;
  for (size_t i = 0; i < t->n; i++) {
    if (group_table__find(open, n, t->v[i].id)) t->v[j++] = t->v[i];
    else prompt_free(&t->v[i].prompt);
  }
  t->n = j;
}

size_t group_table_count(const group_table *t) { return t->n; }
