/* The runner's store of whole rollouts: kept by id, looked up for a batch,
 * freed when the scheduler no longer holds them, counted in bytes. */
#include <criterion/criterion.h>
#include <string.h>

#include "orchestrator/daemon/rollout_store.h"

typedef struct {
  Rlorch__V1__Rollout r[3];
  Rlorch__V1__Rollout *rp[3];
  uint32_t ids[3][4];
  Rlorch__V1__RolloutResult res;
} report;

static void make(report *t, uint64_t first_id, size_t n, uint32_t tag) {
  memset(t, 0, sizeof *t);
  rlorch__v1__rollout_result__init(&t->res);
  for (size_t i = 0; i < n; i++) {
    rlorch__v1__rollout__init(&t->r[i]);
    t->r[i].id = first_id + i;
    for (int k = 0; k < 4; k++) t->ids[i][k] = tag + (uint32_t)k;
    t->r[i].n_completion_token_ids = 4;
    t->r[i].completion_token_ids = t->ids[i];
    t->rp[i] = &t->r[i];
  }
  t->res.n_rollouts = n;
  t->res.rollouts = t->rp;
}

static int keep_even(uint64_t id, void *ud) {
  (void)ud;
  return id % 2 == 0;
}

Test(rollout_store, copies_are_whole_and_found_by_id) {
  rollout_store *s;
  cr_assert_eq(rollout_store_new(&s), 0);
  report t;
  make(&t, 10, 3, 500);
  cr_assert_eq(rollout_store_put(s, &t.res), 0);
  make(&t, 3, 2, 900); /* out of order: the store sorts */
  cr_assert_eq(rollout_store_put(s, &t.res), 0);
  memset(&t, 0xff, sizeof t); /* the caller's memory goes away */
  cr_assert_eq(rollout_store_count(s), 5u);
  const Rlorch__V1__Rollout *r = rollout_store_get(s, 11);
  cr_assert_not_null(r);
  cr_assert_eq(r->n_completion_token_ids, 4u);
  cr_assert_eq(r->completion_token_ids[3], 503u, "a deep copy");
  cr_assert_eq(rollout_store_get(s, 4)->completion_token_ids[0], 900u);
  cr_assert_null(rollout_store_get(s, 5));
  cr_assert_null(rollout_store_get(s, 13));
  rollout_store_free(s);
}

Test(rollout_store, bytes_follow_the_packed_sizes) {
  rollout_store *s;
  cr_assert_eq(rollout_store_new(&s), 0);
  report t;
  make(&t, 1, 3, 100);
  size_t one = rlorch__v1__rollout__get_packed_size(&t.r[0]);
  cr_assert_eq(rollout_store_put(s, &t.res), 0);
  cr_assert_eq(rollout_store_bytes(s), 3 * one);
  rollout_store_retain(s, keep_even, NULL); /* keeps id 2 */
  cr_assert_eq(rollout_store_count(s), 1u);
  cr_assert_eq(rollout_store_bytes(s), one);
  cr_assert_not_null(rollout_store_get(s, 2));
  cr_assert_null(rollout_store_get(s, 1));
  rollout_store_free(s);
}

Test(rollout_store, a_duplicate_keeps_the_first_copy) {
  rollout_store *s;
  cr_assert_eq(rollout_store_new(&s), 0);
  report t;
  make(&t, 7, 1, 100);
  cr_assert_eq(rollout_store_put(s, &t.res), 0);
  uint64_t bytes = rollout_store_bytes(s);
  make(&t, 7, 1, 200);
  cr_assert_eq(rollout_store_put(s, &t.res), 0);
  cr_assert_eq(rollout_store_count(s), 1u);
  cr_assert_eq(rollout_store_bytes(s), bytes);
  cr_assert_eq(rollout_store_get(s, 7)->completion_token_ids[0], 100u);
  rollout_store_free(s);
  rollout_store_free(NULL);
}
