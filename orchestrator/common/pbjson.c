#include "orchestrator/common/pbjson.h"

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>
#include <strings.h>

static void json_string(FILE *f, const char *s, size_t n) {
  fputc('"', f);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    switch (c) {
    case '"': fputs("\\\"", f); break;
    case '\\': fputs("\\\\", f); break;
    case '\n': fputs("\\n", f); break;
    case '\r': fputs("\\r", f); break;
    case '\t': fputs("\\t", f); break;
    default:
      if (c < 0x20) fprintf(f, "\\u%04x", c);
      else fputc(c, f);
    }
  }
  fputc('"', f);
}

static void json_base64(FILE *f, const uint8_t *p, size_t n) {
  static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  fputc('"', f);
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16;
    if (i + 1 < n) v |= (uint32_t)p[i + 1] << 8;
    if (i + 2 < n) v |= p[i + 2];
    fputc(tbl[(v >> 18) & 63], f);
    fputc(tbl[(v >> 12) & 63], f);
    fputc(i + 1 < n ? tbl[(v >> 6) & 63] : '=', f);
    fputc(i + 2 < n ? tbl[v & 63] : '=', f);
  }
  fputc('"', f);
}

static void json_double(FILE *f, double d) {
  if (isnan(d)) fputs("\"NaN\"", f);
  else if (isinf(d)) fputs(d > 0 ? "\"Infinity\"" : "\"-Infinity\"", f);
  else fprintf(f, "%.17g", d);
}

static void json_value(FILE *f, const ProtobufCFieldDescriptor *fd, const void *p) {
  switch (fd->type) {
  case PROTOBUF_C_TYPE_INT32:
  case PROTOBUF_C_TYPE_SINT32:
  case PROTOBUF_C_TYPE_SFIXED32: fprintf(f, "%" PRId32, *(const int32_t *)p); break;
  case PROTOBUF_C_TYPE_UINT32:
  case PROTOBUF_C_TYPE_FIXED32: fprintf(f, "%" PRIu32, *(const uint32_t *)p); break;
  case PROTOBUF_C_TYPE_INT64:
  case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64: fprintf(f, "\"%" PRId64 "\"", *(const int64_t *)p); break;
  case PROTOBUF_C_TYPE_UINT64:
  case PROTOBUF_C_TYPE_FIXED64: fprintf(f, "\"%" PRIu64 "\"", *(const uint64_t *)p); break;
  case PROTOBUF_C_TYPE_FLOAT: json_double(f, *(const float *)p); break;
  case PROTOBUF_C_TYPE_DOUBLE: json_double(f, *(const double *)p); break;
  case PROTOBUF_C_TYPE_BOOL: fputs(*(const protobuf_c_boolean *)p ? "true" : "false", f); break;
  case PROTOBUF_C_TYPE_ENUM: {
    int v = *(const int *)p;
    const ProtobufCEnumValue *ev =
        protobuf_c_enum_descriptor_get_value((const ProtobufCEnumDescriptor *)fd->descriptor, v);
    if (ev) json_string(f, ev->name, strlen(ev->name));
    else fprintf(f, "%d", v);
    break;
  }
  case PROTOBUF_C_TYPE_STRING: {
    const char *s = *(char *const *)p;
    if (s) json_string(f, s, strlen(s));
    else fputs("\"\"", f);
    break;
  }
  case PROTOBUF_C_TYPE_BYTES: {
    const ProtobufCBinaryData *b = p;
    json_base64(f, b->data, b->len);
    break;
  }
  case PROTOBUF_C_TYPE_MESSAGE: {
    const ProtobufCMessage *m = *(ProtobufCMessage *const *)p;
    if (m) pbjson_write(f, m);
    else fputs("null", f);
    break;
  }
  }
}

static size_t elem_size(const ProtobufCFieldDescriptor *fd) {
  switch (fd->type) {
  case PROTOBUF_C_TYPE_INT64:
  case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64:
  case PROTOBUF_C_TYPE_UINT64:
  case PROTOBUF_C_TYPE_FIXED64:
  case PROTOBUF_C_TYPE_DOUBLE: return 8;
  case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
  case PROTOBUF_C_TYPE_ENUM: return sizeof(int);
  case PROTOBUF_C_TYPE_STRING:
  case PROTOBUF_C_TYPE_MESSAGE: return sizeof(void *);
  case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
  default: return 4;
  }
}

void pbjson_write(FILE *f, const ProtobufCMessage *m) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  const char *base = (const char *)m;
  int first = 1;
  fputc('{', f);
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *fd = &d->fields[i];
    const void *member = base + fd->offset;
    if (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
      if (*(const uint32_t *)(base + fd->quantifier_offset) != fd->id) continue;
    } else if (fd->type == PROTOBUF_C_TYPE_MESSAGE && fd->label != PROTOBUF_C_LABEL_REPEATED &&
               *(void *const *)member == NULL) {
      continue;
    }
    if (!first) fputc(',', f);
    first = 0;
    json_string(f, fd->name, strlen(fd->name));
    fputc(':', f);
    if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = *(const size_t *)(base + fd->quantifier_offset);
      const char *arr = *(char *const *)member;
      fputc('[', f);
      for (size_t k = 0; k < n; k++) {
        if (k) fputc(',', f);
        json_value(f, fd, arr + k * elem_size(fd));
      }
      fputc(']', f);
    } else {
      json_value(f, fd, member);
    }
  }
  fputc('}', f);
}

const char *pbjson_enum_short(const ProtobufCEnumDescriptor *d, int value, char *buf,
                              size_t len) {
  const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(d, value);
  if (!ev) {
    snprintf(buf, len, "%d", value);
    return buf;
  }
  /* Strip the longest common prefix shared by the type's values (RUN_STATE_). */
  const char *name = ev->name;
  size_t pre = strlen(d->values[0].name);
  for (unsigned i = 0; i < d->n_values; i++) {
    size_t k = 0;
    while (k < pre && d->values[i].name[k] == d->values[0].name[k]) k++;
    pre = k;
  }
  while (pre > 0 && name[pre - 1] != '_') pre--;
  snprintf(buf, len, "%s", name + pre);
  for (char *p = buf; *p; p++) *p = (char)tolower((unsigned char)*p);
  return buf;
}

int pbjson_enum_parse(const ProtobufCEnumDescriptor *d, const char *s, int *value) {
  if (!s || !*s) return -1;
  char want[128];
  size_t w = 0;
  for (const char *p = s; *p && w < sizeof want - 6; p++) {
    if (*p == '+') {
      memcpy(want + w, "_and_", 5);
      w += 5;
    } else {
      want[w++] = (char)(*p == '-' ? '_' : tolower((unsigned char)*p));
    }
  }
  want[w] = 0;
  for (unsigned i = 0; i < d->n_values; i++) {
    char buf[128];
    const char *shortname = pbjson_enum_short(d, d->values[i].value, buf, sizeof buf);
    if (strcmp(shortname, "unspecified") == 0) continue;
    if (!strcmp(shortname, want) || !strcasecmp(d->values[i].name, s)) {
      *value = d->values[i].value;
      return 0;
    }
  }
  return -1;
}

void pbjson_enum_choices(const ProtobufCEnumDescriptor *d, char *buf, size_t len) {
  size_t off = 0;
  buf[0] = 0;
  for (unsigned i = 0; i < d->n_values && off < len; i++) {
    char tmp[128];
    const char *s = pbjson_enum_short(d, d->values[i].value, tmp, sizeof tmp);
    if (!strcmp(s, "unspecified")) continue;
    int n = snprintf(buf + off, len - off, "%s%s", off ? "|" : "", s);
    if (n < 0) break;
    off += (size_t)n;
  }
}
