/* Where a worker runs (bcast_systopo.c) on fake sysfs trees: NICs (speeds,
 * down and virtual interfaces, missing files, NUMA, RDMA), the CPUs' and the
 * GPU's NUMA node, its measured host-to-device rate, the settings that
 * replace what is detected, and the agents' flags for them (--node, --nics,
 * --nic-gbits). */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/cli/agent_flags.h"
#include "workers/agent/agent_core.h"
#include "workers/bcast/bcast.h"

static char root[128];

static void setup(void) {
  snprintf(root, sizeof root, "%s/rlorch_systopo_XXXXXX", P_tmpdir);
  cr_assert_not_null(mkdtemp(root));
}

static void teardown(void) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  cr_assert_eq(system(cmd), 0);
}

TestSuite(systopo, .init = setup, .fini = teardown);
TestSuite(systopo_flags);

/* mkdir -p root/REL (REL formatted). */
static void mkdirs(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void mkdirs(const char *fmt, ...) {
  char rel[512], path[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(rel, sizeof rel, fmt, ap);
  va_end(ap);
  snprintf(path, sizeof path, "%s/%s", root, rel);
  for (char *p = path + strlen(root) + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    cr_assert(mkdir(path, 0755) == 0 || errno == EEXIST, "mkdir %s: %s", path, strerror(errno));
    *p = '/';
  }
  cr_assert(mkdir(path, 0755) == 0 || errno == EEXIST, "mkdir %s: %s", path, strerror(errno));
}

/* Writes `content` and a newline (as sysfs does) to root/REL, its folders made. */
static void put(const char *rel, const char *content) {
  char dir[512], path[1024];
  snprintf(dir, sizeof dir, "%s", rel);
  char *slash = strrchr(dir, '/');
  if (slash) {
    *slash = '\0';
    mkdirs("%s", dir);
  }
  snprintf(path, sizeof path, "%s/%s", root, rel);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f, "%s: %s", path, strerror(errno));
  fprintf(f, "%s\n", content);
  fclose(f);
}

/* An interface as sysfs shows it: flags (IFF_UP is 0x1), operstate, speed
 * (NULL: no file, as a link without carrier reads), NUMA node (NULL: none). */
static void nic(const char *name, const char *flags, const char *state, const char *speed,
                const char *numa) {
  char rel[256];
  snprintf(rel, sizeof rel, "class/net/%s/flags", name);
  put(rel, flags);
  snprintf(rel, sizeof rel, "class/net/%s/operstate", name);
  put(rel, state);
  snprintf(rel, sizeof rel, "class/net/%s/type", name);
  put(rel, "1");
  if (speed) {
    snprintf(rel, sizeof rel, "class/net/%s/speed", name);
    put(rel, speed);
  }
  if (numa) {
    snprintf(rel, sizeof rel, "class/net/%s/device/numa_node", name);
    put(rel, numa);
  }
}

/* Interface `name`'s MTU file. */
static void mtu(const char *name, const char *bytes) {
  char rel[256];
  snprintf(rel, sizeof rel, "class/net/%s/mtu", name);
  put(rel, bytes);
}

static const bcast_systopo_nic *find_nic(const bcast_systopo *t, const char *name) {
  for (uint32_t i = 0; i < t->n_nics; i++)
    if (!strcmp(t->nics[i].name, name)) return &t->nics[i];
  return NULL;
}

Test(systopo, nics_up_with_speed_numa_and_rdma_sorted_by_name) {
  nic("eth1", "0x1003", "up", "25000", "1");
  nic("eth0", "0x1003", "up", "100000", "0");
  nic("ib0", "0x1043", "up", "200000", "1");
  /* IPoIB: its device has an InfiniBand port. */
  mkdirs("class/net/ib0/device/infiniband/mlx5_1");
  /* RoCE: the InfiniBand device lists the Ethernet interface as its netdev. */
  nic("ens5", "0x1003", "up", "400000", "0");
  mkdirs("class/infiniband/mlx5_0/device/net/ens5");
  bcast_systopo t;
  bcast_systopo_probe(root, "host-a", &t);
  cr_assert_str_eq(t.node, "host-a");
  cr_assert_eq(t.n_nics, 4);
  const char *order[] = {"ens5", "eth0", "eth1", "ib0"};
  for (int i = 0; i < 4; i++) cr_assert_str_eq(t.nics[i].name, order[i]);
  cr_assert_float_eq(find_nic(&t, "eth0")->gbits, 100.0, 1e-9);
  cr_assert_float_eq(find_nic(&t, "eth1")->gbits, 25.0, 1e-9);
  cr_assert_float_eq(find_nic(&t, "ens5")->gbits, 400.0, 1e-9);
  cr_assert_eq(find_nic(&t, "eth1")->numa_node, 1);
  cr_assert_eq(find_nic(&t, "eth0")->numa_node, 0);
  cr_assert_eq(find_nic(&t, "ib0")->rdma, 1);
  cr_assert_eq(find_nic(&t, "ens5")->rdma, 1);
  cr_assert_eq(find_nic(&t, "eth0")->rdma, 0);
  cr_assert_eq(find_nic(&t, "eth1")->rdma, 0);
  cr_assert_eq(t.configured, 0u);
  cr_assert_str_eq(t.note, "", "nothing was missing: %s", t.note);
}

Test(systopo, loopback_down_bridges_and_bond_slaves_are_not_nics) {
  nic("lo", "0x9", "unknown", NULL, NULL);
  nic("loop1", "0x9", "unknown", NULL, NULL);
  put("class/net/loop1/type", "772"); /* ARPHRD_LOOPBACK under another name */
  nic("eth0", "0x1003", "up", "10000", NULL);
  nic("eth1", "0x1002", "down", NULL, NULL);      /* administratively down */
  nic("eth2", "0x1003", "down", NULL, NULL);      /* up, but no carrier */
  nic("eth3", "0x1003", "lowerlayerdown", NULL, NULL);
  nic("ifb0", "0x82", "down", NULL, NULL);
  nic("br0", "0x1003", "up", "-1", NULL);
  mkdirs("class/net/br0/bridge");
  nic("tun0", "0x10d1", "unknown", NULL, NULL);   /* up, its state unknown: kept */
  /* A bond of two ports: the bond (their sum) is listed, its slaves are not. */
  nic("bond0", "0x1403", "up", "200000", NULL);
  nic("ens1f0", "0x1803", "up", "100000", "0");
  mkdirs("class/net/ens1f0/bonding_slave");
  nic("ens1f1", "0x1803", "up", "100000", "0");
  mkdirs("class/net/ens1f1/bonding_slave");
  /* Ports of a bridge: a physical one is listed, a container's veth end is not. */
  nic("eno1", "0x1103", "up", "25000", "0");
  mkdirs("class/net/eno1/brport");
  nic("veth12ab", "0x1103", "up", "10000", NULL);
  mkdirs("class/net/veth12ab/brport");
  bcast_systopo t;
  bcast_systopo_probe(root, "h", &t);
  const char *want[] = {"bond0", "eno1", "eth0", "tun0"};
  cr_assert_eq(t.n_nics, 4, "%u NICs", t.n_nics);
  for (int i = 0; i < 4; i++) cr_assert_str_eq(t.nics[i].name, want[i]);
  cr_assert_float_eq(t.nics[0].gbits, 200.0, 1e-9);
}

Test(systopo, unknown_speed_and_numa_and_missing_files) {
  nic("veth0", "0x1003", "up", "-1", NULL);  /* virtio and bridges say -1 */
  nic("eth0", "0x1003", "up", NULL, "-1");   /* unreadable speed; sysfs's -1 NUMA */
  nic("eth1", "0x1003", "up", "fast", NULL); /* not a number */
  mkdirs("class/net/bare0");                 /* no file at all: kept, all unknown */
  bcast_systopo t;
  bcast_systopo_probe(root, "h", &t);
  cr_assert_eq(t.n_nics, 4);
  for (uint32_t i = 0; i < t.n_nics; i++) {
    cr_assert_eq(t.nics[i].gbits, 0.0, "%s: %g", t.nics[i].name, t.nics[i].gbits);
    cr_assert_eq(t.nics[i].numa_node, -1, "%s", t.nics[i].name);
    cr_assert_eq(t.nics[i].rdma, 0, "%s", t.nics[i].name);
  }
  char d[4096];
  bcast_systopo_describe(&t, d, sizeof d);
  cr_assert(strstr(d, "nics=4x?"), "%s", d);
  cr_assert(strstr(d, "speed unknown (0 Gb/s) for bare0, eth0, eth1, veth0"), "%s", d);
}

Test(systopo, no_class_net_is_no_nic_and_a_note) {
  bcast_systopo t;
  bcast_systopo_probe(root, "h", &t);
  cr_assert_eq(t.n_nics, 0);
  cr_assert(strstr(t.note, "class/net unreadable"), "%s", t.note);
  cr_assert_eq(t.cpu_numa_node, -1, "no node directory: a kernel without NUMA");
  cr_assert_eq(t.numa_node, -1);
}

Test(systopo, more_nics_than_listed_are_counted) {
  for (int i = 0; i < BCAST_SYSTOPO_MAX_NICS + 3; i++) {
    char name[16];
    snprintf(name, sizeof name, "e%03d", i);
    nic(name, "0x1003", "up", "1000", NULL);
  }
  bcast_systopo t;
  bcast_systopo_probe(root, "h", &t);
  cr_assert_eq(t.n_nics, BCAST_SYSTOPO_MAX_NICS);
  cr_assert(strstr(t.note, "3 more NICs not listed"), "%s", t.note);
}

Test(systopo, cpu_numa_node_is_the_one_holding_every_allowed_cpu) {
  put("devices/system/node/node0/cpulist", "4000-4095");
  put("devices/system/node/node3/cpulist", "0-3999");
  put("devices/system/node/possible", "0,3"); /* not a node directory */
  bcast_systopo t;
  bcast_systopo_probe(root, "h", &t);
  cr_assert_eq(t.cpu_numa_node, 3);
  cr_assert_eq(t.numa_node, 3, "no GPU: the CPUs' node");
}

Test(systopo, cpus_spanning_nodes_are_no_one_node) {
  cpu_set_t s;
  cr_assert_eq(sched_getaffinity(0, sizeof s, &s), 0);
  int first = -1, n = 0;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &s)) n++, first = first < 0 ? c : first;
  if (n < 2) cr_skip_test("this process may run on one CPU only");
  char one[32], rest[64];
  snprintf(one, sizeof one, "%d", first);
  snprintf(rest, sizeof rest, "%d-%d", first + 1, CPU_SETSIZE - 1);
  put("devices/system/node/node0/cpulist", one);
  put("devices/system/node/node1/cpulist", rest);
  bcast_systopo t;
  bcast_systopo_probe(root, "h", &t);
  cr_assert_eq(t.cpu_numa_node, -1, "CPUs on nodes 0 and 1: neither is its node");
  /* Pinned to the first CPU (numactl --cpunodebind), it is node 0's. */
  CPU_ZERO(&s);
  CPU_SET(first, &s);
  cr_assert_eq(sched_setaffinity(0, sizeof s, &s), 0);
  bcast_systopo_probe(root, "h", &t);
  cr_assert_eq(t.cpu_numa_node, 0);
}

Test(systopo, gpu_bus_id_normalized_and_its_numa_node_first) {
  mkdirs("class/net");
  put("devices/system/node/node0/cpulist", "0-4095");
  put("bus/pci/devices/0000:3b:00.0/numa_node", "1");
  put("bus/pci/devices/0000:9a:00.0/numa_node", "-1");
  bcast_systopo t;
  bcast_systopo_probe(root, "h", &t);
  cr_assert_eq(t.numa_node, 0);
  bcast_systopo_set_gpu(&t, root, "0000:3B:00.0"); /* CUDA's spelling */
  cr_assert_str_eq(t.gpu_pci_bus_id, "0000:3b:00.0");
  cr_assert_eq(t.gpu_numa_node, 1);
  cr_assert_eq(t.numa_node, 1, "the GPU's node, not the CPUs'");
  bcast_systopo_set_gpu(&t, root, "00000000:9A:00.0"); /* NVML's 8-digit domain */
  cr_assert_str_eq(t.gpu_pci_bus_id, "0000:9a:00.0");
  cr_assert_eq(t.gpu_numa_node, -1);
  cr_assert_eq(t.numa_node, 0, "a GPU without NUMA information: the CPUs' node");
  bcast_systopo_set_gpu(&t, root, "0000:17:00.0"); /* no such device in sysfs */
  cr_assert_eq(t.numa_node, 0);
  bcast_systopo_set_gpu(&t, root, NULL);
  cr_assert_str_eq(t.gpu_pci_bus_id, "");
  cr_assert_str_eq(t.note, "");
  char d[4096];
  bcast_systopo_describe(&t, d, sizeof d);
  cr_assert(strstr(d, "gpu_pci=- ") && strstr(d, "no GPU: no bus id, no NVLink peers"), "%s", d);
  bcast_systopo_set_gpu(&t, root, "3b:00");
  cr_assert_str_eq(t.gpu_pci_bus_id, "");
  cr_assert(strstr(t.gpu_note, "GPU PCI bus id \"3b:00\" malformed"), "%s", t.gpu_note);
  bcast_systopo_set_gpu(&t, root, "0000:3b:00.0");
  cr_assert_str_eq(t.gpu_note, "", "a GPU chosen again starts its remarks afresh");
}

Test(systopo, nvlink_needs_a_gpu_and_says_when_nvml_is_missing) {
  mkdirs("class/net");
  bcast_systopo t;
  bcast_systopo_probe(root, "h", &t);
  const char *ids[] = {"0000:3c:00.0"}, *uuids[] = {"GPU-00000000-0000-0000-0000-000000000001"};
  bcast_systopo_set_nvlink(&t, ids, uuids, 1);
  cr_assert_eq(t.n_nvlink_peers, 0);
  cr_assert_str_eq(t.gpu_note, "", "no GPU: nothing to ask NVML");
  /* A bus id no GPU of this machine has: NVML, where it is installed,
   * knows no such device (or no GPU at all); without it, it is missing.
   * Either way no peer, and the note says why. */
  bcast_systopo_set_gpu(&t, root, "0000:ff:1f.7");
  void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h) dlclose(h);
  bcast_systopo_set_nvlink(&t, ids, uuids, 1);
  cr_assert_eq(t.n_nvlink_peers, 0);
  cr_assert_eq(t.nvlinks, 0u);
  if (!h) cr_assert(strstr(t.gpu_note, "NVML (libnvidia-ml.so.1) not loadable"), "%s", t.gpu_note);
  else cr_assert(strstr(t.gpu_note, "NVML"), "%s", t.gpu_note);
  cr_assert(strstr(t.gpu_note, "NVLink peers unknown"), "%s", t.gpu_note);
  char d[4096];
  bcast_systopo_describe(&t, d, sizeof d);
  cr_assert(strstr(d, "NVLink peers unknown"), "the start-up line says it: %s", d);
}

/* ---- configuration ------------------------------------------------------------ */

static void expect_bad(bcast_systopo_config c, const char *field, const char *needle) {
  const char *f = "unset";
  bcast_err err = {0};
  cr_assert_eq(bcast_systopo_config_check(&c, &f, &err), BCAST_EINVAL, "accepted, wanted %s", needle);
  cr_assert_str_eq(f, field, "%s", err.msg);
  cr_assert(!strncmp(err.msg, field, strlen(field)), "'%s' does not start with %s", err.msg, field);
  cr_assert(strstr(err.msg, needle), "'%s' does not say '%s'", err.msg, needle);
}

Test(systopo, bad_settings_are_refused_naming_the_field) {
  char longname[200];
  memset(longname, 'n', sizeof longname - 1);
  longname[sizeof longname - 1] = '\0';
  expect_bad((bcast_systopo_config){.node = ""}, "node", "empty");
  expect_bad((bcast_systopo_config){.node = longname}, "node", "199 bytes, more than 127");
  expect_bad((bcast_systopo_config){.node = "a b"}, "node", "space");
  expect_bad((bcast_systopo_config){.node = "a\"b"}, "node", "quote");
  expect_bad((bcast_systopo_config){.nics = 2}, "nics", "without nic_gbits");
  expect_bad((bcast_systopo_config){.nics = BCAST_SYSTOPO_MAX_NICS + 1, .nic_gbits = 100}, "nics",
             "33, more than 32");
  expect_bad((bcast_systopo_config){.nic_gbits = -1}, "nic_gbits", "not a positive speed");
  expect_bad((bcast_systopo_config){.nic_gbits = NAN}, "nic_gbits", "not a positive speed");
  expect_bad((bcast_systopo_config){.nic_gbits = INFINITY}, "nic_gbits", "not a positive speed");
  expect_bad((bcast_systopo_config){.nic_gbits = 1e6}, "nic_gbits", "more than 10000");
  const char *f = "unset";
  bcast_err err = {0};
  bcast_systopo_config ok = {.node = "n-1.example", .nics = 8, .nic_gbits = 400};
  cr_assert_eq(bcast_systopo_config_check(&ok, &f, &err), BCAST_OK, "%s", err.msg);
  cr_assert_null(f);
}

Test(systopo, nics_and_speed_replace_the_detected_list) {
  nic("eth0", "0x1003", "up", "10000", "0");
  bcast_systopo t;
  bcast_systopo_probe(root, "host-a", &t);
  bcast_err err = {0};
  bcast_systopo_config c = {.node = "a", .nics = 2, .nic_gbits = 100};
  cr_assert_eq(bcast_systopo_configure(&t, &c, NULL, &err), BCAST_OK, "%s", err.msg);
  cr_assert_str_eq(t.node, "a");
  cr_assert_eq(t.n_nics, 2);
  for (int i = 0; i < 2; i++) {
    char name[8];
    snprintf(name, sizeof name, "nic%d", i);
    cr_assert_str_eq(t.nics[i].name, name);
    cr_assert_float_eq(t.nics[i].gbits, 100.0, 1e-12);
    cr_assert_eq(t.nics[i].numa_node, -1);
    cr_assert_eq(t.nics[i].rdma, 0);
  }
  const char *names[3];
  cr_assert_eq(bcast_systopo_configured_names(t.configured, names), 2);
  cr_assert_str_eq(names[0], "node");
  cr_assert_str_eq(names[1], "nics");
  char d[4096];
  bcast_systopo_describe(&t, d, sizeof d);
  cr_assert(strstr(d, "node=\"a\" "), "%s", d);
  cr_assert(strstr(d, "nics=2x100G nic_list=\"nic0:100G:numa?,nic1:100G:numa?\""), "%s", d);
  cr_assert(strstr(d, "configured=\"node,nics\""), "%s", d);
}

Test(systopo, mtu_read_for_each_nic_and_unknown_when_unreadable) {
  nic("eth0", "0x1003", "up", "100000", "0");
  mtu("eth0", "9000");
  nic("eth1", "0x1003", "up", "25000", "0");
  mtu("eth1", "1500");
  nic("eth2", "0x1003", "up", "25000", "0"); /* no mtu file */
  nic("eth3", "0x1003", "up", "25000", "0");
  mtu("eth3", "jumbo");
  nic("eth4", "0x1003", "up", "25000", "0");
  mtu("eth4", "0");
  bcast_systopo t;
  bcast_systopo_probe(root, "host-a", &t);
  cr_assert_eq(t.n_nics, 5);
  cr_assert_eq(find_nic(&t, "eth0")->mtu, 9000);
  cr_assert_eq(find_nic(&t, "eth1")->mtu, 1500);
  cr_assert_eq(find_nic(&t, "eth2")->mtu, 0);
  cr_assert_eq(find_nic(&t, "eth3")->mtu, 0);
  cr_assert_eq(find_nic(&t, "eth4")->mtu, 0);
  char d[4096];
  bcast_systopo_describe(&t, d, sizeof d);
  cr_assert(strstr(d, " mtu=1500 nics="), "the smallest known MTU is logged: %s", d);
}

Test(systopo, no_mtu_known_is_logged_as_unknown) {
  nic("eth0", "0x1003", "up", "100000", "0");
  bcast_systopo t;
  bcast_systopo_probe(root, "host-a", &t);
  char d[4096];
  bcast_systopo_describe(&t, d, sizeof d);
  cr_assert(strstr(d, " mtu=? nics="), "%s", d);
}

Test(systopo, configured_nics_take_the_largest_mtu_of_the_detected_up_ones) {
  nic("eth0", "0x1003", "up", "10000", "0");
  mtu("eth0", "1500");
  nic("eth1", "0x1003", "up", "10000", "0");
  mtu("eth1", "9000");
  nic("eth2", "0x1002", "down", "10000", "0"); /* down: not a NIC, its MTU not taken */
  mtu("eth2", "65520");
  bcast_systopo t;
  bcast_systopo_probe(root, "host-a", &t);
  bcast_err err = {0};
  bcast_systopo_config c = {.nics = 3, .nic_gbits = 100};
  cr_assert_eq(bcast_systopo_configure(&t, &c, NULL, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(t.n_nics, 3);
  for (int i = 0; i < 3; i++) cr_assert_eq(t.nics[i].mtu, 9000, "nic%d: %u", i, t.nics[i].mtu);
  char d[4096];
  bcast_systopo_describe(&t, d, sizeof d);
  cr_assert(strstr(d, " mtu=9000 nics=3x100G"), "%s", d);
}

Test(systopo, configured_nics_without_a_detected_mtu_have_none) {
  nic("eth0", "0x1003", "up", "10000", "0"); /* no mtu file */
  nic("eth1", "0x1002", "down", "10000", "0");
  mtu("eth1", "9000");
  bcast_systopo t;
  bcast_systopo_probe(root, "host-a", &t);
  bcast_systopo_config c = {.nics = 1, .nic_gbits = 100};
  bcast_err err = {0};
  cr_assert_eq(bcast_systopo_configure(&t, &c, NULL, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(t.nics[0].mtu, 0);
}

Test(systopo, speed_alone_sets_every_detected_nic) {
  nic("veth0", "0x1003", "up", "-1", "0");
  nic("veth1", "0x1003", "up", "10000", NULL);
  bcast_systopo t;
  bcast_systopo_probe(root, "host-a", &t);
  bcast_err err = {0};
  bcast_systopo_config c = {.nic_gbits = 0.5};
  cr_assert_eq(bcast_systopo_configure(&t, &c, NULL, &err), BCAST_OK, "%s", err.msg);
  cr_assert_str_eq(t.node, "host-a", "the node stays the detected one");
  cr_assert_eq(t.n_nics, 2);
  cr_assert_str_eq(t.nics[0].name, "veth0");
  cr_assert_eq(t.nics[0].numa_node, 0, "what was detected besides the speed stays");
  cr_assert_float_eq(t.nics[0].gbits, 0.5, 1e-12);
  cr_assert_float_eq(t.nics[1].gbits, 0.5, 1e-12);
  const char *names[3];
  cr_assert_eq(bcast_systopo_configured_names(t.configured, names), 1);
  cr_assert_str_eq(names[0], "nics.gbits");
  char d[4096];
  bcast_systopo_describe(&t, d, sizeof d);
  cr_assert(strstr(d, "nics=2x0.5G"), "%s", d);
  cr_assert_null(strstr(d, "speed unknown"), "%s", d);
}

Test(systopo, speed_without_any_nic_is_said) {
  bcast_systopo t;
  bcast_systopo_probe(root, "h", &t);
  bcast_err err = {0};
  bcast_systopo_config c = {.nic_gbits = 100};
  cr_assert_eq(bcast_systopo_configure(&t, &c, NULL, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(t.n_nics, 0);
  cr_assert(strstr(t.note, "nic_gbits 100: no NIC detected to set it on"), "%s", t.note);
}

Test(systopo, a_refused_setting_changes_nothing) {
  nic("eth0", "0x1003", "up", "10000", NULL);
  bcast_systopo t;
  bcast_systopo_probe(root, "host-a", &t);
  bcast_err err = {0};
  const char *f = NULL;
  bcast_systopo_config c = {.node = "a", .nics = 2};
  cr_assert_eq(bcast_systopo_configure(&t, &c, &f, &err), BCAST_EINVAL);
  cr_assert_str_eq(f, "nics");
  cr_assert_str_eq(t.node, "host-a");
  cr_assert_eq(t.n_nics, 1);
  cr_assert_eq(t.configured, 0u);
}

Test(systopo_flags, nic_summary_groups_speeds_fastest_first) {
  char b[128];
  cr_assert_str_eq(bcast_systopo_nic_summary(NULL, 0, b, sizeof b), "-");
  cr_assert_str_eq(bcast_systopo_nic_summary((double[]){200}, 1, b, sizeof b), "1x200G");
  cr_assert_str_eq(bcast_systopo_nic_summary((double[]){100, 100}, 2, b, sizeof b), "2x100G");
  cr_assert_str_eq(bcast_systopo_nic_summary((double[]){25, 0, 400, 25}, 4, b, sizeof b),
                   "1x400G+2x25G+1x?");
  cr_assert_str_eq(bcast_systopo_nic_summary((double[]){2.5, -1}, 2, b, sizeof b), "1x2.5G+1x?");
  cr_assert_str_eq(bcast_systopo_nic_summary((double[]){400, 100}, 2, b, 8), "1x400G",
                   "what does not fit is cut at a whole group");
}

/* ---- what Register carries -------------------------------------------------------- */

Test(systopo, register_carries_the_topology) {
  nic("eth0", "0x1003", "up", "25000", "1");
  mtu("eth0", "4200");
  mkdirs("class/net/eth0/device/infiniband/mlx5_0");
  bcast_caps caps;
  bcast_caps_probe(&caps);
  bcast_systopo_probe(root, "host-a", &caps.topo); /* the fake machine's */
  bcast_systopo_set_gpu(&caps.topo, root, "0000:3b:00.0");
  caps.topo.n_nvlink_peers = 1;
  snprintf(caps.topo.nvlink_peers[0], sizeof caps.topo.nvlink_peers[0], "GPU-1");
  bcast_err err = {0};
  bcast_systopo_config c = {.node = "a", .nic_gbits = 100};
  cr_assert_eq(bcast_systopo_configure(&caps.topo, &c, NULL, &err), BCAST_OK, "%s", err.msg);
  agent_caps_pb pb;
  agent_caps_to_pb(&caps, 0, &pb);
  const Rlorch__V1__Topology *t = pb.caps.topology;
  cr_assert_not_null(t);
  cr_assert_str_eq(t->node, "a");
  cr_assert_str_eq(t->gpu_pci_bus_id, "0000:3b:00.0");
  cr_assert_eq(t->n_nvlink_peers, 1);
  cr_assert_str_eq(t->nvlink_peers[0], "GPU-1");
  cr_assert_eq(t->n_nics, 1);
  cr_assert_str_eq(t->nics[0]->name, "eth0");
  cr_assert_float_eq(t->nics[0]->gbits, 100.0, 1e-12);
  cr_assert_eq(t->nics[0]->numa_node, 1);
  cr_assert(t->nics[0]->rdma);
  cr_assert_eq(t->nics[0]->mtu, 4200);
  cr_assert_eq(t->n_configured, 2);
  cr_assert_str_eq(t->configured[0], "node");
  cr_assert_str_eq(t->configured[1], "nics.gbits");
  cr_assert_eq(t->h2d_gbps, 0.0, "not measured");
  /* Encoded and decoded, as the orchestrator gets it. */
  size_t len = rlorch__v1__capabilities__get_packed_size(&pb.caps);
  uint8_t *buf = malloc(len);
  cr_assert_not_null(buf);
  rlorch__v1__capabilities__pack(&pb.caps, buf);
  Rlorch__V1__Capabilities *back = rlorch__v1__capabilities__unpack(NULL, len, buf);
  cr_assert_not_null(back);
  cr_assert_str_eq(back->topology->node, "a");
  cr_assert_eq(back->topology->n_nics, 1);
  rlorch__v1__capabilities__free_unpacked(back, NULL);
  free(buf);
  /* Without a device the GPU's fields stay empty, as gpu_uuid does. */
  agent_caps_to_pb(&caps, -1, &pb);
  cr_assert_str_eq(pb.caps.topology->gpu_pci_bus_id, "");
  cr_assert_eq(pb.caps.topology->n_nvlink_peers, 0);
  cr_assert_str_eq(pb.caps.topology->node, "a");
}

/* ---- the GPU's measured host-to-device rate ------------------------------------------ */

Test(systopo, h2d_is_measured_on_a_gpu_and_said_where_it_cannot_be) {
  bcast_systopo t;
  bcast_systopo_probe(root, "h", &t);
  bcast_systopo_set_gpu(&t, root, "0000:3b:00.0");
  bcast_systopo_measure_h2d(&t, -1);
  cr_assert_eq(t.h2d_gbps, 0.0, "no device: nothing measured");
  cr_assert_str_eq(t.gpu_note, "", "and nothing to say");
  char d[4096];
  bcast_systopo_describe(&t, d, sizeof d);
  cr_assert(strstr(d, " h2d_gbps=- "), "%s", d);
  /* Device 0: measured where there is one, else why not. */
  bcast_caps caps;
  bcast_caps_probe(&caps);
  bcast_systopo_measure_h2d(&t, 0);
  bcast_systopo_describe(&t, d, sizeof d);
  if (caps.cuda_devices > 0) {
    cr_assert_gt(t.h2d_gbps, 0.5, "a GPU's pinned copies: %g GB/s", t.h2d_gbps);
    char want[64];
    snprintf(want, sizeof want, " h2d_gbps=%.1f ", t.h2d_gbps);
    cr_assert(strstr(d, want), "%s", d);
  } else {
    cr_assert_eq(t.h2d_gbps, 0.0);
    cr_assert(strstr(t.gpu_note, caps.cuda_built
                                     ? "h2d not measured: host-to-device floor: no CUDA device visible"
                                     : "h2d not measured: host-to-device floor: built without CUDA"),
              "%s", t.gpu_note);
    cr_assert(strstr(d, " h2d_gbps=- "), "%s", d);
    cr_assert(strstr(d, "h2d not measured"), "the start-up line says why: %s", d);
  }
  t.h2d_gbps = 25;
  bcast_systopo_describe(&t, d, sizeof d);
  cr_assert(strstr(d, " h2d_gbps=25.0 "), "%s", d);
  bcast_systopo_set_gpu(&t, root, "0000:5e:00.0");
  cr_assert_eq(t.h2d_gbps, 0.0, "another GPU: its rate is not the last one's");
  cr_assert_str_eq(t.gpu_note, "");
}

Test(systopo, register_carries_the_measured_h2d_of_its_gpu_only) {
  bcast_caps caps;
  bcast_caps_probe(&caps);
  bcast_systopo_probe(root, "h", &caps.topo);
  bcast_systopo_set_gpu(&caps.topo, root, "0000:3b:00.0");
  caps.topo.h2d_gbps = 52.5;
  agent_caps_pb pb;
  agent_caps_to_pb(&caps, 0, &pb);
  cr_assert_float_eq(pb.caps.topology->h2d_gbps, 52.5, 1e-12);
  agent_caps_to_pb(&caps, -1, &pb);
  cr_assert_eq(pb.caps.topology->h2d_gbps, 0.0, "without a device: none");
}

/* ---- the agents' flags -------------------------------------------------------- */

#define ARGV(...) ((char *[]){"x", "--orchestrator", "h:1", __VA_ARGS__, NULL})
#define ARGC(...) ((int)(sizeof((char *[]){"x", "--orchestrator", "h:1", __VA_ARGS__}) / sizeof(char *)))

static void flags_ok(agent_role role, int argc, char **argv, char **envp, agent_flags *o) {
  char err[512] = "";
  cr_assert_eq(agent_flags_parse(role, argc, argv, envp, o, err, sizeof err), 0, "%s", err);
}

static void flags_bad(agent_role role, int argc, char **argv, char **envp, const char *needle) {
  agent_flags o;
  char err[512] = "";
  cr_assert_eq(agent_flags_parse(role, argc, argv, envp, &o, err, sizeof err), -1,
               "accepted, wanted '%s'", needle);
  cr_assert(strstr(err, needle), "error '%s' does not say '%s'", err, needle);
  agent_flags_free(&o);
}

Test(systopo_flags, both_roles_take_node_nics_and_speed) {
  const agent_role roles[] = {AGENT_ROLE_TRAINER, AGENT_ROLE_INFERENCE};
  for (int r = 0; r < 2; r++) {
    agent_flags o;
    flags_ok(roles[r], ARGC("--node", "a", "--nics", "2", "--nic-gbits", "100"),
             ARGV("--node", "a", "--nics", "2", "--nic-gbits", "100"), NULL, &o);
    cr_assert_str_eq(o.opts.node, "a");
    cr_assert_eq(o.opts.nics, 2u);
    cr_assert_float_eq(o.opts.nic_gbits, 100.0, 1e-12);
    agent_flags_free(&o);
    flags_ok(roles[r], ARGC("--name", "w"), ARGV("--name", "w"), NULL, &o);
    cr_assert_null(o.opts.node, "detected unless set");
    cr_assert_eq(o.opts.nics, 0u);
    cr_assert_eq(o.opts.nic_gbits, 0.0);
    agent_flags_free(&o);
  }
  char *env[] = {"RLORCH_NODE=rack1-n4", "RLORCH_NIC_GBITS=0.5", NULL};
  agent_flags o;
  flags_ok(AGENT_ROLE_INFERENCE, ARGC("--name", "w"), ARGV("--name", "w"), env, &o);
  cr_assert_str_eq(o.opts.node, "rack1-n4");
  cr_assert_float_eq(o.opts.nic_gbits, 0.5, 1e-12);
  agent_flags_free(&o);
}

Test(systopo_flags, bad_values_are_refused_naming_the_flag) {
  char longname[200];
  memset(longname, 'n', sizeof longname - 1);
  longname[sizeof longname - 1] = '\0';
  agent_role r = AGENT_ROLE_TRAINER;
  flags_bad(r, ARGC("--nics", "0", "--nic-gbits", "1"), ARGV("--nics", "0", "--nic-gbits", "1"), NULL,
            "--nics");
  flags_bad(r, ARGC("--nics", "33", "--nic-gbits", "1"), ARGV("--nics", "33", "--nic-gbits", "1"),
            NULL, "--nics");
  flags_bad(r, ARGC("--nics", "2"), ARGV("--nics", "2"), NULL, "--nics: 2 NICs without nic_gbits");
  flags_bad(r, ARGC("--nic-gbits", "0"), ARGV("--nic-gbits", "0"), NULL, "--nic-gbits");
  flags_bad(r, ARGC("--nic-gbits", "-5"), ARGV("--nic-gbits", "-5"), NULL, "--nic-gbits");
  flags_bad(r, ARGC("--nic-gbits", "1e9"), ARGV("--nic-gbits", "1e9"), NULL, "--nic-gbits");
  flags_bad(r, ARGC("--nic-gbits", "fast"), ARGV("--nic-gbits", "fast"), NULL, "--nic-gbits");
  flags_bad(r, ARGC("--node", ""), ARGV("--node", ""), NULL, "--node");
  flags_bad(AGENT_ROLE_INFERENCE, ARGC("--node", longname), ARGV("--node", longname), NULL,
            "--node: 199 bytes, more than 127");
  flags_bad(AGENT_ROLE_INFERENCE, ARGC("--node", "a b"), ARGV("--node", "a b"), NULL, "--node");
  char *env[] = {"RLORCH_NICS=4", NULL};
  flags_bad(AGENT_ROLE_INFERENCE, ARGC("--name", "w"), ARGV("--name", "w"), env,
            "RLORCH_NICS: 4 NICs without nic_gbits");
}
