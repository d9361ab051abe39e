/* Flags of `rlorch trainer` and `rlorch inference`: "--flag value" or
 * "--flag=value". No getopt: its global state would make repeated parses
 * (tests) order-dependent. */
#include "orchestrator/cli/agent_flags.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/bcast/bcast_preset.h"

static const char agent__usage_trainer[] =
    "usage: rlorch trainer --orchestrator ADDR [flags]\n"
    "\n"
    "Trainer worker agent: holds fp32 master weights of a model preset, takes a real\n"
    "AdamW step on each train command and sends the weight broadcast.\n"
    "\n"
    "  --orchestrator ADDR     orchestrator's gRPC address (host:port), required\n"
    "  --token-file F          file holding the bearer token\n"
    "  --name NAME             worker name (default: host name and pid)\n"
    "  --preset P              model preset: 100m, 1b, 4b, 8b (default 100m)\n"
    "  --layers N              keep only the first N decoder layers (default: all)\n"
    "  --offload O             none | params | params+optimizer (default none)\n"
    "  --device N              CUDA device, -1 for none (default 0 when a GPU exists)\n"
    "  --data-listen HOST:PORT host-transport listen address (default 127.0.0.1:0)\n"
    "  --threads N             CPU optimizer threads (default: one per core)\n"
    "  --seed N                seed of the initial weights (default 1)\n"
    "  --log-level L           debug | info | warn | error (default info)\n"
    "  --log-format F          logfmt | json (default logfmt)\n"
    "  --help                  this text\n";

static const char agent__usage_inference[] =
    "usage: rlorch inference --orchestrator ADDR [flags]\n"
    "\n"
    "Inference worker agent: generates synthetic rollouts with the policy version it\n"
    "holds and receives the weight broadcast.\n"
    "\n"
    "  --orchestrator ADDR     orchestrator's gRPC address (host:port), required\n"
    "  --token-file F          file holding the bearer token\n"
    "  --name NAME             worker name (default: host name and pid)\n"
    "  --device N              CUDA device, -1 for none (default 0 when a GPU exists)\n"
    "  --distribution D        lognormal | normal (default lognormal)\n"
    "  --tokens-mean X         mean tokens per rollout (default 256)\n"
    "  --tokens-std X          standard deviation of tokens (default 64)\n"
    "  --latency-ms-mean X     mean generation latency in ms (default 2)\n"
    "  --latency-ms-std X      standard deviation of the latency in ms (default 0.5)\n"
    "  --seed N                rollout generator seed (default: from the pid)\n"
    "  --log-level L           debug | info | warn | error (default info)\n"
    "  --log-format F          logfmt | json (default logfmt)\n"
    "  --help                  this text\n";

const char *agent_flags_usage(agent_role role) {
  return role == AGENT_ROLE_TRAINER ? agent__usage_trainer : agent__usage_inference;
}

static int agent__double(const char *s, double *out) {
  char *end;
  errno = 0;
  double d = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(d)) return -1;
  *out = d;
  return 0;
}

static int agent__int(const char *s, long long lo, long long hi, long long *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

static int agent__u64(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  if (*s == '-') return -1;
  unsigned long long v = strtoull(s, &end, 0);
  if (errno || end == s || *end) return -1;
  *out = v;
  return 0;
}

/* One flag with its value; returns 0 or -1 with err set. */
static int agent__apply(agent_flags *fl, const char *flag, const char *val, char *err,
                        size_t errlen) {
  agent_opts *o = &fl->opts;
  int tr = o->role == AGENT_ROLE_TRAINER, inf = o->role == AGENT_ROLE_INFERENCE;
  long long ll;
  if (!strcmp(flag, "--orchestrator")) {
    if (!*val) goto bad;
    o->orchestrator = val;
  } else if (!strcmp(flag, "--token-file")) {
    o->token_file = val;
  } else if (!strcmp(flag, "--name")) {
    if (!*val || strlen(val) > 200) goto bad;
    o->name = val;
  } else if (!strcmp(flag, "--device")) {
    if (agent__int(val, -1, 1023, &ll)) goto bad;
    o->device = (int)ll;
    o->device_set = 1;
  } else if (!strcmp(flag, "--seed")) {
    if (agent__u64(val, &o->seed)) goto bad;
    o->seed_set = 1;
  } else if (!strcmp(flag, "--log-level")) {
    if (log_level_parse(val, &fl->log_level)) goto bad;
  } else if (!strcmp(flag, "--log-format")) {
    if (log_format_parse(val, &fl->log_format)) goto bad;
  } else if (tr && !strcmp(flag, "--preset")) {
    if (!bcast_preset_find(val)) goto bad;
    o->preset = val;
  } else if (tr && !strcmp(flag, "--layers")) {
    if (agent__int(val, 0, 100000, &ll)) goto bad;
    o->max_layers = (uint32_t)ll;
  } else if (tr && !strcmp(flag, "--offload")) {
    if (!strcmp(val, "none")) o->offload = AGENT_OFFLOAD_NONE;
    else if (!strcmp(val, "params")) o->offload = AGENT_OFFLOAD_PARAMS;
    else if (!strcmp(val, "params+optimizer")) o->offload = AGENT_OFFLOAD_PARAMS_OPTIMIZER;
    else goto bad;
  } else if (tr && !strcmp(flag, "--data-listen")) {
    if (!*val || !strchr(val, ':')) goto bad;
    o->data_listen = val;
  } else if (tr && !strcmp(flag, "--threads")) {
    if (agent__int(val, 0, 1024, &ll)) goto bad;
    o->threads = (int)ll;
  } else if (inf && !strcmp(flag, "--distribution")) {
    if (agent_dist_parse(val, &o->rollout.dist)) goto bad;
  } else if (inf && !strcmp(flag, "--tokens-mean")) {
    if (agent__double(val, &o->rollout.tokens_mean)) goto bad;
  } else if (inf && !strcmp(flag, "--tokens-std")) {
    if (agent__double(val, &o->rollout.tokens_std)) goto bad;
  } else if (inf && !strcmp(flag, "--latency-ms-mean")) {
    if (agent__double(val, &o->rollout.latency_ms_mean)) goto bad;
  } else if (inf && !strcmp(flag, "--latency-ms-std")) {
    if (agent__double(val, &o->rollout.latency_ms_std)) goto bad;
  } else {
    snprintf(err, errlen, "unknown flag %s", flag);
    return -1;
  }
  return 0;
bad:
  snprintf(err, errlen, "%s: invalid value '%s'", flag, val);
  return -1;
}

int agent_flags_parse(agent_role role, int argc, char **argv, agent_flags *o, char *err,
                      size_t errlen) {
  memset(o, 0, sizeof *o);
  agent_opts_defaults(role, &o->opts);
  o->log_level = LOG_INFO;
  o->log_format = LOG_FORMAT_LOGFMT;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      o->help = 1;
      return 1;
    }
    if (strncmp(a, "--", 2) != 0 || !a[2]) {
      snprintf(err, errlen, "unexpected argument '%s'", a);
      return -1;
    }
    char flag[64];
    const char *eq = strchr(a, '='), *val;
    if (eq) {
      if ((size_t)(eq - a) >= sizeof flag) {
        snprintf(err, errlen, "unknown flag %.40s...", a);
        return -1;
      }
      memcpy(flag, a, (size_t)(eq - a));
      flag[eq - a] = 0;
      val = eq + 1;
    } else {
      snprintf(flag, sizeof flag, "%s", a);
      if (i + 1 >= argc) {
        snprintf(err, errlen, "%s needs a value", a);
        return -1;
      }
      val = argv[++i];
    }
    if (agent__apply(o, flag, val, err, errlen)) return -1;
  }
  return agent_opts_check(&o->opts, err, errlen);
}
