/* The SDK's options and tensors: every check the caller's input gets before
 * a worker exists, each failure naming the field. */
#include <math.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/sdk/sdk_internal.h"

_Static_assert((int)RLORCH_DTYPE_FP32 == (int)BCAST_DTYPE_FP32, "dtype values");
_Static_assert((int)RLORCH_DTYPE_BF16 == (int)BCAST_DTYPE_BF16, "dtype values");
_Static_assert((int)RLORCH_DTYPE_FP16 == (int)BCAST_DTYPE_FP16, "dtype values");
_Static_assert((int)RLORCH_DTYPE_U16 == (int)BCAST_DTYPE_U16, "dtype values");
_Static_assert((int)RLORCH_RES_GPU == (int)BCAST_RES_GPU, "residency values");
_Static_assert((int)RLORCH_RES_HOST_PINNED == (int)BCAST_RES_HOST_PINNED, "residency values");
_Static_assert((int)RLORCH_RES_HOST_PAGEABLE == (int)BCAST_RES_HOST_PAGEABLE, "residency values");
_Static_assert(RLORCH_NAME_MAX + 1 == BCAST_NAME_MAX, "name length");
_Static_assert(RLORCH_MAX_DIMS == BCAST_MAX_DIMS, "dimensions");

rlorch_status sdk_fail(rlorch_error *err, rlorch_status code, const char *fmt, ...) {
  if (!err) return code;
  err->code = code;
  va_list ap;
  va_start(ap, fmt);
  /* The analyser, inlining this into its callers, loses the va_start above. */
  vsnprintf(err->message, sizeof err->message, fmt, ap); /* NOLINT(clang-analyzer-valist.Uninitialized) */
  va_end(ap);
  return code;
}

_Static_assert((int)RLORCH_PART_WHOLE == (int)BCAST_PART_WHOLE, "part kinds");
_Static_assert((int)RLORCH_PART_SLICE == (int)BCAST_PART_SLICE, "part kinds");
_Static_assert((int)RLORCH_PART_NONE == (int)BCAST_PART_NONE, "part kinds");

/* The struct's size as each API version laid it out: version 1 ended at
 * broadcast_ud, version 2 at shards, version 3 at nparts, version 4 (this
 * header) at its end. */
#define SDK__V1_SIZE (offsetof(rlorch_options, broadcast_ud) + sizeof(void *))
#define SDK__V2_SIZE (offsetof(rlorch_options, shards) + sizeof(void *))
#define SDK__V3_SIZE (offsetof(rlorch_options, nparts) + sizeof(size_t))
_Static_assert(offsetof(rlorch_options, token) >= SDK__V1_SIZE, "version 2 fields follow version 1's");
_Static_assert(offsetof(rlorch_options, parts) >= SDK__V2_SIZE, "version 3 fields follow version 2's");
_Static_assert(offsetof(rlorch_options, node) >= SDK__V3_SIZE, "version 4 fields follow version 3's");

/* The bytes of the options a caller of API `version` has. */
static size_t sdk__version_size(uint32_t version) {
  return version == 1   ? SDK__V1_SIZE
         : version == 2 ? SDK__V2_SIZE
         : version == 3 ? SDK__V3_SIZE
                        : sizeof(rlorch_options);
}

/* The API version of a caller's struct of `size` bytes (0: not one). */
static uint32_t sdk__size_version(size_t size) {
  return size < SDK__V1_SIZE   ? 0
         : size < SDK__V2_SIZE ? 1
         : size < SDK__V3_SIZE ? 2
         : size < sizeof(rlorch_options) ? 3
                                         : RLORCH_API_VERSION;
}

SDK__EXPORT void rlorch_options_init(rlorch_options *o, size_t size, rlorch_role role) {
  if (!o) return;
  /* Version 1 is the first layout: a caller's struct is at least that long,
   * or it is not one (then api_version stays 0 and rlorch_create says so).
   * A caller built against an older header gets that version's fields and
   * number; no byte past `size` is written. */
  memset(o, 0, size < sizeof *o ? size : sizeof *o);
  if (size < SDK__V1_SIZE) return;
  o->api_version = sdk__size_version(size);
  o->role = role;
  o->device = -1;
  o->max_concurrent_requests = 8; /* the orchestrator's default max_requests_per_worker */
  o->connect_timeout_s = 30;
  o->log_level = RLORCH_LOG_INFO;
}

static int sdk__dup(const char *s, char **out) {
  *out = NULL;
  if (!s) return 0;
  *out = strdup(s);
  return *out ? 0 : -1;
}

static const char *sdk__dtype(int d) {
  const char *n = bcast_dtype_name((bcast_dtype)d);
  return n ? n : "?";
}

/* One tensor of the caller's, converted; i is its index. Checked here: what
 * the conversion needs (pointers, the name's length, ndim before the shape
 * is copied) and the SDK's own rules (an engine's buffers hold the wire
 * dtype, GPU tensors on the worker's device); every rule of a manifest is
 * bcast_manifest_check's, the orchestrator's own, afterwards. */
static rlorch_status sdk__tensor(const rlorch_worker *w, const rlorch_tensor *in, size_t i,
                                 bcast_tensor *out, rlorch_error *err) {
  if (!in->name) return sdk_fail(err, RLORCH_E_INVALID, "options.tensors[%zu].name: NULL", i);
  const char *nm = in->name;
  if (strlen(nm) > RLORCH_NAME_MAX)
    return sdk_fail(err, RLORCH_E_INVALID, "options.tensors[%zu].name: %zu bytes, more than %d", i,
                    strlen(nm), RLORCH_NAME_MAX);
  if (in->ndim < 1 || in->ndim > RLORCH_MAX_DIMS)
    return sdk_fail(err, RLORCH_E_INVALID, "options.tensors[%zu] '%s': ndim %u is outside 1..%d", i,
                    nm, in->ndim, RLORCH_MAX_DIMS);
  if (!in->shape)
    return sdk_fail(err, RLORCH_E_INVALID, "options.tensors[%zu] '%s': shape is NULL", i, nm);
  if (w->ao.role == AGENT_ROLE_INFERENCE && in->storage_dtype != in->wire_dtype)
    return sdk_fail(err, RLORCH_E_INVALID,
                    "options.tensors[%zu] '%s': an inference worker's buffers hold the wire dtype "
                    "(%s), not %s", i, nm, sdk__dtype(in->wire_dtype), sdk__dtype(in->storage_dtype));
  if (in->residency == RLORCH_RES_GPU && w->device < 0)
    return sdk_fail(err, RLORCH_E_INVALID,
                    "options.tensors[%zu] '%s': GPU-resident, but options.device is -1 (none)", i,
                    nm);
  if (in->residency == RLORCH_RES_GPU && in->device != w->device)
    return sdk_fail(err, RLORCH_E_INVALID,
                    "options.tensors[%zu] '%s': on GPU %d, but the worker uses options.device %d",
                    i, nm, in->device, w->device);
  if (!in->data)
    return sdk_fail(err, RLORCH_E_INVALID, "options.tensors[%zu] '%s': data is NULL", i, nm);
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "%s", nm);
  out->layer = in->layer;
  out->storage_dtype = (bcast_dtype)in->storage_dtype;
  out->wire_dtype = (bcast_dtype)in->wire_dtype;
  out->ndim = in->ndim;
  memcpy(out->shape, in->shape, in->ndim * sizeof *in->shape);
  out->residency = (bcast_residency)in->residency;
  out->device = in->residency == RLORCH_RES_GPU ? in->device : -1;
  out->data = in->data;
  return RLORCH_OK;
}

static rlorch_status sdk__tensors(rlorch_worker *w, const rlorch_options *o,
                                  const rlorch_shard *shards, rlorch_error *err) {
  if (o->ntensors && !o->tensors)
    return sdk_fail(err, RLORCH_E_INVALID, "options.tensors: NULL with ntensors %zu", o->ntensors);
  if (o->ntensors == 0 && w->ao.role == AGENT_ROLE_TRAINER)
    return sdk_fail(err, RLORCH_E_INVALID, "options.tensors: a trainer needs at least one tensor");
  w->t = calloc(o->ntensors ? o->ntensors : 1, sizeof *w->t);
  if (!w->t) return sdk_fail(err, RLORCH_E_NOMEM, "no memory for %zu tensors", o->ntensors);
  w->n = o->ntensors;
  for (size_t i = 0; i < w->n; i++) {
    rlorch_status rc = sdk__tensor(w, &o->tensors[i], i, &w->t[i], err);
    if (rc) return rc;
  }
  /* The orchestrator's rules, with its default limits (it may be configured
   * tighter: then Register says so). Its messages number tensors #i, as
   * options.tensors[i]. */
  bcast_err be = {0};
  int rc = bcast_manifest_check(w->t, w->n, NULL, &be);
  if (rc)
    return sdk_fail(err, rc == BCAST_ENOMEM ? RLORCH_E_NOMEM : RLORCH_E_INVALID, "options.tensors: %s",
                    be.msg);
  /* A rank's parts: inside their tensors, none empty. Whether the ranks
   * tile each tensor only the orchestrator, which hears from every rank,
   * can tell. */
  for (size_t i = 0; shards && i < w->n; i++) {
    const rlorch_shard *sh = &shards[i];
    uint64_t e = bcast_tensor_elems(&w->t[i]), end;
    if (sh->element_count == 0)
      return sdk_fail(err, RLORCH_E_INVALID, "options.shards[%zu] '%s': element_count 0 (a rank that "
                      "holds none of a tensor leaves it out of options.tensors)", i, w->t[i].name);
    if (__builtin_add_overflow(sh->element_offset, sh->element_count, &end) || end > e)
      return sdk_fail(err, RLORCH_E_INVALID, "options.shards[%zu] '%s': elements [%llu, %llu + %llu) are "
                      "past the tensor's end (%llu elements)", i, w->t[i].name,
                      (unsigned long long)sh->element_offset, (unsigned long long)sh->element_offset,
                      (unsigned long long)sh->element_count, (unsigned long long)e);
    w->t[i].shard_offset = sh->element_offset;
    w->t[i].shard_elems = sh->element_count;
  }
  return RLORCH_OK;
}

/* The fields of API version 2 (zero, their defaults, for a version 1 caller). */
static rlorch_status sdk__check_v2(const rlorch_options *o, rlorch_error *err) {
  int trainer = o->role == RLORCH_ROLE_TRAINER;
  if (o->token && o->token_file)
    return sdk_fail(err, RLORCH_E_INVALID, "options.token and options.token_file are both set (one or neither)");
  if (o->token && (!o->token[0] || strlen(o->token) >= AGENT_TOKEN_MAX))
    return sdk_fail(err, RLORCH_E_INVALID, "options.token: %zu bytes, not 1..%d", strlen(o->token),
                    AGENT_TOKEN_MAX - 1);
  if (o->model && (!trainer || strlen(o->model) > RLORCH_NAME_MAX))
    return sdk_fail(err, RLORCH_E_INVALID, "options.model: %s", trainer ? "more than 127 bytes"
                    : "only a trainer names its model");
  if ((int)o->offload < RLORCH_OFFLOAD_UNSET || o->offload > RLORCH_OFFLOAD_PARAMS_OPTIMIZER)
    return sdk_fail(err, RLORCH_E_INVALID, "options.offload: unknown value %d", (int)o->offload);
  if (o->offload && !trainer)
    return sdk_fail(err, RLORCH_E_INVALID, "options.offload: only a trainer offloads");
  if ((o->held_run_id || o->held_version) && !trainer)
    return sdk_fail(err, RLORCH_E_INVALID, "options.held_run_id: only a trainer restores weights");
  if (o->held_version && (!o->held_run_id || !o->held_run_id[0]))
    return sdk_fail(err, RLORCH_E_INVALID, "options.held_version: %llu without options.held_run_id",
                    (unsigned long long)o->held_version);
  if (o->held_run_id && strlen(o->held_run_id) > RLORCH_NAME_MAX)
    return sdk_fail(err, RLORCH_E_INVALID, "options.held_run_id: more than 127 bytes");
  if (o->on_bind && trainer)
    return sdk_fail(err, RLORCH_E_INVALID, "options.on_bind: a trainer sends its own tensors");
  if ((o->trainer_rank || o->trainer_ranks || o->shards) && !trainer)
    return sdk_fail(err, RLORCH_E_INVALID, "options.%s: only a trainer has ranks",
                    o->shards ? "shards" : o->trainer_ranks ? "trainer_ranks" : "trainer_rank");
  if (o->trainer_ranks > 1024)
    return sdk_fail(err, RLORCH_E_INVALID, "options.trainer_ranks: %u is outside 0..1024",
                    o->trainer_ranks);
  if (o->trainer_rank >= (o->trainer_ranks ? o->trainer_ranks : 1))
    return sdk_fail(err, RLORCH_E_INVALID, "options.trainer_rank: %u is not below options.trainer_ranks "
                    "%u%s", o->trainer_rank, o->trainer_ranks,
                    o->trainer_ranks ? "" : " (0: a lone trainer, rank 0)");
  if (o->shards && o->trainer_ranks <= 1)
    return sdk_fail(err, RLORCH_E_INVALID, "options.shards: set with options.trainer_ranks %u (a lone "
                    "trainer sends whole tensors)", o->trainer_ranks);
  if (o->on_bind && o->ntensors)
    return sdk_fail(err, RLORCH_E_INVALID, "options.on_bind: set with %zu options.tensors (on_bind "
                    "chooses every broadcast's memory: leave the tensors empty)", o->ntensors);
  return RLORCH_OK;
}

/* The fields of API version 3 (zero for older callers): each part on its
 * own, then against the caller's tensors of its name. What only the
 * trainer's manifest can tell (a tensor it lacks, a slice past its shape
 * when the caller gave no tensors) the orchestrator refuses at Register. */
static rlorch_status sdk__check_v3(const rlorch_options *o, rlorch_error *err) {
  if (!o->nparts && !o->parts) return RLORCH_OK;
  if (o->role != RLORCH_ROLE_INFERENCE)
    return sdk_fail(err, RLORCH_E_INVALID, "options.parts: only an inference worker holds parts "
                    "(a trainer rank's part is options.shards)");
  if (!o->parts)
    return sdk_fail(err, RLORCH_E_INVALID, "options.parts: NULL with nparts %zu", o->nparts);
  if (o->nparts > BCAST_MAX_TENSORS)
    return sdk_fail(err, RLORCH_E_INVALID, "options.nparts: %zu, more than a plan's tensors", o->nparts);
  for (size_t i = 0; i < o->nparts; i++) {
    const rlorch_part *pt = &o->parts[i];
    if (!pt->name || !pt->name[0])
      return sdk_fail(err, RLORCH_E_INVALID, "options.parts[%zu].name: %s", i,
                      pt->name ? "empty" : "NULL");
    const char *nm = pt->name;
    if (strlen(nm) > RLORCH_NAME_MAX)
      return sdk_fail(err, RLORCH_E_INVALID, "options.parts[%zu].name: %zu bytes, more than %d", i,
                      strlen(nm), RLORCH_NAME_MAX);
    for (size_t j = 0; j < i; j++)
      if (!strcmp(o->parts[j].name, nm))
        return sdk_fail(err, RLORCH_E_INVALID, "options.parts[%zu] '%s': listed twice (also "
                        "options.parts[%zu])", i, nm, j);
    if ((int)pt->kind < RLORCH_PART_WHOLE || pt->kind > RLORCH_PART_NONE)
      return sdk_fail(err, RLORCH_E_INVALID, "options.parts[%zu] '%s'.kind: unknown value %d", i, nm,
                      (int)pt->kind);
    if (pt->kind != RLORCH_PART_SLICE) {
      if (pt->dim || pt->start || pt->count)
        return sdk_fail(err, RLORCH_E_INVALID, "options.parts[%zu] '%s': dim, start and count are "
                        "a SLICE's; a %s part leaves them 0", i, nm,
                        pt->kind == RLORCH_PART_WHOLE ? "WHOLE" : "NONE");
      continue;
    }
    uint64_t end;
    if (pt->dim >= RLORCH_MAX_DIMS)
      return sdk_fail(err, RLORCH_E_INVALID, "options.parts[%zu] '%s'.dim: %u, a tensor has at most "
                      "%d dimensions", i, nm, pt->dim, RLORCH_MAX_DIMS);
    if (pt->count == 0)
      return sdk_fail(err, RLORCH_E_INVALID, "options.parts[%zu] '%s'.count: 0; a slice holds at "
                      "least one index (a worker that holds none of a tensor says NONE)", i, nm);
    if (__builtin_add_overflow(pt->start, pt->count, &end))
      return sdk_fail(err, RLORCH_E_INVALID, "options.parts[%zu] '%s'.start: %llu + count %llu "
                      "overflows", i, nm, (unsigned long long)pt->start,
                      (unsigned long long)pt->count);
  }
  return RLORCH_OK;
}

/* The fields of API version 4 (zero, detected, for older callers): the
 * engine's one check of them, as `rlorch trainer --node` gets it. */
static rlorch_status sdk__topo_config(const rlorch_options *o, bcast_systopo_config *c,
                                      rlorch_error *err) {
  *c = (bcast_systopo_config){.node = o->node, .nics = o->nics, .nic_gbits = o->nic_gbits};
  const char *field = NULL;
  bcast_err be = {0};
  if (bcast_systopo_config_check(c, &field, &be))
    return sdk_fail(err, RLORCH_E_INVALID, "options.%s", be.msg); /* "nics: ..." */
  return RLORCH_OK;
}

/* options.parts against the caller's tensors (converted in w->t): a part's
 * tensor given has room for it in its shape; a NONE part's is not given (the
 * worker holds nothing of it). Then the parts are kept on w->t (what the
 * plan's view must equal) and copied for Register. */
static rlorch_status sdk__parts(rlorch_worker *w, const rlorch_part *parts, size_t n,
                                rlorch_error *err) {
  if (!n) return RLORCH_OK;
  w->parts = calloc(n, sizeof *w->parts);
  w->part_names = calloc(n, sizeof *w->part_names);
  if (!w->parts || !w->part_names) return sdk_fail(err, RLORCH_E_NOMEM, "no memory for %zu parts", n);
  w->nparts = n;
  for (size_t i = 0; i < n; i++) {
    const rlorch_part *pt = &parts[i];
    if (!(w->part_names[i] = strdup(pt->name)))
      return sdk_fail(err, RLORCH_E_NOMEM, "no memory for %zu parts", n);
    w->parts[i] = (bcast_part_spec){.name = w->part_names[i],
                                    .part = {.kind = (int)pt->kind, .dim = pt->dim,
                                             .start = pt->start, .count = pt->count}};
    bcast_tensor *t = NULL;
    size_t ti = 0;
    for (size_t j = 0; w->t && j < w->n && !t; j++)
      if (!strcmp(w->t[j].name, w->part_names[i])) t = &w->t[ti = j];
    if (!t && w->n && pt->kind != RLORCH_PART_NONE)
      return sdk_fail(err, RLORCH_E_INVALID, "options.parts[%zu] '%s': no options.tensors of that "
                      "name holds it (a worker that places its tensors gives each part's tensor)",
                      i, pt->name);
    if (!t) continue;
    if (pt->kind == RLORCH_PART_NONE)
      return sdk_fail(err, RLORCH_E_INVALID, "options.parts[%zu] '%s': NONE, but options.tensors[%zu] "
                      "holds it (leave a tensor held NONE out of options.tensors)", i, pt->name, ti);
    if (pt->kind == RLORCH_PART_SLICE && pt->dim >= t->ndim)
      return sdk_fail(err, RLORCH_E_INVALID, "options.parts[%zu] '%s'.dim: %u, but options.tensors[%zu] "
                      "has %u dimensions", i, pt->name, pt->dim, ti, t->ndim);
    if (pt->kind == RLORCH_PART_SLICE && pt->start + pt->count > t->shape[pt->dim])
      return sdk_fail(err, RLORCH_E_INVALID, "options.parts[%zu] '%s': indices [%llu, %llu) along dim "
                      "%u are past options.tensors[%zu]'s shape[%u] %llu", i, pt->name,
                      (unsigned long long)pt->start, (unsigned long long)(pt->start + pt->count),
                      pt->dim, ti, pt->dim, (unsigned long long)t->shape[pt->dim]);
    t->part = w->parts[i].part;
  }
  return RLORCH_OK;
}

rlorch_status sdk_opts_take(rlorch_worker *w, const rlorch_options *o, rlorch_error *err) {
  if (o->api_version == 0)
    return sdk_fail(err, RLORCH_E_VERSION,
                    "options.api_version: 0 (fill the options with rlorch_options_init)");
  if (o->api_version > RLORCH_API_VERSION)
    return sdk_fail(err, RLORCH_E_VERSION,
                    "options.api_version: %u is newer than this library's API version %d",
                    o->api_version, RLORCH_API_VERSION);
  /* Only the fields of the caller's version are read: an older caller's
   * struct ends there; the later ones keep their defaults (zero). */
  memset(&w->so.o, 0, sizeof w->so.o);
  memcpy(&w->so.o, o, sdk__version_size(o->api_version));
  const rlorch_options *v = &w->so.o; /* every field, those of later versions defaulted */
  if (o->role != RLORCH_ROLE_TRAINER && o->role != RLORCH_ROLE_INFERENCE)
    return sdk_fail(err, RLORCH_E_INVALID,
                    "options.role: %d is neither RLORCH_ROLE_TRAINER (1) nor RLORCH_ROLE_INFERENCE (2)",
                    (int)o->role);
  if (!o->orchestrator || !o->orchestrator[0])
    return sdk_fail(err, RLORCH_E_INVALID, "options.orchestrator: required (host:port)");
  if (!o->tls_cert_file != !o->tls_key_file)
    return sdk_fail(err, RLORCH_E_INVALID, "options.%s is set without options.%s (both or neither)",
                    o->tls_cert_file ? "tls_cert_file" : "tls_key_file",
                    o->tls_cert_file ? "tls_key_file" : "tls_cert_file");
  if (o->role == RLORCH_ROLE_INFERENCE &&
      (o->max_concurrent_requests < 1 || o->max_concurrent_requests > 1024))
    return sdk_fail(err, RLORCH_E_INVALID,
                    "options.max_concurrent_requests: %u is outside 1..1024", o->max_concurrent_requests);
  if (!(o->connect_timeout_s > 0))
    return sdk_fail(err, RLORCH_E_INVALID, "options.connect_timeout_s: %g is not a positive number",
                    o->connect_timeout_s);
  if (o->log_level < RLORCH_LOG_DEBUG || o->log_level > RLORCH_LOG_ERROR)
    return sdk_fail(err, RLORCH_E_INVALID, "options.log_level: %d is outside 0..3", (int)o->log_level);
  if (o->device < -1)
    return sdk_fail(err, RLORCH_E_INVALID, "options.device: %d (a CUDA device index, or -1)",
                    o->device);
  bcast_systopo_config topo = {0};
  rlorch_status rc = sdk__check_v2(v, err);
  if (!rc) rc = sdk__check_v3(v, err);
  if (!rc) rc = sdk__topo_config(v, &topo, err);
  if (rc) return rc;
  sdk_opts *so = &w->so;
  if (sdk__dup(o->orchestrator, &so->orchestrator) || sdk__dup(o->name, &so->name) ||
      sdk__dup(o->token_file, &so->token_file) || sdk__dup(o->tls_ca_file, &so->tls_ca_file) ||
      sdk__dup(o->tls_cert_file, &so->tls_cert_file) ||
      sdk__dup(o->tls_key_file, &so->tls_key_file) || sdk__dup(o->data_listen, &so->data_listen) ||
      sdk__dup(v->token, &so->token) || sdk__dup(v->model, &so->model) ||
      sdk__dup(v->held_run_id, &so->held_run_id))
    return sdk_fail(err, RLORCH_E_NOMEM, "no memory for the options");
  so->o.tensors = NULL; /* converted into w->t below; the caller's array may go */
  const rlorch_shard *shards = so->o.shards; /* a version 1 caller's: NULL */
  so->o.shards = NULL;  /* the same */
  const rlorch_part *parts = so->o.parts; /* an older caller's: NULL */
  size_t nparts = so->o.nparts;
  so->o.parts = NULL;   /* copied into w->parts below */
  so->o.nparts = 0;
  agent_role role = o->role == RLORCH_ROLE_TRAINER ? AGENT_ROLE_TRAINER : AGENT_ROLE_INFERENCE;
  agent_opts_defaults(role, &w->ao);
  w->ao.orchestrator = so->orchestrator;
  w->ao.name = so->name;
  w->ao.token_file = so->token_file;
  w->ao.token = so->token;
  w->ao.tls_ca_file = so->tls_ca_file;
  w->ao.tls_client_cert_file = so->tls_cert_file;
  w->ao.tls_client_key_file = so->tls_key_file;
  w->ao.data_listen = so->data_listen;
  w->ao.device = o->device;
  w->ao.device_set = 1;
  w->ao.concurrency = o->max_concurrent_requests;
  char msg[512];
  if (agent_opts_check(&w->ao, msg, sizeof msg))
    return sdk_fail(err, RLORCH_E_INVALID, "options: %s", msg);
  bcast_caps_probe(&w->caps);
  if (o->device >= 0 && o->device >= w->caps.cuda_devices)
    return sdk_fail(err, RLORCH_E_INVALID, "options.device: %d: no such CUDA device (%d visible%s)",
                    o->device, w->caps.cuda_devices,
                    w->caps.cuda_built ? "" : "; this library is built without CUDA");
  w->device = o->device;
  bcast_caps_select_device(&w->caps, w->device);
  bcast_err be = {0};
  /* The node name is copied into the topology: the caller's may go. */
  if (bcast_systopo_configure(&w->caps.topo, &topo, NULL, &be))
    return sdk_fail(err, RLORCH_E_INVALID, "options.%s", be.msg);
  rc = sdk__tensors(w, o, shards, err);
  return rc ? rc : sdk__parts(w, parts, nparts, err);
}

void sdk_opts_free(rlorch_worker *w) {
  sdk_opts *so = &w->so;
  free(so->orchestrator);
  free(so->name);
  free(so->token_file);
  free(so->tls_ca_file);
  free(so->tls_cert_file);
  free(so->tls_key_file);
  free(so->data_listen);
  free(so->token);
  free(so->model);
  free(so->held_run_id);
  free(w->t);
  w->t = NULL;
  for (size_t i = 0; w->part_names && i < w->nparts; i++) free(w->part_names[i]);
  free(w->part_names);
  free(w->parts);
  w->part_names = NULL;
  w->parts = NULL;
  w->nparts = 0;
}
