/* An inference worker's parts (RegisterRequest.parts): each fault named by
 * its index, tensor and field; parts that fit a manifest pass, and the
 * planner's own rules refuse those that do not. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/daemon/parts.h"

typedef struct {
  Rlorch__V1__TensorPart p[4];
  Rlorch__V1__TensorPart *pp[4];
  size_t n;
} parts;

static void add(parts *t, const char *name, Rlorch__V1__PartKind kind, uint32_t dim,
                uint64_t start, uint64_t count) {
  Rlorch__V1__TensorPart *p = &t->p[t->n];
  rlorch__v1__tensor_part__init(p);
  p->name = (char *)name;
  p->kind = kind;
  p->dim = dim;
  p->start = start;
  p->count = count;
  t->pp[t->n] = p;
  t->n++;
}

#define SLICE RLORCH__V1__PART_KIND__PART_KIND_SLICE
#define NONE RLORCH__V1__PART_KIND__PART_KIND_NONE

static void refused(parts *t, const char *want) {
  bcast_part_spec *s = (bcast_part_spec *)1;
  char err[600] = "";
  cr_assert_eq(parts_from_pb(t->pp, t->n, 8, &s, err, sizeof err), -1);
  cr_assert_null(s);
  cr_assert(strstr(err, want), "'%s' has no '%s'", err, want);
}

Test(parts, well_formed_parts_become_specs) {
  parts t = {0};
  add(&t, "w0", SLICE, 1, 4, 4);
  add(&t, "e3", NONE, 0, 0, 0);
  bcast_part_spec *s = NULL;
  char err[600] = "";
  cr_assert_eq(parts_from_pb(t.pp, t.n, 8, &s, err, sizeof err), 0, "%s", err);
  cr_assert_str_eq(s[0].name, "w0");
  cr_assert_eq(s[0].part.kind, BCAST_PART_SLICE);
  cr_assert_eq(s[0].part.dim, 1);
  cr_assert_eq(s[0].part.start, 4);
  cr_assert_eq(s[0].part.count, 4);
  cr_assert_eq(s[1].part.kind, BCAST_PART_NONE);
  free(s);
  cr_assert_eq(parts_from_pb(NULL, 0, 8, &s, err, sizeof err), 0);
  cr_assert_null(s, "no parts: no specs");
}

Test(parts, malformed_parts_are_refused_by_field) {
  parts t = {0};
  add(&t, "", SLICE, 0, 0, 1);
  refused(&t, "parts[0].name: empty");
  t = (parts){0};
  char longname[200];
  memset(longname, 'x', sizeof longname - 1);
  longname[sizeof longname - 1] = 0;
  add(&t, longname, SLICE, 0, 0, 1);
  refused(&t, "parts[0].name: longer than 127 bytes");
  t = (parts){0};
  add(&t, "a", SLICE, 0, 0, 1);
  add(&t, "b", SLICE, 8, 0, 1);
  refused(&t, "parts[1] 'b'.dim: 8, a tensor has at most 8 dimensions");
  t = (parts){0};
  add(&t, "a", SLICE, 0, 3, 0);
  refused(&t, "parts[0] 'a'.count: 0");
  t = (parts){0};
  add(&t, "a", (Rlorch__V1__PartKind)7, 0, 0, 1);
  refused(&t, "parts[0] 'a'.kind: unknown value 7");
  t = (parts){0};
  add(&t, "a", SLICE, 0, 0, 1);
  add(&t, "b", NONE, 0, 0, 0);
  add(&t, "a", NONE, 0, 0, 0);
  refused(&t, "parts: tensor 'a' is listed twice");
  bcast_part_spec *s = NULL;
  char err[600] = "";
  cr_assert_eq(parts_from_pb(t.pp, t.n, 2, &s, err, sizeof err), -1);
  cr_assert(strstr(err, "parts: 3 is over the limit of 2"), "%s", err);
}

static bcast_tensor tensor(const char *name, uint64_t r, uint64_t c) {
  bcast_tensor t;
  memset(&t, 0, sizeof t);
  strcpy(t.name, name);
  t.storage_dtype = BCAST_DTYPE_FP32;
  t.wire_dtype = BCAST_DTYPE_BF16;
  t.residency = BCAST_RES_HOST_PAGEABLE;
  t.ndim = c ? 2 : 1;
  t.shape[0] = r;
  t.shape[1] = c;
  return t;
}

Test(parts, parts_are_checked_against_the_manifest_with_the_planner_rules) {
  bcast_tensor m[] = {tensor("w0", 8, 16), tensor("norm", 16, 0)};
  bcast_part_spec ok[] = {{"w0", {.kind = BCAST_PART_SLICE, .dim = 1, .start = 8, .count = 8}}};
  char err[600] = "";
  cr_assert_eq(parts_fit(m, 2, ok, 1, err, sizeof err), 0, "%s", err);
  bcast_part_spec unknown[] = {{"w9", {.kind = BCAST_PART_NONE}}};
  cr_assert_eq(parts_fit(m, 2, unknown, 1, err, sizeof err), -1);
  cr_assert(strstr(err, "w9"), "%s", err);
  bcast_part_spec past[] = {{"w0", {.kind = BCAST_PART_SLICE, .dim = 0, .start = 6, .count = 4}}};
  cr_assert_eq(parts_fit(m, 2, past, 1, err, sizeof err), -1);
  cr_assert(strstr(err, "w0"), "%s", err);
  bcast_part_spec dim[] = {{"norm", {.kind = BCAST_PART_SLICE, .dim = 1, .start = 0, .count = 1}}};
  cr_assert_eq(parts_fit(m, 2, dim, 1, err, sizeof err), -1);
  cr_assert(strstr(err, "norm"), "%s", err);
  bcast_part_spec nothing[] = {{"w0", {.kind = BCAST_PART_NONE}}, {"norm", {.kind = BCAST_PART_NONE}}};
  cr_assert_eq(parts_fit(m, 2, nothing, 2, err, sizeof err), -1, "a view of nothing is refused");
}
