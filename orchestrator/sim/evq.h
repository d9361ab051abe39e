/* A queue of events in simulated time: a binary min-heap ordered by time,
 * then by insertion, so events due at the same millisecond come out in the
 * order they were pushed and a simulation replays the same way every run.
 * Events are fixed-size records the caller defines (elem bytes each),
 * copied in and out. The simulator and tests/unit/test_sched_sim.c share it. */
#ifndef RLORCH_SIM_EVQ_H
#define RLORCH_SIM_EVQ_H

#include <stddef.h>
#include <stdint.h>

typedef struct evq {
  size_t elem;   /* bytes of one event */
  size_t n, cap; /* events held, room */
  uint64_t seq;  /* next insertion number */
  unsigned char *slots; /* cap + 1 slots: time, order, record */
} evq;

/* An empty queue of events of `elem` bytes. */
void evq_init(evq *q, size_t elem);
void evq_free(evq *q);
/* Copies `ev` in, due at `t`. 0, or -1 when out of memory (nothing changed). */
int evq_push(evq *q, int64_t t, const void *ev);
/* The earliest event's time; INT64_MAX when empty. */
int64_t evq_next(const evq *q);
/* Copies the earliest event out and removes it; its time, or -1 when empty. */
int64_t evq_pop(evq *q, void *ev);

#endif
