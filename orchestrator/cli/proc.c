#include "orchestrator/cli/proc.h"

#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "grpc/health/v1/health.pb-c.h"
#include "rpc/rpc.h"

int proc_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

int proc_self_exe(char *buf, size_t len) {
  ssize_t n = readlink("/proc/self/exe", buf, len - 1);
  if (n <= 0) return -1;
  buf[n] = 0;
  return 0;
}

int proc_wait_serving(const char *target, double timeout_s, int (*stop)(void *), void *arg) {
  rpc_client *c = NULL;
  rpc_client_opts o = {.target = target};
  char err[256];
  if (rpc_client_new(&o, &c, err, sizeof err) != 0) return -1;
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  int ok = 0;
  for (double waited = 0; waited < timeout_s && !ok; waited += 0.1) {
    if (stop && stop(arg)) break;
    ProtobufCMessage *resp = NULL;
    rpc_status st;
    if (rpc_client_call(c, "/grpc.health.v1.Health/Check", &req.base,
                        &grpc__health__v1__health_check_response__descriptor, 1.0, &resp,
                        &st) == GRPC_STATUS_OK) {
      ok = ((Grpc__Health__V1__HealthCheckResponse *)resp)->status ==
           GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
      protobuf_c_message_free_unpacked(resp, NULL);
    }
    if (!ok) {
      struct timespec ts = {0, 100 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
  }
  rpc_client_free(c);
  return ok ? 0 : -1;
}
