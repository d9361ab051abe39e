/* The trainer's checkpoint: what is saved comes back bit for bit, and a file
 * that is not this trainer's (another model, another rank of a group, other
 * element ranges), or not whole, is refused with a message naming what is
 * wrong (never loaded); a file of the format before ranks were recorded
 * still loads into a lone trainer. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "workers/agent/agent_ckpt.h"

typedef struct model {
  bcast_tensor t[2];
  float *m, *v;
  uint64_t total;
  char dir[64];
} model;

/* Rank `rank` of a group of `ranks` (0: a lone trainer) holds elements
 * [lo, lo + len) of each tensor, lo = rank * E / ranks + shift. */
static void model_init_part(model *md, float base, uint32_t rank, uint32_t ranks, uint64_t shift) {
  memset(md, 0, sizeof *md);
  const uint64_t rows[2] = {64, 4};
  for (int i = 0; i < 2; i++) {
    bcast_tensor *t = &md->t[i];
    snprintf(t->name, sizeof t->name, "layers.%d.w", i);
    t->storage_dtype = BCAST_DTYPE_FP32;
    t->wire_dtype = BCAST_DTYPE_BF16;
    t->ndim = 2;
    t->shape[0] = rows[i];
    t->shape[1] = 17;
    t->residency = BCAST_RES_HOST_PAGEABLE;
    uint64_t e = rows[i] * 17;
    if (ranks > 1) {
      t->shard_offset = e * rank / ranks + shift;
      t->shard_elems = e * (rank + 1) / ranks - e * rank / ranks;
    }
    uint64_t held = bcast_tensor_held(t);
    t->data = malloc(held * sizeof(float));
    for (uint64_t k = 0; k < held; k++) ((float *)t->data)[k] = base + (float)k * 0.25f + (float)i;
    md->total += held;
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

static void model_init(model *md, float base) { model_init_part(md, base, 0, 0, 0); }

static agent_ckpt ckpt_of(model *md, const char *preset) {
  return (agent_ckpt){.preset = preset, .layers = 2, .t = md->t, .n = 2, .m = md->m, .v = md->v,
                      .total = md->total};
}

static agent_ckpt rank_ckpt_of(model *md, uint32_t rank, uint32_t ranks) {
  agent_ckpt c = ckpt_of(md, "100m");
  c.rank = rank;
  c.ranks = ranks;
  return c;
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
    if (memcmp(a->t[i].data, b->t[i].data, bcast_tensor_held(&a->t[i]) * 4)) return 0;
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

Test(agent_ckpt, a_rank_loads_its_own_part_only_and_names_both_sides) {
  /* Both ranks of 2 hold parts of the same sizes (1088 and 68 elements are
   * even): before the rank was recorded, rank 1's file loaded into rank 0. */
  model r1, r0, r1b, lone, moved;
  model_init_part(&r1, 4.0f, 1, 2, 0);
  model_init_part(&r0, -1.0f, 0, 2, 0);
  model_init_part(&r1b, -2.0f, 1, 2, 0);
  model_init(&lone, -3.0f);
  char err[512] = "";
  agent_ckpt c = rank_ckpt_of(&r1, 1, 2);
  c.policy_version = 6;
  snprintf(c.run_id, sizeof c.run_id, "run-9");
  cr_assert_eq(agent_ckpt_save(r1.dir, &c, err, sizeof err), 0, "%s", err);

  agent_ckpt other = rank_ckpt_of(&r0, 0, 2);
  cr_assert_eq(other.total, c.total, "the two ranks' parts are of one size");
  cr_assert_eq(agent_ckpt_load(r1.dir, &other, err, sizeof err), -1);
  cr_assert(strstr(err, "trainer.ckpt holds rank 1 of 2; this trainer is rank 0 of 2"), "%s", err);
  cr_assert_eq(other.policy_version, 0u, "nothing is taken from a refused file");
  agent_ckpt bigger = rank_ckpt_of(&r1b, 1, 4);
  cr_assert_eq(agent_ckpt_load(r1.dir, &bigger, err, sizeof err), -1);
  cr_assert(strstr(err, "holds rank 1 of 2; this trainer is rank 1 of 4"), "%s", err);
  agent_ckpt alone = ckpt_of(&lone, "100m");
  cr_assert_eq(agent_ckpt_load(r1.dir, &alone, err, sizeof err), -1);
  cr_assert(strstr(err, "holds rank 1 of 2; this trainer is a lone trainer"), "%s", err);

  /* The same rank with its ranges moved (another layout, parts of the same
   * sizes): named by tensor, with both ranges. */
  model_init_part(&moved, 5.0f, 1, 2, 0);
  moved.t[1].shard_offset -= 2;
  agent_ckpt shifted = rank_ckpt_of(&moved, 1, 2);
  cr_assert_eq(agent_ckpt_load(r1.dir, &shifted, err, sizeof err), -1);
  cr_assert(strstr(err, "tensor 1 layers.1.w holds elements [34, 68) of 68; this trainer holds "
                        "[32, 66) of 68"), "%s", err);

  agent_ckpt mine = rank_ckpt_of(&r1b, 1, 2);
  cr_assert(!same(&r1, &r1b));
  cr_assert_eq(agent_ckpt_load(r1.dir, &mine, err, sizeof err), 0, "%s", err);
  cr_assert(same(&r1, &r1b), "its own rank's part comes back bit for bit");
  cr_assert_eq(mine.policy_version, 6u);
  cr_assert_str_eq(mine.run_id, "run-9");

  /* A lone trainer's file is refused to a rank, naming both. */
  agent_ckpt lc = ckpt_of(&lone, "100m");
  cr_assert_eq(agent_ckpt_save(lone.dir, &lc, err, sizeof err), 0, "%s", err);
  agent_ckpt r0c = rank_ckpt_of(&r0, 0, 2);
  cr_assert_eq(agent_ckpt_load(lone.dir, &r0c, err, sizeof err), -1);
  cr_assert(strstr(err, "holds a lone trainer's weights; this trainer is rank 0 of 2"), "%s", err);
  model_free(&r1, 1);
  model_free(&r0, 1);
  model_free(&r1b, 1);
  model_free(&lone, 1);
  model_free(&moved, 1);
}

/* A file of format 1, as trainers wrote it before the rank was recorded:
 * the header without rank and ranks, per tensor its name and the elements
 * held only. Written here field by field, as that trainer did. */
static void put_le(FILE *f, XXH3_state_t *h, uint64_t v, int bytes) {
  uint8_t b[8];
  for (int i = 0; i < bytes; i++) b[i] = (uint8_t)(v >> (8 * i));
  cr_assert_eq(fwrite(b, 1, (size_t)bytes, f), (size_t)bytes);
  XXH3_64bits_update(h, b, (size_t)bytes);
}

static void put_raw(FILE *f, XXH3_state_t *h, const void *p, size_t n) {
  cr_assert_eq(fwrite(p, 1, n, f), n);
  XXH3_64bits_update(h, p, n);
}

static void write_format1(const model *md, uint64_t version, const char *run) {
  char path[128], runb[64] = {0}, preset[32] = "100m";
  snprintf(path, sizeof path, "%s/trainer.ckpt", md->dir);
  snprintf(runb, sizeof runb, "%s", run);
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f);
  XXH3_state_t *h = XXH3_createState();
  XXH3_64bits_reset(h);
  put_le(f, h, 0x4b434c52u, 4);
  put_le(f, h, 1, 4);
  put_le(f, h, md->total, 8);
  put_le(f, h, 2, 8);
  put_le(f, h, version, 8); /* optimizer steps */
  put_le(f, h, version, 8);
  put_raw(f, h, runb, sizeof runb);
  put_raw(f, h, preset, sizeof preset);
  put_le(f, h, 2, 4);
  for (int i = 0; i < 2; i++) {
    put_le(f, h, strlen(md->t[i].name), 4);
    put_raw(f, h, md->t[i].name, strlen(md->t[i].name));
    put_le(f, h, bcast_tensor_held(&md->t[i]), 8);
  }
  for (int i = 0; i < 2; i++) put_raw(f, h, md->t[i].data, bcast_tensor_held(&md->t[i]) * 4);
  put_raw(f, h, md->m, md->total * 4);
  put_raw(f, h, md->v, md->total * 4);
  uint64_t digest = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  uint8_t db[8];
  for (int i = 0; i < 8; i++) db[i] = (uint8_t)(digest >> (8 * i));
  cr_assert_eq(fwrite(db, 1, 8, f), 8u);
  cr_assert_eq(fclose(f), 0);
}

Test(agent_ckpt, a_lone_trainers_format_1_file_still_loads) {
  model a, b, r;
  model_init(&a, 1.25f);
  model_init(&b, 8.0f);
  model_init_part(&r, 0.5f, 0, 2, 0);
  write_format1(&a, 5, "run-old");
  char err[512] = "";
  agent_ckpt d = ckpt_of(&b, "100m");
  cr_assert_eq(agent_ckpt_load(a.dir, &d, err, sizeof err), 0, "%s", err);
  cr_assert(same(&a, &b), "weights, m and v of the old file come back bit for bit");
  cr_assert_eq(d.policy_version, 5u);
  cr_assert_eq(d.steps, 5u);
  cr_assert_str_eq(d.run_id, "run-old");
  /* Nothing in it says whose part it is: a rank of a group refuses it. */
  write_format1(&r, 5, "run-old");
  agent_ckpt rc = rank_ckpt_of(&r, 0, 2);
  cr_assert_eq(agent_ckpt_load(r.dir, &rc, err, sizeof err), -1);
  cr_assert(strstr(err, "is of format 1, which records no trainer rank") &&
                strstr(err, "this trainer is rank 0 of 2"), "%s", err);
  /* The next save writes the current format, which the trainer reads back. */
  cr_assert_eq(agent_ckpt_save(a.dir, &d, err, sizeof err), 0, "%s", err);
  char path[128];
  snprintf(path, sizeof path, "%s/trainer.ckpt", a.dir);
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f);
  uint8_t hdr[8];
  cr_assert_eq(fread(hdr, 1, 8, f), 8u);
  fclose(f);
  cr_assert_eq(hdr[4], 2, "saved as format 2");
  cr_assert_eq(agent_ckpt_load(a.dir, &d, err, sizeof err), 0, "%s", err);
  model_free(&a, 1);
  model_free(&b, 1);
  model_free(&r, 1);
}
