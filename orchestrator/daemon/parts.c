#include "orchestrator/daemon/parts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parts__name_cmp(const void *a, const void *b) {
  const bcast_part_spec *x = a, *y = b;
  return strcmp(x->name, y->name);
}

int parts_from_pb(Rlorch__V1__TensorPart *const *parts, size_t n, size_t max_parts,
                  bcast_part_spec **out, char *err, size_t errlen) {
  *out = NULL;
  if (!n) return 0;
  if (max_parts && n > max_parts)
    return snprintf(err, errlen, "parts: %zu is over the limit of %zu (max_manifest_tensors)", n,
                    max_parts),
           -1;
  bcast_part_spec *v = calloc(n, sizeof *v);
  bcast_part_spec *sorted = calloc(n, sizeof *sorted);
  int rc = 0;
  if (!v || !sorted) rc = (snprintf(err, errlen, "parts: out of memory"), -1);
  for (size_t i = 0; rc == 0 && i < n; i++) {
    const Rlorch__V1__TensorPart *p = parts[i];
    const char *name = p->name ? p->name : "";
    size_t len = strlen(name);
    if (!len || len >= BCAST_NAME_MAX) {
      rc = (snprintf(err, errlen, "parts[%zu].name: %s", i,
                     len ? "longer than 127 bytes" : "empty"), -1);
      break;
    }
    bcast_part pt = {0};
    switch (p->kind) {
    case RLORCH__V1__PART_KIND__PART_KIND_WHOLE: pt.kind = BCAST_PART_WHOLE; break;
    case RLORCH__V1__PART_KIND__PART_KIND_NONE: pt.kind = BCAST_PART_NONE; break;
    case RLORCH__V1__PART_KIND__PART_KIND_SLICE:
      pt = (bcast_part){.kind = BCAST_PART_SLICE, .dim = p->dim, .start = p->start, .count = p->count};
      if (p->dim >= BCAST_MAX_DIMS)
        rc = (snprintf(err, errlen, "parts[%zu] '%s'.dim: %u, a tensor has at most %d dimensions",
                       i, name, p->dim, BCAST_MAX_DIMS), -1);
      else if (!p->count)
        rc = (snprintf(err, errlen, "parts[%zu] '%s'.count: 0; a slice holds at least one index",
                       i, name), -1);
      break;
    default:
      rc = (snprintf(err, errlen, "parts[%zu] '%s'.kind: unknown value %d", i, name, (int)p->kind),
            -1);
    }
    v[i] = (bcast_part_spec){.name = name, .part = pt};
  }
  if (rc == 0) {
    memcpy(sorted, v, n * sizeof *v);
    qsort(sorted, n, sizeof *sorted, parts__name_cmp);
    for (size_t i = 1; i < n; i++)
      if (!strcmp(sorted[i - 1].name, sorted[i].name)) {
        rc = (snprintf(err, errlen, "parts: tensor '%s' is listed twice", sorted[i].name), -1);
        break;
      }
  }
  free(sorted);
  if (rc) free(v);
  else *out = v;
  return rc;
}

int parts_fit(const bcast_tensor *t, size_t nt, const bcast_part_spec *specs, size_t n,
              char *err, size_t errlen) {
  /* A plan of this view, to one receiver: the rules are the planner's. */
  bcast_receiver_view views[2] = {{0}, {.parts = specs, .nparts = n}};
  bcast_plan_opts po = {.id = "parts-check",
                        .mode = BCAST_MODE_HOST,
                        .world_size = 2,
                        .host_endpoint = "127.0.0.1:1",
                        .receiver_views = views};
  bcast_plan *p = NULL;
  bcast_err be = {0};
  int rc = bcast_plan_build(t, nt, &po, &p, &be);
  bcast_plan_free(p);
  if (rc) return snprintf(err, errlen, "parts: %s", be.msg), -1;
  return 0;
}
