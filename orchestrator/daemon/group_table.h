/* The groups a run has asked for and not yet got: each one's prompt (drawn
 * from the prompt source at the group's first dispatch, sent again with any
 * re-sent request of the group, and filled into the rollouts that answer it)
 * and when it was first dispatched (for the request latency metric).
 *
 * Group ids only grow, so the table is an array sorted by id that grows at
 * its end; after each batch of scheduler actions the runner keeps only the
 * groups the scheduler still has open (sched_open_groups). Loop thread only. */
#ifndef RLORCH_DAEMON_GROUP_TABLE_H
#define RLORCH_DAEMON_GROUP_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/daemon/prompt_source.h"

typedef struct group_entry {
  uint64_t id;
  prompt prompt;            /* owned */
  int64_t dispatched_ms;    /* monotonic time of the first dispatch */
} group_entry;

typedef struct group_table group_table;

group_table *group_table_new(void); /* NULL: out of memory */
void group_table_free(group_table *t); /* NULL is fine */

/* Adds group `id` (above every id added before), taking ownership of *p
 * (emptied). 0; -1 when id is not above the last one or out of memory (then
 * *p is left to the caller). */
int group_table_add(group_table *t, uint64_t id, prompt *p, int64_t now_ms);
group_entry *group_table_get(group_table *t, uint64_t id); /* or NULL */
/* Keeps only the groups whose ids are in open[0..n) (ascending). */
void group_table_retain(group_table *t, const uint64_t *open, size_t n);
size_t group_table_count(const group_table *t);

#endif
