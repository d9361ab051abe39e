#!/usr/bin/env node
// A third-party gRPC client for the integration tests: grpc-js, not the C core,
// so the server is exercised by an implementation it does not share code with.
//
//   node client.js --target HOST:PORT --method /pkg.Service/Method [--json '{...}']
//                  [--token T] [--deadline-ms N] [--raw-hex HEX] [--max-send BYTES]
//                  [--stream [--max-messages N] [--cancel-after-ms N] [--read-delay-ms N]]
//                  [--pad-bytes N] [--raw-file FILE] [--timing]
//   node client.js --target HOST:PORT --health SERVICE | --health-watch SERVICE
//
// Output: one JSON line per response message ({"message": {...}}), then one final
// line {"status": {"code": N, "name": "OK", "details": "..."}}.
// Exit status: 0 whenever the call completed, whatever its gRPC status;
// 3 for usage errors found before any call is made; 1 for anything unexpected.
//
// Methods go through generic definitions with identity serializers: the request
// is encoded here (or taken verbatim from --raw-hex), so unknown methods and
// undecodable bytes reach the server exactly as given.
'use strict';

const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
// protobufjs comes with proto-loader; its reflection gives field-level checks.
const protobuf = require(require.resolve('protobufjs', {
  paths: [path.dirname(require.resolve('@grpc/proto-loader'))],
}));

const EXIT_USAGE = 3;
const DEFAULT_UNARY_DEADLINE_MS = 30000;
const LOAD_OPTS = {
  keepCase: true, longs: String, enums: String, bytes: String, defaults: true, oneofs: true,
};

class UsageError extends Error {}

const USAGE = `usage: node client.js --target HOST:PORT (--method /pkg.Service/Method | --health SERVICE
                      | --health-watch SERVICE | --list) [options]
  --json '{...}'        request as JSON (proto field names; camelCase accepted)
  --token TOKEN         send "authorization: Bearer TOKEN"
  --metadata K=V        extra request metadata (repeatable)
  --deadline-ms N       call deadline (unary default ${DEFAULT_UNARY_DEADLINE_MS} ms; streams: none)
  --raw-hex HEX         send these bytes as the request, bypassing the codec
  --raw-file FILE       the same, the bytes of FILE (a request too large for a command line)
  --pad-bytes N         append N bytes to a string field of the request
  --pad-field NAME      the field --pad-bytes stuffs (default: first string field)
  --max-send BYTES      client-side limit on the request size
  --timing              print {"elapsed_ms": N} before the status: the call alone, from
                        sending the request to its status (encoding and start-up left out)
  --stream              server-streaming call (implied for known streaming methods)
  --max-messages N      cancel the stream after N messages
  --cancel-after-ms N   cancel the call after N ms
  --read-delay-ms N     stop reading the stream for N ms after its first message
                        (a slow reader: the server's flow control holds it back)
  --tls-ca FILE         use TLS, trusting the PEM roots in FILE
  --schemas DIR         .proto root (default: the repository's schemas/)`;

// ---- arguments ---------------------------------------------------------------

const FLAGS = {
  '--target': 'str', '--method': 'str', '--json': 'str', '--token': 'str',
  '--deadline-ms': 'int', '--raw-hex': 'str', '--max-send': 'int', '--stream': 'bool',
  '--max-messages': 'int', '--cancel-after-ms': 'int', '--read-delay-ms': 'int', '--pad-bytes': 'int',
  '--pad-field': 'str', '--health': 'str', '--health-watch': 'str', '--tls-ca': 'str',
  '--schemas': 'str', '--metadata': 'list', '--list': 'bool', '--help': 'bool',
  '--raw-file': 'str', '--timing': 'bool',
};

function parseArgs(argv) {
  const o = { metadata: [] };
  for (let i = 0; i < argv.length; i++) {
    let flag = argv[i];
    let value;
    const eq = flag.indexOf('=');
    if (flag.startsWith('--') && eq > 0) {
      value = flag.slice(eq + 1);
      flag = flag.slice(0, eq);
    }
    const kind = FLAGS[flag];
    if (!kind) throw new UsageError(`unknown argument "${flag}"`);
    const key = flag.slice(2).replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    if (kind === 'bool') {
      if (value !== undefined) throw new UsageError(`${flag} takes no value`);
      o[key] = true;
      continue;
    }
    if (value === undefined) {
      if (i + 1 >= argv.length) throw new UsageError(`${flag} needs a value`);
      value = argv[++i];
    }
    if (kind === 'int') {
      if (!/^\d+$/.test(value)) throw new UsageError(`${flag}: "${value}" is not a non-negative integer`);
      o[key] = Number(value);
    } else if (kind === 'list') {
      o[key].push(value);
    } else {
      o[key] = value;
    }
  }
  return o;
}

function checkArgs(o) {
  if (o.help || o.list) return;
  if (!o.target) throw new UsageError('--target is required');
  const modes = ['method', 'health', 'healthWatch'].filter((k) => o[k] !== undefined);
  if (modes.length !== 1) throw new UsageError('give exactly one of --method, --health, --health-watch');
  if (o.method !== undefined && !/^\/[^/\s]+\/[^/\s]+$/.test(o.method)) {
    throw new UsageError(`--method "${o.method}" is not of the form /package.Service/Method`);
  }
  if (o.rawFile !== undefined && (o.rawHex !== undefined || o.json !== undefined || o.padBytes !== undefined)) {
    throw new UsageError('--raw-file excludes --raw-hex, --json and --pad-bytes');
  }
  if (o.rawHex !== undefined && (o.json !== undefined || o.padBytes !== undefined)) {
    throw new UsageError('--raw-hex excludes --json and --pad-bytes');
  }
  if (o.rawHex !== undefined && !/^(?:[0-9a-fA-F]{2})*$/.test(o.rawHex.replace(/\s+/g, ''))) {
    throw new UsageError('--raw-hex: an even number of hex digits expected');
  }
  for (const m of o.metadata) {
    if (!/^[0-9a-z_.-]+=/.test(m)) throw new UsageError(`--metadata "${m}": KEY=VALUE with a lowercase key expected`);
  }
}

// ---- schemas -----------------------------------------------------------------

function findProtos(root) {
  const out = [];
  const walk = (dir) => {
    for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
      const p = path.join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith('.proto')) out.push(path.relative(root, p));
    }
  };
  walk(root);
  return out.sort();
}

// Returns a map from full method path to { def (proto-loader), method (protobufjs) }.
function loadSchemas(dir) {
  let files;
  try {
    files = findProtos(dir);
  } catch (e) {
    throw new UsageError(`cannot read the schemas directory ${dir}: ${e.message}`);
  }
  if (files.length === 0) throw new UsageError(`no .proto files under ${dir}`);
  const pkg = protoLoader.loadSync(files, { ...LOAD_OPTS, includeDirs: [dir] });
  const root = new protobuf.Root();
  root.resolvePath = (_origin, target) => path.join(dir, target);
  root.loadSync(files, { keepCase: true });
  root.resolveAll();

  const methods = new Map();
  for (const [name, entry] of Object.entries(pkg)) {
    if (entry.format !== undefined) continue; // a message or enum, not a service
    const svc = root.lookupService(name);
    for (const [mname, def] of Object.entries(entry)) {
      methods.set(def.path, { def, method: svc.methods[mname] });
    }
  }
  return methods;
}

// ---- request validation: a clear error naming the field, never a silent coercion

const INT32 = new Set(['int32', 'sint32', 'sfixed32']);
const UINT32 = new Set(['uint32', 'fixed32']);
const INT64 = new Set(['int64', 'sint64', 'sfixed64', 'uint64', 'fixed64']);

function snake(s) {
  return s.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
}

function checkScalar(field, v, where) {
  const t = field.type;
  const bad = (what) => new UsageError(`${where}: ${what} expected for ${t} field, got ${JSON.stringify(v)}`);
  if (field.resolvedType instanceof protobuf.Enum) {
    if (typeof v === 'string' && Object.hasOwn(field.resolvedType.values, v)) return v;
    if (Number.isInteger(v)) return v;
    throw bad(`one of ${Object.keys(field.resolvedType.values).join(', ')}`);
  }
  if (field.resolvedType instanceof protobuf.Type) return normalize(field.resolvedType, v, where);
  if (INT32.has(t)) {
    if (!Number.isInteger(v) || v < -2147483648 || v > 2147483647) throw bad('a 32-bit integer');
  } else if (UINT32.has(t)) {
    if (!Number.isInteger(v) || v < 0 || v > 4294967295) throw bad('an unsigned 32-bit integer');
  } else if (INT64.has(t)) {
    const ok = (Number.isSafeInteger(v) || (typeof v === 'string' && /^-?\d+$/.test(v)));
    if (!ok || (t.startsWith('u') || t.startsWith('fixed')) && String(v).startsWith('-')) {
      throw bad('a 64-bit integer (number or decimal string)');
    }
  } else if (t === 'double' || t === 'float') {
    if (typeof v !== 'number') throw bad('a number');
  } else if (t === 'bool') {
    if (typeof v !== 'boolean') throw bad('true or false');
  } else if (t === 'string') {
    if (typeof v !== 'string') throw bad('a string');
  } else if (t === 'bytes') {
    if (typeof v !== 'string' || !/^[A-Za-z0-9+/]*={0,2}$/.test(v)) throw bad('a base64 string');
  }
  return v;
}

// Checks `obj` against `type` and returns a copy keyed by proto field names.
function normalize(type, obj, where) {
  if (obj === null || typeof obj !== 'object' || Array.isArray(obj)) {
    throw new UsageError(`${where}: a JSON object expected for ${type.fullName.slice(1)}`);
  }
  const out = {};
  for (const [key, v] of Object.entries(obj)) {
    const field = type.fields[key] || type.fields[snake(key)];
    const at = where ? `${where}.${key}` : key;
    if (!field) {
      const known = Object.keys(type.fields).join(', ') || 'none';
      throw new UsageError(`unknown field "${at}" in ${type.fullName.slice(1)} (fields: ${known})`);
    }
    if (v === null) throw new UsageError(`${at}: null is not a value; leave the field out`);
    if (field.map) {
      throw new UsageError(`${at}: map fields are not supported by this client`);
    } else if (field.repeated) {
      if (!Array.isArray(v)) throw new UsageError(`${at}: a JSON array expected`);
      out[field.name] = v.map((e, i) => checkScalar(field, e, `${at}[${i}]`));
    } else {
      out[field.name] = checkScalar(field, v, at);
    }
  }
  return out;
}

function pad(type, obj, n, fieldName) {
  const field = fieldName !== undefined
    ? type.fields[fieldName] || type.fields[snake(fieldName)]
    : type.fieldsArray.find((f) => f.type === 'string' && !f.repeated && !f.partOf);
  if (!field || field.type !== 'string' || field.repeated) {
    const which = fieldName !== undefined ? `"${fieldName}" is not a singular string field` : 'it has no singular string field';
    throw new UsageError(`--pad-bytes: cannot pad ${type.fullName.slice(1)}: ${which}`);
  }
  obj[field.name] = (obj[field.name] || '') + 'x'.repeat(n);
}

// ---- the call ------------------------------------------------------------------

function buildRequest(o, entry) {
  if (o.rawFile !== undefined) {
    try {
      return fs.readFileSync(o.rawFile);
    } catch (e) {
      throw new UsageError(`--raw-file: ${e.message}`);
    }
  }
  if (o.rawHex !== undefined) return Buffer.from(o.rawHex.replace(/\s+/g, ''), 'hex');
  let obj = {};
  if (o.json !== undefined) {
    try {
      obj = JSON.parse(o.json);
    } catch (e) {
      throw new UsageError(`--json is not valid JSON: ${e.message}`);
    }
  }
  if (!entry) {
    if (o.json !== undefined && Object.keys(obj).length > 0 || o.padBytes !== undefined) {
      throw new UsageError(`${o.method} is not in the schemas: only --raw-hex or an empty request can be sent`);
    }
    return Buffer.alloc(0);
  }
  const type = entry.method.resolvedRequestType;
  obj = normalize(type, obj, '');
  if (o.padBytes !== undefined) pad(type, obj, o.padBytes, o.padField);
  return entry.def.requestSerialize(obj);
}

function decodeResponse(entry, buf) {
  if (!entry) return { message: { raw_hex: buf.toString('hex') } };
  try {
    return { message: entry.def.responseDeserialize(buf) };
  } catch (e) {
    return { message: { raw_hex: buf.toString('hex') }, decode_error: e.message };
  }
}

const STATUS_NAMES = Object.fromEntries(
  Object.entries(grpc.status).filter(([, v]) => typeof v === 'number').map(([k, v]) => [v, k]));

function printLine(obj) {
  process.stdout.write(`${JSON.stringify(obj)}\n`);
}

let callStart = null; // set when the call is made, for --timing
let timing = false;

function finish(code, details) {
  if (timing && callStart !== null) {
    printLine({ elapsed_ms: Number(process.hrtime.bigint() - callStart) / 1e6 });
  }
  printLine({ status: { code, name: STATUS_NAMES[code] || 'UNKNOWN', details: details || '' } });
  process.exit(0);
}

function call(o, methods) {
  if (o.health !== undefined || o.healthWatch !== undefined) {
    o.stream = o.healthWatch !== undefined;
    o.method = `/grpc.health.v1.Health/${o.stream ? 'Watch' : 'Check'}`;
    o.json = JSON.stringify({ service: o.stream ? o.healthWatch : o.health });
  }
  const entry = methods.get(o.method);
  const streaming = o.stream || (entry !== undefined && entry.def.responseStream);
  if (entry && entry.def.requestStream) {
    throw new UsageError(`${o.method} takes a client stream, which this client does not send`);
  }
  const req = buildRequest(o, entry);

  const chanOpts = { 'grpc.max_receive_message_length': -1 };
  if (o.maxSend !== undefined) chanOpts['grpc.max_send_message_length'] = o.maxSend;
  let creds;
  if (o.tlsCa !== undefined) {
    let ca;
    try {
      ca = fs.readFileSync(o.tlsCa);
    } catch (e) {
      throw new UsageError(`--tls-ca: ${e.message}`);
    }
    creds = grpc.credentials.createSsl(ca);
  } else {
    creds = grpc.credentials.createInsecure();
  }
  const client = new grpc.Client(o.target, creds, chanOpts);

  const md = new grpc.Metadata();
  if (o.token !== undefined) md.add('authorization', `Bearer ${o.token}`);
  for (const m of o.metadata) {
    const eq = m.indexOf('=');
    md.add(m.slice(0, eq), m.slice(eq + 1));
  }
  const callOpts = {};
  const deadlineMs = o.deadlineMs !== undefined ? o.deadlineMs : streaming ? undefined : DEFAULT_UNARY_DEADLINE_MS;
  if (deadlineMs !== undefined) callOpts.deadline = new Date(Date.now() + deadlineMs);

  const ident = (b) => b;
  timing = Boolean(o.timing);
  callStart = process.hrtime.bigint();
  let c;
  if (streaming) {
    let seen = 0;
    c = client.makeServerStreamRequest(o.method, ident, ident, req, md, callOpts);
    c.on('data', (buf) => {
      if (o.maxMessages !== undefined && seen >= o.maxMessages) return;
      printLine(decodeResponse(entry, buf));
      seen++;
      if (o.maxMessages !== undefined && seen >= o.maxMessages) c.cancel();
      if (o.readDelayMs !== undefined && seen === 1) {
        c.pause();
        setTimeout(() => c.resume(), o.readDelayMs);
      }
    });
    c.on('error', () => {}); // the status event carries the same facts
    c.on('status', (s) => finish(s.code, s.details));
  } else {
    let result = null;
    c = client.makeUnaryRequest(o.method, ident, ident, req, md, callOpts, (err, buf) => {
      result = { err, buf };
    });
    c.on('status', (s) => {
      if (result && result.buf) printLine(decodeResponse(entry, result.buf));
      if (result && result.err) finish(result.err.code, result.err.details);
      else finish(s.code, s.details);
    });
  }
  if (o.cancelAfterMs !== undefined) setTimeout(() => c.cancel(), o.cancelAfterMs).unref();
}

function main() {
  let o;
  try {
    o = parseArgs(process.argv.slice(2));
    checkArgs(o);
    if (o.help) {
      process.stdout.write(`${USAGE}\n`);
      return;
    }
    const dir = path.resolve(o.schemas || path.join(__dirname, '..', '..', '..', 'schemas'));
    const methods = loadSchemas(dir);
    if (o.list) {
      for (const [p, e] of methods) printLine({ method: p, server_stream: e.def.responseStream });
      return;
    }
    call(o, methods);
  } catch (e) {
    if (e instanceof UsageError) {
      process.stderr.write(`client.js: ${e.message}\n(try --help)\n`);
      process.exit(EXIT_USAGE);
    }
    process.stderr.write(`client.js: ${e.stack || e}\n`);
    process.exit(1);
  }
}

main();
