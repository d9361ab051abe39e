/* pbjson: protobuf-c messages as JSON, and enum short names both ways. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/common/pbjson.h"
#include "rlorch/v1/control.pb-c.h"
#include "rlorch/v1/worker.pb-c.h"

static char *to_json(const ProtobufCMessage *m) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  pbjson_write(f, m);
  fclose(f);
  return buf;
}

Test(pbjson, scalars_enums_strings_and_64_bit_integers) {
  Rlorch__V1__RunSpec spec = RLORCH__V1__RUN_SPEC__INIT;
  spec.name = "a \"quoted\"\nname";
  spec.preset = "4b";
  spec.steps = 7;
  spec.policy = RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_STAGED;
  spec.staging_budget_bytes = 18446744073709551615ull;
  Rlorch__V1__Run run = RLORCH__V1__RUN__INIT;
  run.id = "run-1";
  run.spec = &spec;
  run.created_unix_ms = -5;
  char *j = to_json(&run.base);
  cr_assert(strstr(j, "\"id\":\"run-1\""), "%s", j);
  cr_assert(strstr(j, "\"name\":\"a \\\"quoted\\\"\\nname\""), "escaping: %s", j);
  cr_assert(strstr(j, "\"policy\":\"BROADCAST_MODE_STAGED\""), "enum name: %s", j);
  cr_assert(strstr(j, "\"staging_budget_bytes\":\"18446744073709551615\""), "uint64: %s", j);
  cr_assert(strstr(j, "\"created_unix_ms\":\"-5\""), "int64: %s", j);
  cr_assert(strstr(j, "\"steps\":7"), "uint32 as a number: %s", j);
  cr_assert(strstr(j, "\"state\":\"RUN_STATE_UNSPECIFIED\""), "defaults are present: %s", j);
  free(j);
}

Test(pbjson, oneof_repeated_and_bytes) {
  uint64_t ids[] = {1, 2, 3};
  uint8_t raw[] = {0xff, 0x00, 0x10, 0x20};
  Rlorch__V1__TrainStep ts = RLORCH__V1__TRAIN_STEP__INIT;
  ts.rollout_ids = ids;
  ts.n_rollout_ids = 3;
  Rlorch__V1__Command cmd = RLORCH__V1__COMMAND__INIT;
  cmd.kind_case = RLORCH__V1__COMMAND__KIND_TRAIN;
  cmd.train = &ts;
  char *j = to_json(&cmd.base);
  cr_assert(strstr(j, "\"train\":{"), "the set member: %s", j);
  cr_assert_null(strstr(j, "\"rollout\""), "unset oneof members are left out: %s", j);
  cr_assert(strstr(j, "\"rollout_ids\":[\"1\",\"2\",\"3\"]"), "repeated: %s", j);
  free(j);

  Rlorch__V1__StepDone sd = RLORCH__V1__STEP_DONE__INIT;
  sd.nccl_unique_id.data = raw;
  sd.nccl_unique_id.len = sizeof raw;
  j = to_json(&sd.base);
  cr_assert(strstr(j, "\"nccl_unique_id\":\"/wAQIA==\""), "base64 with padding: %s", j);
  free(j);
}

Test(pbjson, enum_short_names_round_trip) {
  char buf[64];
  cr_assert_str_eq(pbjson_enum_short(&rlorch__v1__run_state__descriptor,
                                     RLORCH__V1__RUN_STATE__RUN_STATE_SUCCEEDED, buf, sizeof buf),
                   "succeeded");
  int v = 0;
  cr_assert_eq(pbjson_enum_parse(&rlorch__v1__offload__descriptor, "params+optimizer", &v), 0);
  cr_assert_eq(v, RLORCH__V1__OFFLOAD__OFFLOAD_PARAMS_AND_OPTIMIZER);
  cr_assert_eq(pbjson_enum_parse(&rlorch__v1__broadcast_mode__descriptor, "STAGED", &v), 0);
  cr_assert_eq(v, RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_STAGED);
  cr_assert_eq(pbjson_enum_parse(&rlorch__v1__broadcast_mode__descriptor,
                                 "BROADCAST_MODE_HOST", &v), 0);
  cr_assert_eq(v, RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_HOST);
  cr_assert_eq(pbjson_enum_parse(&rlorch__v1__broadcast_mode__descriptor, "unspecified", &v), -1,
               "UNSPECIFIED is never accepted");
  cr_assert_eq(pbjson_enum_parse(&rlorch__v1__broadcast_mode__descriptor, "fast", &v), -1);
  cr_assert_eq(pbjson_enum_parse(&rlorch__v1__broadcast_mode__descriptor, "", &v), -1);
  pbjson_enum_choices(&rlorch__v1__broadcast_mode__descriptor, buf, sizeof buf);
  cr_assert_str_eq(buf, "auto|direct|staged|host|colocated");
}
