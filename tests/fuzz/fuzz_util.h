/* Helpers shared by the libFuzzer harnesses of tests/fuzz.
 *
 * FUZZ_CHECK states a property that must hold for every input; when it does
 * not, the harness aborts, and libFuzzer keeps the input as a crash like any
 * sanitizer report. */
#ifndef RLORCH_FUZZ_UTIL_H
#define RLORCH_FUZZ_UTIL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define FUZZ_CHECK(cond, ...)                                                        \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "fuzz: %s:%d: property failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                  \
      fputc('\n', stderr);                                                           \
      abort();                                                                       \
    }                                                                                \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* A file in memory (memfd) that code under test opens by path, as it would
 * open a file an operator names: /proc/self/fd/N. Set once per process. */
typedef struct fuzz_file {
  int fd;
  char path[64];
} fuzz_file;

static inline void fuzz_file_init(fuzz_file *f, const char *name) {
  f->fd = memfd_create(name, MFD_CLOEXEC);
  FUZZ_CHECK(f->fd >= 0, "memfd_create failed");
  snprintf(f->path, sizeof f->path, "/proc/self/fd/%d", f->fd);
}

/* Replaces the file's contents with data. */
static inline void fuzz_file_set(fuzz_file *f, const void *data, size_t size) {
  FUZZ_CHECK(ftruncate(f->fd, 0) == 0, "ftruncate failed");
  const uint8_t *p = data;
  for (size_t off = 0; off < size;) {
    ssize_t w = pwrite(f->fd, p + off, size - off, (off_t)off);
    FUZZ_CHECK(w > 0, "pwrite failed");
    off += (size_t)w;
  }
}

#endif
