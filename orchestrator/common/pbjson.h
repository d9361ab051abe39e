/* pbjson: protobuf-c messages as JSON (proto3 JSON mapping with the proto field
 * names kept, enums as names, 64-bit integers as strings, bytes as base64,
 * default values included so scripts can rely on every field being present). */
#ifndef RLORCH_PBJSON_H
#define RLORCH_PBJSON_H

#include <stdio.h>

#include <protobuf-c/protobuf-c.h>

void pbjson_write(FILE *f, const ProtobufCMessage *m);
/* Enum value name without the type prefix: RUN_STATE_RUNNING -> "running". */
const char *pbjson_enum_short(const ProtobufCEnumDescriptor *d, int value, char *buf,
                              size_t len);



/* Parses a short enum name ("staged", "running") or the full value name; "+" may
 * stand for "_and_" ("params+optimizer"). Returns 0, or -1 when unknown. The
 * UNSPECIFIED value is refused. */
int pbjson_enum_parse(const ProtobufCEnumDescriptor *d, const char *s, int *value);
/* "a|b|c": the accepted short names, for error messages. */
void pbjson_enum_choices(const ProtobufCEnumDescriptor *d, char *buf, size_t len);
#endif
