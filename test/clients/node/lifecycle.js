// A client of pleg's Lifecycle API (api/lifecycle/v1/lifecycle.proto) in
// Node, built only from @grpc/grpc-js, @grpc/proto-loader and the
// repository's .proto: no generated code, no pleg code.
//
//   node lifecycle.js --proto PATH --address unix:///run/pleg/pleg.sock watch [--cursor C] [--namespace NS]...
//   node lifecycle.js --proto PATH --address ADDR list [--namespace NS]...
//   node lifecycle.js --proto PATH --address ADDR get-container ID
//
// watch prints every message of the stream as one JSON line on stdout, in
// order, until its standard input closes: then it cancels the call (the
// client disconnects) and prints {"closed":{"cursor":LAST}} with the cursor
// of the last message it printed, from which a later `watch --cursor`
// resumes. A stream that ends on its own prints {"end":{"code":N,
// "details":"..."}}. list and get-container print their answer as one JSON
// line. Errors go to stderr with exit code 1.
'use strict';

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

function usage(msg) {
  process.stderr.write(`lifecycle.js: ${msg}\n`);
  process.exit(2);
}

function parseArgs(argv) {
  const o = { namespaces: [], cursor: '', rest: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const val = () => {
      if (i + 1 >= argv.length) usage(`${a} needs a value`);
      return argv[++i];
    };
    switch (a) {
      case '--proto': o.proto = val(); break;
      case '--address': o.address = val(); break;
      case '--cursor': o.cursor = val(); break;
      case '--namespace': o.namespaces.push(val()); break;
      default:
        if (a.startsWith('--')) usage(`unknown flag ${a}`);
        o.rest.push(a);
    }
  }
  if (!o.proto) usage('--proto is required');
  if (!o.address) usage('--address is required');
  if (o.rest.length === 0) usage('want a command: watch, list or get-container');
  return o;
}

const opts = parseArgs(process.argv.slice(2));

// keepCase: the .proto's field names; longs and enums as strings;
// defaults: every field present; oneofs: the oneof's name says which
// message a WatchResponse is ("message": "snapshot", "event", ...).
const definition = protoLoader.loadSync(opts.proto, {
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
});
const pkg = grpc.loadPackageDefinition(definition);
const Lifecycle = pkg.pleg.lifecycle.v1.Lifecycle;
const client = new Lifecycle(opts.address, grpc.credentials.createInsecure());

function out(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

function fail(err) {
  process.stderr.write(`lifecycle.js: ${err.code !== undefined ? `code ${err.code}: ` : ''}${err.details || err.message}\n`);
  process.exit(1);
}

const filter = { namespaces: opts.namespaces };

switch (opts.rest[0]) {
  case 'watch': {
    let last = opts.cursor;
    let closing = false;
    const call = client.Watch({ cursor: opts.cursor, filter });
    call.on('data', (m) => {
      last = m.cursor;
      out(m);
    });
    call.on('error', (err) => {
      if (closing && err.code === grpc.status.CANCELLED) return; // our own cancel
      out({ end: { code: err.code, details: err.details || err.message } });
    });
    call.on('status', (st) => {
      if (st.code === grpc.status.OK) out({ end: { code: 0, details: st.details } });
    });
    call.on('close', () => {
      if (closing) out({ closed: { cursor: last } });
      client.close();
    });
    // Standard input closed: disconnect.
    process.stdin.on('end', () => {
      closing = true;
      call.cancel();
    });
    process.stdin.resume();
    break;
  }
  case 'list':
    client.ListPods({ filter }, (err, res) => {
      if (err) fail(err);
      out(res);
      client.close();
    });
    break;
  case 'get-container':
    if (opts.rest.length !== 2) usage('get-container needs an ID');
    client.GetContainer({ id: opts.rest[1] }, (err, res) => {
      if (err) fail(err);
      out(res);
      client.close();
    });
    break;
  default:
    usage(`unknown command ${opts.rest[0]}`);
}
