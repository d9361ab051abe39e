#include "orchestrator/cli/ctl_format.h"

#include <inttypes.h>
#include <time.h>

#include "orchestrator/common/pbjson.h"
#include "workers/bcast/bcast.h"

const char *ctl_enum(const ProtobufCEnumDescriptor *d, int v, char *buf, size_t len) {
  return pbjson_enum_short(d, v, buf, len);
}

const char *ctl_bytes(uint64_t b, char *buf, size_t len) {
  if (b >= 1000000000ull) snprintf(buf, len, "%.2f GB", (double)b / 1e9);
  else if (b >= 1000000ull) snprintf(buf, len, "%.1f MB", (double)b / 1e6);
  else if (b >= 1000ull) snprintf(buf, len, "%.1f kB", (double)b / 1e3);
  else snprintf(buf, len, "%" PRIu64 " B", b);
  return buf;
}

static const char *when(int64_t ms, char *buf, size_t len) {
  time_t t = (time_t)(ms / 1000);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void ctl_print_runs(FILE *f, const Rlorch__V1__Run *const *runs, size_t n) {
  fprintf(f, "%-12s %-16s %-10s %-7s %-6s %8s %8s %-20s %s\n", "ID", "NAME", "STATE", "POLICY",
          "PRESET", "STEPS", "VERSION", "CREATED", "MESSAGE");
  for (size_t i = 0; i < n; i++) {
    const Rlorch__V1__Run *r = runs[i];
    char s[32], p[32], c[32], steps[32];
    const Rlorch__V1__RunSpec *spec = r->spec;
    if (spec && spec->steps)
      snprintf(steps, sizeof steps, "%" PRIu64 "/%u", r->steps_done, spec->steps);
    else
      snprintf(steps, sizeof steps, "%" PRIu64, r->steps_done);
    fprintf(f, "%-12s %-16s %-10s %-7s %-6s %8s %8" PRIu64 " %-20s %s\n", r->id,
            spec && spec->name[0] ? spec->name : "-",
            ctl_enum(&rlorch__v1__run_state__descriptor, r->state, s, sizeof s),
            ctl_enum(&rlorch__v1__broadcast_mode__descriptor, r->policy, p, sizeof p),
            spec && spec->preset[0] ? spec->preset : "-", steps, r->policy_version,
            when(r->created_unix_ms, c, sizeof c), r->message);
  }
}

/* A worker's NICs as the table shows them ("2x100G"), from its topology. */
static const char *ctl__nics(const Rlorch__V1__Topology *t, char *buf, size_t len) {
  double g[BCAST_SYSTOPO_MAX_NICS];
  size_t n = t ? t->n_nics : 0;
  if (n > BCAST_SYSTOPO_MAX_NICS) n = BCAST_SYSTOPO_MAX_NICS;
  for (size_t i = 0; i < n; i++) g[i] = t->nics[i]->gbits;
  return bcast_systopo_nic_summary(g, n, buf, len);
}

void ctl_print_workers(FILE *f, const Rlorch__V1__WorkerInfo *const *w, size_t n) {
  fprintf(f, "%-12s %-9s %-10s %-18s %-16s %-12s %-10s %7s %5s %-8s %-8s %s\n", "ID", "ROLE",
          "STATE", "NAME", "NODE", "NICS", "RUN", "VERSION", "GPUS", "CUDA", "NCCL", "DATA");
  for (size_t i = 0; i < n; i++) {
    char r[32], s[32], nics[64];
    const Rlorch__V1__Capabilities *c = w[i]->capabilities;
    const Rlorch__V1__Topology *t = c ? c->topology : NULL;
    /* A node named by default is the machine's boot id: its first 16
     * characters tell machines apart; --json has it whole. */
    fprintf(f, "%-12s %-9s %-10s %-18s %-16.16s %-12s %-10s %7" PRIu64 " %5u %-8s %-8s %s\n",
            w[i]->id, ctl_enum(&rlorch__v1__worker_role__descriptor, w[i]->role, r, sizeof r),
            ctl_enum(&rlorch__v1__worker_state__descriptor, w[i]->state, s, sizeof s), w[i]->name,
            t && t->node[0] ? t->node : "-", ctl__nics(t, nics, sizeof nics),
            w[i]->run_id[0] ? w[i]->run_id : "-", w[i]->policy_version, c ? c->cuda_devices : 0,
            c && c->cuda_version[0] ? c->cuda_version : "-",
            c && c->nccl_version[0] ? c->nccl_version : "-",
            w[i]->data_address[0] ? w[i]->data_address : "-");
  }
}

/* "2x100G", in the speed format of ctl__nics. */
static const char *ctl__node_nics(const Rlorch__V1__TopologyNode *n, char *buf, size_t len) {
  char one[32];
  /* One NIC's summary is "1x<speed>": the speed is what follows the "1x". */
  bcast_systopo_nic_summary(&n->nic_gbits, 1, one, sizeof one);
  snprintf(buf, len, "%ux%s%s", n->nics, one + 2, n->nics_assumed ? "(assumed)" : "");
  return buf;
}

void ctl_print_topology(FILE *f, const Rlorch__V1__GetTopologyResponse *t) {
  fprintf(f, "%-16s %-20s %7s %5s\n", "NODE", "NICS", "WORKERS", "GPUS");
  fprintf(f, "  %-12s %-9s %-18s %-5s %-14s %4s %8s\n", "WORKER", "ROLE", "NAME", "PLACE",
          "GPU_PCI", "NUMA", "H2D_GB/S");
  for (size_t i = 0; i < t->n_nodes; i++) {
    const Rlorch__V1__TopologyNode *n = t->nodes[i];
    char nics[64];
    /* A node's first 16 characters, as list-workers shows it; --json has it whole. */
    fprintf(f, "%-16.16s %-20s %7zu %5zu\n", n->name, ctl__node_nics(n, nics, sizeof nics),
            n->n_workers, n->n_gpus);
    for (size_t k = 0; k < n->n_workers; k++) {
      const Rlorch__V1__TopologyWorker *w = n->workers[k];
      char r[32], place[16], h2d[16] = "-";
      if (w->host) snprintf(place, sizeof place, "host");
      else snprintf(place, sizeof place, "gpu%u", w->gpu);
      if (w->h2d_gbps > 0) snprintf(h2d, sizeof h2d, "%.1f", w->h2d_gbps);
      fprintf(f, "  %-12s %-9s %-18s %-5s %-14s %4d %8s\n", w->id,
              ctl_enum(&rlorch__v1__worker_role__descriptor, w->role, r, sizeof r), w->name, place,
              w->gpu_pci_bus_id[0] ? w->gpu_pci_bus_id : "-", w->numa_node, h2d);
    }
  }
  const Rlorch__V1__LinkFigures *l = t->links;
  if (t->h2d_measured)
    fprintf(f, "h2d: %.3g GB/s, the slowest a worker measured\n", t->h2d_gbps);
  else
    fprintf(f, "h2d: %.3g GB/s, configured (link_h2d_gbps): no worker measured one\n", t->h2d_gbps);
  if (l)
    fprintf(f,
            "links (link_*): nvlink %.4g GB/s, d2d %.4g GB/s, cast %.4g GB/s, tcp_stream %.4g GB/s, "
            "tls_stream %.4g GB/s, tcp_send %.4g GB/s, host %.4g GB/s, host_cast %.4g GB/s, "
            "pageable %.4g GB/s, hop_latency %.4g us; a node without a NIC speed: %u x %.4g Gb/s\n",
            l->nvlink_gbps, l->d2d_gbps, l->cast_gbps, l->tcp_stream_gbps, l->tls_stream_gbps,
            l->tcp_send_gbps, l->host_gbps, l->host_cast_gbps, l->pageable_gbps,
            l->hop_latency_us, l->nics, l->nic_gbits);
  if (t->note[0]) fprintf(f, "note: %s\n", t->note);
}

void ctl_print_step_header(FILE *f) {
  fprintf(f, "%5s %5s %7s %8s %-7s %10s %9s %9s %9s %8s %7s %9s %6s  %s\n", "STEP", "USED",
          "DROPPED", "TRAIN_S", "MODE", "BYTES", "STAGING_S", "WIRE_S", "TOTAL_S", "GB/S", "STAGE%",
          "PRED_S", "MEAS/P", "BOTTLENECK");
}

void ctl_print_step(FILE *f, const Rlorch__V1__StepRecord *s) {
  char m[32], b[32];
  fprintf(f, "%5" PRIu64 " %5u %7u %8.3f %-7s %10s %9.4f %9.4f %9.4f %8.2f %6.1f%%", s->step,
          s->rollouts_used, s->rollouts_dropped, s->train_seconds,
          ctl_enum(&rlorch__v1__broadcast_mode__descriptor, s->mode, m, sizeof m),
          ctl_bytes(s->wire_bytes, b, sizeof b), s->exposed_staging_seconds, s->wire_seconds,
          s->total_seconds, s->gbps, 100.0 * s->staging_share);
  /* The cost model's prediction beside the measurement (docs/ARCHITECTURE.md,
   * "Every plan predicted"); "-" where it made none. */
  const Rlorch__V1__CostPrediction *p = s->prediction;
  if (p)
    fprintf(f, " %9.4f %6.2f  %s %s\n", p->total_seconds, p->measured_over_predicted, p->layout,
            p->bottleneck);
  else
    fprintf(f, " %9s %6s  %s\n", "-", "-", s->prediction_note[0] ? s->prediction_note : "-");
}

void ctl_print_event(FILE *f, const Rlorch__V1__RunEvent *e, int *header_done) {
  char a[32], b[32];
  switch (e->event_case) {
  case RLORCH__V1__RUN_EVENT__EVENT_STEP:
    if (!*header_done) {
      ctl_print_step_header(f);
      *header_done = 1;
    }
    ctl_print_step(f, e->step);
    break;
  case RLORCH__V1__RUN_EVENT__EVENT_WORKER:
    if (e->worker->worker)
      fprintf(f, "# worker %s (%s) %s\n", e->worker->worker->name,
              ctl_enum(&rlorch__v1__worker_role__descriptor, e->worker->worker->role, a, sizeof a),
              ctl_enum(&rlorch__v1__worker_state__descriptor, e->worker->worker->state, b,
                       sizeof b));
    break;
  case RLORCH__V1__RUN_EVENT__EVENT_BROADCAST:
    fprintf(f, "# broadcast %s %s %s%s%s\n", e->broadcast->plan_id,
            ctl_enum(&rlorch__v1__broadcast_event__phase__descriptor, e->broadcast->phase, a,
                     sizeof a),
            ctl_enum(&rlorch__v1__broadcast_mode__descriptor, e->broadcast->mode, b, sizeof b),
            e->broadcast->reason[0] ? ": " : "", e->broadcast->reason);
    break;
  case RLORCH__V1__RUN_EVENT__EVENT_RUN:
    fprintf(f, "# run %s %s%s%s\n", e->run->id,
            ctl_enum(&rlorch__v1__run_state__descriptor, e->run->state, a, sizeof a),
            e->run->message[0] ? ": " : "", e->run->message);
    break;
  default: break;
  }
}
