/* Configuration of `rlorch serve`: typed fields, parsed once at start-up by
 * the opt mechanism (orchestrator/common/opt.h), like every other command.
 *
 * Precedence, lowest first: built-in defaults < YAML file (--config FILE or
 * RLORCH_CONFIG) < RLORCH_* environment variables < command-line flags. Every
 * value is validated after merging; an error message names the field and
 * where it came from, e.g.
 *   rlorch serve: rlorch.yaml:3: listen: invalid address "x:y:z" (want HOST:PORT)
 *   rlorch serve: RLORCH_MAX_ASYNC_LEVEL: not an integer: "abc"
 *   rlorch serve: --listen: missing value
 *
 * YAML keys are the field names below (snake_case); environment variables are
 * RLORCH_ + the upper-cased field name (RLORCH_METRICS_LISTEN, ...). Unknown
 * YAML keys are errors; unknown RLORCH_* variables are ignored (other commands
 * use the prefix too). An empty variable clears an optional path (token_file,
 * tls_*). Byte sizes accept a KiB, MiB or GiB suffix. print_config is a flag
 * only. `rlorch serve --help` lists every flag, key and variable.
 *
 * Not thread-safe; meant to be called once from main. */
#ifndef RLORCH_CONFIG_H
#define RLORCH_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "orchestrator/common/log.h"
#include "orchestrator/common/opt.h"
#include "rlorch/v1/broadcast.pb-c.h"
#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_topo.h"

typedef struct config {
  char *config_file;      /* --config FILE, or NULL: not a YAML key */
  char *listen;           /* gRPC HOST:PORT, default "127.0.0.1:7070" */
  char *metrics_listen;   /* HTTP HOST:PORT, default "127.0.0.1:9464" */
  char *data_dir;         /* SQLite directory, default "rlorch-data" */
  char *token_file;       /* bearer token file, or NULL for no auth */
  char *tls_cert_file;    /* PEM certificate chain, or NULL (both or neither) */
  char *tls_key_file;     /* PEM private key, or NULL */
  char *tls_client_ca_file; /* PEM roots: clients must present a certificate they
                               signed (mutual TLS); needs tls_cert_file; or NULL */
  char *token;            /* contents of token_file without surrounding
                             white space (rpc_token_read), or NULL; never printed */
  log_level log_level;    /* default LOG_INFO */
  log_format log_format;  /* default LOG_FORMAT_LOGFMT */
  uint64_t max_message_bytes;     /* gRPC message cap, default 4 MiB */
  uint64_t max_rollout_bytes;     /* one reported rollout at most, default 1 MiB */
  uint64_t batch_chunk_bytes;     /* one FetchBatch message at most (a rollout larger
                                     than this goes alone); default 4 MiB, or
                                     max_message_bytes when that is smaller; never
                                     above it */
  uint64_t rollout_buffer_bytes;  /* buffered per run before dispatch holds, default 256 MiB */
  bool rollout_log;               /* each step's batch as JSONL under data_dir, default on */
  /* What a worker's manifest may hold (bcast_manifest_check): tensors, bytes a
   * tensor, bytes in all; defaults 131072, 1 TiB, 16 TiB. */
  uint32_t max_manifest_tensors;
  uint64_t max_tensor_bytes;
  uint64_t max_manifest_bytes;
  double shutdown_grace_s;        /* drain time on SIGTERM, default 5.0 */
  uint32_t heartbeat_interval_ms; /* default 1000 */
  uint32_t worker_timeout_ms;     /* worker lost after this, default 5000 */
  uint32_t max_workers;           /* live workers at most, default 4096, at most
                                     WORKERS_MAX (16384) */
  double lost_worker_retention_s; /* a lost worker is listed this long, then removed;
                                     default 60 */
  uint32_t http_timeout_ms;       /* per-connection HTTP deadline, default 5000 */
  uint32_t http_max_connections;  /* default 256 */
  /* Run defaults, applied to a RunSpec field left at 0. */
  Rlorch__V1__BroadcastMode default_policy; /* "auto|direct|staged|host", default AUTO */
  uint32_t max_async_level;       /* default 1, at most 64 */
  uint32_t rollouts_per_step;     /* default 8 */
  uint32_t max_requests_per_worker; /* rollout requests in flight per inference worker,
                                       default 8, 1..1024 */
  uint32_t group_size;            /* completions per prompt, default 1 */
  char *prompts_file;             /* JSONL prompts, or NULL: synthetic */
  uint32_t max_prompt_tokens;     /* longest prompt accepted from a source, default 32768 */
  uint32_t max_tokens;            /* completion tokens per sequence, default 1024 */
  double temperature;             /* of a run without sampling parameters, default 1.0 */
  uint32_t request_timeout_ms;    /* re-send a slower request elsewhere; 0 (default): never */
  uint64_t staging_budget_bytes;  /* default 256 MiB */
  /* The cost model that bounds every plan (bcast_cost_estimate): the rate
   * each mode is expected to give at least, in GB/s, a safety factor and a
   * slack; worker_timeout_ms is its loss detection time. */
  double broadcast_gbps_host;     /* default 0.5 */
  double broadcast_gbps_staged;   /* default 5 */
  double broadcast_gbps_direct;   /* default 10 */
  double broadcast_safety;        /* default 4 */
  uint32_t broadcast_slack_ms;    /* default 2000 */
  /* The links no worker reports, for the topology cost model that predicts
   * every plan (bcast_topo.h; defaults bcast_topo_default's): topology.nodes,
   * gpus_per_node and node are unused here (the workers' reports give them);
   * nics_per_node x nic_gbits are a node's NICs when none of its workers
   * reports a speed. */
  bcast_topo topology;
  int data_channel_tls;           /* host plans: TLS 1.3 on every data connection; default 0 */
  bool print_config;              /* --print-config: print and exit 0 */
  bool help;                      /* --help: config_usage(stdout) and exit 0 */
} config;

/* Fills every field with its default. config_load calls it first. */
void config_defaults(config *c);

/* Loads the configuration. argv[0] is the command name and is skipped; envp is
 * a NULL-terminated "NAME=value" array (NULL for none). Returns 0 on success
 * (check c->help and c->print_config), or -1 with the whole message line
 * ("rlorch serve: ORIGIN: MESSAGE") in err; the caller prints it and exits 2. On both paths release c with config_free. */
int config_load(config *c, int argc, char **argv, char **envp, char *err, size_t errlen);

/* Prints the flags, the environment variables and the YAML keys. */
void config_usage(FILE *f);

/* Prints the effective configuration as YAML that config_load accepts back.
 * The token itself is never printed, only token_file. */
void config_print(const config *c, FILE *f);

/* Frees the strings; c may be reused after config_defaults. */
void config_free(config *c);


/* The manifest limits of the configuration, for bcast_manifest_check. */
bcast_manifest_limits config_manifest_limits(const config *c);

/* "auto", "direct", "staged", "host", "colocated" <-> enum; parse returns 0 or -1. */
int config_policy_parse(const char *s, Rlorch__V1__BroadcastMode *out);
const char *config_policy_name(Rlorch__V1__BroadcastMode m);

#endif
