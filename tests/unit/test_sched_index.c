/* The scheduler's indexes (sched_map.h, sched_heap.h) against brute force:
 * random sequences of inserts, updates and removals, each answer compared
 * with a plain array that holds the same keys. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/sched/sched.h"
#include "orchestrator/sched/sched_heap.h"
#include "orchestrator/sched/sched_map.h"

static uint64_t rng_state;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

/* The reference: keys, values (or priorities) and presence by slot. */
#define NKEYS 700
typedef struct ref {
  uint64_t key[NKEYS];
  int64_t val[NKEYS];
  int in[NKEYS];
} ref;

/* Keys that collide in a small table and include 0 and the largest. */
static void ref_keys(ref *r) {
  memset(r, 0, sizeof *r);
  r->key[0] = 0;
  r->key[1] = UINT64_MAX;
  for (size_t i = 2; i < NKEYS; i++) r->key[i] = i % 3 ? i * 1024 : rnd();
}

Test(sched_map, random_operations_match_an_array) {
  for (uint64_t seed = 1; seed <= 20; seed++) {
    rng_state = seed * 0x9e3779b97f4a7c15ull;
    ref r;
    ref_keys(&r);
    sched_map m;
    sched_map_init(&m);
    size_t n = 0;
    for (int op = 0; op < 20000; op++) {
      size_t k = rnd() % NKEYS;
      switch (rnd() % 4) {
      case 0:
      case 1: {
        uint32_t v = (uint32_t)rnd();
        cr_assert_eq(sched_map_put(&m, r.key[k], v), 0);
        if (!r.in[k]) n++;
        r.in[k] = 1;
        r.val[k] = v;
        break;
      }
      case 2:
        cr_assert_eq(sched_map_del(&m, r.key[k]), r.in[k], "seed %lu op %d: del", (unsigned long)seed, op);
        if (r.in[k]) n--;
        r.in[k] = 0;
        break;
      default: /* a look-up only, below */
        break;
      }
      cr_assert_eq(sched_map_size(&m), n);
      /* Every key, present or not, answers as the array does. */
      if (op % 97 == 0 || op > 19900)
        for (size_t i = 0; i < NKEYS; i++) {
          uint32_t *v = sched_map_get(&m, r.key[i]);
          cr_assert_eq(v != NULL, r.in[i], "seed %lu op %d key %zu", (unsigned long)seed, op, i);
          if (v) cr_assert_eq(*v, (uint32_t)r.val[i]);
        }
    }
    sched_map_free(&m);
  }
}

Test(sched_map, reserve_makes_room_that_puts_do_not_grow) {
  sched_map m;
  sched_map_init(&m);
  cr_assert_null(sched_map_get(&m, 7), "an empty map holds nothing");
  cr_assert_eq(sched_map_del(&m, 7), 0);
  cr_assert_eq(sched_map_reserve(&m, 1000), 0);
  const sched_map_slot *slots = m.slots;
  for (uint64_t k = 0; k < 1000; k++) cr_assert_eq(sched_map_put(&m, k * 7919, (uint32_t)k), 0);
  cr_assert_eq(m.slots, slots, "puts within the reserved room do not move the table");
  for (uint64_t k = 0; k < 1000; k++) cr_assert_eq(*sched_map_get(&m, k * 7919), (uint32_t)k);
  cr_assert_eq(sched_map_reserve(&m, SIZE_MAX), SCHED_ENOMEM, "an impossible size is refused");
  cr_assert_eq(sched_map_size(&m), 1000, "and the map is unchanged");
  sched_map_free(&m);
}

/* The least priority and the two least of the reference, ties by slot. */
static size_t ref_least(const ref *r, int64_t out[2]) {
  size_t n = 0;
  for (size_t i = 0; i < NKEYS; i++) {
    if (!r->in[i]) continue;
    if (n < 2) out[n++] = r->val[i];
    else if (r->val[i] < out[1]) out[1] = r->val[i];
    if (n == 2 && out[1] < out[0]) {
      int64_t t = out[0];
      out[0] = out[1];
      out[1] = t;
    }
  }
  return n;
}

Test(sched_heap, random_operations_match_an_array) {
  for (uint64_t seed = 1; seed <= 20; seed++) {
    rng_state = seed * 0x2545f4914f6cdd1dull;
    ref r;
    ref_keys(&r);
    sched_heap h;
    sched_heap_init(&h);
    size_t n = 0;
    for (int op = 0; op < 20000; op++) {
      size_t k = rnd() % NKEYS;
      /* Few distinct priorities: ties are common, as equal loads are. */
      int64_t prio = (int64_t)(rnd() % 50) - 25;
      switch (rnd() % 5) {
      case 0:
      case 1:
        cr_assert_eq(sched_heap_set(&h, r.key[k], prio), 0);
        if (!r.in[k]) n++;
        r.in[k] = 1;
        r.val[k] = prio;
        break;
      case 2:
        cr_assert_eq(sched_heap_del(&h, r.key[k]), r.in[k]);
        if (r.in[k]) n--;
        r.in[k] = 0;
        break;
      case 3: {
        sched_heap_entry e;
        int64_t want[2];
        size_t nw = ref_least(&r, want);
        cr_assert_eq(sched_heap_pop(&h, &e), nw > 0);
        if (!nw) break;
        cr_assert_eq(e.prio, want[0], "seed %lu op %d: pop", (unsigned long)seed, op);
        size_t i = 0;
        while (!(r.in[i] && r.key[i] == e.key)) i++; /* the key popped was present */
        cr_assert_eq(r.val[i], e.prio, "with its own priority");
        r.in[i] = 0;
        n--;
        break;
      }
      default: {
        int64_t p;
        cr_assert_eq(sched_heap_get(&h, r.key[k], &p), r.in[k]);
        if (r.in[k]) cr_assert_eq(p, r.val[k]);
      }
      }
      cr_assert_eq(sched_heap_size(&h), n);
      int64_t want[2];
      sched_heap_entry two[2];
      size_t nw = ref_least(&r, want), ng = sched_heap_least(&h, two);
      cr_assert_eq(ng, nw);
      for (size_t i = 0; i < ng; i++)
        cr_assert_eq(two[i].prio, want[i], "seed %lu op %d: least[%zu]", (unsigned long)seed, op, i);
      if (ng == 2) cr_assert_neq(two[0].key, two[1].key, "two different keys");
      const sched_heap_entry *m = sched_heap_min(&h);
      cr_assert_eq(m != NULL, nw > 0);
      if (m) cr_assert_eq(m->prio, want[0]);
    }
    sched_heap_free(&h);
  }
}

Test(sched_heap, pops_in_priority_order) {
  sched_heap h;
  sched_heap_init(&h);
  rng_state = 99;
  for (uint64_t k = 0; k < 5000; k++) cr_assert_eq(sched_heap_set(&h, k, (int64_t)(rnd() % 100000)), 0);
  /* Moving keys both ways keeps the order whole. */
  for (uint64_t k = 0; k < 5000; k += 3) cr_assert_eq(sched_heap_set(&h, k, (int64_t)(rnd() % 100000)), 0);
  int64_t last = INT64_MIN;
  sched_heap_entry e;
  size_t n = 0;
  while (sched_heap_pop(&h, &e)) {
    cr_assert_geq(e.prio, last);
    cr_assert_not(sched_heap_get(&h, e.key, NULL), "a popped key is gone");
    last = e.prio;
    n++;
  }
  cr_assert_eq(n, 5000);
  cr_assert_null(sched_heap_min(&h));
  cr_assert_eq(sched_heap_reserve(&h, (size_t)UINT32_MAX + 1), SCHED_ENOMEM,
               "positions are 32-bit: a larger heap is refused");
  sched_heap_free(&h);
}
