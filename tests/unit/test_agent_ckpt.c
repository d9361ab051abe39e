/* The trainer's checkpoint: what is saved comes back bit for bit, and a file
 * that is not this trainer's, or not whole, is refused with a message naming
 * what is wrong (never loaded). */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "workers/agent/agent_ckpt.h"

typedef struct model {
  bcast_tensor t[2];
  float *m, *v;
  uint64_t total;
  char dir[64];
} model;

static void model_init(model *md, float base) {
  memset(md, 0, sizeof *md);
  const uint64_t rows[2] = {64, 3};
  for (int i = 0; i < 2; i++) {
    bcast_tensor *t = &md->t[i];
    snprintf(t->name, sizeof t->name, "layers.%d.w", i);
    t->storage_dtype = BCAST_DTYPE_FP32;
    t->wire_dtype = BCAST_DTYPE_BF16;
    t->ndim = 2;
    t->shape[0] = rows[i];
    t->shape[1] = 17;
    t->residency = BCAST_RES_HOST_PAGEABLE;
    t->data = malloc(rows[i] * 17 * sizeof(float));
    for (uint64_t k = 0; k < rows[i] * 17; k++) ((float *)t->data)[k] = base + (float)k * 0.25f + (float)i;
    md->total += rows[i] * 17;
  }
  md->m = malloc(md->total * sizeof(float));
  md->v = malloc(md->total * sizeof(float));
  for (uint64_t k = 0; k < md->total; k++) {
    md->m[k] = base * 0.5f + (float)k;
    md->v[k] = base * 0.125f + (float)k * 2;
  }
  snprintf(md->dir, sizeof md->dir, "/tmp/rlorch-ckpt.XXXXXX");
  cr_assert_not_null(mkdtemp(md->dir));
}

static agent_ckpt ckpt_of(model *md, const char *preset) {
  return (agent_ckpt){.preset = preset, .layers = 2, .t = md->t, .n = 2, .m = md->m, .v = md->v,
                      .total = md->total};
}

static void model_free(model *md, int rm) {
  for (int i = 0; i < 2; i++) free(md->t[i].data);
  free(md->m);
  free(md->v);
  if (rm) {
    char path[128];
    snprintf(path, sizeof path, "%s/trainer.ckpt", md->dir);
    unlink(path);
    rmdir(md->dir);
  }
}

static int same(const model *a, const model *b) {
  for (int i = 0; i < 2; i++)
    if (memcmp(a->t[i].data, b->t[i].data, bcast_tensor_elems(&a->t[i]) * 4)) return 0;
  return !memcmp(a->m, b->m, a->total * 4) && !memcmp(a->v, b->v, a->total * 4);
}

/* Flips one byte of the file at offset `at` from its end (negative) or start. */
static void poke(const char *dir, long at) {
  char path[128];
  snprintf(path, sizeof path, "%s/trainer.ckpt", dir);
  int fd = open(path, O_RDWR);
  cr_assert_geq(fd, 0);
  off_t end = lseek(fd, 0, SEEK_END);
  off_t off = at < 0 ? end + at : at;
  uint8_t b;
  cr_assert_eq(pread(fd, &b, 1, off), 1);
  b ^= 0x5a;
  cr_assert_eq(pwrite(fd, &b, 1, off), 1);
  close(fd);
}

Test(agent_ckpt, round_trip_bit_for_bit_with_its_version_and_run) {
  model a, b;
  model_init(&a, 1.5f);
  model_init(&b, -7.0f);
  char err[512] = "";
  agent_ckpt c = ckpt_of(&a, "100m");
  cr_assert_eq(agent_ckpt_load(a.dir, &c, err, sizeof err), 1, "no checkpoint yet: %s", err);
  c.steps = 12;
  c.policy_version = 12;
  snprintf(c.run_id, sizeof c.run_id, "run-3");
  cr_assert_eq(agent_ckpt_save(a.dir, &c, err, sizeof err), 0, "%s", err);
  char path[128];
  struct stat st;
  snprintf(path, sizeof path, "%s/trainer.ckpt", a.dir);
  cr_assert_eq(stat(path, &st), 0);
  cr_assert_eq(st.st_mode & 0777, 0600, "mode %o", st.st_mode & 0777);
  snprintf(path, sizeof path, "%s/trainer.ckpt.tmp", a.dir);
  cr_assert_neq(stat(path, &st), 0, "no temporary file left");

  agent_ckpt d = ckpt_of(&b, "100m");
  cr_assert(!same(&a, &b));
  cr_assert_eq(agent_ckpt_load(a.dir, &d, err, sizeof err), 0, "%s", err);
  cr_assert(same(&a, &b), "weights, m and v come back bit for bit");
  cr_assert_eq(d.steps, 12u);
  cr_assert_eq(d.policy_version, 12u);
  cr_assert_str_eq(d.run_id, "run-3");
  /* A second save replaces the first whole. */
  ((float *)a.t[1].data)[5] = 99.0f;
  c.policy_version = 13;
  cr_assert_eq(agent_ckpt_save(a.dir, &c, err, sizeof err), 0, "%s", err);
  cr_assert_eq(agent_ckpt_load(a.dir, &d, err, sizeof err), 0, "%s", err);
  cr_assert_eq(((float *)b.t[1].data)[5], 99.0f);
  cr_assert_eq(d.policy_version, 13u);
  model_free(&a, 1);
  model_free(&b, 0);
}

Test(agent_ckpt, another_model_or_a_damaged_file_is_refused_by_name) {
  model a, b;
  model_init(&a, 2.0f);
  model_init(&b, 3.0f);
  char err[512] = "";
  agent_ckpt c = ckpt_of(&a, "100m");
  c.policy_version = 4;
  cr_assert_eq(agent_ckpt_save(a.dir, &c, err, sizeof err), 0, "%s", err);

  agent_ckpt other = ckpt_of(&b, "1b");
  cr_assert_eq(agent_ckpt_load(a.dir, &other, err, sizeof err), -1);
  cr_assert(strstr(err, "preset 100m") && strstr(err, "this trainer has 1b"), "%s", err);
  snprintf(b.t[1].name, sizeof b.t[1].name, "layers.1.other");
  agent_ckpt renamed = ckpt_of(&b, "100m");
  cr_assert_eq(agent_ckpt_load(a.dir, &renamed, err, sizeof err), -1);
  cr_assert(strstr(err, "tensor 1 is layers.1.w") && strstr(err, "layers.1.other"), "%s", err);
  snprintf(b.t[1].name, sizeof b.t[1].name, "layers.1.w");

  poke(a.dir, -100); /* inside v */
  agent_ckpt d = ckpt_of(&b, "100m");
  cr_assert_eq(agent_ckpt_load(a.dir, &d, err, sizeof err), -1);
  cr_assert(strstr(err, "corrupted"), "%s", err);
  cr_assert_eq(d.policy_version, 0u, "nothing is taken from a refused file");

  poke(a.dir, 0); /* the magic */
  cr_assert_eq(agent_ckpt_load(a.dir, &d, err, sizeof err), -1);
  cr_assert(strstr(err, "not a trainer checkpoint"), "%s", err);

  char path[128];
  snprintf(path, sizeof path, "%s/trainer.ckpt", a.dir);
  cr_assert_eq(agent_ckpt_save(a.dir, &c, err, sizeof err), 0, "%s", err);
  struct stat st;
  cr_assert_eq(stat(path, &st), 0);
  cr_assert_eq(truncate(path, st.st_size - 20), 0);
  cr_assert_eq(agent_ckpt_load(a.dir, &d, err, sizeof err), -1);
  cr_assert(strstr(err, "cut short"), "%s", err);

  cr_assert_eq(agent_ckpt_save("/nonexistent/dir", &c, err, sizeof err), -1);
  cr_assert(strstr(err, "/nonexistent/dir/trainer.ckpt.tmp") && strstr(err, "create"), "%s", err);
  model_free(&a, 1);
  model_free(&b, 0);
}
