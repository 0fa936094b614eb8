// A client of pleg's Lifecycle API (api/lifecycle/v1/lifecycle.proto) in
// Node, built only from @grpc/grpc-js, @grpc/proto-loader and the
// repository's .proto: no generated code, no pleg code.
//
//   node lifecycle.js --proto PATH --address unix:///run/pleg/pleg.sock watch [--cursor C] [--namespace NS]...
//   node lifecycle.js --proto PATH --address ADDR watch --follow [--max-backoff-ms N] [--cursor C] [--namespace NS]...
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
//
// watch --follow is an agent that stays: when the stream ends it prints
// {"end":{"code":N,"details":"...","resume":C,"retry_ms":N}} and watches
// again after a backoff (100 ms, doubling up to --max-backoff-ms, default
// 5000; a message received resets it) from C, the cursor of the last
// message it printed that can be resumed from (a snapshot's cannot: a
// snapshot cut short starts again without a cursor). When pleg cannot
// resume the cursor (resync_required, then the stream ends OK) it prints
// {"resync":{"reason":"...","cursor":OLD}} and watches again at once
// without a cursor: the snapshot that follows replaces everything. An
// INVALID_ARGUMENT end is not retried. Closing its standard input
// disconnects it as watch does ({"closed":{"cursor":C}}).
'use strict';

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

function usage(msg) {
  process.stderr.write(`lifecycle.js: ${msg}\n`);
  process.exit(2);
}

function parseArgs(argv) {
  const o = { namespaces: [], cursor: '', rest: [], follow: false, maxBackoffMs: 5000 };
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
      case '--follow': o.follow = true; break;
      case '--max-backoff-ms':
        o.maxBackoffMs = Number(val());
        if (!Number.isInteger(o.maxBackoffMs) || o.maxBackoffMs < 100) usage('--max-backoff-ms wants an integer of at least 100');
        break;
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
// A follower also reconnects its channel as fast as its own backoff asks,
// not grpc-js's default of up to two minutes.
const channelOptions = opts.follow
  ? { 'grpc.initial_reconnect_backoff_ms': 100, 'grpc.max_reconnect_backoff_ms': opts.maxBackoffMs }
  : {};
const client = new Lifecycle(opts.address, grpc.credentials.createInsecure(), channelOptions);

function out(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

function fail(err) {
  process.stderr.write(`lifecycle.js: ${err.code !== undefined ? `code ${err.code}: ` : ''}${err.details || err.message}\n`);
  process.exit(1);
}

const filter = { namespaces: opts.namespaces };

// follow watches until standard input closes, reconnecting, resuming
// and resyncing by itself.
function follow() {
  let resume = opts.cursor; // where the next watch starts
  let call = null;
  let timer = null;
  let backoff = 0;
  let closing = false;

  const watch = () => {
    timer = null;
    const from = resume;
    let resync = null; // the reason of a resync_required
    let status = null;
    let ended = false;
    const c = client.Watch({ cursor: from, filter });
    call = c;
    // Reconnect once the status came and every message before it was
    // handled (grpc-js emits the status before the buffered messages).
    const finish = () => {
      if (!status || !ended || closing) return;
      call = null;
      if (resync !== null && status.code === grpc.status.OK) {
        out({ resync: { reason: resync, cursor: from } });
        backoff = 0;
        watch();
        return;
      }
      if (status.code === grpc.status.INVALID_ARGUMENT) {
        out({ end: { code: status.code, details: status.details } });
        client.close();
        return;
      }
      backoff = backoff === 0 ? 100 : Math.min(2 * backoff, opts.maxBackoffMs);
      const wait = Math.round(backoff * (0.8 + 0.2 * Math.random()));
      out({ end: { code: status.code, details: status.details, resume, retry_ms: wait } });
      timer = setTimeout(watch, wait);
    };
    c.on('data', (m) => {
      backoff = 0;
      switch (m.message) {
        case 'snapshot': resume = ''; break;
        case 'resync_required': resume = ''; resync = m.resync_required.reason; break;
        default: resume = m.cursor;
      }
      out(m);
    });
    c.on('error', () => {}); // the status says it
    c.on('status', (st) => { status = st; finish(); });
    c.on('end', () => { ended = true; finish(); });
  };

  process.stdin.on('end', () => {
    closing = true;
    if (timer !== null) clearTimeout(timer);
    if (call !== null) call.cancel();
    out({ closed: { cursor: resume } });
    client.close();
  });
  process.stdin.resume();
  watch();
}

switch (opts.rest[0]) {
  case 'watch': {
    if (opts.follow) {
      follow();
      break;
    }
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
