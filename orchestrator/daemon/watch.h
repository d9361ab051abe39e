/* WatchRun subscribers: who listens to which run, and the events they get.
 * The runner and the worker table publish; the Control API subscribes. Knows
 * nothing of either. Loop thread only. */
#ifndef RLORCH_DAEMON_WATCH_H
#define RLORCH_DAEMON_WATCH_H

#include <stdint.h>

#include "rlorch/v1/control.pb-c.h"
#include "rpc/rpc.h"

typedef struct watch_hub watch_hub;
typedef struct watch_sub watch_sub;

int watch_hub_new(watch_hub **out); /* 0, or -1 out of memory */
/* Frees the subscribers at exit; their calls must be ended already. NULL is fine. */
void watch_hub_free(watch_hub *h);
/* From now on watch_end finishes streams with UNAVAILABLE instead of OK: a
 * client must tell a run that ended from a daemon that went away. */
void watch_hub_closing(watch_hub *h);

/* A subscriber of `run_id` on the open stream `call`, not yet receiving
 * published events: the caller may send it a history first. NULL: out of
 * memory. Owned by the caller until watch_subscribe. */
watch_sub *watch_sub_new(rpc_call *call, const char *run_id);
void watch_sub_free(watch_sub *s);
/* Sends one event to `s`; seq is set here and unix_ms when 0. rpc_call_send's result. */
int watch_send(watch_sub *s, Rlorch__V1__RunEvent *ev);
/* The hub takes `s` and sends it every later event of its run. */
void watch_subscribe(watch_hub *h, watch_sub *s);

/* Sends an event to every subscriber of run_id; seq and time are filled in here. */
void watch_publish(watch_hub *h, const char *run_id, const Rlorch__V1__RunEvent *ev);
/* Ends every subscriber of run_id after the run reached a final state. */
void watch_end(watch_hub *h, const char *run_id);

#endif
