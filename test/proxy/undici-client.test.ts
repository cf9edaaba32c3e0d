// The undici upstream client (proxy.client: undici; the one that serves https)
// against a raw loopback engine, on the two points where it differed from the
// native client: headersTimeoutMs bounds the time to the final head
// whatever 1xx heads arrive (an engine sending 102 every 100 ms held a request
// for 40 s against a 5 s limit), and a 100 Continue before the final head is
// skipped (undici turned 100 then 200 into an error, so the router answered 502).
// Same cases through the native client (by IP address and by DNS name), which already behaved so.
import t from 'tap';
import { UndiciUpstreamClient } from '../../src/proxy/undici-client.js';
import { NativeUpstreamClient } from '../../src/proxy/native-client.js';
import { EndpointSet } from '../../src/endpoints/endpoint.js';
import type { UpstreamClient, UpstreamSink } from '../../src/proxy/upstream.js';
import { DEFAULTS } from '../../src/config/schema.js';
import { rawEngine } from '../support/router-util.js';

const CLIENTS = [
  ['undici', UndiciUpstreamClient, '127.0.0.1'],
  ['native, endpoint named localhost', NativeUpstreamClient, 'localhost'],
  ['native', NativeUpstreamClient, '127.0.0.1'],
] as const;

interface Result {
  status: number;
  body: string;
  ms: number;
  error?: Error & { code?: string };
}

function collect(client: UpstreamClient, set: EndpointSet, guardMs: number): Promise<Result> {
  const t0 = performance.now();
  return new Promise((resolve) => {
    const r: Result = { status: 0, body: '', ms: 0 };
    const done = () => {
      clearTimeout(guard);
      r.ms = performance.now() - t0;
      resolve(r);
    };
    // a client that never answers fails the test instead of hanging it
    const guard = setTimeout(() => {
      r.error = Object.assign(new Error(`no answer within ${guardMs} ms`), { code: 'GUARD' });
      call.abort();
      done();
    }, guardMs);
    const sink: UpstreamSink = {
      onUpstreamHeaders: (status) => {
        r.status = status;
      },
      onUpstreamData: (chunk) => {
        r.body += chunk.toString('latin1');
      },
      onUpstreamEnd: done,
      onUpstreamError: (err) => {
        r.error = err;
        done();
      },
    };
    const call = client.send(set.all[0]!, { method: 'POST', path: '/v1/completions', headers: ['content-type', 'application/json'], body: Buffer.from('{}') }, sink);
  });
}


const OK = 'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"ok":true}';

for (const [name, Client, host] of CLIENTS) {
  const engine = (t: Tap.Test, f: Parameters<typeof rawEngine>[1]) => rawEngine(t, f, host);
  t.test(`${name}: 102 every 100 ms does not extend headersTimeoutMs`, async (t) => {
    let timers = 0;
    const { set } = await engine(t, (sock) => {
      const iv = setInterval(() => sock.write('HTTP/1.1 102 Processing\r\n\r\n'), 100);
      timers++;
      sock.on('close', () => clearInterval(iv));
      t.teardown(() => clearInterval(iv));
    });
    const client = new Client({ ...DEFAULTS.proxy, headersTimeoutMs: 600 });
    t.teardown(() => client.close());
    const r = await collect(client, set, 4000);
    t.equal(timers, 1, 'the engine got the request');
    t.equal(r.error?.code, 'ETIMEDOUT', `fails with ETIMEDOUT (got ${r.error?.code}: ${r.error?.message})`);
    t.ok(r.ms >= 550 && r.ms < 1500, `after about the limit (600 ms): ${Math.round(r.ms)} ms`);
  });

  t.test(`${name}: 100 Continue then 200 relays the 200`, async (t) => {
    const { set, conns } = await engine(t, (sock) => sock.write('HTTP/1.1 100 Continue\r\n\r\n' + OK));
    const client = new Client({ ...DEFAULTS.proxy, headersTimeoutMs: 2000 });
    t.teardown(() => client.close());
    for (let i = 1; i <= 2; i++) {
      const r = await collect(client, set, 4000);
      t.equal(r.error, undefined, `request ${i}: no error (${r.error?.message ?? ''})`);
      t.equal(r.status, 200, `request ${i}: status 200`);
      t.equal(r.body, '{"ok":true}', `request ${i}: body`);
    }
    // undici does not reuse a connection that carried a 1xx head (any 1xx, not only 100): a new one is fine
    if (name === 'undici') t.ok(conns() <= 2, `connections: ${conns()}`);
    else t.equal(conns(), 1, 'one keep-alive connection');
  });

  t.test(`${name}: 100 and 103 split across writes, then 200`, async (t) => {
    const { set } = await engine(t, (sock) => {
      sock.write('HTTP/1.1 100 Cont');
      setTimeout(() => sock.write('inue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n'), 20);
      setTimeout(() => sock.write(OK), 40);
    });
    const client = new Client({ ...DEFAULTS.proxy, headersTimeoutMs: 2000 });
    t.teardown(() => client.close());
    const r = await collect(client, set, 4000);
    t.equal(r.error, undefined, `no error (${r.error?.message ?? ''})`);
    t.equal(r.status, 200);
    t.equal(r.body, '{"ok":true}');
  });

  t.test(`${name}: 1xx heads arriving in time do not fail the call`, async (t) => {
    const { set } = await engine(t, (sock) => {
      const iv = setInterval(() => sock.write('HTTP/1.1 102 Processing\r\n\r\n'), 50);
      setTimeout(() => {
        clearInterval(iv);
        sock.write(OK);
      }, 300);
      sock.on('close', () => clearInterval(iv));
    });
    const client = new Client({ ...DEFAULTS.proxy, headersTimeoutMs: 1000 });
    t.teardown(() => client.close());
    const r = await collect(client, set, 4000);
    t.equal(r.error, undefined, `no error (${r.error?.message ?? ''})`);
    t.equal(r.status, 200);
  });
}
