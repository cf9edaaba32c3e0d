// ext_proc bounds (issue #30, F8) against a real router and simulated
// engines, with the grpc-js client playing Envoy (bench/lib/envoy-client.ts):
// a stream left open after its decision has its in-flight slot released at
// extProc.decisionTimeoutMs (not when the connection closes), an idle stream
// is ended at extProc.idleTimeoutMs, streams beyond extProc.maxStreams are
// refused, and request bodies buffered over all streams are bounded by
// extProc.maxBufferedBytes (503 beyond).
import t from 'tap';
import { startTestRouter } from '../support/router-util.js';
import { decide, extProcClient, EnvoyStream, headerMap } from '../../testkit/envoy-client.js';

async function setup(t: Tap.Test, extProc: Record<string, unknown>) {
  const r = await startTestRouter(t, { n: 2, fleet: { timeScale: 0 }, extra: { extProc: { host: '127.0.0.1', port: 0, ...extProc } } });
  const client = extProcClient(`127.0.0.1:${r.router.extProc!.port}`);
  t.teardown(() => client.close());
  return { ...r, client };
}

const chat = (content: string) => JSON.stringify({ model: 'open-model', max_tokens: 2, messages: [{ role: 'user', content }] });
const inFlight = (router: Awaited<ReturnType<typeof startTestRouter>>['router']) => router.core.endpoints.all.reduce((n, ep) => n + ep.inFlight, 0);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

t.test('a decision whose response never comes: its in-flight slot is released at decisionTimeoutMs, the stream still open', async (t) => {
  // a timeout long enough that six decisions in a row fit in it on a loaded machine; the release is checked
  // as a lower bound in time (never before the timeout) and by polling (a loaded machine only delays it)
  const TIMEOUT = 2000;
  const { router, client } = await setup(t, { decisionTimeoutMs: TIMEOUT });
  const ds = [];
  const t0 = performance.now();
  for (let i = 0; i < 6; i++) {
    const d = await decide(client, chat(`left open ${i}`));
    if (!d.picked) throw new Error('not picked');
    ds.push(d);
  }
  const last = performance.now();
  if (last - t0 < TIMEOUT * 0.9) t.equal(inFlight(router), 6, 'six decisions in flight');
  else t.comment(`the six decisions took ${(last - t0).toFixed(0)} ms: the first may already be released`);
  const end = last + 15_000;
  while (inFlight(router) > 0 && performance.now() < end) await sleep(20);
  const at = performance.now();
  t.equal(inFlight(router), 0, 'released at the decision timeout although no stream was closed by the client');
  t.ok(at - last >= TIMEOUT * 0.95, `the last decision's slot held until its timeout (${(at - last).toFixed(0)} ms)`);
  for (const d of ds) d.stream.call.cancel();
});

t.test('an idle stream (headers, then nothing) is ended at idleTimeoutMs', async (t) => {
  const { client } = await setup(t, { idleTimeoutMs: 200 });
  const s = new EnvoyStream(client);
  s.send({ request_headers: { headers: headerMap({ ':method': 'POST', ':path': '/v1/chat/completions', 'content-type': 'application/json' }), end_of_stream: false }, protocol_config: { request_body_mode: 2, response_body_mode: 0 } });
  await s.next(); // the headers answer
  const ended = await new Promise<{ code?: number }>((resolve) => {
    s.call.on('error', (e: { code?: number }) => resolve(e));
    s.call.on('end', () => resolve({}));
    setTimeout(() => resolve({ code: -1 }), 3000);
  });
  t.equal(ended.code, 4, 'ended with DEADLINE_EXCEEDED by the router');
});

t.test('streams over maxStreams are refused with RESOURCE_EXHAUSTED; the open ones keep working', async (t) => {
  const { client } = await setup(t, { maxStreams: 2 });
  const open = [new EnvoyStream(client), new EnvoyStream(client)];
  for (const s of open) s.send({ request_headers: { headers: headerMap({ ':method': 'GET', ':path': '/healthz' }), end_of_stream: true } });
  for (const s of open) await s.next();
  const third = new EnvoyStream(client);
  third.send({ request_headers: { headers: headerMap({ ':method': 'GET', ':path': '/x' }), end_of_stream: true } });
  const code = await new Promise<number>((resolve) => {
    third.call.on('error', (e: { code?: number }) => resolve(e.code ?? 0));
    third.call.on('data', () => resolve(0));
    setTimeout(() => resolve(-1), 3000);
  });
  t.equal(code, 8, 'RESOURCE_EXHAUSTED');
  for (const s of open) s.call.cancel();
  await sleep(100);
  const d = await decide(client, chat('after'));
  t.ok(d.picked, 'a new stream is served once the others closed');
  if (d.picked) d.stream.call.cancel();
});

t.test('bodies buffered over all streams are bounded by maxBufferedBytes (503), and the budget comes back', async (t) => {
  const { client } = await setup(t, { maxBufferedBytes: 100_000 });
  // streams that send a body chunk and never end it hold their bytes
  const holders: EnvoyStream[] = [];
  for (let i = 0; i < 3; i++) {
    const s = new EnvoyStream(client);
    s.send({ request_headers: { headers: headerMap({ ':method': 'POST', ':path': '/v1/chat/completions' }), end_of_stream: false }, protocol_config: { request_body_mode: 2, response_body_mode: 0 } });
    await s.next();
    s.send({ request_body: { body: Buffer.alloc(30_000, 0x20), end_of_stream: false } });
    await s.next();
    holders.push(s);
  }
  const over = await decide(client, Buffer.from(' '.repeat(20_000) + chat('over the budget')));
  t.equal(over.picked ? 200 : over.status, 503, 'a body beyond the global budget: 503');
  for (const s of holders) s.call.cancel();
  await sleep(200);
  const ok = await decide(client, Buffer.from(' '.repeat(20_000) + chat('budget back')));
  t.ok(ok.picked, 'served once the holders ended');
  if (ok.picked) ok.stream.call.cancel();
});
