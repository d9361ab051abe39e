/* Configuration of `rlorch serve` on the opt mechanism: one table of fields
 * drives the YAML file, the environment, the flags, the printer and the usage
 * text. Checks that involve several fields or the file system run once after
 * merging, and name the origin of the value they refuse. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/daemon/config.h"
#include "rpc/rpc.h"
#include "workers/bcast/bcast.h"

static const opt_name config__policies[] = {
    {"auto", RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_AUTO},
    {"direct", RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_DIRECT},
    {"staged", RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_STAGED},
    {"host", RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_HOST},
    {"colocated", RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_COLOCATED},
    {NULL, 0},
};

static const opt_name config__on_off[] = {{"on", 1}, {"off", 0}, {NULL, 0}};

#define CONFIG__OFF(m, ctype) OPT_OFF(config, m, ctype)
static const opt_field config__fields[] = {
    {.name = "listen", .flag = "--listen", .type = OPT_ADDR, .off = CONFIG__OFF(listen, char *),
     .metavar = "ADDR", .help = "gRPC address, HOST:PORT"},
    {.name = "metrics_listen", .flag = "--metrics-listen", .type = OPT_ADDR,
     .off = CONFIG__OFF(metrics_listen, char *), .metavar = "ADDR",
     .help = "HTTP address for /metrics, /healthz, /readyz"},
    {.name = "data_dir", .flag = "--data-dir", .type = OPT_STR, .off = CONFIG__OFF(data_dir, char *),
     .metavar = "DIR", .help = "directory of the SQLite database"},
    {.name = "token_file", .flag = "--token-file", .type = OPT_PATH,
     .off = CONFIG__OFF(token_file, char *), .metavar = "FILE",
     .help = "file holding the bearer token clients must send", .dflt = "none: no auth"},
    {.name = "tls_cert_file", .flag = "--tls-cert", .type = OPT_PATH,
     .off = CONFIG__OFF(tls_cert_file, char *), .metavar = "FILE", .help = "PEM certificate chain"},
    {.name = "tls_key_file", .flag = "--tls-key", .type = OPT_PATH,
     .off = CONFIG__OFF(tls_key_file, char *), .metavar = "FILE", .help = "PEM private key"},
    {.name = "tls_client_ca_file", .flag = "--tls-client-ca", .type = OPT_PATH,
     .off = CONFIG__OFF(tls_client_ca_file, char *), .metavar = "FILE",
     .help = "PEM roots: every client must present a certificate they signed (mutual TLS)",
     .dflt = "none: no client certificate asked"},
    {.name = "log_level", .flag = "--log-level", .type = OPT_ENUM, .off = CONFIG__OFF(log_level, int),
     .names = opt_log_level_names, .metavar = "LEVEL", .help = "log threshold"},
    {.name = "log_format", .flag = "--log-format", .type = OPT_ENUM,
     .off = CONFIG__OFF(log_format, int), .names = opt_log_format_names, .metavar = "FMT",
     .help = "log line format"},
    /* At least the smallest batch_chunk_bytes: the chunk size follows a smaller
     * message limit, and must stay in its own range. */
    {.name = "max_message_bytes", .type = OPT_BYTES, .off = CONFIG__OFF(max_message_bytes, uint64_t),
     .min = 4096, .max = 2147483647.0, .metavar = "BYTES", .help = "largest gRPC message"},
    {.name = "max_rollout_bytes", .type = OPT_BYTES, .off = CONFIG__OFF(max_rollout_bytes, uint64_t),
     .min = 64, .max = 2147483647.0, .metavar = "BYTES",
     .help = "largest rollout a worker may report (its packed size)"},
    {.name = "batch_chunk_bytes", .flag = "--batch-chunk-bytes", .type = OPT_BYTES,
     .off = CONFIG__OFF(batch_chunk_bytes, uint64_t), .min = 4096, .max = 2147483647.0,
     .metavar = "BYTES",
     .help = "largest message of a FetchBatch stream, at most max_message_bytes (whole "
             "rollouts: a larger one goes alone)",
     .dflt = "4MiB, or max_message_bytes when smaller"},
    {.name = "rollout_log", .type = OPT_SWITCH, .off = CONFIG__OFF(rollout_log, bool),
     .help = "write each step's batch to DATA_DIR/rollouts/RUN/step-N.jsonl"},
    {.name = "rollout_buffer_bytes", .type = OPT_BYTES,
     .off = CONFIG__OFF(rollout_buffer_bytes, uint64_t), .min = 1024, .max = 1099511627776.0,
     .metavar = "BYTES",
     .help = "rollouts kept per run (buffered, and the batch being trained) before dispatch is "
             "held back"},
    {.name = "max_manifest_tensors", .type = OPT_U32,
     .off = CONFIG__OFF(max_manifest_tensors, uint32_t), .min = 1, .max = 4294967295.0,
     .metavar = "N",
     .help = "tensors a worker's manifest may hold; more get INVALID_ARGUMENT at Register (the "
             "largest models have well under 100,000 named tensors: the default fits them with "
             "room, and bounds what one registration costs)"},
    {.name = "max_tensor_bytes", .type = OPT_BYTES, .off = CONFIG__OFF(max_tensor_bytes, uint64_t),
     .min = 1, .max = 1125899906842624.0, .metavar = "BYTES",
     .help = "largest tensor of a manifest: elements times the larger of its storage and wire "
             "element sizes (at most 2^50)"},
    {.name = "max_manifest_bytes", .type = OPT_BYTES,
     .off = CONFIG__OFF(max_manifest_bytes, uint64_t), .min = 1, .max = 1152921504606846976.0,
     .metavar = "BYTES", .help = "the tensors of one manifest together, sized as for max_tensor_bytes"},
    {.name = "shutdown_grace_s", .type = OPT_DOUBLE, .off = CONFIG__OFF(shutdown_grace_s, double),
     .min = 0, .max = 3600, .flags = OPT_GT_MIN, .metavar = "SECONDS",
     .help = "time given to in-flight work on shutdown"},
    {.name = "heartbeat_interval_ms", .type = OPT_U32,
     .off = CONFIG__OFF(heartbeat_interval_ms, uint32_t), .min = 10, .max = 600000, .metavar = "MS",
     .help = "interval of worker heartbeats"},
    {.name = "worker_timeout_ms", .type = OPT_U32, .off = CONFIG__OFF(worker_timeout_ms, uint32_t),
     .min = 10, .max = 3600000, .metavar = "MS",
     .help = "a worker without heartbeat for this long is lost"},
    {.name = "max_workers", .type = OPT_U32, .off = CONFIG__OFF(max_workers, uint32_t), .min = 1,
     .max = 16384, .metavar = "N",
     .help = "live workers at most (1..16384); registrations beyond get RESOURCE_EXHAUSTED "
             "(lost ones do not count)"},
    {.name = "lost_worker_retention_s", .type = OPT_DOUBLE,
     .off = CONFIG__OFF(lost_worker_retention_s, double), .min = 0, .max = 86400,
     .metavar = "SECONDS", .help = "a lost worker is listed this long, then removed"},
    {.name = "http_timeout_ms", .type = OPT_U32, .off = CONFIG__OFF(http_timeout_ms, uint32_t),
     .min = 10, .max = 3600000, .metavar = "MS",
     .help = "time an HTTP connection has to send its whole request, from its accept or its "
             "previous request (trickled bytes do not extend it); then it is closed, with 408 "
             "when it held part of one"},
    {.name = "http_max_connections", .type = OPT_U32,
     .off = CONFIG__OFF(http_max_connections, uint32_t), .min = 1, .max = 65536, .metavar = "N",
     .help = "open HTTP connections at most; at the cap a new one takes the place of the one "
             "that waited longest for its request (503 only when every one is being written to)"},
    {.name = "default_policy", .type = OPT_ENUM, .off = CONFIG__OFF(default_policy, int),
     .names = config__policies, .metavar = "MODE", .help = "broadcast mode of a run that sets none"},
    {.name = "max_async_level", .type = OPT_U32, .off = CONFIG__OFF(max_async_level, uint32_t),
     .min = 0, .max = 64, .metavar = "N", .help = "off-policy bound of a run"},
    {.name = "rollouts_per_step", .type = OPT_U32, .off = CONFIG__OFF(rollouts_per_step, uint32_t),
     .min = 1, .max = 1000000, .metavar = "N", .help = "rollouts in a training batch"},
    {.name = "max_requests_per_worker", .type = OPT_U32,
     .off = CONFIG__OFF(max_requests_per_worker, uint32_t), .min = 1, .max = 1024, .metavar = "N",
     .help = "rollout requests in flight on one inference worker"},
    {.name = "group_size", .type = OPT_U32, .off = CONFIG__OFF(group_size, uint32_t), .min = 1,
     .max = 4096, .metavar = "N",
     .help = "completions per prompt: a request's group; rollouts_per_step is a multiple"},
    {.name = "prompts_file", .type = OPT_PATH, .off = CONFIG__OFF(prompts_file, char *),
     .metavar = "FILE", .help = "JSONL prompts of a run that names none",
     .dflt = "none: synthetic prompts"},
    {.name = "max_prompt_tokens", .type = OPT_U32, .off = CONFIG__OFF(max_prompt_tokens, uint32_t),
     .min = 1, .max = 16777216, .metavar = "N", .help = "longest prompt a prompt source may hold"},
    {.name = "max_tokens", .type = OPT_U32, .off = CONFIG__OFF(max_tokens, uint32_t), .min = 1,
     .max = 1048576, .metavar = "N", .help = "completion tokens per sequence, when sampling sets none"},
    {.name = "temperature", .type = OPT_DOUBLE, .off = CONFIG__OFF(temperature, double), .min = 0,
     .max = 100, .metavar = "T", .help = "sampling temperature of a run that sets no sampling"},
    {.name = "request_timeout_ms", .type = OPT_U32,
     .off = CONFIG__OFF(request_timeout_ms, uint32_t), .min = 0, .max = 86400000, .metavar = "MS",
     .help = "a rollout request slower than this is also sent to another worker; 0: never"},
    {.name = "staging_budget_bytes", .type = OPT_BYTES,
     .off = CONFIG__OFF(staging_budget_bytes, uint64_t), .min = 1048576.0, .max = 1099511627776.0,
     .metavar = "BYTES", .help = "staging memory budget per bucket"},
    {.name = "broadcast_gbps_host", .type = OPT_DOUBLE,
     .off = CONFIG__OFF(broadcast_gbps_host, double), .min = 0, .max = 1e6, .flags = OPT_GT_MIN,
     .metavar = "GBPS",
     .help = "slowest rate (GB/s, summed over receivers) the host transport is expected to give; "
             "bounds each plan with broadcast_safety and broadcast_slack_ms"},
    {.name = "broadcast_gbps_staged", .type = OPT_DOUBLE,
     .off = CONFIG__OFF(broadcast_gbps_staged, double), .min = 0, .max = 1e6, .flags = OPT_GT_MIN,
     .metavar = "GBPS", .help = "slowest rate (GB/s) staged and colocated modes are expected to give"},
    {.name = "broadcast_gbps_direct", .type = OPT_DOUBLE,
     .off = CONFIG__OFF(broadcast_gbps_direct, double), .min = 0, .max = 1e6, .flags = OPT_GT_MIN,
     .metavar = "GBPS", .help = "slowest rate (GB/s) direct mode is expected to give"},
    {.name = "broadcast_safety", .type = OPT_DOUBLE, .off = CONFIG__OFF(broadcast_safety, double),
     .min = 1, .max = 1000, .metavar = "X",
     .help = "a plan may take this many times what its bytes cost at the expected rate"},
    {.name = "broadcast_slack_ms", .type = OPT_U32, .off = CONFIG__OFF(broadcast_slack_ms, uint32_t),
     .min = 0, .max = 86400000, .metavar = "MS",
     .help = "fixed time added to every plan's bounds, on top of worker_timeout_ms"},
    {.name = "link_h2d_gbps", .type = OPT_DOUBLE, .off = CONFIG__OFF(topology.h2d_gbps, double),
     .min = 0, .max = 1e6, .flags = OPT_GT_MIN, .metavar = "GBPS",
     .help = "cost model: host-to-device GB/s of a GPU that reports no measured rate"},
    {.name = "link_nvlink_gbps", .type = OPT_DOUBLE,
     .off = CONFIG__OFF(topology.nvlink_gbps, double), .min = 0, .max = 1e6, .flags = OPT_GT_MIN,
     .metavar = "GBPS", .help = "cost model: NVLink GB/s of a GPU, one direction"},
    {.name = "link_d2d_gbps", .type = OPT_DOUBLE, .off = CONFIG__OFF(topology.d2d_gbps, double),
     .min = 0, .max = 1e6, .flags = OPT_GT_MIN, .metavar = "GBPS",
     .help = "cost model: a copy inside one GPU's memory, GB/s"},
    {.name = "link_cast_gbps", .type = OPT_DOUBLE, .off = CONFIG__OFF(topology.cast_gbps, double),
     .min = 0, .max = 1e6, .flags = OPT_GT_MIN, .metavar = "GBPS",
     .help = "cost model: input GB/s a GPU casts to the wire dtype"},
    {.name = "link_tcp_stream_gbps", .type = OPT_DOUBLE,
     .off = CONFIG__OFF(topology.tcp_stream_gbps, double), .min = 0, .max = 1e6,
     .metavar = "GBPS", .help = "cost model: one host-transport TCP stream at most; 0: no cap"},
    {.name = "link_tls_stream_gbps", .type = OPT_DOUBLE,
     .off = CONFIG__OFF(topology.tls_stream_gbps, double), .min = 0, .max = 1e6,
     .metavar = "GBPS", .help = "cost model: one TLS host-transport stream at most; 0: no cap"},
    {.name = "link_tcp_send_gbps", .type = OPT_DOUBLE,
     .off = CONFIG__OFF(topology.tcp_send_gbps, double), .min = 0, .max = 1e6,
     .metavar = "GBPS",
     .help = "cost model: one host-transport process's sending thread over all its streams; 0: no cap"},
    {.name = "link_host_gbps", .type = OPT_DOUBLE, .off = CONFIG__OFF(topology.host_gbps, double),
     .min = 0, .max = 1e6, .metavar = "GBPS",
     .help = "cost model: a node's memory and kernel over every host-transport stream end on it; 0: no cap"},
    {.name = "link_host_cast_gbps", .type = OPT_DOUBLE,
     .off = CONFIG__OFF(topology.host_cast_gbps, double), .min = 0, .max = 1e6,
     .metavar = "GBPS", .help = "cost model: a host-transport source's CPU cast and checksum; 0: no cap"},
    {.name = "link_pageable_gbps", .type = OPT_DOUBLE,
     .off = CONFIG__OFF(topology.pageable_gbps, double), .min = 0, .max = 1e6,
     .flags = OPT_GT_MIN, .metavar = "GBPS",
     .help = "cost model: copies between GPU tensors and pageable host memory"},
    {.name = "link_hop_latency_us", .type = OPT_DOUBLE,
     .off = CONFIG__OFF(topology.hop_latency_us, double), .min = 0, .max = 1e6, .metavar = "US",
     .help = "cost model: latency of one NCCL hop"},
    {.name = "link_nics", .type = OPT_U32, .off = CONFIG__OFF(topology.nics_per_node, uint32_t),
     .min = 1, .max = 1024, .metavar = "N",
     .help = "cost model: NICs of a node none of whose workers reports a NIC speed"},
    {.name = "link_nic_gbits", .type = OPT_DOUBLE, .off = CONFIG__OFF(topology.nic_gbits, double),
     .min = 0, .max = 1e6, .flags = OPT_GT_MIN, .metavar = "GBITS",
     .help = "cost model: Gb/s of each of those NICs"},
    {.name = "link_nic_frame_bytes", .type = OPT_DOUBLE,
     .off = CONFIG__OFF(topology.nic_frame_bytes, double), .min = 0, .max = 65536,
     .metavar = "BYTES",
     .help = "cost model: bytes of a NIC's line rate each frame costs beside its MTU (38 on a wire, "
             "14 through a tc tbf shaper)"},
    {.name = "data_channel_tls", .type = OPT_ENUM, .off = CONFIG__OFF(data_channel_tls, int),
     .names = config__on_off, .metavar = "S",
     .help = "host-transport plans also encrypt their data connections (TLS 1.3 keyed from each "
             "plan's secret, no certificates): for networks the weights must not be read on"},
    {.name = "print_config", .flag = "--print-config", .type = OPT_SWITCH,
     .off = CONFIG__OFF(print_config, bool), .flags = OPT_NO_ENV | OPT_NO_FILE,
     .help = "print the effective configuration as YAML and exit"},
};

static const opt_cmd config__cmd = {
    .name = "serve",
    .about = "The orchestrator daemon: gRPC Control and Worker API, HTTP /metrics /healthz\n"
             "/readyz, SQLite state, the scheduler of the active run.",
    .fields = config__fields,
    .nfields = sizeof config__fields / sizeof config__fields[0],
    .flags = OPT_CMD_CONFIG,
};

void config_defaults(config *c) {
  memset(c, 0, sizeof *c);
  c->listen = strdup("127.0.0.1:7070");
  c->metrics_listen = strdup("127.0.0.1:9464");
  c->data_dir = strdup("rlorch-data");
  c->log_level = LOG_INFO;
  c->log_format = LOG_FORMAT_LOGFMT;
  c->max_message_bytes = 4u << 20;
  c->max_rollout_bytes = 1u << 20;
  c->batch_chunk_bytes = 4u << 20;
  c->rollout_buffer_bytes = 256u << 20;
  c->rollout_log = true;
  c->max_manifest_tensors = 131072;
  c->max_tensor_bytes = 1ull << 40;
  c->max_manifest_bytes = 1ull << 44;
  c->shutdown_grace_s = 5.0;
  c->heartbeat_interval_ms = 1000;
  c->worker_timeout_ms = 5000;
  c->max_workers = 4096;
  c->lost_worker_retention_s = 60.0;
  c->http_timeout_ms = 5000;
  c->http_max_connections = 256;
  c->default_policy = RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_AUTO;
  c->max_async_level = 1;
  c->rollouts_per_step = 8;
  c->max_requests_per_worker = 8;
  c->group_size = 1;
  c->max_prompt_tokens = 32768;
  c->max_tokens = 1024;
  c->temperature = 1.0;
  c->staging_budget_bytes = 256u << 20;
  bcast_topo_default(&c->topology, 1);
  bcast_cost_model m; /* one set of defaults, the engine's */
  bcast_cost_model_default(&m);
  c->broadcast_gbps_host = m.gbps[BCAST_MODE_HOST];
  c->broadcast_gbps_staged = m.gbps[BCAST_MODE_STAGED];
  c->broadcast_gbps_direct = m.gbps[BCAST_MODE_DIRECT];
  c->broadcast_safety = m.safety;
  c->broadcast_slack_ms = (uint32_t)(m.slack_s * 1000.0);
}

void config_free(config *c) {
  if (!c) return;
  opt_free(&config__cmd, c);
  free(c->config_file);
  free(c->token);
  c->token = NULL;
  c->config_file = NULL;
}

bcast_manifest_limits config_manifest_limits(const config *c) {
  return (bcast_manifest_limits){.max_manifest_tensors = c->max_manifest_tensors,
                                 .max_tensor_bytes = c->max_tensor_bytes,
                                 .max_manifest_bytes = c->max_manifest_bytes};
}

int config_policy_parse(const char *s, Rlorch__V1__BroadcastMode *out) {
  for (size_t i = 0; s && config__policies[i].name; i++)
    if (!strcmp(s, config__policies[i].name))
      return *out = (Rlorch__V1__BroadcastMode)config__policies[i].value, 0;
  return -1;
}

const char *config_policy_name(Rlorch__V1__BroadcastMode m) {
  const char *s = opt_enum_name(config__policies, (int)m);
  return s ? s : "unspecified";
}

/* ---- checks across fields ------------------------------------------------------ */

static int config__check_readable(opt_state *st, const char *name, const char *path) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return opt_fail(st, opt_origin(st, name), "cannot read \"%s\": %s", path, strerror(errno));
  fclose(fp);
  return 0;
}

static int config__validate(config *c, opt_state *st) {
  if (c->worker_timeout_ms <= c->heartbeat_interval_ms)
    return opt_fail(st, opt_origin(st, "worker_timeout_ms"),
                    "%u must exceed heartbeat_interval_ms (%u)", c->worker_timeout_ms,
                    c->heartbeat_interval_ms);
  if (c->rollouts_per_step % c->group_size)
    return opt_fail(st, opt_origin(st, "rollouts_per_step"), "%u is not a multiple of group_size (%u)",
                    c->rollouts_per_step, c->group_size);
  if (c->prompts_file && config__check_readable(st, "prompts_file", c->prompts_file)) return -1;
  /* A chunk is a message: the server's own limit bounds it, so a peer that
   * accepts what it may send accepts every chunk. */
  if (c->batch_chunk_bytes > c->max_message_bytes) {
    if (opt_is_set(st, "batch_chunk_bytes"))
      return opt_fail(st, opt_origin(st, "batch_chunk_bytes"),
                      "%llu exceeds max_message_bytes (%llu), the largest gRPC message the "
                      "server uses", (unsigned long long)c->batch_chunk_bytes,
                      (unsigned long long)c->max_message_bytes);
    c->batch_chunk_bytes = c->max_message_bytes; /* the default follows a smaller limit */
  }
  if (!c->tls_cert_file != !c->tls_key_file) {
    const char *set = c->tls_cert_file ? "tls_cert_file" : "tls_key_file";
    const char *unset = c->tls_cert_file ? "tls_key_file" : "tls_cert_file";
    return opt_fail(st, opt_origin(st, set), "set without %s (give both or neither)", unset);
  }
  if (c->tls_cert_file && (config__check_readable(st, "tls_cert_file", c->tls_cert_file) ||
                           config__check_readable(st, "tls_key_file", c->tls_key_file)))
    return -1;
  if (c->tls_client_ca_file && !c->tls_cert_file)
    return opt_fail(st, opt_origin(st, "tls_client_ca_file"),
                    "client certificates need TLS: set tls_cert_file and tls_key_file too");
  if (c->tls_client_ca_file && config__check_readable(st, "tls_client_ca_file", c->tls_client_ca_file))
    return -1;
  if (c->token_file) {
    /* The clients' reader, so a file that works for ctl and the agents works here. */
    char tok[4097], terr[512];
    if (rpc_token_read(c->token_file, tok, sizeof tok, terr, sizeof terr) != 0)
      return opt_fail(st, opt_origin(st, "token_file"), "%s", terr);
    c->token = strdup(tok);
    memset(tok, 0, sizeof tok);
    if (!c->token) return opt_fail(st, opt_origin(st, "token_file"), "out of memory");
  }
  return 0;
}

int config_load(config *c, int argc, char **argv, char **envp, char *err, size_t errlen) {
  if (err && errlen) err[0] = 0;
  config_defaults(c);
  opt_state *st = malloc(sizeof *st);
  if (!st) {
    if (err && errlen) snprintf(err, errlen, "rlorch serve: out of memory");
    return -1;
  }
  int rc = opt_parse(&config__cmd, c, argc, argv, envp, st);
  c->help = st->help;
  if (rc == 0 && !c->help) {
    if (st->config_file && !(c->config_file = strdup(st->config_file)))
      rc = opt_fail(st, "--config", "out of memory");
    else rc = config__validate(c, st);
  }
  if (rc != 0 && err && errlen) snprintf(err, errlen, "%s", st->err);
  free(st);
  return rc;
}

#define CONFIG__AT(c, f, T) ((T *)((char *)(c) + (f)->off))

/* ---- output ------------------------------------------------------------------ */

/* The length (1..4) of the UTF-8 sequence at p and its code point, or 0 when
 * p does not start a well-formed one (overlong, surrogate, past U+10FFFF). */
static size_t config__utf8(const unsigned char *p, uint32_t *cp) {
  size_t n = p[0] >= 0xf0 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc0 ? 2 : 0;
  if (n == 0 || p[0] > 0xf4) return 0;
  uint32_t v = p[0] & (0x7fu >> n);
  for (size_t i = 1; i < n; i++) {
    if ((p[i] & 0xc0) != 0x80) return 0; /* the string's NUL ends here too */
    v = v << 6 | (p[i] & 0x3fu);
  }
  static const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < least[n] || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
  *cp = v;
  return n;
}

/* A double-quoted YAML scalar that reads back as the same string. Escaped:
 * quotes and backslashes, and what a YAML reader refuses or changes when it
 * stands raw in a scalar: control characters, U+0080..U+009F (NEL, U+0085,
 * is a line break), the line and paragraph separators (folded like a line
 * break), U+FEFF, U+FFFE and U+FFFF. Bytes that are not UTF-8 have no YAML
 * spelling at all: \xNN, which reads back as U+00NN, is the nearest. */
static void config__print_string(const char *s, FILE *f) {
  if (!s) {
    fputs("null", f);
    return;
  }
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p;) {
    if (*p < 0x80) {
      if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
      else if (*p == '\n') fputs("\\n", f);
      else if (*p == '\t') fputs("\\t", f);
      else if (*p < 0x20 || *p == 0x7f) fprintf(f, "\\x%02x", *p);
      else fputc(*p, f);
      p++;
      continue;
    }
    uint32_t cp = 0;
    size_t n = config__utf8(p, &cp);
    if (n == 0) {
      fprintf(f, "\\x%02x", *p++);
    } else if (cp <= 0x9f || cp == 0x2028 || cp == 0x2029 || cp == 0xfeff || cp == 0xfffe ||
               cp == 0xffff) {
      fprintf(f, "\\u%04x", (unsigned)cp);
      p += n;
    } else {
      fwrite(p, 1, n, f);
      p += n;
    }
  }
  fputc('"', f);
}

void config_print(const config *c, FILE *f) {
  fputs("# rlorch serve: effective configuration\n", f);
  for (size_t i = 0; i < config__cmd.nfields; i++) {
    const opt_field *fl = &config__fields[i];
    if (fl->flags & OPT_NO_FILE) continue;
    const config *cc = c;
    fprintf(f, "%s: ", fl->name);
    switch (fl->type) {
      case OPT_STR:
      case OPT_PATH:
      case OPT_ADDR:
      case OPT_TARGET:
        config__print_string(*CONFIG__AT(cc, fl, char *const), f);
        break;
      case OPT_ENUM: {
        const char *name = opt_enum_name(fl->names, *CONFIG__AT(cc, fl, const int));
        fputs(name ? name : "null", f);
        break;
      }
      case OPT_U32: fprintf(f, "%u", *CONFIG__AT(cc, fl, const uint32_t)); break;
      case OPT_I32: fprintf(f, "%d", *CONFIG__AT(cc, fl, const int32_t)); break;
      case OPT_U64:
      case OPT_BYTES:
        fprintf(f, "%llu", (unsigned long long)*CONFIG__AT(cc, fl, const uint64_t));
        break;
      case OPT_I64: fprintf(f, "%lld", (long long)*CONFIG__AT(cc, fl, const int64_t)); break;
      case OPT_SWITCH: fputs(*CONFIG__AT(cc, fl, const bool) ? "true" : "false", f); break;
      case OPT_DOUBLE: {
        double d = *CONFIG__AT(cc, fl, const double);
        char num[40];
        for (int prec = 15; prec <= 17; prec++) {
          snprintf(num, sizeof num, "%.*g", prec, d);
          if (strtod(num, NULL) == d) break;
        }
        fputs(num, f);
        break;
      }
    }
    fputc('\n', f);
  }
}

void config_usage(FILE *f) {
  config d;
  config_defaults(&d);
  opt_usage(&config__cmd, &d, f);
  config_free(&d);
}
