// Retries before the first byte start clean: an endpoint that sends an error
// status and then resets must not leave its answer's state behind for the
// attempt that succeeds on another endpoint.
import t from 'tap';
import { createServer, type Socket } from 'node:net';
import { startTestRouter } from './router-util.js';

t.test('a 4xx head followed by a reset is retried, and the retried answer is relayed untouched', async (t) => {
  const socks = new Set<Socket>();
  let hits = 0;
  const bad = createServer((sock) => {
    socks.add(sock);
    sock.on('error', () => {});
    sock.on('data', (b: Buffer) => {
      // health checks and metrics scrapes (GET) get an empty 200, so the endpoint stays routable
      if (b.toString('latin1', 0, 4) === 'GET ') {
        sock.write('HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n');
        return;
      }
      hits++;
      // an inference request: status and part of a JSON error body, then the connection dies
      sock.write('HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{"object":"error","mess');
      setTimeout(() => sock.destroy(), 20);
    });
  });
  await new Promise<void>((r) => bad.listen(0, '127.0.0.1', r));
  t.teardown(() => {
    for (const s of socks) s.destroy();
    bad.close();
  });
  const port = (bad.address() as { port: number }).port;
  const { url } = await startTestRouter(t, {
    n: 1,
    extraEndpoints: [{ name: 'bad', url: `http://127.0.0.1:${port}` }],
    extra: { scheduling: { scorers: [], picker: 'round-robin' }, proxy: { client: 'h1' } },
  });
  for (let i = 0; i < 4; i++) {
    const res = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'open-model', prompt: 'hello there', max_tokens: 4 }),
    });
    const text = await res.text();
    if (res.status !== 200) {
      // a request may land on the bad endpoint after the breaker let it through again: the 502 must say so
      t.equal(res.status, 502, `request ${i}: 200 or 502 (${text.slice(0, 120)})`);
      continue;
    }
    const j = JSON.parse(text);
    t.equal(res.headers.get('content-type'), 'application/json', `request ${i}: JSON answer`);
    t.ok(Array.isArray(j.choices) && j.choices.length === 1, `request ${i}: the engine's completion, not an error (${text.slice(0, 120)})`);
    t.equal(res.headers.get('x-switchyard-endpoint'), 'e0', `request ${i}: served by the healthy engine`);
  }
  t.ok(hits >= 1, `the bad endpoint was tried (${hits} times)`);
});

t.test('a dispatch that fails before any byte is forgotten by the prefix index', async (t) => {
  const socks = new Set<Socket>();
  let hits = 0;
  const bad = createServer((sock) => {
    socks.add(sock);
    sock.on('error', () => {});
    sock.on('data', (b: Buffer) => {
      if (b.toString('latin1', 0, 4) === 'GET ') {
        sock.write('HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n');
        return;
      }
      hits++;
      const body = '{"error":{"message":"overloaded","type":"server_error","param":null,"code":null}}';
      sock.write(`HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
    });
  });
  await new Promise<void>((r) => bad.listen(0, '127.0.0.1', r));
  t.teardown(() => {
    for (const s of socks) s.destroy();
    bad.close();
  });
  const port = (bad.address() as { port: number }).port;
  const { url, router } = await startTestRouter(t, {
    n: 1,
    extraEndpoints: [{ name: 'bad', url: `http://127.0.0.1:${port}` }],
    // no health filter: the checks below must reach `bad` whatever its breaker says
    extra: { scheduling: { filters: ['model'], scorers: [{ type: 'prefix-cache', weight: 1 }], picker: 'round-robin' }, proxy: { client: 'h1' } },
  });
  const prompts = [0, 1, 2, 3].map((i) => `conversation ${i}: ` + 'the quick brown fox jumps over the lazy dog. '.repeat(40));
  for (const prompt of prompts) {
    const res = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'open-model', prompt, max_tokens: 2 }),
    });
    await res.text();
    t.equal(res.status, 200, 'answered by the healthy engine after the retry, if any');
    t.equal(res.headers.get('x-switchyard-endpoint'), 'e0');
  }
  t.ok(hits >= 1, `the failing endpoint was tried (${hits} times)`);
  const s = router.core.scheduler;
  const e0 = s.endpoints.all.find((e) => e.name === 'e0')!;
  const badEp = s.endpoints.all.find((e) => e.name === 'bad')!;
  for (const [i, p] of prompts.entries()) {
    const prompt = Buffer.from(p, 'utf8');
    const onBad = s.pick({ model: 'open-model', prompt }, [e0])!;
    t.equal(onBad.endpoint, badEp);
    t.ok(onBad.promptBlocks > 20, `prompt ${i} spans ${onBad.promptBlocks} blocks`);
    t.equal(onBad.matchedBlocks, 0, `prompt ${i}: the failing endpoint is not believed to hold it`);
    s.complete(onBad, 'aborted');
    const onGood = s.pick({ model: 'open-model', prompt }, [badEp])!;
    t.equal(onGood.matchedBlocks, onGood.promptBlocks, `prompt ${i}: the endpoint that answered holds all of it`);
    s.complete(onGood, 'aborted');
  }
});
