/* The topology of a plan's participants: the nodes they said they run on
 * (Capabilities.topology, else Capabilities.host_id), each node's NICs and
 * each rank's GPU, as the cost model (workers/bcast/bcast_topo.h) takes
 * them. Pure: protobuf in, bcast_topo out; the runner builds one for every
 * plan from the workers it names, so a worker that joins or leaves changes
 * the next plan's topology and nothing else.
 *
 * Every assumption is said: a node whose workers report no NIC speed gets
 * the configured default (`nic_gbits`, `nics`), and `note` names it, so a
 * prediction made on guessed links says so in the step record; likewise a
 * node of unknown MTU (the model assumes 1500). */
#ifndef RLORCH_DAEMON_TOPOLOGY_H
#define RLORCH_DAEMON_TOPOLOGY_H

#include <stddef.h>
#include <stdint.h>

#include "rlorch/v1/control.pb-c.h"
#include "workers/bcast/bcast_topo.h"

#define TOPOLOGY_NODE_NAME_MAX 64
#define TOPOLOGY_NOTE_MAX 384

typedef struct topology {
  bcast_topo topo;          /* topo.node points at `node` */
  bcast_topo_node *node;    /* topo.nodes entries, owned */
  bcast_topo_place *place;  /* one per participant, in rank order, owned */
  size_t nplace;
  char (*node_name)[TOPOLOGY_NODE_NAME_MAX]; /* topo.nodes entries, owned */
  unsigned char *nics_assumed; /* topo.nodes entries, owned: 1 where no worker reports a
                                  NIC speed and the node got base's NICs */
  int h2d_measured;             /* topo.h2d_gbps is a worker's measured rate, not base's */
  char note[TOPOLOGY_NOTE_MAX]; /* what was assumed rather than reported; "" when nothing */
} topology;

/* Builds the topology of participants caps[0..n) (rank order; an entry may
 * be NULL: a worker that reported nothing). `base` gives the link figures
 * no worker reports (bcast_topo_default's, or configured), and the NICs of
 * a node none of whose workers reports a NIC speed. Ranks are packed on
 * their node's GPUs by GPU identity (PCI bus id, else UUID): workers on one
 * GPU share a place; a worker without a GPU gets a place of its own, marked
 * host-only. 0, or -1 with err (out of memory; a bad `base`). */
int topology_build(const Rlorch__V1__Capabilities *const *caps, size_t n, const bcast_topo *base,
                   topology *out, char *err, size_t errlen);
void topology_free(topology *t);

/* The node index of rank r's place, and its name. */
const char *topology_node_name(const topology *t, uint32_t node);

/* What GetTopology answers (control.proto): workers w[0..n) (registration
 * order; none is fine) built into a topology by topology_build, as a plan
 * of theirs would be, and shown node by node with their workers and GPUs,
 * base's figures as the links. `resp` points into the view (which is
 * therefore not to be copied) and into w, which must outlive it. 0, or -1 with err (topology_build's). */
typedef struct topology_view {
  Rlorch__V1__GetTopologyResponse resp;
  topology t;
  Rlorch__V1__LinkFigures links;
  Rlorch__V1__TopologyNode *node, **nodep;       /* t.topo.nodes entries */
  Rlorch__V1__TopologyWorker *worker, **workerp; /* n entries, grouped by node */
  char **gpus;                                   /* n entries at most, grouped by node */
} topology_view;

int topology_view_build(const Rlorch__V1__WorkerInfo *const *w, size_t n, const bcast_topo *base,
                        topology_view *out, char *err, size_t errlen);
void topology_view_free(topology_view *v);

#endif
