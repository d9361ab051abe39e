#!/usr/bin/env node
// A registration flood: N Register calls (inference role, no token, never a
// heartbeat after), CONCURRENCY at a time over one channel, through grpc-js.
//
//   node flood.js HOST:PORT N [CONCURRENCY]
//
// Prints one JSON object: how many registrations each status code got, the
// first refusal's message, and the seconds from the first call to the last
// answer.
'use strict';

const path = require('path');
const nodeDir = path.join(__dirname, '..', 'integration', 'node', 'node_modules');
const grpc = require(path.join(nodeDir, '@grpc', 'grpc-js'));
const protoLoader = require(path.join(nodeDir, '@grpc', 'proto-loader'));

const [target, nArg, concArg] = process.argv.slice(2);
const n = parseInt(nArg, 10);
const concurrency = parseInt(concArg || '64', 10);
if (!target || !(n > 0) || !(concurrency > 0)) {
  process.stderr.write('usage: node flood.js HOST:PORT N [CONCURRENCY]\n');
  process.exit(3);
}
const schemas = path.join(__dirname, '..', '..', 'schemas');
const pkg = protoLoader.loadSync('rlorch/v1/worker.proto', { keepCase: true, includeDirs: [schemas] });
const Worker = grpc.loadPackageDefinition(pkg).rlorch.v1.Worker;
const client = new Worker(target, grpc.credentials.createInsecure());

const codes = {};
let firstRefusal = '';
let next = 0;
let done = 0;
const t0 = Date.now();

function one() {
  if (next >= n) return;
  const i = next++;
  const deadline = new Date(Date.now() + 30000);
  client.Register({ role: 'WORKER_ROLE_INFERENCE', name: `flood-${i}` }, { deadline }, (err) => {
    const name = err ? grpc.status[err.code] : 'OK';
    codes[name] = (codes[name] || 0) + 1;
    if (err && err.code === grpc.status.RESOURCE_EXHAUSTED && !firstRefusal) firstRefusal = err.details;
    if (++done === n) {
      console.log(JSON.stringify({ codes, first_refusal: firstRefusal, seconds: (Date.now() - t0) / 1000 }));
      client.close();
    } else {
      one();
    }
  });
}
for (let k = 0; k < concurrency; k++) one();
