/* Human-readable tables shared by `rlorch ctl` and `rlorch run`. */
#ifndef RLORCH_CTL_FORMAT_H
#define RLORCH_CTL_FORMAT_H

#include <stddef.h>
#include <stdio.h>

#include "rlorch/v1/control.pb-c.h"

void ctl_print_runs(FILE *f, const Rlorch__V1__Run *const *runs, size_t n);
void ctl_print_workers(FILE *f, const Rlorch__V1__WorkerInfo *const *w, size_t n);
/* A row per node, its workers under it, then the links and the note. */
void ctl_print_topology(FILE *f, const Rlorch__V1__GetTopologyResponse *t);
/* One line per step record; the header is printed once (*header_done). */
void ctl_print_step_header(FILE *f);
void ctl_print_step(FILE *f, const Rlorch__V1__StepRecord *s);
void ctl_print_event(FILE *f, const Rlorch__V1__RunEvent *e, int *header_done);
/* "1.50 GB", "512.0 MB" */
const char *ctl_bytes(uint64_t b, char *buf, size_t len);
const char *ctl_enum(const ProtobufCEnumDescriptor *d, int v, char *buf, size_t len);

#endif
