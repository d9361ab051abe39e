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
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
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

/* ---- sockets ------------------------------------------------------------------------------ */

/* libFuzzer's alarm (-timeout) interrupts system calls now and then: these
 * retry what an interruption cuts short, so that an input takes the same path
 * however often it runs. */

/* 1 when fd has events within ms, else 0. */
static inline int fuzz_poll(int fd, short events, int ms) {
  struct pollfd pf = {fd, events, 0};
  for (;;) {
    int n = poll(&pf, 1, ms);
    if (n >= 0) return n > 0;
    if (errno != EINTR) return 0;
  }
}

static inline int fuzz_connect(int fd, const struct sockaddr *a, socklen_t n) {
  if (connect(fd, a, n) == 0) return 0;
  if (errno != EINTR) return -1;
  /* An interrupted connect goes on in the background: wait for its outcome. */
  if (!fuzz_poll(fd, POLLOUT, 10000)) return -1;
  int e = 0;
  socklen_t el = sizeof e;
  return getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) == 0 && e == 0 ? 0 : -1;
}

static inline int fuzz_accept(int lfd) {
  for (;;) {
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0 || errno != EINTR) return fd;
  }
}

static inline ssize_t fuzz_send(int fd, const void *b, size_t n) {
  for (;;) {
    ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
    if (w >= 0 || errno != EINTR) return w;
  }
}

static inline ssize_t fuzz_recv(int fd, void *b, size_t n) {
  for (;;) {
    ssize_t r = recv(fd, b, n, 0);
    if (r >= 0 || errno != EINTR) return r;
  }
}

#endif
