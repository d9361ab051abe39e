/* What each mode can do on this machine. */
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "workers/bcast/bcast_internal.h"

#ifdef RLORCH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* Where the topology is read from; tests point bcast_systopo_probe elsewhere. */
#define BCAST__SYSFS "/sys"

#if defined(__x86_64__)
/* XCR0: the register state the OS saves on a context switch. */
static uint64_t bcast__xcr0(void) {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}
#endif

void bcast__cpu_probe(bcast__cpu *c) {
  memset(c, 0, sizeof *c);
#if defined(__x86_64__)
  unsigned int a, b, cx, d;
  if (!__get_cpuid(1, &a, &b, &cx, &d)) return;
  /* Every feature here is VEX/EVEX-encoded: useless unless the OS saves the
   * YMM (and for AVX-512 the opmask and ZMM) state. */
  if (!(cx & bit_OSXSAVE) || !(cx & bit_AVX)) return;
  uint64_t xcr0 = bcast__xcr0();
  if ((xcr0 & 0x6) != 0x6) return; /* SSE and AVX state */
  int zmm_state = (xcr0 & 0xe6) == 0xe6; /* plus opmask, ZMM0-15 upper, ZMM16-31 */
  c->f16c = (cx & bit_F16C) != 0;
  if (__get_cpuid_max(0, NULL) < 7) return;
  __cpuid_count(7, 0, a, b, cx, d);
  c->avx2 = (b & bit_AVX2) != 0;
  c->avx512f = zmm_state && (b & bit_AVX512F) != 0;
  c->avx512bw = zmm_state && (b & bit_AVX512BW) != 0;
#endif
}

void bcast_caps_probe(bcast_caps *c) {
  memset(c, 0, sizeof *c);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  c->cpu_threads = n > 0 ? (int)n : 1;
  bcast__cpu cpu;
  bcast__cpu_probe(&cpu);
  c->cpu_avx2 = cpu.avx2 && cpu.f16c;
  c->cpu_avx512 = cpu.avx512f && cpu.avx512bw;
  struct rlimit rl;
  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  uint64_t phys = (pages > 0 && psz > 0) ? (uint64_t)pages * (uint64_t)psz : 0;
  c->pinned_limit_bytes = phys;
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && geteuid() != 0 &&
      (uint64_t)rl.rlim_cur < phys)
    c->pinned_limit_bytes = (uint64_t)rl.rlim_cur;
  bcast__host_id(c->host_id, sizeof c->host_id);
  bcast_systopo_probe(BCAST__SYSFS, c->host_id, &c->topo);
  bcast__gpu_probe(c);
}

void bcast__host_id(char *out, size_t len) {
  if (!out || !len) return;
  out[0] = '\0';
  /* The boot id names one boot of one kernel: containers on a host share it
   * (and may share its GPUs), distinct machines never do; host names can. */
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    if (fgets(out, (int)len, f)) out[strcspn(out, "\r\n")] = '\0';
    fclose(f);
  }
  if (out[0]) return;
  if (gethostname(out, len) != 0) out[0] = '\0';
  out[len - 1] = '\0';
}

#ifdef RLORCH_HAVE_CUDA
/* The GPU's place: its bus id, its NUMA node, and which other visible GPUs
 * it reaches over NVLink (by their UUIDs, as Capabilities.gpu_uuid names
 * GPUs). */
static void bcast__caps_gpu_topo(bcast_caps *c, int device) {
  char bus[32];
  if (cudaDeviceGetPCIBusId(bus, (int)sizeof bus, device) != cudaSuccess) {
    (void)cudaGetLastError();
    bcast_systopo_gpu_note(&c->topo, "CUDA gives no PCI bus id for device %d", device);
    return;
  }
  bcast_systopo_set_gpu(&c->topo, BCAST__SYSFS, bus);
  char ids[BCAST_SYSTOPO_MAX_PEERS][32], uuids[BCAST_SYSTOPO_MAX_PEERS][48];
  const char *idp[BCAST_SYSTOPO_MAX_PEERS], *uup[BCAST_SYSTOPO_MAX_PEERS];
  size_t n = 0;
  for (int d = 0; d < c->cuda_devices && n < BCAST_SYSTOPO_MAX_PEERS; d++) {
    if (d == device) continue;
    if (cudaDeviceGetPCIBusId(ids[n], (int)sizeof ids[n], d) != cudaSuccess ||
        bcast__gpu_uuid(d, uuids[n], sizeof uuids[n]) != BCAST_OK) {
      (void)cudaGetLastError();
      continue;
    }
    idp[n] = ids[n];
    uup[n] = uuids[n];
    n++;
  }
  bcast_systopo_set_nvlink(&c->topo, idp, uup, n);
}
#endif

void bcast_caps_select_device(bcast_caps *c, int device) {
  if (!c) return;
  c->gpu_name[0] = c->gpu_uuid[0] = '\0';
  bcast_systopo_set_gpu(&c->topo, BCAST__SYSFS, NULL);
  if (device < 0 || device >= c->cuda_devices) return;
#ifdef RLORCH_HAVE_CUDA
  struct cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess)
    snprintf(c->gpu_name, sizeof c->gpu_name, "%.127s", prop.name);
  else
    (void)cudaGetLastError();
  bcast__caps_gpu_topo(c, device);
#endif
  bcast__gpu_uuid(device, c->gpu_uuid, sizeof c->gpu_uuid);
}

int bcast_mode_available(const bcast_caps *c, bcast_mode m, char *why, size_t whylen) {
  const char *reason = NULL;
  switch (m) {
  case BCAST_MODE_HOST: break;
  case BCAST_MODE_COLOCATED:
    /* CUDA IPC within one GPU: no NCCL involved. */
    if (!c->cuda_built) reason = "built without CUDA";
    else if (c->cuda_devices <= 0) reason = "no CUDA device visible";
    break;
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
