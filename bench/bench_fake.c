#include "bench/bench_fake.h"

#include <stdio.h>

int bench_fake_register(rpc_client *c, int trainer, uint32_t index, char *id, size_t idlen,
                        const char *who) {
  Rlorch__V1__RegisterRequest q = RLORCH__V1__REGISTER_REQUEST__INIT;
  Rlorch__V1__Capabilities caps = RLORCH__V1__CAPABILITIES__INIT;
  Rlorch__V1__WeightManifest man = RLORCH__V1__WEIGHT_MANIFEST__INIT;
  Rlorch__V1__TensorSpec t = RLORCH__V1__TENSOR_SPEC__INIT;
  Rlorch__V1__TensorSpec *tp = &t;
  uint64_t shape = 1;
  char name[32];
  snprintf(name, sizeof name, "%s-%u", trainer ? "trainer" : "inference", index);
  q.role = trainer ? RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER
                   : RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE;
  q.name = name;
  q.capabilities = &caps;
  caps.cpu_threads = 1;
  if (trainer) {
    t.name = "w";
    t.storage_dtype = RLORCH__V1__DTYPE__DTYPE_FP32;
    t.wire_dtype = RLORCH__V1__DTYPE__DTYPE_BF16;
    t.shape = &shape;
    t.n_shape = 1;
    t.residency = RLORCH__V1__RESIDENCY__RESIDENCY_HOST_PAGEABLE;
    man.tensors = &tp;
    man.n_tensors = 1;
    q.manifest = &man;
    q.data_address = "127.0.0.1:9"; /* never dialled: the broadcast is answered at once */
  }
  ProtobufCMessage *resp = NULL;
  rpc_status st;
  if (rpc_client_call(c, "/rlorch.v1.Worker/Register", &q.base,
                      &rlorch__v1__register_response__descriptor, 10, &resp,
                      &st) != GRPC_STATUS_OK) {
    fprintf(stderr, "%s: Register: %s: %s\n", who, rpc_status_name(st.code), st.message);
    return -1;
  }
  snprintf(id, idlen, "%s", ((Rlorch__V1__RegisterResponse *)resp)->worker_id);
  protobuf_c_message_free_unpacked(resp, NULL);
  return 0;
}

void bench_fake_attach(rpc_client *c, const char *worker_id,
                       int (*on_command)(ProtobufCMessage *m, void *ud), void *ud) {
  Rlorch__V1__AttachRequest a = RLORCH__V1__ATTACH_REQUEST__INIT;
  a.worker_id = (char *)worker_id; /* protobuf-c never writes through it when packing */
  rpc_status st;
  rpc_client_stream(c, "/rlorch.v1.Worker/Attach", &a.base, &rlorch__v1__command__descriptor, 0,
                    on_command, ud, &st);
}

int bench_fake_report(rpc_client *c, const char *worker_id, Rlorch__V1__ReportRequest *r) {
  r->worker_id = (char *)worker_id; /* protobuf-c never writes through it when packing */
  ProtobufCMessage *resp = NULL;
  rpc_status st;
  if (rpc_client_call(c, "/rlorch.v1.Worker/Report", &r->base,
                      &rlorch__v1__report_response__descriptor, 10, &resp, &st) != GRPC_STATUS_OK)
    return -1;
  protobuf_c_message_free_unpacked(resp, NULL);
  return 0;
}

int bench_fake_send(rpc_client *c, rpc_oneway *ow, const char *worker_id,
                    Rlorch__V1__ReportRequest *r) {
  if (ow) {
    r->worker_id = (char *)worker_id; /* protobuf-c never writes through it when packing */
    rpc_status st;
    if (rpc_oneway_send(ow, &r->base, 10, &st)) return 0;
  }
  return bench_fake_report(c, worker_id, r);
}

static void bench_fake_refused(uint64_t seq, const rpc_status *st, void *ud) {
  fprintf(stderr, "%s: report %llu refused: %s: %s\n", (const char *)ud, (unsigned long long)seq,
          rpc_status_name(st->code), st->message);
}

rpc_oneway *bench_fake_report_stream(rpc_client *c, const char *who) {
  rpc_oneway_opts o = {.method = "/rlorch.v1.Worker/ReportStream",
                       .on_failed = bench_fake_refused,
                       .ud = (void *)who};
  rpc_oneway *ow = NULL;
  char err[256];
  if (rpc_oneway_new(c, &o, &ow, err, sizeof err) < 0) {
    fprintf(stderr, "%s: report stream: %s\n", who, err);
    return NULL;
  }
  return ow;
}

int bench_fake_ack(rpc_client *c, rpc_oneway *ow, const char *worker_id,
                   const Rlorch__V1__BroadcastPlan *plan) {
  Rlorch__V1__ReportRequest r = RLORCH__V1__REPORT_REQUEST__INIT;
  Rlorch__V1__PlanAck ack = RLORCH__V1__PLAN_ACK__INIT;
  ack.plan_id = plan->plan_id;
  ack.plan_hash = plan->hash;
  r.kind_case = RLORCH__V1__REPORT_REQUEST__KIND_PLAN_ACK;
  r.plan_ack = &ack;
  return bench_fake_send(c, ow, worker_id, &r);
}

int bench_fake_done(rpc_client *c, rpc_oneway *ow, const char *worker_id,
                    const Rlorch__V1__TriggerBroadcast *t) {
  Rlorch__V1__ReportRequest r = RLORCH__V1__REPORT_REQUEST__INIT;
  Rlorch__V1__BroadcastDone bd = RLORCH__V1__BROADCAST_DONE__INIT;
  Rlorch__V1__StepRecord rec = RLORCH__V1__STEP_RECORD__INIT;
  rec.transport = "none";
  bd.plan_id = t->plan_id;
  bd.record = &rec;
  r.kind_case = RLORCH__V1__REPORT_REQUEST__KIND_BROADCAST_DONE;
  r.broadcast_done = &bd;
  return bench_fake_send(c, ow, worker_id, &r);
}
