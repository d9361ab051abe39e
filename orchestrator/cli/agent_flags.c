/* Settings of `rlorch trainer` and `rlorch inference` on the opt mechanism:
 * one table per role over agent_flags. */
#include "orchestrator/cli/agent_flags.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/common/opt.h"
#include "rpc/rpc.h"
#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_preset.h"

#define AF(m, ctype) OPT_OFF(agent_flags, m, ctype)

static const opt_name agent__offloads[] = {
    {"none", AGENT_OFFLOAD_NONE},
    {"params", AGENT_OFFLOAD_PARAMS},
    {"params+optimizer", AGENT_OFFLOAD_PARAMS_OPTIMIZER},
    {NULL, 0},
};

/* Values of agent_opts.bf16_shadow and double_buffer. */
static const opt_name agent__on_off[] = {{"on", 1}, {"off", 0}, {NULL, 0}};

static const opt_name agent__dists[] = {
    {"lognormal", AGENT_DIST_LOGNORMAL}, {"normal", AGENT_DIST_NORMAL}, {NULL, 0}};

/* The settings both roles share; the names match ctl's and serve's where the
 * meaning is the same (RLORCH_ORCHESTRATOR, RLORCH_TOKEN_FILE, RLORCH_LOG_*). */
#define AGENT__COMMON                                                                              \
  {.name = "orchestrator", .flag = "--orchestrator", .type = OPT_TARGET,                           \
   .off = AF(opts.orchestrator, char *), .metavar = "TARGET",                                      \
   .help = "orchestrator's gRPC target: HOST:PORT, dns:///HOST:PORT, unix:PATH, ...",              \
   .flags = OPT_REQUIRED},                                                                         \
  {.name = "token_file", .flag = "--token-file", .type = OPT_PATH,                                 \
   .off = AF(opts.token_file, char *), .metavar = "FILE", .help = "file holding the bearer token"}, \
  {.name = "tls_ca_file", .flag = "--tls-ca", .type = OPT_PATH, .off = AF(opts.tls_ca_file, char *), \
   .metavar = "FILE", .help = "PEM roots to verify the orchestrator by; turns TLS on"},            \
  {.name = "tls_client_cert_file", .flag = "--tls-client-cert", .type = OPT_PATH,                 \
   .off = AF(opts.tls_client_cert_file, char *), .metavar = "FILE",                              \
   .help = "PEM client certificate for an orchestrator that asks for one (with --tls-client-key)"}, \
  {.name = "tls_client_key_file", .flag = "--tls-client-key", .type = OPT_PATH,                   \
   .off = AF(opts.tls_client_key_file, char *), .metavar = "FILE",                               \
   .help = "PEM private key of --tls-client-cert"},                                              \
  {.name = "name", .flag = "--name", .type = OPT_STR, .off = AF(opts.name, char *),                \
   .metavar = "NAME", .help = "worker name, at most 200 bytes", .dflt = "host name and pid"},      \
  {.name = "device", .flag = "--device", .type = OPT_I32, .off = AF(opts.device, int),             \
   .min = -1, .max = 1023, .metavar = "N", .help = "CUDA device, -1 for none",                     \
   .dflt = "0 when a GPU exists, else -1"},                                                    \
  {.name = "node", .flag = "--node", .type = OPT_STR, .off = AF(opts.node, char *),                \
   .metavar = "NAME", .help = "the node (machine) this worker runs on; workers of one node share " \
   "its NICs", .dflt = "the machine's boot id"},                                                 \
  {.name = "nics", .flag = "--nics", .type = OPT_U32, .off = AF(opts.nics, uint32_t), .min = 1,   \
   .max = BCAST_SYSTOPO_MAX_NICS, .metavar = "N",                                                 \
   .help = "with --nic-gbits: the node has N NICs of that speed, instead of those detected",     \
   .dflt = "those detected (sysfs)"},                                                             \
  {.name = "nic_gbits", .flag = "--nic-gbits", .type = OPT_DOUBLE,                                \
   .off = AF(opts.nic_gbits, double), .min = 0, .max = BCAST_SYSTOPO_MAX_GBITS,                  \
   .flags = OPT_GT_MIN, .metavar = "G",                                                           \
   .help = "each NIC's speed in Gb/s (a shaped link's rate); alone, sets every detected NIC's",   \
   .dflt = "each NIC's own (sysfs)"}

#define AGENT__DATA_LISTEN(what, dflt_)                                                           \
  {.name = "data_listen", .flag = "--data-listen", .type = OPT_ADDR,                               \
   .off = AF(opts.data_listen, char *), .metavar = "ADDR", .help = what, .dflt = dflt_}

#define AGENT__TAIL                                                                                \
  {.name = "log_level", .flag = "--log-level", .type = OPT_ENUM, .off = AF(log_level, int),        \
   .names = opt_log_level_names, .metavar = "LEVEL", .help = "log threshold"},                     \
  {.name = "log_format", .flag = "--log-format", .type = OPT_ENUM, .off = AF(log_format, int),     \
   .names = opt_log_format_names, .metavar = "FMT", .help = "log line format"}

static const opt_field agent__trainer_fields[] = {
    AGENT__COMMON,
    {.name = "preset", .flag = "--preset", .type = OPT_STR, .off = AF(opts.preset, char *),
     .metavar = "P", .help = "model preset: 100m, 1b, 4b, 8b"},
    {.name = "layers", .flag = "--layers", .type = OPT_U32, .off = AF(opts.max_layers, uint32_t),
     .min = 0, .max = 100000, .metavar = "N", .help = "keep only the first N decoder layers",
     .dflt = "0: all"},
    {.name = "offload", .flag = "--offload", .type = OPT_ENUM, .off = AF(opts.offload, int),
     .names = agent__offloads, .metavar = "O", .help = "what lives in host memory"},
    AGENT__DATA_LISTEN("host-transport listen address", "127.0.0.1:0"),
    {.name = "threads", .flag = "--threads", .type = OPT_I32, .off = AF(opts.threads, int),
     .min = 0, .max = 1024, .metavar = "N", .help = "CPU optimizer threads",
     .dflt = "0: one per core"},
    {.name = "bf16_shadow", .flag = "--bf16-shadow", .type = OPT_ENUM,
     .off = AF(opts.bf16_shadow, int), .names = agent__on_off, .metavar = "S",
     .help = "with --offload params+optimizer: send a bf16 copy the CPU optimizer writes in "
             "its update pass"},
    {.name = "checkpoint_dir", .flag = "--checkpoint-dir", .type = OPT_PATH,
     .off = AF(opts.checkpoint_dir, char *), .metavar = "DIR",
     .help = "keep the trainer's own checkpoint (weights, optimizer state, version) here and "
             "resume from it at start", .dflt = "none"},
    {.name = "checkpoint_every", .flag = "--checkpoint-every", .type = OPT_U32,
     .off = AF(opts.checkpoint_every, uint32_t), .min = 1, .max = 1000000, .metavar = "N",
     .help = "write the checkpoint after every N-th optimizer step (1: the run resumes without "
             "losing a step)"},
    {.name = "rank", .flag = "--rank", .type = OPT_U32, .off = AF(opts.trainer_rank, uint32_t),
     .min = 0, .max = 1023, .metavar = "R",
     .help = "this process's rank in a trainer group of --ranks: it holds and sends rank R's "
             "part of every tensor and fetches rank R's share of each batch"},
    {.name = "ranks", .flag = "--ranks", .type = OPT_U32, .off = AF(opts.trainer_ranks, uint32_t),
     .min = 0, .max = 1024, .metavar = "N",
     .help = "ranks of the trainer group, one process each", .dflt = "0: a lone trainer"},
    {.name = "seed", .flag = "--seed", .type = OPT_U64, .off = AF(opts.seed, uint64_t),
     .metavar = "N", .help = "seed of the initial weights"},
    AGENT__TAIL,
};

static const opt_field agent__inference_fields[] = {
    AGENT__COMMON,
    AGENT__DATA_LISTEN("host-transport listen address, announced at registration, for relaying "
                       "broadcasts to other inference workers (one per node)", "none"),
    {.name = "distribution", .flag = "--distribution", .type = OPT_ENUM,
     .off = AF(opts.rollout.dist, int), .names = agent__dists, .metavar = "D",
     .help = "distribution of rollout lengths and latencies"},
    {.name = "tokens_mean", .flag = "--tokens-mean", .type = OPT_DOUBLE,
     .off = AF(opts.rollout.tokens_mean, double), .min = 1, .max = 1e6, .metavar = "X",
     .help = "mean tokens per rollout, before max_tokens and stop tokens"},
    {.name = "tokens_std", .flag = "--tokens-std", .type = OPT_DOUBLE,
     .off = AF(opts.rollout.tokens_std, double), .min = 0, .max = 1e6, .metavar = "X",
     .help = "standard deviation of tokens"},
    {.name = "latency_ms_mean", .flag = "--latency-ms-mean", .type = OPT_DOUBLE,
     .off = AF(opts.rollout.latency_ms_mean, double), .min = 0, .max = 3.6e6, .metavar = "X",
     .help = "mean generation latency in ms"},
    {.name = "latency_ms_std", .flag = "--latency-ms-std", .type = OPT_DOUBLE,
     .off = AF(opts.rollout.latency_ms_std, double), .min = 0, .max = 3.6e6, .metavar = "X",
     .help = "standard deviation of the latency in ms"},
    {.name = "vocab_size", .flag = "--vocab-size", .type = OPT_U32,
     .off = AF(opts.rollout.vocab_size, uint32_t), .min = 2, .max = UINT32_MAX, .metavar = "N",
     .help = "completion token ids are below N"},
    {.name = "concurrency", .flag = "--concurrency", .type = OPT_U32,
     .off = AF(opts.concurrency, uint32_t), .min = 1, .max = 1024, .metavar = "N",
     .help = "rollout requests generated at once, announced to the orchestrator"},
    {.name = "double_buffer", .flag = "--double-buffer", .type = OPT_ENUM,
     .off = AF(opts.double_buffer, int), .names = agent__on_off, .metavar = "S",
     .help = "receive each version into a second set of buffers and swap it in when whole: "
             "generation goes on meanwhile, a failed broadcast leaves the previous version "
             "(twice the memory)"},
    {.name = "tp_size", .flag = "--tp-size", .type = OPT_U32, .off = AF(opts.tp_size, uint32_t),
     .min = 0, .max = 1024, .metavar = "T",
     .help = "run as one rank of a tensor-parallel engine of T: hold and receive a 1/T slice of "
             "every 2-D tensor of --preset (dim 0 and dim 1 in turn), 1-D tensors whole",
     .dflt = "0: every tensor whole"},
    {.name = "tp_rank", .flag = "--tp-rank", .type = OPT_U32, .off = AF(opts.tp_rank, uint32_t),
     .min = 0, .max = 1023, .metavar = "K",
     .help = "this process's rank of the --tp-size engine: slice K of each 2-D tensor"},
    {.name = "preset", .flag = "--preset", .type = OPT_STR, .off = AF(opts.preset, char *),
     .metavar = "P", .help = "with --tp-size: the trainer's model preset, whose tensors are sliced (unused "
             "without it)"},
    {.name = "layers", .flag = "--layers", .type = OPT_U32, .off = AF(opts.max_layers, uint32_t),
     .min = 0, .max = 100000, .metavar = "N",
     .help = "with --tp-size: the trainer's --layers (its first N decoder layers)", .dflt = "0: all"},
    {.name = "seed", .flag = "--seed", .type = OPT_U64, .off = AF(opts.seed, uint64_t),
     .metavar = "N", .help = "sampling seed of requests that carry none", .dflt = "from the pid"},
    AGENT__TAIL,
};

static const opt_cmd agent__trainer_cmd = {
    .name = "trainer",
    .about = "Trainer worker agent: holds fp32 master weights of a model preset, takes a real\n"
             "AdamW step on each train command and sends the weight broadcast.",
    .fields = agent__trainer_fields,
    .nfields = sizeof agent__trainer_fields / sizeof agent__trainer_fields[0],
};

static const opt_cmd agent__inference_cmd = {
    .name = "inference",
    .about = "Inference worker agent: answers each rollout request with a group of synthetic\n"
             "completions of its prompt (seeded, max_tokens and stop tokens honoured, a built-in\n"
             "reward) with the policy version it holds, and receives the weight broadcast.",
    .fields = agent__inference_fields,
    .nfields = sizeof agent__inference_fields / sizeof agent__inference_fields[0],
};

static const opt_cmd *agent__cmd(agent_role role) {
  return role == AGENT_ROLE_TRAINER ? &agent__trainer_cmd : &agent__inference_cmd;
}

static void agent__defaults(agent_role role, agent_flags *o) {
  memset(o, 0, sizeof *o);
  agent_opts_defaults(role, &o->opts);
  o->log_level = LOG_INFO;
  o->log_format = LOG_FORMAT_LOGFMT;
}

void agent_flags_usage(agent_role role, FILE *f) {
  agent_flags d;
  agent__defaults(role, &d);
  opt_usage(agent__cmd(role), &d, f); /* the defaults' strings are literals: nothing to free */
}

void agent_flags_free(agent_flags *o) {
  if (!o) return;
  opt_free(agent__cmd(o->opts.role), o);
  memset(o->token, 0, sizeof o->token); /* the secret does not outlive its use */
  o->opts.token = NULL;
}

/* Checks that need more than one value's syntax. */
static int agent__check(agent_flags *o, opt_state *st) {
  agent_opts *a = &o->opts;
  if (a->name && strlen(a->name) > 200)
    return opt_fail(st, opt_origin(st, "name"), "longer than 200 bytes");
  if (a->role == AGENT_ROLE_TRAINER && !bcast_preset_find(a->preset))
    return opt_fail(st, opt_origin(st, "preset"), "unknown preset \"%s\" (want 100m, 1b, 4b, 8b)",
                    a->preset);
  if (a->role == AGENT_ROLE_INFERENCE && a->tp_rank >= (a->tp_size > 1 ? a->tp_size : 1))
    return opt_fail(st, opt_origin(st, "tp_rank"), "%u is not below --tp-size %u", a->tp_rank,
                    a->tp_size);
  if (a->role == AGENT_ROLE_INFERENCE && a->tp_size > 1 && !bcast_preset_find(a->preset))
    return opt_fail(st, opt_origin(st, "preset"), "unknown preset \"%s\" (want 100m, 1b, 4b, 8b)",
                    a->preset);
  if (a->token_file) {
    /* Read here, once, so a bad file is a usage error naming its origin; the
     * agent is handed the token itself. */
    char terr[512];
    if (rpc_token_read(a->token_file, o->token, sizeof o->token, terr, sizeof terr))
      return opt_fail(st, opt_origin(st, "token_file"), "%s", terr);
    a->token = o->token;
  }
  /* Unreadable TLS files are usage errors naming where they were set, not a
   * connection that fails later. */
  const char *const tls[][2] = {{"tls_ca_file", a->tls_ca_file},
                                {"tls_client_cert_file", a->tls_client_cert_file},
                                {"tls_client_key_file", a->tls_client_key_file}};
  for (size_t i = 0; i < sizeof tls / sizeof tls[0]; i++) {
    if (!tls[i][1]) continue;
    FILE *f = fopen(tls[i][1], "rb");
    if (!f)
      return opt_fail(st, opt_origin(st, tls[i][0]), "cannot read \"%s\": %s", tls[i][1], strerror(errno));
    fclose(f);
  }
  if (!a->tls_client_cert_file != !a->tls_client_key_file) {
    const char *set = a->tls_client_cert_file ? "tls_client_cert_file" : "tls_client_key_file";
    return opt_fail(st, opt_origin(st, set), "set without %s (give both or neither)",
                    a->tls_client_cert_file ? "--tls-client-key" : "--tls-client-cert");
  }
  /* The one check of these settings, the SDK's too; its field names are
   * this table's. */
  const char *field = NULL;
  bcast_err be = {0};
  bcast_systopo_config tc = {.node = a->node, .nics = a->nics, .nic_gbits = a->nic_gbits};
  if (bcast_systopo_config_check(&tc, &field, &be)) {
    size_t skip = strlen(field) + 2; /* "nics: " */
    return opt_fail(st, opt_origin(st, field), "%s", strlen(be.msg) > skip ? be.msg + skip : be.msg);
  }
  a->device_set = opt_is_set(st, "device");
  a->seed_set = opt_is_set(st, "seed");
  char err[256];
  if (agent_opts_check(a, err, sizeof err)) return opt_fail(st, "settings", "%s", err);
  return 0;
}

int agent_flags_parse(agent_role role, int argc, char **argv, char **envp, agent_flags *o,
                      char *err, size_t errlen) {
  const opt_cmd *cmd = agent__cmd(role);
  agent__defaults(role, o);
  opt_state *st = malloc(sizeof *st);
  if (!st || opt_own(cmd, o)) {
    free(st);
    snprintf(err, errlen, "rlorch %s: out of memory", cmd->name);
    return -1;
  }
  int rc = opt_parse(cmd, o, argc, argv, envp, st);
  o->help = st->help;
  if (rc == 0 && o->help) rc = 1;
  else if (rc == 0) rc = agent__check(o, st);
  if (rc < 0) snprintf(err, errlen, "%s", st->err);
  free(st);
  return rc;
}
