#!/usr/bin/env node
// Decodes protobuf bytes (hex, as SQLite's hex() prints a BLOB) of a message
// type from the repository's schemas and prints it as one JSON line, with the
// proto field names, enums as names and 64-bit integers as strings.
//   node decode.js rlorch.v1.StepRecord 0A05...
'use strict';
const path = require('path');
const fs = require('fs');
const protobuf = require(require.resolve('protobufjs', {
  paths: [path.dirname(require.resolve('@grpc/proto-loader'))],
}));

function protoFiles(dir, rel = '') {
  let out = [];
  for (const e of fs.readdirSync(path.join(dir, rel), { withFileTypes: true })) {
    const r = path.join(rel, e.name);
    if (e.isDirectory()) out = out.concat(protoFiles(dir, r));
    else if (e.name.endsWith('.proto')) out.push(r);
  }
  return out;
}

const [type, hex] = process.argv.slice(2);
if (!type || hex === undefined) {
  process.stderr.write('usage: node decode.js FULL.TYPE.NAME HEX\n');
  process.exit(3);
}
const dir = path.resolve(__dirname, '../../../schemas');
const root = new protobuf.Root();
root.resolvePath = (origin, target) => path.join(dir, target);
root.loadSync(protoFiles(dir), { keepCase: true });
const T = root.lookupType(type);
const msg = T.decode(Buffer.from(hex, 'hex'));
process.stdout.write(JSON.stringify(T.toObject(msg, { enums: String, longs: String, defaults: true })) + '\n');
