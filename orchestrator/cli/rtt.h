/* The baseline of the orchestrator's benchmarks: a bare unary RPC round trip
 * (a gRPC health Check, which does no work), measured in the same run as the
 * figure divided by it, so that the ratio holds on whatever machine runs it. */
#ifndef RLORCH_CLI_RTT_H
#define RLORCH_CLI_RTT_H

#include <stddef.h>

/* The round trip, in seconds, of health Checks of the server at `target`
 * ("127.0.0.1:7070"): after 100 that warm the channel, the least of the
 * medians of three runs of n / 3 (n >= 3); 0 when none was answered. */
double rtt_health_check(const char *target, int n);

/* The same against a server of this process on a loopback port, started and
 * stopped here (its own libuv loop and thread). 0 with the median in *out,
 * or -1 with a message in err. */
int rtt_loopback(int n, double *out, char *err, size_t errlen);

#endif
