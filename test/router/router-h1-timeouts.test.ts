// The built-in HTTP/1.1 upstream client's timeouts, kept by one coarse timer
// per pool instead of a socket timer refreshed on every read and write:
// an endpoint that never answers, one that stalls mid-body, and one that is
// slow but keeps sending (inactivity, not total time, is what times out).
import t from 'tap';
import type { Socket } from 'node:net';
import { listenRaw } from '../support/router-util.js';
import { NativeUpstreamClient } from '../../src/proxy/native-client.js';
import { EndpointSet } from '../../src/endpoints/endpoint.js';
import type { UpstreamCall, UpstreamClient, UpstreamSink } from '../../src/proxy/upstream.js';
import { DEFAULTS } from '../../src/config/schema.js';

interface Result {
  status: number;
  body: string;
  ms: number;
  error?: Error & { code?: string };
}

// the native client over an endpoint given by IP address, and by DNS name (the
// TypeScript client these cases also ran over served names until it was retired)
const CLIENTS = [
  ['native', NativeUpstreamClient, '127.0.0.1'],
  ['native, endpoint named localhost', NativeUpstreamClient, 'localhost'],
] as const;

function collect(client: UpstreamClient, set: EndpointSet, onData?: (r: Result, call: UpstreamCall) => void): Promise<Result> {
  const t0 = performance.now();
  return new Promise((resolve) => {
    const r: Result = { status: 0, body: '', ms: 0 };
    const sink: UpstreamSink = {
      onUpstreamHeaders: (status) => {
        r.status = status;
      },
      onUpstreamData: (chunk) => {
        r.body += chunk.toString('latin1');
        onData?.(r, call);
      },
      onUpstreamEnd: () => {
        r.ms = performance.now() - t0;
        resolve(r);
      },
      onUpstreamError: (err) => {
        r.error = err;
        r.ms = performance.now() - t0;
        resolve(r);
      },
    };
    const call = client.send(set.all[0], { method: 'POST', path: '/x', headers: ['content-type', 'application/json'], body: Buffer.from('{}') }, sink);
  });
}

async function serverAt(host: string, t: Tap.Test, onRequest: (sock: Socket) => void): Promise<EndpointSet> {
  const { port } = await listenRaw(t, (sock) => {
    let seen = '';
    sock.on('data', (b) => {
      seen += b.toString('latin1');
      const end = seen.indexOf('\r\n\r\n');
      if (end >= 0 && seen.length >= end + 4 + 2) {
        seen = '';
        onRequest(sock);
      }
    });
  });
  return new EndpointSet([{ name: 'p', engine: 'vllm', accelerator: 'nvidia', models: ['m'], endpoints: [{ name: 'raw', url: `http://${host}:${port}`, role: 'both' }] }]);
}

/** A request handler that answers `body` one byte every `gapMs`. */
function trickle(body: string, gapMs: number) {
  return (sock: Socket) => {
    sock.write(`HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: ${body.length}\r\n\r\n`);
    let i = 0;
    const next = () => {
      if (sock.destroyed) return;
      sock.write(body[i++]);
      if (i < body.length) setTimeout(next, gapMs);
    };
    setTimeout(next, gapMs);
  };
}

const LIMIT = 200;
const cfg = { ...DEFAULTS.proxy, headersTimeoutMs: LIMIT, bodyTimeoutMs: LIMIT };

for (const [name, Client, host] of CLIENTS) {
  const server = (t: Tap.Test, onRequest: (sock: Socket) => void) => serverAt(host, t, onRequest);
  t.test(`${name}: an endpoint that never answers times out after headersTimeoutMs, not before`, async (t) => {
    const set = await server(t, () => {});
    const client = new Client(cfg);
    t.teardown(() => client.close());
    const r = await collect(client, set);
    t.equal(r.error?.code, 'ETIMEDOUT', `timed out (${r.error?.message})`);
    t.ok(r.ms >= LIMIT - 5 && r.ms < LIMIT * 3 + 200, `after ${r.ms.toFixed(0)} ms (limit ${LIMIT} ms)`);
  });

  t.test(`${name}: a call waiting for a free connection times out headersTimeoutMs after it was sent`, async (t) => {
    const set = await server(t, () => {}); // never answers
    const client = new Client({ ...cfg, connectionsPerEndpoint: 1 });
    t.teardown(() => client.close());
    // send from a timer callback: the native client stamps the wait with the loop's time, which
    // lags the real time by whatever JS ran since the loop last updated it (a busy turn of tap's
    // own work can take tens of ms on a loaded machine; the limit's slack is one 25 ms tick)
    await new Promise((r) => setTimeout(r, 1));
    const [a, b] = await Promise.all([collect(client, set), collect(client, set)]);
    t.equal(a.error?.code, 'ETIMEDOUT', `the call on the connection timed out (${a.error?.message})`);
    t.equal(b.error?.code, 'ETIMEDOUT', `the queued call timed out (${b.error?.message})`);
    t.match(b.error?.message, /free connection/, 'as a call that waited for a free connection');
    t.ok(b.ms >= LIMIT - 5 && b.ms < LIMIT * 2, `after ${b.ms.toFixed(0)} ms: its wait counted, no fresh limit after the first call failed`);
  });

  t.test(`${name}: the wait for a free connection counts toward the headers limit`, async (t) => {
    // one connection; the engine answers the first request after 0.75 of the limit. The second
    // call waits that long for the connection: an engine that answers it at once is in time,
    // one that takes another 0.75 of the limit is not (1.5 in all since it was sent).
    const limit = 400;
    let n = 0;
    let secondDelay = 0;
    const set = await server(t, (sock) => {
      const delay = ++n === 1 ? limit * 0.75 : secondDelay;
      setTimeout(() => sock.destroyed || sock.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok'), delay);
    });
    const client = new Client({ ...DEFAULTS.proxy, headersTimeoutMs: limit, bodyTimeoutMs: limit, connectionsPerEndpoint: 1 });
    t.teardown(() => client.close());
    let [a, b] = await Promise.all([collect(client, set), collect(client, set)]);
    t.equal(a.body, 'ok', `the first call is answered (${a.error?.message})`);
    t.equal(b.body, 'ok', `a queued call answered at once is in time (${b.error?.message}, ${b.ms.toFixed(0)} ms)`);
    n = 0;
    secondDelay = limit * 0.75;
    [a, b] = await Promise.all([collect(client, set), collect(client, set)]);
    t.equal(a.body, 'ok', `the first call is answered (${a.error?.message})`);
    t.equal(b.error?.code, 'ETIMEDOUT', `a queued call answered ${limit * 1.5} ms after it was sent times out (${b.error?.message ?? 'answered'})`);
    t.ok(b.ms < limit * 1.5, `after ${b.ms.toFixed(0)} ms`);
  });

  t.test(`${name}: the wait counts on a new connection too (the busy one closed), from when it connected`, async (t) => {
    // one connection; the engine answers the first request after 0.75 of the limit and closes
    // that connection, so the waiting call goes out on a new one (its connect phase is under
    // connectTimeoutMs); the engine takes another 0.75 of the limit: 1.5 in all since it was sent
    const limit = 400;
    let n = 0;
    const set = await server(t, (sock) => {
      const first = ++n === 1;
      setTimeout(() => {
        if (sock.destroyed) return;
        if (first) sock.end('HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok');
        else sock.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok');
      }, limit * 0.75);
    });
    const client = new Client({ ...DEFAULTS.proxy, headersTimeoutMs: limit, bodyTimeoutMs: limit, connectionsPerEndpoint: 1 });
    t.teardown(() => client.close());
    const [a, b] = await Promise.all([collect(client, set), collect(client, set)]);
    t.equal(a.body, 'ok', `the first call is answered (${a.error?.message})`);
    t.equal(n, 2, 'the waiting call was sent, on a second connection');
    t.equal(b.error?.code, 'ETIMEDOUT', `a queued call answered ${limit * 1.5} ms after it was sent times out (${b.error?.message ?? 'answered'})`);
    t.match(b.error?.message, /waiting for the endpoint/, 'as a call the endpoint did not answer in time');
  });

  t.test(`${name}: a response head trickled byte by byte must still be complete within headersTimeoutMs`, async (t) => {
    const head = 'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok';
    const set = await server(t, (sock) => {
      let i = 0;
      const next = () => {
        if (sock.destroyed || i >= head.length) return;
        sock.write(head[i++]);
        setTimeout(next, LIMIT / 8); // a byte every 25 ms: the whole head takes ~1.5 s
      };
      next();
    });
    const client = new Client(cfg);
    t.teardown(() => client.close());
    const r = await collect(client, set);
    t.equal(r.error?.code, 'ETIMEDOUT', `timed out (${r.error?.message ?? `answered ${r.status} after ${r.ms.toFixed(0)} ms`})`);
    t.ok(r.ms >= LIMIT - 5 && r.ms < LIMIT * 3 + 200, `after ${r.ms.toFixed(0)} ms (limit ${LIMIT} ms)`);
  });

  t.test(`${name}: 1xx interim heads do not restart headersTimeoutMs; one followed in time by the final head is fine`, async (t) => {
    // an engine that sends "102 Processing" every quarter of the limit and its final head only
    // after 4 limits: the interim heads are not the response head the limit waits for
    const set = await server(t, (sock) => {
      const tick = setInterval(() => sock.write('HTTP/1.1 102 Processing\r\n\r\n'), LIMIT / 4);
      const last = setTimeout(() => {
        clearInterval(tick);
        sock.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok');
      }, LIMIT * 4);
      sock.on('close', () => {
        clearInterval(tick);
        clearTimeout(last);
      });
    });
    const client = new Client(cfg);
    t.teardown(() => client.close());
    const r = await collect(client, set);
    t.equal(r.error?.code, 'ETIMEDOUT', `timed out (${r.error?.message ?? `answered ${r.status} after ${r.ms.toFixed(0)} ms`})`);
    t.ok(r.ms >= LIMIT - 5 && r.ms < LIMIT * 4, `after ${r.ms.toFixed(0)} ms (limit ${LIMIT} ms), before the final head`);
    // the interim heads themselves are skipped: a final head after them, within the limit, is the answer
    const set2 = await server(t, (sock) => {
      sock.write('HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n');
      setTimeout(() => sock.destroyed || sock.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok'), LIMIT / 4);
    });
    const client2 = new Client(cfg); // a new client: pools are keyed by endpoint id, and both sets' endpoint is id 0
    t.teardown(() => client2.close());
    const ok = await collect(client2, set2);
    t.equal(ok.body, 'ok', `answered after the interim heads (${ok.error?.message ?? ok.status})`);
  });

  t.test(`${name}: bodyTimeoutMs counts from the complete head, not from when the request was sent`, async (t) => {
    // the head alone arrives after 0.6 of the limit, the body 0.8 of the limit after the head:
    // 1.4 limits after the request was sent, but within the body limit of the head's arrival
    const limit = 800;
    const set = await server(t, (sock) => {
      setTimeout(() => {
        if (sock.destroyed) return;
        sock.write('HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\n');
        setTimeout(() => sock.destroyed || sock.write('ok'), limit * 0.8);
      }, limit * 0.6);
    });
    const client = new Client({ ...DEFAULTS.proxy, headersTimeoutMs: limit, bodyTimeoutMs: limit });
    t.teardown(() => client.close());
    const r = await collect(client, set);
    t.equal(r.error, undefined, `no timeout (${r.error?.message} after ${r.ms.toFixed(0)} ms)`);
    t.equal(r.body, 'ok', 'whole body');
  });

  t.test(`${name}: a 204 or 304 head without a length ends the call (no body phase, the connection is reused)`, async (t) => {
    const conns = new Set<Socket>();
    let n = 0;
    const set = await server(t, (sock) => {
      conns.add(sock);
      const status = ++n === 1 ? '204 No Content' : n === 2 ? '304 Not Modified' : '200 OK\r\nContent-Length: 2';
      sock.write(`HTTP/1.1 ${status}\r\n\r\n${n > 2 ? 'ok' : ''}`);
    });
    const client = new Client(cfg);
    t.teardown(() => client.close());
    for (const want of [204, 304, 200]) {
      const r = await collect(client, set);
      t.equal(r.error, undefined, `${want}: no error (${r.error?.message})`);
      t.equal(r.status, want, `${want}: status`);
      t.equal(r.body, want === 200 ? 'ok' : '', `${want}: body`);
    }
    t.equal(conns.size, 1, 'one connection served all three');
  });

  t.test(`${name}: a body that stalls halfway times out after bodyTimeoutMs`, async (t) => {
    const set = await server(t, (sock) => {
      sock.write('HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n{"a"');
    });
    const client = new Client(cfg);
    t.teardown(() => client.close());
    const r = await collect(client, set);
    t.equal(r.status, 200, 'headers arrived');
    t.equal(r.body, '{"a"', 'the first bytes were relayed');
    t.equal(r.error?.code, 'ETIMEDOUT', `then it timed out (${r.error?.message})`);
    t.ok(r.ms >= LIMIT - 5, `after ${r.ms.toFixed(0)} ms`);
  });

  t.test(`${name}: a slow body that keeps making progress is not cut off`, async (t) => {
    const body = '0123456789';
    const set = await server(t, trickle(body, LIMIT / 4));
    const client = new Client(cfg);
    t.teardown(() => client.close());
    const r = await collect(client, set);
    t.equal(r.error, undefined, 'no timeout');
    t.equal(r.body, body, 'whole body');
    t.ok(r.ms > LIMIT * 2, `took ${r.ms.toFixed(0)} ms, longer than the limit in total`);
  });

  t.test(`${name}: bodyTimeoutMs 0 means no body timeout: gaps between chunks never cut a stream`, async (t) => {
    const body = '0123456789';
    const set = await server(t, trickle(body, 30));
    const client = new Client({ ...DEFAULTS.proxy, headersTimeoutMs: LIMIT, bodyTimeoutMs: 0 });
    t.teardown(() => client.close());
    const r = await collect(client, set);
    t.equal(r.error, undefined, `no timeout (${r.error?.message})`);
    t.equal(r.body, body, 'whole body');
  });

  t.test(`${name}: a call paused for a slow client is not timed out while paused`, async (t) => {
    const set = await server(t, (sock) => {
      sock.write('HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n\r\nab');
      setTimeout(() => sock.destroyed || sock.write('cd'), LIMIT * 2.5);
    });
    const client = new Client(cfg);
    t.teardown(() => client.close());
    const r = await collect(client, set, (res, call) => {
      if (res.body === 'ab') {
        // the client stops reading for longer than the body timeout, then resumes
        call.pause();
        setTimeout(() => call.resume(), LIMIT * 2);
      }
    });
    t.equal(r.error, undefined, `no timeout (${r.error?.message})`);
    t.equal(r.body, 'abcd', 'whole body');
  });
}
