/* rpc codec: protobuf-c <-> grpc byte buffers, the method table, bearer
 * tokens, clocks, status names, and gRPC's start-up. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/support/time.h>

#include "rpc/rpc_internal.h"

/* Debian builds Abseil without NDEBUG, so every absl::Mutex that gRPC takes
 * also updates a lock-order graph (deadlock detection, GraphCycles): 5% of
 * the daemon's CPU under load. Abseil has no environment variable or flag
 * for it, only absl::SetMutexDeadlockDetectionMode(OnDeadlockCycle), a C++
 * function; its symbol is looked up by its mangled name in the Abseil of
 * Debian 12 (inline namespace debian3; kIgnore is 0). Another build's name
 * differs and is not found: detection then stays as that build set it. */
#define RPC__ABSL_DEADLOCK_MODE "_ZN4absl7debian329SetMutexDeadlockDetectionModeENS0_15OnDeadlockCycleE"

static int rpc__absl_quiet_rc = -1;

static void rpc__absl_quiet(void) {
  void *sym = dlsym(RTLD_DEFAULT, RPC__ABSL_DEADLOCK_MODE);
  if (!sym) return;
  void (*set_mode)(int) = NULL;
  memcpy(&set_mode, &sym, sizeof set_mode); /* ISO C has no object-to-function cast */
  set_mode(0);
  rpc__absl_quiet_rc = 0;
}

int rpc__init(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, rpc__absl_quiet);
  grpc_init();
  return rpc__absl_quiet_rc;
}

grpc_byte_buffer *rpc__encode(const ProtobufCMessage *msg) {
  size_t len = protobuf_c_message_get_packed_size(msg);
  grpc_slice sl = grpc_slice_malloc(len);
  protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(sl));
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  return bb;
}

int rpc__flatten(grpc_byte_buffer *bb, uint8_t **out, size_t *len) {
  grpc_byte_buffer_reader rd;
  *out = NULL;
  *len = 0;
  if (!bb || !grpc_byte_buffer_reader_init(&rd, bb)) return -1;
  grpc_slice sl = grpc_byte_buffer_reader_readall(&rd);
  grpc_byte_buffer_reader_destroy(&rd);
  size_t n = GRPC_SLICE_LENGTH(sl);
  uint8_t *p = malloc(n ? n : 1);
  if (!p) {
    grpc_slice_unref(sl);
    return -1;
  }
  if (n) memcpy(p, GRPC_SLICE_START_PTR(sl), n);
  grpc_slice_unref(sl);
  *out = p;
  *len = n;
  return 0;
}

/* protobuf-c 1.4 reads a tag of field number 0 when it is spelled in more
 * than one byte ("80 00"), which the protobuf encoding does not allow, keeps
 * it as an unknown field, and writes it back in one byte ("00"), which it
 * refuses to read. A message holding one would be kept in a form that never
 * decodes again (StartRun stores the spec packed, unknown fields included:
 * GetRun and ListRuns then failed on it for good), so it does not decode. */
static int rpc__tags_valid(const ProtobufCMessage *m) {
  for (unsigned i = 0; i < m->n_unknown_fields; i++)
    if (m->unknown_fields[i].tag == 0) return 0;
  const ProtobufCMessageDescriptor *d = m->descriptor;
  const char *base = (const char *)m;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = *(const size_t *)(base + f->quantifier_offset);
      ProtobufCMessage *const *v = *(ProtobufCMessage *const *const *)(base + f->offset);
      for (size_t k = 0; k < n; k++)
        if (v[k] && !rpc__tags_valid(v[k])) return 0;
      continue;
    }
    /* The members of a oneof share their storage: only the set one is a message. */
    if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
        *(const uint32_t *)(base + f->quantifier_offset) != f->id)
      continue;
    const ProtobufCMessage *sub = *(ProtobufCMessage *const *)(base + f->offset);
    if (sub && !rpc__tags_valid(sub)) return 0;
  }
  return 1;
}

ProtobufCMessage *rpc_unpack(const ProtobufCMessageDescriptor *desc, const uint8_t *data,
                             size_t len) {
  ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, len, data);
  if (m && !rpc__tags_valid(m)) {
    protobuf_c_message_free_unpacked(m, NULL);
    return NULL;
  }
  return m;
}

static int rpc__varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  *v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (*p >= end) return -1;
    uint8_t b = *(*p)++;
    *v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) return 0;
  }
  return -1;
}

int rpc_wire_count(const uint8_t *data, size_t len, const uint32_t *path, size_t depth,
                   uint64_t *count) {
  if (depth == 0) return -1;
  const uint8_t *p = data, *end = data + len;
  while (p < end) {
    uint64_t tag, v;
    if (rpc__varint(&p, end, &tag)) return -1;
    uint64_t field = tag >> 3;
    const uint8_t *body = p;
    size_t blen = 0;
    switch (tag & 7) {
    case 0: if (rpc__varint(&p, end, &v)) return -1; break;
    case 1: if (end - p < 8) return -1; p += 8; break;
    case 5: if (end - p < 4) return -1; p += 4; break;
    case 2:
      if (rpc__varint(&p, end, &v) || v > (uint64_t)(end - p)) return -1;
      body = p;
      blen = (size_t)v;
      p += v;
      break;
    default: return -1; /* groups are not proto3 */
    }
    if (field != path[0]) continue;
    if (depth == 1) {
      (*count)++;
    } else {
      if ((tag & 7) != 2) return -1;
      if (rpc_wire_count(body, blen, path + 1, depth - 1, count)) return -1;
    }
  }
  return 0;
}

ProtobufCMessage *rpc__decode(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc) {
  uint8_t *p;
  size_t n;
  if (rpc__flatten(bb, &p, &n) < 0) return NULL;
  ProtobufCMessage *m = rpc_unpack(desc, p, n);
  free(p);
  return m;
}

/* The comparison runs over the whole presented value whatever the token, so
 * its duration says nothing about how many leading bytes matched. */
int rpc__check_bearer(const char *value, size_t len, const char *token) {
  static const char prefix[] = "Bearer ";
  size_t plen = sizeof prefix - 1, tlen = strlen(token);
  if (len < plen || strncasecmp(value, prefix, plen) != 0) return -1;
  value += plen;
  len -= plen;
  unsigned char diff = (unsigned char)(len != tlen);
  for (size_t i = 0; i < len; i++) diff |= (unsigned char)(value[i] ^ token[tlen ? i % tlen : 0]);
  return diff == 0 && tlen > 0 ? 0 : -1;
}

double rpc__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

gpr_timespec rpc__deadline(double timeout_s) {
  if (timeout_s <= 0) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
  int64_t ms = (int64_t)(timeout_s * 1e3);
  if (ms < 1) ms = 1;
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

/* ---- method table ------------------------------------------------------------ */

static int rpc__entry_cmp(const void *a, const void *b) {
  return strcmp(((const rpc__entry *)a)->m.name, ((const rpc__entry *)b)->m.name);
}

/* "/pkg.Service/Method": a leading slash, a service, a slash, a method. */
static int rpc__name_valid(const char *name) {
  if (!name || name[0] != '/') return 0;
  const char *slash = strrchr(name, '/');
  return slash > name + 1 && slash[1] != '\0';
}

int rpc__table_init(rpc__table *t, const rpc_method *m, size_t n, char *err, size_t errlen) {
  t->n = 0;
  t->e = calloc(n ? n : 1, sizeof *t->e);
  if (!t->e) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  for (size_t i = 0; i < n; i++) {
    if (!rpc__name_valid(m[i].name)) {
      snprintf(err, errlen, "method %zu: bad name '%s' (want /package.Service/Method)", i,
               m[i].name ? m[i].name : "(null)");
      goto fail;
    }
    if (!m[i].request || !m[i].response || !m[i].handler ||
        (m[i].kind != RPC_UNARY && m[i].kind != RPC_SERVER_STREAM && m[i].kind != RPC_ONEWAY_STREAM)) {
      snprintf(err, errlen, "method %s: needs request, response, handler and a kind", m[i].name);
      goto fail;
    }
    t->e[i].m = m[i];
    t->e[i].m.name = strdup(m[i].name);
    t->n++;
    if (!t->e[i].m.name) {
      snprintf(err, errlen, "out of memory");
      goto fail;
    }
  }
  qsort(t->e, t->n, sizeof *t->e, rpc__entry_cmp);
  for (size_t i = 1; i < t->n; i++)
    if (!strcmp(t->e[i].m.name, t->e[i - 1].m.name)) {
      snprintf(err, errlen, "method %s registered twice", t->e[i].m.name);
      goto fail;
    }
  return 0;
fail:
  rpc__table_free(t);
  return -1;
}

rpc__entry *rpc__table_find(const rpc__table *t, const char *name, size_t len) {
  size_t lo = 0, hi = t->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const char *k = t->e[mid].m.name;
    size_t klen = strlen(k);
    int c = memcmp(k, name, klen < len ? klen : len);
    if (c == 0) c = klen < len ? -1 : klen > len ? 1 : 0;
    if (c == 0) return &t->e[mid];
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

void rpc__table_free(rpc__table *t) {
  for (size_t i = 0; i < t->n; i++) free((char *)t->e[i].m.name);
  free(t->e);
  t->e = NULL;
  t->n = 0;
}

const char *rpc_status_name(grpc_status_code code) {
  static const char *const names[] = {
      "OK",           "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",    "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL",      "UNAVAILABLE",       "DATA_LOSS",
      "UNAUTHENTICATED"};
  if ((int)code >= 0 && (size_t)code < sizeof names / sizeof names[0]) return names[code];
  return "INVALID_STATUS";
}
