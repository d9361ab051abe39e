/* Fuzz target: the plan decoder, rlorch.v1.BroadcastPlan bytes as every
 * participant receives them in a plan command (bcast_plan_unpack,
 * bcast_plan_from_pb: decode, validate, check the hash).
 *
 * The hash is the one field that random bytes never get right, and a plan
 * whose hash is wrong stops before anything else is looked at. So when the
 * decoder refuses a plan for its hash alone, the harness decodes it a second
 * time with the hash the decoder computed, and the plan goes on through the
 * rest: what an accepted plan must satisfy (it validates, it survives the
 * wire unchanged, its copy hashes the same, local tensors that match it bind
 * and a missing one is named). */
#include "fuzz_util.h"

#include "rlorch/v1/broadcast.pb-c.h"
#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_pb.h"

static const char hash_msg[] = "does not match its contents (";

static void check_local(const bcast_plan *p) {
  if (p->ntensors == 0) return;
  static uint8_t dummy; /* binding checks pointers; it never reads through them */
  bcast_tensor *local = calloc(p->ntensors, sizeof *local);
  FUZZ_CHECK(local, "out of memory");
  /* In reverse order: binding goes by name, not by position. */
  for (size_t i = 0; i < p->ntensors; i++) {
    local[p->ntensors - 1 - i] = p->tensors[i];
    local[p->ntensors - 1 - i].data = &dummy;
  }
  bcast_err e = {0};
  FUZZ_CHECK(bcast_plan_check_local(p, local, p->ntensors, 1, &e) == 0, "sender: %s", e.msg);
  FUZZ_CHECK(bcast_plan_check_local(p, local, p->ntensors, 0, &e) == 0, "receiver: %s", e.msg);
  /* Without the plan's first tensor (last of the local array) it is named. */
  FUZZ_CHECK(bcast_plan_check_local(p, local, p->ntensors - 1, 0, &e) == BCAST_EINVAL &&
                 strstr(e.msg, p->tensors[0].name),
             "a missing tensor is not named: %s", e.msg);
  free(local);
}

static void check_accepted(const bcast_plan *p) {
  bcast_err e = {0};
  FUZZ_CHECK(bcast_plan_validate(p, &e) == 0, "accepted plan does not validate: %s", e.msg);
  FUZZ_CHECK(bcast_plan_hash(p) == p->hash, "accepted plan's hash is not its contents'");
  uint64_t wire = bcast_plan_wire_bytes(p);

  /* Through the wire again: same plan, same bytes. */
  uint8_t *a = NULL, *b = NULL;
  size_t na = 0, nb = 0;
  FUZZ_CHECK(bcast_plan_pack(p, &a, &na, &e) == 0, "pack: %s", e.msg);
  bcast_plan *q = NULL;
  FUZZ_CHECK(bcast_plan_unpack(a, na, &q, &e) == 0, "its own encoding is refused: %s", e.msg);
  FUZZ_CHECK(q->hash == p->hash && q->ntensors == p->ntensors && q->nbuckets == p->nbuckets &&
                 bcast_plan_wire_bytes(q) == wire && !strcmp(q->id, p->id) &&
                 !strcmp(q->host_endpoint, p->host_endpoint) &&
                 q->deadline_unix_ms == p->deadline_unix_ms,
             "plan changed on the wire");
  FUZZ_CHECK(bcast_plan_pack(q, &b, &nb, &e) == 0, "pack: %s", e.msg);
  FUZZ_CHECK(na == nb && !memcmp(a, b, na), "encoding not stable");
  free(a);
  free(b);
  bcast_plan_free(q);

  bcast_plan *d = bcast_plan_dup(p);
  FUZZ_CHECK(d, "dup: out of memory");
  FUZZ_CHECK(bcast_plan_hash(d) == p->hash, "copy hashes differently");
  /* A new NCCL id is covered by the hash, and the plan stays valid. */
  uint8_t id[128];
  for (size_t i = 0; i < sizeof id; i++) id[i] = (uint8_t)(p->nccl_id[i] ^ 0x5a);
  bcast_plan_set_nccl_id(d, id);
  FUZZ_CHECK(d->hash == bcast_plan_hash(d) && bcast_plan_validate(d, &e) == 0,
             "plan with a new NCCL id: %s", e.msg);
  bcast_plan_free(d);

  check_local(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Rlorch__V1__BroadcastPlan *m = rlorch__v1__broadcast_plan__unpack(NULL, size, data);
  bcast_plan *p = NULL;
  bcast_err e = {0};
  int rc = bcast_plan_unpack(data, size, &p, &e);
  if (!m) {
    FUZZ_CHECK(rc == BCAST_EINVAL && !p, "bytes protobuf-c refuses were decoded (%d)", rc);
    return 0;
  }
  if (rc == BCAST_EMISMATCH) {
    const char *at = strstr(e.msg, hash_msg);
    unsigned long long want = 0;
    FUZZ_CHECK(at && sscanf(at + sizeof hash_msg - 1, "%llx", &want) == 1,
               "hash refusal without the computed hash: %s", e.msg);
    m->hash = want;
    rc = bcast_plan_from_pb(m, &p, &e);
    FUZZ_CHECK(rc == BCAST_OK, "refused for its hash, then for %d: %s", rc, e.msg);
  }
  if (rc == BCAST_OK) {
    check_accepted(p);
    bcast_plan_free(p);
  } else {
    FUZZ_CHECK(e.msg[0] && !p, "plan refused without a reason (%d)", rc);
  }
  rlorch__v1__broadcast_plan__free_unpacked(m, NULL);
  return 0;
}
