/* The open-group table: ids only grow, prompts are owned and freed by the
 * sweep, look-ups find exactly what was added and kept. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/daemon/group_table.h"

static prompt make_prompt(uint32_t first, size_t n) {
  prompt p = {0};
  p.token_ids = malloc(n * sizeof *p.token_ids);
  cr_assert_not_null(p.token_ids);
  for (size_t i = 0; i < n; i++) p.token_ids[i] = first + (uint32_t)i;
  p.ntokens = n;
  return p;
}

Test(group_table, add_get_and_retain) {
  group_table *t = group_table_new();
  cr_assert_not_null(t);
  for (uint64_t id = 1; id <= 100; id++) {
    prompt p = make_prompt((uint32_t)id * 10, 3);
    cr_assert_eq(group_table_add(t, id, &p, (int64_t)id * 5), 0);
    cr_assert_null(p.token_ids, "the table took the prompt");
  }
  group_entry *e = group_table_get(t, 42);
  cr_assert_not_null(e);
  cr_assert_eq(e->id, 42);
  cr_assert_eq(e->prompt.ntokens, 3);
  cr_assert_eq(e->prompt.token_ids[0], 420);
  cr_assert_eq(e->dispatched_ms, 210);
  cr_assert_null(group_table_get(t, 0));
  cr_assert_null(group_table_get(t, 101));

  const uint64_t open[] = {2, 42, 99, 1000};
  group_table_retain(t, open, 4);
  cr_assert_eq(group_table_count(t), 3);
  cr_assert_not_null(group_table_get(t, 2));
  cr_assert_not_null(group_table_get(t, 99));
  cr_assert_null(group_table_get(t, 3), "a closed group is gone");
  cr_assert_eq(group_table_get(t, 42)->prompt.token_ids[2], 422, "a kept one is intact");
  group_table_retain(t, NULL, 0);
  cr_assert_eq(group_table_count(t), 0);
  group_table_free(t);
}

Test(group_table, ids_must_grow) {
  group_table *t = group_table_new();
  prompt p = make_prompt(1, 1);
  cr_assert_eq(group_table_add(t, 7, &p, 0), 0);
  prompt q = make_prompt(2, 2);
  cr_assert_eq(group_table_add(t, 7, &q, 0), -1, "the same id again is refused");
  cr_assert_eq(group_table_add(t, 3, &q, 0), -1, "a lower id is refused");
  cr_assert_not_null(q.token_ids, "a refused prompt stays the caller's");
  cr_assert_eq(group_table_get(t, 7)->prompt.token_ids[0], 1);
  prompt_free(&q);
  group_table_free(t);
}
