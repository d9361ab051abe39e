/* Small shared pieces of the engine: errors, names, clock. */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "workers/bcast/bcast_internal.h"

const char *bcast_strerror(int code) {
  switch (code) {
  case BCAST_OK: return "ok";
  case BCAST_EINVAL: return "invalid argument";
  case BCAST_ENOMEM: return "out of memory";
  case BCAST_EIO: return "i/o error";
  case BCAST_ETIMEDOUT: return "deadline exceeded";
  case BCAST_ENOTSUP: return "not supported";
  case BCAST_ECUDA: return "CUDA error";
  case BCAST_ENCCL: return "NCCL error";
  case BCAST_EPEER: return "peer failed";
  case BCAST_ECHECKSUM: return "checksum mismatch";
  case BCAST_EMISMATCH: return "plan mismatch";
  case BCAST_ECANCELED: return "cancelled";
  default: return "unknown error";
  }
}

void bcast__failf(bcast_err *err, int code, const char *fmt, ...) {
  if (!err) return;
  err->code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err->msg, sizeof err->msg, fmt, ap);
  va_end(ap);
}

double bcast__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double bcast__exposed_s(double total_s, double wire_alone_s) {
  return total_s > wire_alone_s ? total_s - wire_alone_s : 0;
}

size_t bcast_dtype_size(bcast_dtype d) {
  switch (d) {
  case BCAST_DTYPE_FP32: return 4;
  case BCAST_DTYPE_BF16:
  case BCAST_DTYPE_FP16:
  case BCAST_DTYPE_U16: return 2;
  default: return 0;
  }
}

const char *bcast_dtype_name(bcast_dtype d) {
  switch (d) {
  case BCAST_DTYPE_FP32: return "fp32";
  case BCAST_DTYPE_BF16: return "bf16";
  case BCAST_DTYPE_FP16: return "fp16";
  case BCAST_DTYPE_U16: return "u16";
  default: return "unknown";
  }
}

const char *bcast_mode_name(bcast_mode m) {
  switch (m) {
  case BCAST_MODE_DIRECT: return "direct";
  case BCAST_MODE_STAGED: return "staged";
  case BCAST_MODE_HOST: return "host";
  case BCAST_MODE_COLOCATED: return "colocated";
  default: return "unknown";
  }
}
