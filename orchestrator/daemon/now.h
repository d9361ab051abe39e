/* The daemon's two clocks. The monotonic one drives the scheduler, timeouts
 * and durations (it never goes back); the wall clock only stamps what people
 * and other machines read (records, events, deadlines sent to workers). */
#ifndef RLORCH_DAEMON_NOW_H
#define RLORCH_DAEMON_NOW_H

#include <stdint.h>

int64_t now_unix_ms(void); /* wall clock, Unix milliseconds */
int64_t now_mono_ms(void); /* monotonic milliseconds, arbitrary origin */

#endif
