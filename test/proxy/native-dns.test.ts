// Endpoints named by DNS name through the native upstream client: the name is
// looked up in TypeScript (src/proxy/resolver.ts), the addon dials the address,
// the host header stays the name. A name whose address changes is followed
// (after the TTL, and at once when the old address stops answering); every
// address a name has is tried; a name that does not resolve is a clear error.
// Real simulated engines on loopback addresses; the lookup is a seam the test
// controls (the engines listen on 127.0.0.1 and 127.0.0.2 at one port).
import t from 'tap';
import { startEngine, type SimEngine } from '../../src/sim/index.js';
import { NativeUpstreamClient, type NativeClientOptions } from '../../src/proxy/native-client.js';
import { EndpointSet } from '../../src/endpoints/endpoint.js';
import { DEFAULTS, validateConfig, API_VERSION } from '../../src/config/schema.js';
import { startRouter } from '../../src/server/router.js';
import type { UpstreamClient } from '../../src/proxy/upstream.js';

/** One completion through the client to the set's endpoint: status, body, or the error. */
function post(c: UpstreamClient, set: EndpointSet): Promise<{ status: number; body: string; error?: Error & { code?: string } }> {
  return new Promise((resolve) => {
    const r: { status: number; body: string; error?: Error & { code?: string } } = { status: 0, body: '' };
    const body = Buffer.from(JSON.stringify({ model: 'm', prompt: 'hello there', max_tokens: 2 }));
    c.send(set.all[0]!, { method: 'POST', path: '/v1/completions', headers: ['content-type', 'application/json'], body }, {
      onUpstreamHeaders: (status) => (r.status = status),
      onUpstreamData: (chunk) => (r.body += chunk.toString()),
      onUpstreamEnd: () => resolve(r),
      onUpstreamError: (err) => resolve({ ...r, error: err }),
    });
  });
}

const setOf = (url: string) => new EndpointSet([{ name: 'p', engine: 'vllm', accelerator: 'nvidia', models: ['m'], endpoints: [{ name: 'e', url, role: 'both' }] }]);

async function engineAt(t: Tap.Test, host: string, port = 0): Promise<SimEngine> {
  const e = await startEngine({ host, port, models: ['m'], timeScale: 0 });
  e.recordHeaders(['host']);
  t.teardown(() => e.close());
  return e;
}

function newClient(t: Tap.Test, opts: NativeClientOptions): NativeUpstreamClient {
  const c = new NativeUpstreamClient({ ...DEFAULTS.proxy, connectTimeoutMs: 1000, headersTimeoutMs: 5000 }, opts);
  t.teardown(() => c.close());
  return c;
}

/** Which of the engines answered the last request (by the requests each recorded). */
function counts(...engines: SimEngine[]): number[] {
  return engines.map((e) => e.recorded().length);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

t.test('an endpoint named localhost answers through the native client; the host header is the name', async (t) => {
  const a = await engineAt(t, '127.0.0.1');
  const c = newClient(t, {}); // the system resolver
  const set = setOf(`http://localhost:${a.port}`);
  for (let i = 0; i < 3; i++) {
    const r = await post(c, set);
    t.equal(r.error, undefined, `request ${i}: no error (${r.error?.message ?? ''})`);
    t.equal(r.status, 200, `request ${i}: 200`);
  }
  t.same(
    a.recorded().map((r) => r.headers.host),
    [`localhost:${a.port}`, `localhost:${a.port}`, `localhost:${a.port}`],
    'the engine saw the name as host',
  );
});

t.test('the router serves a pool whose endpoint is named localhost through the native client (proxy.client auto)', async (t) => {
  const a = await engineAt(t, '127.0.0.1');
  const cfg = validateConfig({
    apiVersion: API_VERSION,
    kind: 'Router',
    pools: [{ name: 'p', models: ['m'], endpoints: [{ name: 'e', url: `http://localhost:${a.port}` }] }],
    logging: { level: 'silent' },
  });
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(200));
  t.ok(router.core.upstream instanceof NativeUpstreamClient, 'the native client serves it');
  const res = await fetch(`http://127.0.0.1:${router.port}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', prompt: 'hello there', max_tokens: 3 }),
  });
  t.equal(res.status, 200);
  const body = (await res.json()) as { choices: { text: string }[] };
  t.ok(body.choices[0]!.text.length > 0, 'a completion came back');
  t.equal(a.recorded().at(-1)?.headers.host, `localhost:${a.port}`);
});

t.test('a name whose address changes is followed after the TTL; connections to the old address close', async (t) => {
  const a = await engineAt(t, '127.0.0.1');
  const b = await engineAt(t, '127.0.0.2', a.port);
  let answer = '127.0.0.1';
  const looked: string[] = [];
  const c = newClient(t, {
    dnsTtlMs: 100,
    lookup: async (name) => {
      looked.push(name);
      return [{ address: answer }];
    },
  });
  const set = setOf(`http://engine.test:${a.port}`);
  for (let i = 0; i < 3; i++) t.equal((await post(c, set)).status, 200);
  t.same(counts(a, b), [3, 0], 'the first address served');
  t.same(looked, ['engine.test'], 'one lookup within the TTL');
  t.equal(c.stats().open, 1, 'one kept-alive connection');
  answer = '127.0.0.2';
  await sleep(150);
  // the first call past the TTL starts the lookup and still uses the address in hand
  const stale = await post(c, set);
  t.equal(stale.status, 200);
  await sleep(20);
  for (let i = 0; i < 3; i++) t.equal((await post(c, set)).status, 200);
  t.same(counts(a, b), [4, 3], 'the calls after the lookup went to the new address');
  t.equal(b.recorded()[0]!.headers.host, `engine.test:${a.port}`, 'the host header is still the name');
  t.equal(looked.length, 2, 'looked up once more');
  t.equal(c.stats().open, 1, 'the connection to the old address was closed');
});

t.test('an address that stops answering: the name is looked up again at once and the call is served there', async (t) => {
  const a = await engineAt(t, '127.0.0.1');
  const b = await engineAt(t, '127.0.0.2', a.port);
  let answer = '127.0.0.1';
  let lookups = 0;
  const c = newClient(t, {
    dnsTtlMs: 600_000, // the TTL never passes in this test: only the failure makes it look again
    lookup: async () => {
      lookups++;
      return [{ address: answer }];
    },
  });
  const set = setOf(`http://engine.test:${a.port}`);
  t.equal((await post(c, set)).status, 200);
  t.same(counts(a, b), [1, 0]);
  answer = '127.0.0.2';
  await a.close(); // the kept-alive connection goes stale, new connects are refused
  const r = await post(c, set);
  t.equal(r.error, undefined, `no error reached the caller (${r.error?.message ?? ''})`);
  t.equal(r.status, 200);
  t.equal(b.recorded().length, 1, 'the new address served the call');
  t.equal(lookups, 2, 'looked up again after the connect failure');
  // the address stays: the next call goes straight there
  t.equal((await post(c, set)).status, 200);
  t.equal(b.recorded().length, 2);
  t.equal(lookups, 2);
});

t.test('every address of a name is tried; a refused one is skipped for later calls', async (t) => {
  const a = await engineAt(t, '127.0.0.1');
  const lookup = async () => [{ address: '127.0.0.3' }, { address: '127.0.0.1' }]; // nothing listens on 127.0.0.3
  const c = newClient(t, { lookup });
  const set = setOf(`http://engine.test:${a.port}`);
  for (let i = 0; i < 3; i++) {
    const r = await post(c, set);
    t.equal(r.error, undefined, `request ${i}: no error (${r.error?.message ?? ''})`);
    t.equal(c.stats().opened, 2, `request ${i}: two connections opened in all (the refused one, then one kept alive)`);
  }
  t.equal(a.recorded().length, 3);
});

t.test('a name that does not resolve fails its calls with the lookup error; the next call looks again', async (t) => {
  const a = await engineAt(t, '127.0.0.1');
  let fail = true;
  const c = newClient(t, {
    lookup: async () => {
      if (fail) throw Object.assign(new Error('getaddrinfo ENOTFOUND engine.test'), { code: 'ENOTFOUND' });
      return [{ address: '127.0.0.1' }];
    },
  });
  const set = setOf(`http://engine.test:${a.port}`);
  const [x, y] = await Promise.all([post(c, set), post(c, set)]);
  for (const r of [x, y]) {
    t.equal(r.error?.code, 'ENOTFOUND');
    t.match(r.error?.message, /cannot resolve engine\.test: ENOTFOUND/);
  }
  fail = false;
  const ok = await post(c, set);
  t.equal(ok.error, undefined);
  t.equal(ok.status, 200);
});

t.test('calls sent before the first lookup answers wait for it; one aborted meanwhile is never sent', async (t) => {
  const a = await engineAt(t, '127.0.0.1');
  let release!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  const c = newClient(t, {
    lookup: async () => {
      await gate;
      return [{ address: '127.0.0.1' }];
    },
  });
  const set = setOf(`http://engine.test:${a.port}`);
  const calls = Array.from({ length: 4 }, () => post(c, set));
  let aborted = 0;
  const call = c.send(set.all[0]!, { method: 'POST', path: '/v1/completions', headers: ['content-type', 'application/json'], body: Buffer.from('{}') }, {
    onUpstreamHeaders: () => aborted++,
    onUpstreamData: () => aborted++,
    onUpstreamEnd: () => aborted++,
    onUpstreamError: () => aborted++,
  });
  call.abort();
  await sleep(20);
  t.equal(a.recorded().length, 0, 'nothing sent before the lookup answered');
  release();
  const done = await Promise.all(calls);
  t.same(done.map((r) => r.status), [200, 200, 200, 200], 'the waiting calls were sent and answered');
  await sleep(20);
  t.equal(aborted, 0, 'the aborted call saw no callback');
  t.equal(a.recorded().length, 4, 'and never reached the engine');
});

t.test('close() fails calls still waiting for a lookup', async (t) => {
  const c = new NativeUpstreamClient(DEFAULTS.proxy, { lookup: () => new Promise(() => {}) });
  const pending = post(c, setOf('http://engine.test:8000'));
  await c.close();
  const r = await pending;
  t.equal(r.error?.code, 'ECLOSED');
});
