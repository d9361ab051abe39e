/* The daemon's clocks: CLOCK_REALTIME and CLOCK_MONOTONIC in milliseconds. */
#include "orchestrator/daemon/now.h"

#include <time.h>

static int64_t now__ms(clockid_t id) {
  struct timespec ts;
  /* Cannot fail for these two clocks with a valid pointer. */
  clock_gettime(id, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t now_unix_ms(void) { return now__ms(CLOCK_REALTIME); }

int64_t now_mono_ms(void) { return now__ms(CLOCK_MONOTONIC); }
