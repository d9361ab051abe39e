/* The SDK's bad-input paths through rlorch.h alone: every call that must fail
 * returns its code and fills rlorch_error with a message naming what was
 * wrong, and the process goes on.
 *
 *   sdk_errors ORCHESTRATOR DEAD_ADDRESS TOKEN_FILE
 *
 * ORCHESTRATOR requires the bearer token in TOKEN_FILE; nothing listens on
 * DEAD_ADDRESS. Prints "ok ..." or "FAIL ..." per check; exits 1 on any FAIL. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sdk_model.h"

static int failures, passes;

static void expect(rlorch_status got, rlorch_status want, const rlorch_error *err, const char *msg,
                   const char *what) {
  if (got == want && (int)err->code == (int)want && strstr(err->message, msg)) {
    passes++;
    printf("ok   %s: %s: %s\n", what, rlorch_status_name(got), err->message);
  } else {
    failures++;
    printf("FAIL %s: got %s (err.code %s) \"%s\", want %s with \"%s\"\n", what,
           rlorch_status_name(got), rlorch_status_name(err->code), err->message,
           rlorch_status_name(want), msg);
  }
}

static void check(int ok, const char *what, const char *detail) {
  passes += ok;
  failures += !ok;
  printf("%s %s: %s\n", ok ? "ok  " : "FAIL", what, detail ? detail : "(null)");
}

/* A TCP connection to "127.0.0.1:PORT" succeeds: something listens there. */
static int listens(const char *addr) {
  unsigned port = 0;
  char tail;
  if (!addr || sscanf(addr, "127.0.0.1:%u%c", &port, &tail) != 1 || port < 1 || port > 65535)
    return 0;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
  close(fd);
  return ok;
}

static float data[4][64];
static uint64_t shape2[2] = {8, 8}, shape0[2] = {8, 0};

static void tensors(rlorch_tensor *t, rlorch_dtype storage, rlorch_dtype wire) {
  const char *names[4] = {"a", "b", "c", "d"};
  for (int k = 0; k < 4; k++)
    t[k] = (rlorch_tensor){.name = names[k], .layer = (uint32_t)k, .storage_dtype = storage,
                           .wire_dtype = wire, .ndim = 2, .shape = shape2,
                           .residency = RLORCH_RES_HOST_PAGEABLE, .data = data[k]};
}

static int place(void *ud, uint64_t version, rlorch_tensor *t, size_t n, char *msg, size_t len) {
  (void)ud, (void)version, (void)t, (void)n, (void)msg, (void)len;
  return -1;
}

/* rlorch_create with o; expects a failure and that *w stays NULL. */
static void create_fails(const rlorch_options *o, rlorch_status want, const char *msg,
                         const char *what) {
  rlorch_worker *w = (rlorch_worker *)&passes; /* must be reset to NULL */
  rlorch_error err = {0, ""};
  expect(rlorch_create(o, &w, &err), want, &err, msg, what);
  if (w) {
    failures++;
    printf("FAIL %s: the worker pointer was not reset to NULL\n", what);
  }
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: sdk_errors ORCHESTRATOR DEAD_ADDRESS TOKEN_FILE\n");
    return 2;
  }
  const char *orch = argv[1], *dead = argv[2], *token = argv[3];
  rlorch_tensor t[4];
  rlorch_options o;
  rlorch_error err;

#define RESET(role)                   \
  do {                                \
    rlorch_options_init(&o, sizeof o, role); \
    o.orchestrator = orch;            \
    o.token_file = token;             \
    o.connect_timeout_s = 10;         \
    tensors(t, (role) == RLORCH_ROLE_TRAINER ? RLORCH_DTYPE_FP32 : RLORCH_DTYPE_BF16, \
            RLORCH_DTYPE_BF16);       \
    o.tensors = t;                    \
    o.ntensors = 4;                   \
  } while (0)

  RESET(RLORCH_ROLE_TRAINER);
  o.api_version = 0;
  create_fails(&o, RLORCH_E_VERSION, "options.api_version: 0 (fill the options with rlorch_options_init)",
               "options not initialised");
  {
    /* A caller whose struct is shorter than this library's (an older header):
     * nothing is written past the size it gives, and the options it got are
     * refused as not filled in, not read beyond it. */
    unsigned char room[sizeof(rlorch_options) + 16];
    memset(room, 0xA5, sizeof room);
    size_t short_size = offsetof(rlorch_options, tensors);
    rlorch_options_init((rlorch_options *)room, short_size, RLORCH_ROLE_TRAINER);
    int spill = 0;
    for (size_t k = short_size; k < sizeof room; k++) spill |= room[k] != 0xA5;
    int zeroed = 1;
    for (size_t k = 0; k < short_size; k++) zeroed &= room[k] == 0;
    if (spill || !zeroed) {
      failures++;
      printf("FAIL rlorch_options_init with a short size: %s\n",
             spill ? "wrote past the size" : "left the struct unset");
    } else {
      passes++;
      printf("ok rlorch_options_init writes no byte past the size it is given\n");
    }
  }
  RESET(RLORCH_ROLE_TRAINER);
  o.api_version = RLORCH_API_VERSION + 1;
  create_fails(&o, RLORCH_E_VERSION, "is newer than this library's API version", "a newer API version");
  RESET(RLORCH_ROLE_TRAINER);
  o.role = (rlorch_role)7;
  create_fails(&o, RLORCH_E_INVALID, "options.role: 7 is neither", "an unknown role");
  RESET(RLORCH_ROLE_TRAINER);
  o.orchestrator = NULL;
  create_fails(&o, RLORCH_E_INVALID, "options.orchestrator: required", "no orchestrator");
  RESET(RLORCH_ROLE_TRAINER);
  t[2].storage_dtype = (rlorch_dtype)9;
  create_fails(&o, RLORCH_E_INVALID, "options.tensors: tensor #2 'c': storage_dtype: unknown value 9",
               "an unknown tensor dtype");
  RESET(RLORCH_ROLE_TRAINER);
  t[1].wire_dtype = (rlorch_dtype)0;
  create_fails(&o, RLORCH_E_INVALID, "options.tensors: tensor #1 'b': wire_dtype: unknown value 0",
               "an unknown wire dtype");
  RESET(RLORCH_ROLE_TRAINER);
  t[3].name = "b";
  create_fails(&o, RLORCH_E_INVALID, "options.tensors: tensors #1 and #3: duplicate name 'b'",
               "a duplicate tensor name");
  RESET(RLORCH_ROLE_TRAINER);
  t[0].storage_dtype = RLORCH_DTYPE_FP16;
  create_fails(&o, RLORCH_E_INVALID, "options.tensors: tensor #0 'a': wire_dtype: no cast from fp16 to bf16",
               "a cast the broadcast cannot make");
  RESET(RLORCH_ROLE_INFERENCE);
  t[1].storage_dtype = RLORCH_DTYPE_FP32;
  create_fails(&o, RLORCH_E_INVALID, "options.tensors[1] 'b': an inference worker's buffers hold the wire dtype",
               "inference buffers not in the wire dtype");
  RESET(RLORCH_ROLE_TRAINER);
  t[2].shape = shape0;
  create_fails(&o, RLORCH_E_INVALID, "options.tensors: tensor #2 'c': shape[1]: 0, every dimension is at least 1", "an empty dimension");
  RESET(RLORCH_ROLE_TRAINER);
  t[0].ndim = 9;
  create_fails(&o, RLORCH_E_INVALID, "options.tensors[0] 'a': ndim 9 is outside 1..8", "too many dimensions");
  RESET(RLORCH_ROLE_TRAINER);
  t[1].data = NULL;
  create_fails(&o, RLORCH_E_INVALID, "options.tensors[1] 'b': data is NULL", "a NULL data pointer");
  RESET(RLORCH_ROLE_TRAINER);
  t[0].name = "";
  create_fails(&o, RLORCH_E_INVALID, "options.tensors: tensor #0: name: empty", "an empty name");
  RESET(RLORCH_ROLE_TRAINER);
  t[1].name = "b\nc";
  create_fails(&o, RLORCH_E_INVALID, "options.tensors: tensor #1: name: control character 0x0a at byte 1",
               "a control character in a name");
  RESET(RLORCH_ROLE_TRAINER);
  t[2].residency = (rlorch_residency)0;
  create_fails(&o, RLORCH_E_INVALID, "options.tensors: tensor #2 'c': residency: unknown value 0",
               "an unknown residency");
  RESET(RLORCH_ROLE_TRAINER);
  t[0].residency = RLORCH_RES_GPU;
  create_fails(&o, RLORCH_E_INVALID, "options.tensors[0] 'a': GPU-resident, but options.device is -1",
               "a GPU tensor without a device");
  RESET(RLORCH_ROLE_TRAINER);
  o.ntensors = 0;
  create_fails(&o, RLORCH_E_INVALID, "options.tensors: a trainer needs at least one tensor",
               "a trainer without tensors");
  RESET(RLORCH_ROLE_TRAINER);
  o.device = 64;
  create_fails(&o, RLORCH_E_INVALID, "options.device: 64: no such CUDA device", "a device that is not there");
  RESET(RLORCH_ROLE_INFERENCE);
  o.max_concurrent_requests = 0;
  create_fails(&o, RLORCH_E_INVALID, "options.max_concurrent_requests: 0 is outside 1..1024",
               "no concurrency");
  RESET(RLORCH_ROLE_TRAINER);
  o.tls_cert_file = "cert.pem";
  create_fails(&o, RLORCH_E_INVALID, "options.tls_cert_file is set without options.tls_key_file",
               "a client certificate without its key");
  RESET(RLORCH_ROLE_TRAINER);
  o.token_file = "/nonexistent/rlorch-token";
  create_fails(&o, RLORCH_E_IO, "/nonexistent/rlorch-token", "a token file that is not there");
  RESET(RLORCH_ROLE_TRAINER);
  o.data_listen = "256.1.1.1:http";
  create_fails(&o, RLORCH_E_IO, "options.data_listen", "a data address that cannot be listened on");
  RESET(RLORCH_ROLE_TRAINER);
  o.connect_timeout_s = 0;
  create_fails(&o, RLORCH_E_INVALID, "options.connect_timeout_s: 0 is not a positive number",
               "no connect timeout");
  create_fails(NULL, RLORCH_E_INVALID, "rlorch_create: options is NULL", "NULL options");

  /* API version 2's options. */
  RESET(RLORCH_ROLE_INFERENCE);
  o.on_bind = place;
  create_fails(&o, RLORCH_E_INVALID, "options.on_bind: set with 4 options.tensors",
               "on_bind beside tensors");
  RESET(RLORCH_ROLE_TRAINER);
  o.on_bind = place;
  create_fails(&o, RLORCH_E_INVALID, "options.on_bind: a trainer sends its own tensors",
               "on_bind on a trainer");
  RESET(RLORCH_ROLE_TRAINER);
  o.offload = (rlorch_offload)4;
  create_fails(&o, RLORCH_E_INVALID, "options.offload: unknown value 4", "an unknown offload");
  RESET(RLORCH_ROLE_TRAINER);
  o.token_file = NULL;
  o.token = "";
  create_fails(&o, RLORCH_E_INVALID, "options.token: 0 bytes, not 1..1023", "an empty token");
  {
    static char long_token[2000];
    memset(long_token, 'x', sizeof long_token - 1);
    RESET(RLORCH_ROLE_TRAINER);
    o.token_file = NULL;
    o.token = long_token;
    create_fails(&o, RLORCH_E_INVALID, "options.token: 1999 bytes, not 1..1023", "an over-long token");
  }
  {
    static char long_model[RLORCH_NAME_MAX + 2];
    memset(long_model, 'm', sizeof long_model - 1);
    RESET(RLORCH_ROLE_TRAINER);
    o.model = long_model;
    create_fails(&o, RLORCH_E_INVALID, "options.model: more than 127 bytes", "a model name of 128 bytes");
  }
  /* A rank of a sharded trainer: its rank, its group, its parts. */
  {
    rlorch_shard sh[4] = {{0, 32}, {32, 32}, {0, 64}, {10, 20}};
    RESET(RLORCH_ROLE_TRAINER);
    o.trainer_rank = 2;
    o.trainer_ranks = 2;
    create_fails(&o, RLORCH_E_INVALID, "options.trainer_rank: 2 is not below options.trainer_ranks 2",
                 "a rank past its group");
    RESET(RLORCH_ROLE_TRAINER);
    o.trainer_rank = 1;
    create_fails(&o, RLORCH_E_INVALID,
                 "options.trainer_rank: 1 is not below options.trainer_ranks 0 (0: a lone trainer, rank 0)",
                 "a rank without a group");
    RESET(RLORCH_ROLE_TRAINER);
    o.trainer_ranks = 1025;
    create_fails(&o, RLORCH_E_INVALID, "options.trainer_ranks: 1025 is outside 0..1024",
                 "a group over 1024 ranks");
    RESET(RLORCH_ROLE_TRAINER);
    o.shards = sh;
    create_fails(&o, RLORCH_E_INVALID,
                 "options.shards: set with options.trainer_ranks 0 (a lone trainer sends whole tensors)",
                 "shards on a lone trainer");
    RESET(RLORCH_ROLE_INFERENCE);
    o.trainer_ranks = 2;
    create_fails(&o, RLORCH_E_INVALID, "options.trainer_ranks: only a trainer has ranks",
                 "ranks on an inference worker");
    RESET(RLORCH_ROLE_TRAINER);
    o.trainer_ranks = 2;
    o.shards = sh;
    sh[1] = (rlorch_shard){40, 32};
    create_fails(&o, RLORCH_E_INVALID,
                 "options.shards[1] 'b': elements [40, 40 + 32) are past the tensor's end (64 elements)",
                 "a part past the tensor's end");
    sh[1] = (rlorch_shard){UINT64_MAX, 2};
    create_fails(&o, RLORCH_E_INVALID, "options.shards[1] 'b': elements [18446744073709551615, "
                 "18446744073709551615 + 2) are past the tensor's end", "a part whose end overflows");
    sh[1] = (rlorch_shard){32, 0};
    create_fails(&o, RLORCH_E_INVALID, "options.shards[1] 'b': element_count 0 (a rank that holds "
                 "none of a tensor leaves it out of options.tensors)", "an empty part");
    sh[1] = (rlorch_shard){32, 32};
    rlorch_worker *ws = NULL;
    expect(rlorch_create(&o, &ws, &err), RLORCH_OK, &err, "", "a rank with parts inside its tensors");
    rlorch_free(ws);
  }
  /* An inference worker's parts (API 3): each refused by name. */
  {
    rlorch_part pt[2] = {{.name = "a", .kind = RLORCH_PART_SLICE, .dim = 0, .start = 0, .count = 4},
                         {.name = "b", .kind = RLORCH_PART_SLICE, .dim = 1, .start = 4, .count = 4}};
#define PARTS(role)   \
  do {                \
    RESET(role);      \
    o.parts = pt;     \
    o.nparts = 2;     \
  } while (0)
    PARTS(RLORCH_ROLE_TRAINER);
    create_fails(&o, RLORCH_E_INVALID, "options.parts: only an inference worker holds parts",
                 "parts on a trainer");
    PARTS(RLORCH_ROLE_INFERENCE);
    o.parts = NULL;
    create_fails(&o, RLORCH_E_INVALID, "options.parts: NULL with nparts 2", "nparts without parts");
    PARTS(RLORCH_ROLE_INFERENCE);
    pt[1].name = "";
    create_fails(&o, RLORCH_E_INVALID, "options.parts[1].name: empty", "a part with an empty name");
    pt[1].name = NULL;
    create_fails(&o, RLORCH_E_INVALID, "options.parts[1].name: NULL", "a part without a name");
    char longname[RLORCH_NAME_MAX + 2];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    pt[1].name = longname;
    create_fails(&o, RLORCH_E_INVALID, "options.parts[1].name: 128 bytes, more than 127",
                 "a part name of 128 bytes");
    pt[1].name = "a";
    create_fails(&o, RLORCH_E_INVALID, "options.parts[1] 'a': listed twice (also options.parts[0])",
                 "a tensor's part given twice");
    pt[1].name = "b";
    pt[1].kind = (rlorch_part_kind)7;
    create_fails(&o, RLORCH_E_INVALID, "options.parts[1] 'b'.kind: unknown value 7", "an unknown kind");
    pt[1].kind = RLORCH_PART_SLICE;
    pt[1].count = 0;
    create_fails(&o, RLORCH_E_INVALID, "options.parts[1] 'b'.count: 0; a slice holds at least one index",
                 "a slice of no index");
    pt[1].count = 4;
    pt[1].dim = 2;
    create_fails(&o, RLORCH_E_INVALID, "options.parts[1] 'b'.dim: 2, but options.tensors[1] has 2 "
                 "dimensions", "a slice along a dimension the tensor lacks");
    pt[1].dim = 8;
    create_fails(&o, RLORCH_E_INVALID, "options.parts[1] 'b'.dim: 8, a tensor has at most 8 dimensions",
                 "a slice along dimension 8");
    pt[1].dim = 1;
    pt[1].start = 5;
    create_fails(&o, RLORCH_E_INVALID, "options.parts[1] 'b': indices [5, 9) along dim 1 are past "
                 "options.tensors[1]'s shape[1] 8", "a slice past the tensor's shape");
    pt[1].start = UINT64_MAX;
    create_fails(&o, RLORCH_E_INVALID, "options.parts[1] 'b'.start: 18446744073709551615 + count 4 "
                 "overflows", "a slice whose end overflows");
    pt[1].start = 4;
    pt[1].kind = RLORCH_PART_WHOLE;
    create_fails(&o, RLORCH_E_INVALID, "options.parts[1] 'b': dim, start and count are a SLICE's; a "
                 "WHOLE part leaves them 0", "a whole part with a slice's fields");
    pt[1] = (rlorch_part){.name = "b", .kind = RLORCH_PART_NONE};
    create_fails(&o, RLORCH_E_INVALID, "options.parts[1] 'b': NONE, but options.tensors[1] holds it "
                 "(leave a tensor held NONE out of options.tensors)", "a NONE part's tensor given");
    pt[1] = (rlorch_part){.name = "e", .kind = RLORCH_PART_SLICE, .dim = 0, .start = 0, .count = 1};
    create_fails(&o, RLORCH_E_INVALID, "options.parts[1] 'e': no options.tensors of that name holds it",
                 "a part of a tensor not given");
    /* Good parts: a NONE part of a tensor not given, a slice inside its
     * tensor; with on_bind (no tensors) the shapes are the plan's. */
    pt[1] = (rlorch_part){.name = "e", .kind = RLORCH_PART_NONE};
    rlorch_worker *wp = NULL;
    expect(rlorch_create(&o, &wp, &err), RLORCH_OK, &err, "", "an inference worker with good parts");
    rlorch_free(wp);
    PARTS(RLORCH_ROLE_INFERENCE);
    o.tensors = NULL;
    o.ntensors = 0;
    o.on_bind = place;
    wp = NULL;
    expect(rlorch_create(&o, &wp, &err), RLORCH_OK, &err, "", "parts with on_bind placing the tensors");
    rlorch_free(wp);
#undef PARTS
  }
  {
    /* A caller built against version 2's header: its struct ends before
     * version 3's parts, and what lies past it is neither written nor read
     * (0xA5 bytes read as parts would be refused or crash). */
    unsigned char room[sizeof(rlorch_options) + 16];
    memset(room, 0xA5, sizeof room);
    size_t v2_size = offsetof(rlorch_options, parts);
    rlorch_options *v2 = (rlorch_options *)(void *)room;
    rlorch_options_init(v2, v2_size, RLORCH_ROLE_INFERENCE);
    int spill = 0;
    for (size_t k = v2_size; k < sizeof room; k++) spill |= room[k] != 0xA5;
    rlorch_tensor t2[4];
    tensors(t2, RLORCH_DTYPE_BF16, RLORCH_DTYPE_BF16);
    v2->orchestrator = orch;
    v2->token = "inline";
    v2->tensors = t2;
    v2->ntensors = 4;
    rlorch_worker *w2 = NULL;
    rlorch_status rc = rlorch_create(v2, &w2, &err);
    if (spill || v2->api_version != 2 || rc != RLORCH_OK) {
      failures++;
      printf("FAIL a version 2 caller: api_version %u, %s, create %s: %s\n", v2->api_version,
             spill ? "written past its struct" : "nothing written past its struct",
             rlorch_status_name(rc), err.message);
    } else {
      passes++;
      printf("ok   a version 2 caller gets api_version 2 and a worker; the bytes past its struct are "
             "neither written nor read\n");
    }
    rlorch_free(w2);
  }
  {
    /* A caller built against version 1's header: its struct ends before
     * version 2's fields, and what lies past it is not read. */
    unsigned char room[sizeof(rlorch_options) + 16];
    memset(room, 0xA5, sizeof room);
    size_t v1_size = offsetof(rlorch_options, token);
    rlorch_options *v1 = (rlorch_options *)(void *)room;
    rlorch_options_init(v1, v1_size, RLORCH_ROLE_TRAINER);
    int spill = 0;
    for (size_t k = v1_size; k < sizeof room; k++) spill |= room[k] != 0xA5;
    rlorch_tensor t1[4];
    tensors(t1, RLORCH_DTYPE_FP32, RLORCH_DTYPE_BF16);
    v1->orchestrator = orch;
    v1->token_file = token;
    v1->tensors = t1;
    v1->ntensors = 4;
    rlorch_worker *w1 = NULL;
    rlorch_status rc = rlorch_create(v1, &w1, &err);
    if (spill || v1->api_version != 1 || rc != RLORCH_OK) {
      failures++;
      printf("FAIL a version 1 caller: api_version %u, %s, create %s: %s\n", v1->api_version,
             spill ? "written past its struct" : "nothing written past its struct",
             rlorch_status_name(rc), err.message);
    } else {
      passes++;
      printf("ok   a version 1 caller gets api_version 1 and a worker; the bytes past its struct are "
             "neither written nor read\n");
    }
    rlorch_free(w1);
  }

  {
    /* API version 4: where the worker runs. Each bad setting is refused
     * naming its field; good ones make a worker. */
    char longname[200];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    RESET(RLORCH_ROLE_INFERENCE);
    o.node = "";
    create_fails(&o, RLORCH_E_INVALID, "options.node: empty", "an empty node name");
    o.node = longname;
    create_fails(&o, RLORCH_E_INVALID, "options.node: 199 bytes, more than 127", "a node name too long");
    o.node = "rack 1";
    create_fails(&o, RLORCH_E_INVALID, "options.node: \"rack 1\" holds a space", "a node name with a space");
    RESET(RLORCH_ROLE_TRAINER);
    o.nics = 2;
    create_fails(&o, RLORCH_E_INVALID, "options.nics: 2 NICs without nic_gbits", "NICs without their speed");
    o.nics = 33;
    o.nic_gbits = 100;
    create_fails(&o, RLORCH_E_INVALID, "options.nics: 33, more than 32", "too many NICs");
    o.nics = 0;
    o.nic_gbits = -1;
    create_fails(&o, RLORCH_E_INVALID, "options.nic_gbits: -1 is not a positive speed", "a negative speed");
    o.nic_gbits = 0.0 / 0.0;
    create_fails(&o, RLORCH_E_INVALID, "nan is not a positive speed in Gb/s", "a NaN speed");
    o.nic_gbits = 1e6;
    create_fails(&o, RLORCH_E_INVALID, "options.nic_gbits: 1e+06 Gb/s, more than 10000", "an absurd speed");
    o.node = "n-1";
    o.nics = 2;
    o.nic_gbits = 100;
    rlorch_worker *wt = NULL;
    expect(rlorch_create(&o, &wt, &err), RLORCH_OK, &err, "", "a worker on node n-1 with 2 x 100 Gb/s");
    rlorch_free(wt);
  }
  {
    /* A caller built against version 3's header: its struct ends before
     * version 4's node, nics and nic_gbits; 0xA5 bytes read as them would be
     * a wild pointer and 0xA5A5A5A5 NICs. */
    unsigned char room[sizeof(rlorch_options) + 16];
    memset(room, 0xA5, sizeof room);
    size_t v3_size = offsetof(rlorch_options, nparts) + sizeof(size_t);
    rlorch_options *v3 = (rlorch_options *)(void *)room;
    rlorch_options_init(v3, v3_size, RLORCH_ROLE_INFERENCE);
    int spill = 0;
    for (size_t k = v3_size; k < sizeof room; k++) spill |= room[k] != 0xA5;
    rlorch_tensor t3[4];
    tensors(t3, RLORCH_DTYPE_BF16, RLORCH_DTYPE_BF16);
    v3->orchestrator = orch;
    v3->token_file = token;
    v3->tensors = t3;
    v3->ntensors = 4;
    rlorch_worker *w3 = NULL;
    rlorch_status rc = rlorch_create(v3, &w3, &err);
    if (spill || v3->api_version != 3 || rc != RLORCH_OK) {
      failures++;
      printf("FAIL a version 3 caller: api_version %u, %s, create %s: %s\n", v3->api_version,
             spill ? "written past its struct" : "nothing written past its struct",
             rlorch_status_name(rc), err.message);
    } else {
      passes++;
      printf("ok   a version 3 caller gets api_version 3 and a worker; the bytes past its struct are "
             "neither written nor read\n");
    }
    rlorch_free(w3);
  }

  /* A worker that exists but is not started. */
  RESET(RLORCH_ROLE_TRAINER);
  rlorch_worker *w = NULL;
  expect(rlorch_create(&o, &w, &err), RLORCH_OK, &err, "", "a good trainer is created");
  rlorch_command *cmd = NULL;
  expect(rlorch_next(w, 0, &cmd, &err), RLORCH_E_STATE, &err, "the worker is not started",
         "next before start");
  expect(rlorch_stop_status(w, &err), RLORCH_E_STATE, &err, "the worker has not stopped",
         "stop_status before start");
  /* Its data listener exists from rlorch_create on, at the port chosen for
   * the default 127.0.0.1:0. */
  check(listens(rlorch_data_address(w)), "a trainer's data address listens", rlorch_data_address(w));
  rlorch_free(w);
  check(rlorch_data_address(NULL) == NULL, "no data address for a NULL worker",
        rlorch_data_address(NULL));

  /* Nothing listens: start gives up after connect_timeout_s. */
  RESET(RLORCH_ROLE_INFERENCE);
  o.orchestrator = dead;
  o.connect_timeout_s = 1.5;
  w = NULL;
  expect(rlorch_create(&o, &w, &err), RLORCH_OK, &err, "", "an inference worker for a dead address");
  check(rlorch_data_address(w) == NULL, "no data address for an inference worker",
        rlorch_data_address(w));
  expect(rlorch_start(w, &err), RLORCH_E_UNAVAILABLE, &err, "within 1.5 s (options.connect_timeout_s)",
         "start with no orchestrator");
  expect(rlorch_next(w, 0, &cmd, &err), RLORCH_E_STOPPED, &err, "the worker stopped",
         "next after a failed start");
  rlorch_free(w);

  /* Given data_listen, an inference worker listens too: it may relay. */
  RESET(RLORCH_ROLE_INFERENCE);
  o.orchestrator = dead;
  o.data_listen = "127.0.0.1:0";
  w = NULL;
  expect(rlorch_create(&o, &w, &err), RLORCH_OK, &err, "", "an inference worker that may relay");
  check(listens(rlorch_data_address(w)), "a relaying inference worker's data address listens",
        rlorch_data_address(w));
  rlorch_free(w);

  /* The orchestrator refuses a wrong token: its status text comes back. */
  RESET(RLORCH_ROLE_TRAINER);
  o.token_file = NULL;
  w = NULL;
  expect(rlorch_create(&o, &w, &err), RLORCH_OK, &err, "", "a trainer without the token");
  expect(rlorch_start(w, &err), RLORCH_E_REFUSED, &err,
         "the orchestrator refused the registration: UNAUTHENTICATED", "start without the token");
  expect(rlorch_stop_status(w, &err), RLORCH_E_REFUSED, &err, "UNAUTHENTICATED",
         "stop_status after a refused registration");
  rlorch_free(w);

  /* With the token it registers; a second start is refused here. */
  RESET(RLORCH_ROLE_TRAINER);
  w = NULL;
  expect(rlorch_create(&o, &w, &err), RLORCH_OK, &err, "", "a trainer with the token");
  expect(rlorch_start(w, &err), RLORCH_OK, &err, "", "start with the token");
  expect(rlorch_start(w, &err), RLORCH_E_STATE, &err, "was started already", "a second start");
  expect(rlorch_next(w, 0, &cmd, &err), RLORCH_TIMEOUT, &err, "", "next with nothing queued");
  expect(rlorch_next(w, 0.0 / 0.0, &cmd, &err), RLORCH_E_INVALID, &err, "timeout_s is NaN", "a NaN timeout");
  expect(rlorch_stop_status(w, &err), RLORCH_E_STATE, &err, "the worker has not stopped",
         "stop_status of a running worker");
  rlorch_stop(w);
  expect(rlorch_next(w, 5, &cmd, &err), RLORCH_E_STOPPED, &err, "the worker stopped", "next after stop");
  expect(rlorch_stop_status(w, &err), RLORCH_OK, &err, "", "stop_status after rlorch_stop");
  rlorch_free(w);

  /* A token given inline, not in a file. */
  RESET(RLORCH_ROLE_INFERENCE);
  char tok[256] = "";
  FILE *tf = fopen(token, "r");
  if (!tf || !fgets(tok, sizeof tok, tf)) tok[0] = 0;
  if (tf) fclose(tf);
  tok[strcspn(tok, "\r\n")] = 0;
  o.token_file = NULL;
  o.token = tok;
  w = NULL;
  expect(rlorch_create(&o, &w, &err), RLORCH_OK, &err, "", "an inference worker with the token inline");
  expect(rlorch_start(w, &err), RLORCH_OK, &err, "", "start with the token inline");
  rlorch_free(w);
  expect(rlorch_stop_status(NULL, &err), RLORCH_E_INVALID, &err, "worker is NULL", "stop_status on NULL");
  rlorch_free(NULL);

  expect(rlorch_next(NULL, 0, &cmd, &err), RLORCH_E_INVALID, &err, "rlorch_next: worker is NULL",
         "next on NULL");
  printf("%d passed, %d failed\n", passes, failures);
  return failures || !passes ? 1 : 0;
}
