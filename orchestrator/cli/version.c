/* `rlorch version`: what was built in and what this machine offers now. */
#include <stdio.h>
#include <string.h>

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>
#include <sqlite3.h>
#include <uv.h>

#include "build_info.h"
#include "orchestrator/cli/commands.h"
#include "orchestrator/common/opt.h"
#include "workers/bcast/bcast.h"

extern char **environ;

typedef struct version_opts {
  bool json;
} version_opts;

static const opt_field version__fields[] = {
    {.name = "json", .flag = "--json", .type = OPT_SWITCH,
     .off = OPT_OFF(version_opts, json, bool), .help = "one JSON object instead of text"},
};

static const opt_cmd version__cmd = {
    .name = "version",
    .about = "Prints the version, what was built in and what this machine offers now.",
    .fields = version__fields,
    .nfields = sizeof version__fields / sizeof version__fields[0],
};

int cmd_version(int argc, char **argv) {
  const version_opts d = {0};
  version_opts o = d;
  opt_state st;
  int rc = opt_parse_main(&version__cmd, &o, &d, argc, argv, environ, &st);
  if (rc >= 0) return rc;
  int json = o.json;
  bcast_caps c;
  bcast_caps_probe(&c);
  const char *transport = c.cuda_devices > 0 && c.nccl_version[0] ? "nccl" : "host-tcp";
  if (json) {
    printf("{\"version\":\"%s\",\"build_type\":\"%s\",\"cuda_built\":%s,\"nccl_built\":%s,"
           "\"cuda_devices\":%d,\"cuda_version\":\"%s\",\"nccl_version\":\"%s\","
           "\"gpu_name\":\"%s\",\"cpu_threads\":%d,\"avx2\":%s,\"avx512\":%s,"
           "\"pinned_limit_bytes\":%llu,\"default_transport\":\"%s\",\"grpc\":\"%s\","
           "\"libuv\":\"%s\",\"sqlite\":\"%s\",\"protobuf_c\":\"%s\"}\n",
           RLORCH_VERSION, RLORCH_BUILD_TYPE, c.cuda_built ? "true" : "false",
           c.nccl_built ? "true" : "false", c.cuda_devices, c.cuda_version, c.nccl_version,
           c.gpu_name, c.cpu_threads, c.cpu_avx2 ? "true" : "false",
           c.cpu_avx512 ? "true" : "false", (unsigned long long)c.pinned_limit_bytes, transport,
           grpc_version_string(), uv_version_string(), sqlite3_libversion(),
           protobuf_c_version());
    return 0;
  }
  printf("rlorch %s (%s%s%s)\n", RLORCH_VERSION, RLORCH_BUILD_TYPE,
         RLORCH_SANITIZE[0] ? ", sanitize=" : "", RLORCH_SANITIZE);
  printf("built in:   CUDA %s, NCCL %s, gRPC core %s, libuv %s, SQLite %s, protobuf-c %s\n",
         c.cuda_built ? "yes" : "no", c.nccl_built ? "yes" : "no", grpc_version_string(),
         uv_version_string(), sqlite3_libversion(), protobuf_c_version());
  printf("this host:  CUDA devices %d%s%s%s, runtime %s, driver %s, NCCL %s\n", c.cuda_devices,
         c.gpu_name[0] ? " (" : "", c.gpu_name, c.gpu_name[0] ? ")" : "",
         c.cuda_version[0] ? c.cuda_version : "-", c.driver_version[0] ? c.driver_version : "-",
         c.nccl_version[0] ? c.nccl_version : "-");
  printf("cpu:        %d threads, AVX2 %s, AVX-512 %s, pinned limit %llu MiB\n", c.cpu_threads,
         c.cpu_avx2 ? "yes" : "no", c.cpu_avx512 ? "yes" : "no",
         (unsigned long long)(c.pinned_limit_bytes >> 20));
  printf("transport:  %s%s%s\n", transport, c.note[0] ? " - " : "", c.note);
  return 0;
}
