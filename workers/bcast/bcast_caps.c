/* What each mode can do on this machine. */
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "workers/bcast/bcast_internal.h"

void bcast_caps_probe(bcast_caps *c) {
  memset(c, 0, sizeof *c);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  c->cpu_threads = n > 0 ? (int)n : 1;
#if defined(__x86_64__)
  __builtin_cpu_init();
  c->cpu_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  c->cpu_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#endif
  struct rlimit rl;
  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  uint64_t phys = (pages > 0 && psz > 0) ? (uint64_t)pages * (uint64_t)psz : 0;
  c->pinned_limit_bytes = phys;
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && geteuid() != 0 &&
      (uint64_t)rl.rlim_cur < phys)
    c->pinned_limit_bytes = (uint64_t)rl.rlim_cur;
  bcast__gpu_probe(c);
}

int bcast_mode_available(const bcast_caps *c, bcast_mode m, char *why, size_t whylen) {
  const char *reason = NULL;
  switch (m) {
  case BCAST_MODE_HOST: break;
  case BCAST_MODE_DIRECT:
  case BCAST_MODE_STAGED:
    if (!c->cuda_built) reason = "built without CUDA";
    else if (!c->nccl_built) reason = "built without NCCL";
    else if (c->cuda_devices <= 0) reason = "no CUDA device visible";
    else if (!c->nccl_version[0]) reason = "NCCL library not loadable";
    break;
  default: reason = "unknown mode";
  }
  if (reason && why && whylen) snprintf(why, whylen, "%s", reason);
  return reason == NULL;
}
