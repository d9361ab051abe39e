/* The trainer's checkpoint file (agent_ckpt.h has the layout and the rules). */
#include "workers/agent/agent_ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#ifdef RLORCH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define CKPT_MAGIC 0x4b434c52u /* "RLCK" */
#define CKPT_FORMAT 2u     /* what save writes */
#define CKPT_FORMAT_NORANK 1u /* before the rank was recorded: still read */
#define CKPT_CHUNK (64u << 20) /* bytes per write, and the GPU bounce buffer */

typedef struct ckpt_io {
  int fd;
  XXH3_state_t *h;
  uint8_t *bounce; /* CKPT_CHUNK bytes, for device memory */
  char *err;
  size_t errlen;
  const char *path;
} ckpt_io;

static int io_fail(ckpt_io *io, const char *what, int e) {
  snprintf(io->err, io->errlen, "checkpoint %s: %s: %s", io->path, what, strerror(e));
  return -1;
}

static int put_bytes(ckpt_io *io, const void *p, size_t n) {
  XXH3_64bits_update(io->h, p, n);
  const uint8_t *b = p;
  while (n > 0) {
    ssize_t w = write(io->fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return io_fail(io, "write", w < 0 ? errno : EIO);
    b += w;
    n -= (size_t)w;
  }
  return 0;
}

static int get_bytes(ckpt_io *io, void *p, size_t n) {
  uint8_t *b = p;
  size_t want = n;
  while (n > 0) {
    ssize_t r = read(io->fd, b, n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return io_fail(io, "read", errno);
    if (r == 0) {
      snprintf(io->err, io->errlen, "checkpoint %s: cut short (%zu of %zu bytes of a field)", io->path,
               want - n, want);
      return -1;
    }
    b += r;
    n -= (size_t)r;
  }
  XXH3_64bits_update(io->h, p, want);
  return 0;
}

static int put_u32(ckpt_io *io, uint32_t v) {
  uint8_t b[4];
  for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
  return put_bytes(io, b, 4);
}

static int put_u64(ckpt_io *io, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
  return put_bytes(io, b, 8);
}

static int get_u32(ckpt_io *io, uint32_t *v) {
  uint8_t b[4];
  if (get_bytes(io, b, 4)) return -1;
  *v = 0;
  for (int i = 0; i < 4; i++) *v |= (uint32_t)b[i] << (8 * i);
  return 0;
}

static int get_u64(ckpt_io *io, uint64_t *v) {
  uint8_t b[8];
  if (get_bytes(io, b, 8)) return -1;
  *v = 0;
  for (int i = 0; i < 8; i++) *v |= (uint64_t)b[i] << (8 * i);
  return 0;
}

/* n bytes of host or device memory, through the bounce buffer for the latter. */
static int put_mem(ckpt_io *io, const void *src, size_t n, int on_gpu) {
  if (!on_gpu) return put_bytes(io, src, n);
#ifdef RLORCH_HAVE_CUDA
  for (size_t off = 0; off < n; off += CKPT_CHUNK) {
    size_t len = n - off < CKPT_CHUNK ? n - off : CKPT_CHUNK;
    cudaError_t ce = cudaMemcpy(io->bounce, (const uint8_t *)src + off, len, cudaMemcpyDeviceToHost);
    if (ce != cudaSuccess) {
      snprintf(io->err, io->errlen, "checkpoint %s: copy from the GPU: %s", io->path, cudaGetErrorString(ce));
      return -1;
    }
    if (put_bytes(io, io->bounce, len)) return -1;
  }
  return 0;
#else
  snprintf(io->err, io->errlen, "checkpoint %s: device memory in a build without CUDA", io->path);
  return -1;
#endif
}

static int get_mem(ckpt_io *io, void *dst, size_t n, int on_gpu) {
  if (!on_gpu) return get_bytes(io, dst, n);
#ifdef RLORCH_HAVE_CUDA
  for (size_t off = 0; off < n; off += CKPT_CHUNK) {
    size_t len = n - off < CKPT_CHUNK ? n - off : CKPT_CHUNK;
    if (get_bytes(io, io->bounce, len)) return -1;
    cudaError_t ce = cudaMemcpy((uint8_t *)dst + off, io->bounce, len, cudaMemcpyHostToDevice);
    if (ce != cudaSuccess) {
      snprintf(io->err, io->errlen, "checkpoint %s: copy to the GPU: %s", io->path, cudaGetErrorString(ce));
      return -1;
    }
  }
  return 0;
#else
  snprintf(io->err, io->errlen, "checkpoint %s: device memory in a build without CUDA", io->path);
  return -1;
#endif
}

static int any_on_gpu(const agent_ckpt *c) {
  if (c->state_on_gpu) return 1;
  for (size_t i = 0; i < c->n; i++)
    if (c->t[i].residency == BCAST_RES_GPU) return 1;
  return 0;
}

static int io_open(ckpt_io *io, const agent_ckpt *c, char *err, size_t errlen, const char *path) {
  memset(io, 0, sizeof *io);
  io->fd = -1;
  io->err = err;
  io->errlen = errlen;
  io->path = path;
  io->h = XXH3_createState();
  if (io->h) XXH3_64bits_reset(io->h);
  io->bounce = any_on_gpu(c) ? malloc(CKPT_CHUNK) : NULL;
  if (!io->h || (any_on_gpu(c) && !io->bounce)) {
    snprintf(err, errlen, "checkpoint %s: no memory", path);
    return -1;
  }
  return 0;
}

static void io_close(ckpt_io *io) {
  if (io->fd >= 0) close(io->fd);
  XXH3_freeState(io->h);
  free(io->bounce);
}

/* A lone trainer is a group of one. */
static uint32_t ckpt_ranks(const agent_ckpt *c) { return c->ranks ? c->ranks : 1; }

/* The first element a tensor holds: 0 for a whole one. */
static uint64_t ckpt_first(const bcast_tensor *t) { return t->shard_elems ? t->shard_offset : 0; }

static int save_body(ckpt_io *io, const agent_ckpt *c) {
  char run[64] = {0}, preset[32] = {0};
  snprintf(run, sizeof run, "%s", c->run_id);
  snprintf(preset, sizeof preset, "%s", c->preset ? c->preset : "");
  if (put_u32(io, CKPT_MAGIC) || put_u32(io, CKPT_FORMAT) || put_u64(io, c->total) ||
      put_u64(io, c->n) || put_u64(io, c->steps) || put_u64(io, c->policy_version) ||
      put_bytes(io, run, sizeof run) || put_bytes(io, preset, sizeof preset) || put_u32(io, c->layers) ||
      put_u32(io, c->rank) || put_u32(io, ckpt_ranks(c)))
    return -1;
  for (size_t i = 0; i < c->n; i++) {
    uint32_t len = (uint32_t)strnlen(c->t[i].name, sizeof c->t[i].name);
    if (put_u32(io, len) || put_bytes(io, c->t[i].name, len) || put_u64(io, bcast_tensor_elems(&c->t[i])) ||
        put_u64(io, ckpt_first(&c->t[i])) || put_u64(io, bcast_tensor_held(&c->t[i])))
      return -1;
  }
  for (size_t i = 0; i < c->n; i++)
    if (put_mem(io, c->t[i].data, bcast_tensor_held(&c->t[i]) * sizeof(float),
                c->t[i].residency == BCAST_RES_GPU))
      return -1;
  if (put_mem(io, c->m, c->total * sizeof(float), c->state_on_gpu) ||
      put_mem(io, c->v, c->total * sizeof(float), c->state_on_gpu))
    return -1;
  uint64_t digest = XXH3_64bits_digest(io->h);
  return put_u64(io, digest);
}

int agent_ckpt_save(const char *dir, const agent_ckpt *c, char *err, size_t errlen) {
  char path[4096], tmp[4200];
  snprintf(path, sizeof path, "%s/trainer.ckpt", dir);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  ckpt_io io;
  if (io_open(&io, c, err, errlen, tmp)) {
    io_close(&io);
    return -1;
  }
  int rc = -1;
  io.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (io.fd < 0) {
    io_fail(&io, "create", errno);
  } else if (save_body(&io, c) == 0) {
    if (fsync(io.fd) != 0) {
      io_fail(&io, "fsync", errno);
    } else if (close(io.fd) != 0) {
      io.fd = -1;
      io_fail(&io, "close", errno);
    } else {
      io.fd = -1;
      if (rename(tmp, path) != 0) {
        io_fail(&io, "rename", errno);
      } else {
        /* The rename itself is durable only once the directory is. */
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
          fsync(dfd);
          close(dfd);
        }
        rc = 0;
      }
    }
  }
  if (rc) unlink(tmp);
  io_close(&io);
  return rc;
}

/* Whose weights the file holds must be this trainer's: the same rank of a
 * group of the same size, asked before anything else, since another rank's
 * parts may well have the same sizes. */
static int check_rank(ckpt_io *io, const agent_ckpt *c, uint32_t format, uint32_t rank, uint32_t ranks) {
  if (format == CKPT_FORMAT_NORANK && ckpt_ranks(c) > 1) {
    snprintf(io->err, io->errlen,
             "checkpoint %s is of format %u, which records no trainer rank (a lone trainer's, or "
             "any rank's); this trainer is rank %u of %u: start it with the checkpoint of its own "
             "rank, or without one", io->path, format, c->rank, ckpt_ranks(c));
    return -1;
  }
  if (rank == c->rank && ranks == ckpt_ranks(c)) return 0;
  char held[48], want[48];
  if (ranks > 1) snprintf(held, sizeof held, "rank %u of %u", rank, ranks);
  else snprintf(held, sizeof held, "a lone trainer's weights");
  if (ckpt_ranks(c) > 1) snprintf(want, sizeof want, "rank %u of %u", c->rank, ckpt_ranks(c));
  else snprintf(want, sizeof want, "a lone trainer");
  snprintf(io->err, io->errlen, "checkpoint %s holds %s; this trainer is %s", io->path, held, want);
  return -1;
}

/* The header and tensor list must describe this trainer's model and part. */
static int load_header(ckpt_io *io, agent_ckpt *c) {
  uint32_t magic = 0, format = 0, layers = 0, rank = 0, ranks = 1;
  uint64_t total = 0, n = 0;
  char preset[32];
  if (get_u32(io, &magic) || get_u32(io, &format)) return -1;
  if (magic != CKPT_MAGIC) {
    snprintf(io->err, io->errlen, "checkpoint %s: not a trainer checkpoint (magic %08x)", io->path, magic);
    return -1;
  }
  if (format != CKPT_FORMAT && format != CKPT_FORMAT_NORANK) {
    snprintf(io->err, io->errlen, "checkpoint %s: format %u, this trainer reads %u and %u", io->path,
             format, CKPT_FORMAT_NORANK, CKPT_FORMAT);
    return -1;
  }
  if (get_u64(io, &total) || get_u64(io, &n) || get_u64(io, &c->steps) || get_u64(io, &c->policy_version) ||
      get_bytes(io, c->run_id, sizeof c->run_id) || get_bytes(io, preset, sizeof preset) ||
      get_u32(io, &layers))
    return -1;
  if (format != CKPT_FORMAT_NORANK && (get_u32(io, &rank) || get_u32(io, &ranks))) return -1;
  if (check_rank(io, c, format, rank, ranks)) return -1;
  c->run_id[sizeof c->run_id - 1] = 0;
  preset[sizeof preset - 1] = 0;
  if (strcmp(preset, c->preset ? c->preset : "") != 0 || layers != c->layers || total != c->total ||
      n != c->n) {
    snprintf(io->err, io->errlen,
             "checkpoint %s is of preset %s, %u layers, %llu tensors, %llu parameters; this trainer "
             "has %s, %u layers, %zu tensors, %llu parameters",
             io->path, preset, layers, (unsigned long long)n, (unsigned long long)total,
             c->preset ? c->preset : "", c->layers, c->n, (unsigned long long)c->total);
    return -1;
  }
  for (size_t i = 0; i < c->n; i++) {
    const bcast_tensor *t = &c->t[i];
    uint32_t len = 0;
    uint64_t whole = 0, first = 0, elems = 0;
    char name[sizeof t->name];
    if (get_u32(io, &len)) return -1;
    if (len >= sizeof name) {
      snprintf(io->err, io->errlen, "checkpoint %s: tensor %zu has a name of %u bytes", io->path, i, len);
      return -1;
    }
    if (get_bytes(io, name, len)) return -1;
    if (format != CKPT_FORMAT_NORANK && (get_u64(io, &whole) || get_u64(io, &first))) return -1;
    if (get_u64(io, &elems)) return -1;
    name[len] = 0;
    if (format == CKPT_FORMAT_NORANK) whole = elems; /* a lone trainer's: whole tensors */
    if (strcmp(name, t->name) != 0 || elems != bcast_tensor_held(t)) {
      snprintf(io->err, io->errlen, "checkpoint %s: tensor %zu is %s of %llu elements, this trainer's %s "
               "of %llu", io->path, i, name, (unsigned long long)elems, t->name,
               (unsigned long long)bcast_tensor_held(t));
      return -1;
    }
    if (whole != bcast_tensor_elems(t) || first != ckpt_first(t)) {
      snprintf(io->err, io->errlen,
               "checkpoint %s: tensor %zu %s holds elements [%llu, %llu) of %llu; this trainer "
               "holds [%llu, %llu) of %llu", io->path, i, name, (unsigned long long)first,
               (unsigned long long)(first + elems), (unsigned long long)whole,
               (unsigned long long)ckpt_first(t), (unsigned long long)(ckpt_first(t) + elems),
               (unsigned long long)bcast_tensor_elems(t));
      return -1;
    }
  }
  return 0;
}

int agent_ckpt_load(const char *dir, agent_ckpt *c, char *err, size_t errlen) {
  char path[4096];
  snprintf(path, sizeof path, "%s/trainer.ckpt", dir);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) return 1;
  ckpt_io io;
  if (io_open(&io, c, err, errlen, path)) {
    if (fd >= 0) close(fd);
    io_close(&io);
    return -1;
  }
  io.fd = fd;
  if (fd < 0) {
    io_fail(&io, "open", errno);
    io_close(&io);
    return -1;
  }
  agent_ckpt got = *c;
  int rc = load_header(&io, &got);
  for (size_t i = 0; i < c->n && !rc; i++)
    rc = get_mem(&io, c->t[i].data, bcast_tensor_held(&c->t[i]) * sizeof(float),
                 c->t[i].residency == BCAST_RES_GPU);
  if (!rc) rc = get_mem(&io, c->m, c->total * sizeof(float), c->state_on_gpu);
  if (!rc) rc = get_mem(&io, c->v, c->total * sizeof(float), c->state_on_gpu);
  if (!rc) {
    uint64_t want = XXH3_64bits_digest(io.h), digest = 0;
    uint8_t b[8], extra;
    if (read(fd, b, 8) != 8) {
      snprintf(err, errlen, "checkpoint %s: cut short (no digest)", path);
      rc = -1;
    } else {
      for (int i = 0; i < 8; i++) digest |= (uint64_t)b[i] << (8 * i);
      if (digest != want) {
        snprintf(err, errlen, "checkpoint %s: digest %016llx, its contents give %016llx: corrupted",
                 path, (unsigned long long)digest, (unsigned long long)want);
        rc = -1;
      } else if (read(fd, &extra, 1) != 0) {
        snprintf(err, errlen, "checkpoint %s: bytes after the digest", path);
        rc = -1;
      }
    }
  }
  if (!rc) {
    c->steps = got.steps;
    c->policy_version = got.policy_version;
    memcpy(c->run_id, got.run_id, sizeof c->run_id);
  }
  io_close(&io);
  return rc;
}
