/* Where a worker runs: NICs and NUMA nodes from sysfs, NVLink peers from NVML
 * (opened at run time), and what the worker's settings say instead.
 *
 * Every path is taken under a sysfs root, so that tests run the same code on
 * a fake tree. Nothing here fails: what cannot be read is unknown (speed 0,
 * NUMA node -1), and the note says what was missing. */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "workers/bcast/bcast_internal.h"

/* ---- small sysfs readers ---------------------------------------------------- */

static int st__vread(char *buf, size_t len, const char *root, const char *fmt, va_list ap) {
  char rel[512], path[1024];
  buf[0] = '\0';
  int n = vsnprintf(rel, sizeof rel, fmt, ap);
  if (n < 0 || (size_t)n >= sizeof rel) return -1;
  n = snprintf(path, sizeof path, "%s/%s", root, rel);
  if (n < 0 || (size_t)n >= sizeof path) return -1;
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t got = fread(buf, 1, len - 1, f);
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    buf[0] = '\0';
    return -1;
  }
  buf[got] = '\0';
  while (got > 0 && isspace((unsigned char)buf[got - 1])) buf[--got] = '\0';
  return 0;
}

/* Reads the file at root/REL (REL formatted) into buf, trailing whitespace
 * cut. 0, or -1 when it does not exist, cannot be read (a link that is down
 * answers EINVAL for its speed) or the path does not fit. */
static int st__read(char *buf, size_t len, const char *root, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int st__read(char *buf, size_t len, const char *root, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = st__vread(buf, len, root, fmt, ap);
  va_end(ap);
  return rc;
}

/* A file holding one integer (decimal, or 0x hex as `flags` is); -1 when
 * absent or not a number. */
static int st__vread_long(long *out, const char *root, const char *fmt, va_list ap) {
  char buf[64], *end;
  if (st__vread(buf, sizeof buf, root, fmt, ap) || !buf[0]) return -1;
  long v = strtol(buf, &end, 0);
  if (*end) return -1;
  *out = v;
  return 0;
}

static int st__read_long(long *out, const char *root, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int st__read_long(long *out, const char *root, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = st__vread_long(out, root, fmt, ap);
  va_end(ap);
  return rc;
}

/* A numa_node file: the node, or -1 (what sysfs says without NUMA, and
 * what a missing file means). */
static int st__numa(const char *root, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int st__numa(const char *root, const char *fmt, ...) {
  long v = -1;
  va_list ap;
  va_start(ap, fmt);
  int rc = st__vread_long(&v, root, fmt, ap);
  va_end(ap);
  return rc || v < 0 || v > 65535 ? -1 : (int)v;
}

static int st__is_dir(const char *root, const char *rel) {
  char path[1024];
  struct stat sb;
  int n = snprintf(path, sizeof path, "%s/%s", root, rel);
  return n > 0 && (size_t)n < sizeof path && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int st__cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names in directory root/rel but "." and "..", sorted (readdir's order
 * is the file system's); NULL and 0 when it cannot be read, an array of
 * none when it is empty. Free with st__names_free. */
static char **st__names(const char *root, const char *rel, size_t *n) {
  char path[1024];
  *n = 0;
  int len = snprintf(path, sizeof path, "%s/%s", root, rel);
  if (len < 0 || (size_t)len >= sizeof path) return NULL;
  DIR *d = opendir(path);
  if (!d) return NULL;
  size_t cap = 16;
  char **v = malloc(cap * sizeof *v);
  struct dirent *e;
  while (v && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (*n == cap) {
      size_t nc = cap * 2;
      char **nv = realloc(v, nc * sizeof *nv);
      if (!nv) break;
      v = nv;
      cap = nc;
    }
    if (!(v[*n] = strdup(e->d_name))) break;
    (*n)++;
  }
  closedir(d);
  if (*n) qsort(v, *n, sizeof *v, st__cmp);
  return v;
}

static void st__names_free(char **v, size_t n) {
  for (size_t i = 0; i < n; i++) free(v[i]);
  free(v);
}

static void st__note(char *note, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void st__note(char *note, size_t len, const char *fmt, ...) {
  size_t used = strlen(note);
  if (used && used + 2 < len) {
    memcpy(note + used, "; ", 3);
    used += 2;
  }
  if (used + 1 >= len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(note + used, len - used, fmt, ap);
  va_end(ap);
}

void bcast_systopo_gpu_note(bcast_systopo *t, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  st__note(t->gpu_note, sizeof t->gpu_note, "%s", msg);
}

/* ---- NUMA node of the CPUs -------------------------------------------------- */

/* Whether cpu is in a cpulist ("0-3,8,10-11"). */
static int st__cpulist_has(const char *list, long cpu) {
  const char *p = list;
  while (*p) {
    char *end;
    long a = strtol(p, &end, 10), b = a;
    if (end == p) return 0;
    if (*end == '-') {
      p = end + 1;
      b = strtol(p, &end, 10);
      if (end == p) return 0;
    }
    if (cpu >= a && cpu <= b) return 1;
    p = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') return 0;
  }
  return 0;
}

/* The one NUMA node that holds every CPU the process may run on; -1 when
 * they span several (the memory it touches lands on either) or sysfs has no
 * node directory (a kernel without NUMA). */
static int st__cpu_numa(const char *root) {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (sched_getaffinity(0, sizeof cpus, &cpus) != 0) return -1;
  size_t n;
  char **names = st__names(root, "devices/system/node", &n);
  int found = -1;
  for (size_t i = 0; i < n; i++) {
    char *end;
    if (strncmp(names[i], "node", 4) || !isdigit((unsigned char)names[i][4])) continue;
    long node = strtol(names[i] + 4, &end, 10);
    if (*end || node > 65535) continue;
    char list[4096];
    if (st__read(list, sizeof list, root, "devices/system/node/%s/cpulist", names[i])) continue;
    for (int c = 0; c < CPU_SETSIZE; c++) {
      if (!CPU_ISSET(c, &cpus) || !st__cpulist_has(list, c)) continue;
      if (found >= 0 && found != node) {
        st__names_free(names, n);
        return -1;
      }
      found = (int)node;
    }
  }
  st__names_free(names, n);
  return found;
}

/* ---- NICs ------------------------------------------------------------------- */

#define ST__IFF_UP 0x1
#define ST__ARPHRD_LOOPBACK 772

static int st__net_has(const char *root, const char *name, const char *what) {
  char rel[128];
  snprintf(rel, sizeof rel, "class/net/%s/%s", name, what);
  return st__is_dir(root, rel);
}

/* Whether interface `name` carries the node's traffic once: not the
 * loopback, not down, and not counted twice: a bridge's traffic leaves
 * through its ports and a bond's slaves carry the bond's (sysfs gives the
 * bond their sum), so the bridge and the slaves are left out; so is a
 * virtual port of a bridge (the host's end of a container's veth), whose
 * traffic is the container's. What cannot be read does not exclude it. */
static int st__nic_usable(const char *root, const char *name) {
  long v;
  char state[32];
  if (!strcmp(name, "lo")) return 0;
  if (!st__read_long(&v, root, "class/net/%s/type", name) && v == ST__ARPHRD_LOOPBACK) return 0;
  if (!st__read_long(&v, root, "class/net/%s/flags", name) && !(v & ST__IFF_UP)) return 0;
  if (!st__read(state, sizeof state, root, "class/net/%s/operstate", name) &&
      (!strcmp(state, "down") || !strcmp(state, "lowerlayerdown") || !strcmp(state, "notpresent")))
    return 0;
  if (st__net_has(root, name, "bridge") || st__net_has(root, name, "bonding_slave")) return 0;
  return !(st__net_has(root, name, "brport") && !st__net_has(root, name, "device"));
}

/* RDMA: the interface's device has an InfiniBand port (mlx5 Ethernet ports
 * for RoCE, IPoIB), or an InfiniBand device lists it as its netdev. */
static int st__nic_rdma(const char *root, const char *name, char **ib, size_t nib) {
  char rel[256];
  size_t n;
  snprintf(rel, sizeof rel, "class/net/%s/device/infiniband", name);
  char **v = st__names(root, rel, &n);
  st__names_free(v, n);
  if (n) return 1;
  for (size_t i = 0; i < nib; i++) {
    int len = snprintf(rel, sizeof rel, "class/infiniband/%s/device/net/%s", ib[i], name);
    if (len > 0 && (size_t)len < sizeof rel && st__is_dir(root, rel)) return 1;
  }
  return 0;
}

static void st__probe_nics(const char *root, bcast_systopo *t) {
  size_t n, nib;
  char **names = st__names(root, "class/net", &n);
  char **ib = st__names(root, "class/infiniband", &nib);
  uint32_t unlisted = 0;
  for (size_t i = 0; i < n; i++) {
    if (strlen(names[i]) >= sizeof t->nics[0].name || !st__nic_usable(root, names[i])) continue;
    if (t->n_nics == BCAST_SYSTOPO_MAX_NICS) {
      unlisted++;
      continue;
    }
    bcast_systopo_nic *c = &t->nics[t->n_nics++];
    snprintf(c->name, sizeof c->name, "%s", names[i]);
    long mbits;
    /* Mb/s; -1 (virtio, bridges) or unreadable (a link without carrier):
     * unknown. */
    c->gbits = !st__read_long(&mbits, root, "class/net/%s/speed", names[i]) && mbits > 0
                   ? (double)mbits / 1000.0
                   : 0;
    c->numa_node = st__numa(root, "class/net/%s/device/numa_node", names[i]);
    c->rdma = st__nic_rdma(root, names[i], ib, nib);
    long mtu;
    /* The frame's payload: how much of the line rate TCP gets. */
    c->mtu = !st__read_long(&mtu, root, "class/net/%s/mtu", names[i]) && mtu > 0 && mtu <= 1 << 20
                 ? (uint32_t)mtu
                 : 0;
  }
  if (unlisted)
    st__note(t->note, sizeof t->note, "%u more NICs not listed (at most %d)", unlisted,
             BCAST_SYSTOPO_MAX_NICS);
  if (!names) st__note(t->note, sizeof t->note, "%s/class/net unreadable: no NIC known", root);
  st__names_free(names, n);
  st__names_free(ib, nib);
}

static void st__numa_choose(bcast_systopo *t) {
  t->numa_node = t->gpu_numa_node >= 0 ? t->gpu_numa_node : t->cpu_numa_node;
}

void bcast_systopo_probe(const char *sysfs_root, const char *host_id, bcast_systopo *t) {
  memset(t, 0, sizeof *t);
  snprintf(t->node, sizeof t->node, "%s", host_id ? host_id : "");
  t->gpu_numa_node = -1;
  t->cpu_numa_node = st__cpu_numa(sysfs_root);
  st__numa_choose(t);
  st__probe_nics(sysfs_root, t);
}

/* "0000:3B:00.0" or NVML's "00000000:3B:00.0" as sysfs names the device:
 * lower case, four digits of domain at least. 0, or -1 when malformed. */
static int st__bus_id(const char *in, char *out, size_t len) {
  unsigned dom, bus, dev, fn;
  char tail;
  if (sscanf(in, "%x:%x:%x.%x%c", &dom, &bus, &dev, &fn, &tail) != 4 || bus > 0xff || dev > 0x1f ||
      fn > 7)
    return -1;
  int n = snprintf(out, len, "%04x:%02x:%02x.%x", dom, bus, dev, fn);
  return n > 0 && (size_t)n < len ? 0 : -1;
}

void bcast_systopo_set_gpu(bcast_systopo *t, const char *sysfs_root, const char *pci_bus_id) {
  t->gpu_pci_bus_id[0] = t->gpu_note[0] = '\0';
  t->gpu_numa_node = -1;
  t->nvlinks = t->n_nvlink_peers = 0;
  t->h2d_gbps = 0; /* another GPU's rate is not this one's */
  if (pci_bus_id && pci_bus_id[0]) {
    if (st__bus_id(pci_bus_id, t->gpu_pci_bus_id, sizeof t->gpu_pci_bus_id))
      st__note(t->gpu_note, sizeof t->gpu_note, "GPU PCI bus id \"%.40s\" malformed", pci_bus_id);
    else
      t->gpu_numa_node = st__numa(sysfs_root, "bus/pci/devices/%s/numa_node", t->gpu_pci_bus_id);
  }
  st__numa_choose(t);
}

void bcast_systopo_measure_h2d(bcast_systopo *t, int device) {
  t->h2d_gbps = 0;
  if (device < 0) return;
  /* The floor the benchmarks report against, so that the model's rate and
   * theirs are one measurement. */
  bcast_err err = {0};
  double g = 0;
  if (bcast_floor_h2d(device, BCAST_SYSTOPO_H2D_BYTES, BCAST_SYSTOPO_H2D_REPS, &g, &err) != 0)
    st__note(t->gpu_note, sizeof t->gpu_note, "h2d not measured: %s", err.msg);
  else t->h2d_gbps = g;
}

/* ---- NVLink peers through NVML ----------------------------------------------
 * NVML is the driver's library (libnvidia-ml.so.1), present wherever a GPU
 * is: opened with dlopen so that the program runs, and links, without it.
 * The declarations are the stable NVML API's (nvml.h is not in the CUDA
 * toolkit's runtime headers everywhere). */
typedef void *st__nvml_dev;
typedef struct {
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
} st__nvml_pci; /* nvmlPciInfo_t */
#define ST__NVML_NVLINK_MAX_LINKS 18
#define ST__NVML_P2P_CAPS_INDEX_NVLINK 2

typedef struct {
  int (*init)(void);
  int (*shutdown)(void);
  int (*by_bus_id)(const char *, st__nvml_dev *);
  int (*link_state)(st__nvml_dev, unsigned, int *);
  int (*link_remote)(st__nvml_dev, unsigned, st__nvml_pci *);
  int (*p2p)(st__nvml_dev, st__nvml_dev, int, int *);
} st__nvml;

static int st__nvml_open(void *h, st__nvml *f) {
  /* POSIX: a data pointer from dlsym converts to a function pointer. */
  *(void **)&f->init = dlsym(h, "nvmlInit_v2");
  *(void **)&f->shutdown = dlsym(h, "nvmlShutdown");
  *(void **)&f->by_bus_id = dlsym(h, "nvmlDeviceGetHandleByPciBusId_v2");
  *(void **)&f->link_state = dlsym(h, "nvmlDeviceGetNvLinkState");
  *(void **)&f->link_remote = dlsym(h, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
  *(void **)&f->p2p = dlsym(h, "nvmlDeviceGetP2PStatus"); /* optional */
  return f->init && f->shutdown && f->by_bus_id && f->link_state && f->link_remote ? 0 : -1;
}

/* Whether `peer` is reached over NVLink from `dev`: NVML's own answer where
 * it has one (it knows NVSwitch fabrics), else a link of dev's whose far end
 * is peer's bus id (GPUs linked directly). */
static int st__nvlinked(const st__nvml *f, st__nvml_dev dev, st__nvml_dev peer,
                        const char *peer_bus, const int *active) {
  int status = -1;
  if (f->p2p && f->p2p(dev, peer, ST__NVML_P2P_CAPS_INDEX_NVLINK, &status) == 0)
    return status == 0;
  for (unsigned l = 0; l < ST__NVML_NVLINK_MAX_LINKS; l++) {
    st__nvml_pci pci;
    char bus[32];
    memset(&pci, 0, sizeof pci);
    if (!active[l] || f->link_remote(dev, l, &pci) != 0) continue;
    pci.bus_id[sizeof pci.bus_id - 1] = '\0';
    if (!st__bus_id(pci.bus_id, bus, sizeof bus) && !strcmp(bus, peer_bus)) return 1;
  }
  return 0;
}

void bcast_systopo_set_nvlink(bcast_systopo *t, const char *const *bus_ids,
                              const char *const *uuids, size_t n) {
  t->nvlinks = t->n_nvlink_peers = 0;
  if (!t->gpu_pci_bus_id[0]) return;
  void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    st__note(t->gpu_note, sizeof t->gpu_note, "NVML (libnvidia-ml.so.1) not loadable: NVLink peers unknown");
    return;
  }
  st__nvml f;
  int rc;
  st__nvml_dev dev;
  if (st__nvml_open(h, &f)) {
    st__note(t->gpu_note, sizeof t->gpu_note, "NVML lacks the NVLink calls: NVLink peers unknown");
  } else if ((rc = f.init()) != 0) {
    st__note(t->gpu_note, sizeof t->gpu_note, "NVML init failed (%d): NVLink peers unknown", rc);
  } else {
    if ((rc = f.by_bus_id(t->gpu_pci_bus_id, &dev)) != 0) {
      st__note(t->gpu_note, sizeof t->gpu_note, "NVML does not know GPU %s (%d): NVLink peers unknown",
               t->gpu_pci_bus_id, rc);
    } else {
      int active[ST__NVML_NVLINK_MAX_LINKS] = {0};
      for (unsigned l = 0; l < ST__NVML_NVLINK_MAX_LINKS; l++) {
        int on = 0;
        /* Links past the GPU's count answer an error: not active. */
        active[l] = f.link_state(dev, l, &on) == 0 && on == 1;
        t->nvlinks += (uint32_t)active[l];
      }
      for (size_t i = 0; t->nvlinks && i < n; i++) {
        char bus[32];
        st__nvml_dev peer;
        if (!bus_ids[i] || !uuids[i] || !uuids[i][0] || st__bus_id(bus_ids[i], bus, sizeof bus) ||
            !strcmp(bus, t->gpu_pci_bus_id) || f.by_bus_id(bus, &peer) != 0 ||
            !st__nvlinked(&f, dev, peer, bus, active))
          continue;
        if (t->n_nvlink_peers == BCAST_SYSTOPO_MAX_PEERS) {
          st__note(t->gpu_note, sizeof t->gpu_note, "NVLink peers past %d not listed", BCAST_SYSTOPO_MAX_PEERS);
          break;
        }
        snprintf(t->nvlink_peers[t->n_nvlink_peers++], sizeof t->nvlink_peers[0], "%s", uuids[i]);
      }
    }
    f.shutdown();
  }
  dlclose(h);
}

/* ---- configuration ---------------------------------------------------------- */

static int st__bad(const char **field, const char *name, bcast_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int st__bad(const char **field, const char *name, bcast_err *err, const char *fmt, ...) {
  char msg[sizeof err->msg];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (field) *field = name;
  return bcast__fail(err, BCAST_EINVAL, "%s: %s", name, msg);
}

int bcast_systopo_config_check(const bcast_systopo_config *c, const char **field, bcast_err *err) {
  if (field) *field = NULL;
  if (c->node) {
    size_t len = strlen(c->node);
    if (!len) return st__bad(field, "node", err, "empty (a node name is 1 to %d bytes)", BCAST_SYSTOPO_NODE_MAX - 1);
    if (len >= BCAST_SYSTOPO_NODE_MAX)
      return st__bad(field, "node", err, "%zu bytes, more than %d", len, BCAST_SYSTOPO_NODE_MAX - 1);
    /* It is printed in tables and log lines, unquoted in some. */
    for (const unsigned char *p = (const unsigned char *)c->node; *p; p++)
      if (*p <= ' ' || *p == 0x7f || *p == '"' || *p == '\\')
        return st__bad(field, "node", err, "\"%s\" holds a space, quote, backslash or control "
                       "character", c->node);
  }
  if (!isfinite(c->nic_gbits) || c->nic_gbits < 0)
    return st__bad(field, "nic_gbits", err, "%g is not a positive speed in Gb/s", c->nic_gbits);
  if (c->nic_gbits > BCAST_SYSTOPO_MAX_GBITS)
    return st__bad(field, "nic_gbits", err, "%g Gb/s, more than %d (a NIC's speed in Gb/s: 100, 400)",
                   c->nic_gbits, BCAST_SYSTOPO_MAX_GBITS);
  if (c->nics > BCAST_SYSTOPO_MAX_NICS)
    return st__bad(field, "nics", err, "%u, more than %d", c->nics, BCAST_SYSTOPO_MAX_NICS);
  if (c->nics && c->nic_gbits == 0)
    return st__bad(field, "nics", err, "%u NICs without nic_gbits (the speed of each)", c->nics);
  return BCAST_OK;
}

int bcast_systopo_configure(bcast_systopo *t, const bcast_systopo_config *c, const char **field,
                            bcast_err *err) {
  int rc = bcast_systopo_config_check(c, field, err);
  if (rc) return rc;
  if (c->node) {
    snprintf(t->node, sizeof t->node, "%s", c->node);
    t->configured |= BCAST_SYSTOPO_CONF_NODE;
  }
  if (c->nics) {
    /* The configured NICs carry the node's traffic, which leaves by the
     * detected interfaces (all up, st__nic_usable): they take the largest
     * MTU of those, the data network's where a management interface keeps
     * 1500 beside jumbo frames; 0 when none is known. */
    uint32_t mtu = 0;
    for (uint32_t i = 0; i < t->n_nics; i++)
      if (t->nics[i].mtu > mtu) mtu = t->nics[i].mtu;
    memset(t->nics, 0, sizeof t->nics);
    t->n_nics = c->nics;
    for (uint32_t i = 0; i < c->nics; i++) {
      snprintf(t->nics[i].name, sizeof t->nics[i].name, "nic%u", i);
      t->nics[i].gbits = c->nic_gbits;
      t->nics[i].numa_node = -1;
      t->nics[i].mtu = mtu;
    }
    t->configured |= BCAST_SYSTOPO_CONF_NICS;
  } else if (c->nic_gbits > 0) {
    for (uint32_t i = 0; i < t->n_nics; i++) t->nics[i].gbits = c->nic_gbits;
    if (!t->n_nics)
      st__note(t->note, sizeof t->note, "nic_gbits %g: no NIC detected to set it on", c->nic_gbits);
    t->configured |= BCAST_SYSTOPO_CONF_NIC_GBITS;
  }
  return BCAST_OK;
}

size_t bcast_systopo_configured_names(unsigned configured, const char *names[3]) {
  size_t n = 0;
  if (configured & BCAST_SYSTOPO_CONF_NODE) names[n++] = "node";
  if (configured & BCAST_SYSTOPO_CONF_NICS) names[n++] = "nics";
  if (configured & BCAST_SYSTOPO_CONF_NIC_GBITS) names[n++] = "nics.gbits";
  return n;
}

/* ---- description ------------------------------------------------------------ */

static int st__cmp_desc(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* A speed as NICs are sold: "100G", "2.5G", "0.1G". */
static void st__gbits(double g, char *buf, size_t len) {
  if (g == floor(g)) snprintf(buf, len, "%.0fG", g);
  else snprintf(buf, len, "%.3gG", g);
}

const char *bcast_systopo_nic_summary(const double *gbits, size_t n, char *buf, size_t len) {
  if (!len) return buf;
  buf[0] = '\0';
  if (!n) {
    snprintf(buf, len, "-");
    return buf;
  }
  double s[BCAST_SYSTOPO_MAX_NICS];
  size_t m = n < BCAST_SYSTOPO_MAX_NICS ? n : BCAST_SYSTOPO_MAX_NICS;
  for (size_t i = 0; i < m; i++) s[i] = gbits[i] > 0 && isfinite(gbits[i]) ? gbits[i] : 0;
  qsort(s, m, sizeof s[0], st__cmp_desc); /* unknown (0) last */
  size_t used = 0;
  for (size_t i = 0; i < m;) {
    size_t j = i;
    while (j < m && s[j] == s[i]) j++;
    char sp[32];
    if (s[i] > 0) st__gbits(s[i], sp, sizeof sp);
    else snprintf(sp, sizeof sp, "?");
    int w = snprintf(buf + used, len - used, "%s%zux%s", used ? "+" : "", j - i, sp);
    if (w < 0 || (size_t)w >= len - used) {
      buf[used] = '\0'; /* whole groups only */
      break;
    }
    used += (size_t)w;
    i = j;
  }
  return buf;
}

/* The smallest MTU known among the NICs, as "1500"; "?" when none is. */
static void st__mtu(const bcast_systopo *t, char *buf, size_t len) {
  uint32_t least = 0;
  for (uint32_t i = 0; i < t->n_nics; i++)
    if (t->nics[i].mtu && (!least || t->nics[i].mtu < least)) least = t->nics[i].mtu;
  if (least) snprintf(buf, len, "%u", least);
  else snprintf(buf, len, "?");
}

const char *bcast_systopo_describe(const bcast_systopo *t, char *buf, size_t len) {
  char sum[256], list[1024] = "", unknown[512] = "", conf[64] = "", note[1024], mtu[16];
  double g[BCAST_SYSTOPO_MAX_NICS];
  size_t used = 0, uused = 0;
  for (uint32_t i = 0; i < t->n_nics; i++) {
    const bcast_systopo_nic *c = &t->nics[i];
    char sp[32], numa[16];
    g[i] = c->gbits;
    if (c->gbits > 0) st__gbits(c->gbits, sp, sizeof sp);
    else snprintf(sp, sizeof sp, "?");
    if (c->numa_node >= 0) snprintf(numa, sizeof numa, "numa%d", c->numa_node);
    else snprintf(numa, sizeof numa, "numa?");
    int w = snprintf(list + used, sizeof list - used, "%s%s:%s:%s%s", used ? "," : "", c->name, sp,
                     numa, c->rdma ? ":rdma" : "");
    if (w > 0 && (size_t)w < sizeof list - used) used += (size_t)w;
    if (c->gbits > 0) continue;
    w = snprintf(unknown + uused, sizeof unknown - uused, "%s%s", uused ? ", " : "", c->name);
    if (w > 0 && (size_t)w < sizeof unknown - uused) uused += (size_t)w;
  }
  bcast_systopo_nic_summary(g, t->n_nics, sum, sizeof sum);
  st__mtu(t, mtu, sizeof mtu);
  const char *names[3];
  size_t nn = bcast_systopo_configured_names(t->configured, names);
  for (size_t i = 0; i < nn; i++) {
    size_t l = strlen(conf);
    snprintf(conf + l, sizeof conf - l, "%s%s", i ? "," : "", names[i]);
  }
  char h2d[32] = "-"; /* "-": not measured (no GPU, or the note says why) */
  if (t->h2d_gbps > 0) snprintf(h2d, sizeof h2d, "%.1f", t->h2d_gbps);
  snprintf(note, sizeof note, "%s", t->note);
  if (t->gpu_note[0]) st__note(note, sizeof note, "%s", t->gpu_note);
  if (!t->gpu_pci_bus_id[0]) st__note(note, sizeof note, "no GPU: no bus id, no NVLink peers");
  if (unknown[0])
    st__note(note, sizeof note, "speed unknown (0 Gb/s) for %s: set nic_gbits (--nic-gbits)", unknown);
  snprintf(buf, len,
           "node=\"%s\" numa_node=%d numa_from=%s gpu_pci=%s nvlinks=%u nvlink_peers=%u h2d_gbps=%s "
           "mtu=%s nics=%s nic_list=\"%s\" configured=\"%s\" note=\"%s\"",
           t->node, t->numa_node,
           t->gpu_numa_node >= 0 ? "gpu" : t->cpu_numa_node >= 0 ? "cpu" : "none",
           t->gpu_pci_bus_id[0] ? t->gpu_pci_bus_id : "-", t->nvlinks, t->n_nvlink_peers, h2d, mtu,
           sum, list, conf, note);
  return buf;
}
