// Retries before the first byte start clean: an endpoint that sends an error
// status and then resets must not leave its answer's state behind for the
// attempt that succeeds on another endpoint.
import t from 'tap';
import type { Socket } from 'node:net';
import { listenRaw, startTestRouter } from '../support/router-util.js';

/**
 * A raw HTTP/1.1 engine on loopback: GETs (health checks, metrics scrapes) get
 * an empty 200, so it stays routable; every other request goes to `onPost`.
 * Closed with the test. Returns its URL.
 */
async function rawEngine(t: Tap.Test, onPost: (sock: Socket) => void): Promise<string> {
  const { port } = await listenRaw(t, (sock) =>
    sock.on('data', (b: Buffer) => {
      if (b.toString('latin1', 0, 4) === 'GET ') sock.write('HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n');
      else onPost(sock);
    }),
  );
  return `http://127.0.0.1:${port}`;
}

for (const client of ['native'] as const) {
  t.test(`${client}: a 4xx head followed by a reset is retried, and the retried answer is relayed untouched`, async (t) => {
    let hits = 0;
    const badUrl = await rawEngine(t, (sock) => {
      hits++;
      // an inference request: status and part of a JSON error body, then the connection dies
      sock.write('HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{"object":"error","mess');
      setTimeout(() => sock.destroy(), 20);
    });
    const { url } = await startTestRouter(t, {
      n: 1,
      extraEndpoints: [{ name: 'bad', url: badUrl }],
      extra: { scheduling: { scorers: [], picker: 'round-robin' }, proxy: { client } },
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

  t.test(`${client}: a dispatch that fails before any byte is forgotten by the prefix index`, async (t) => {
    let hits = 0;
    const badUrl = await rawEngine(t, (sock) => {
      hits++;
      const body = '{"error":{"message":"overloaded","type":"server_error","param":null,"code":null}}';
      sock.write(`HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
    });
    const { url, router } = await startTestRouter(t, {
      n: 1,
      extraEndpoints: [{ name: 'bad', url: badUrl }],
      // no health filter: the checks below must reach `bad` whatever its breaker says
      extra: { scheduling: { filters: ['model'], scorers: [{ type: 'prefix-cache', weight: 1 }], picker: 'round-robin' }, proxy: { client } },
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

  t.test(`${client}: a flat-shape error event split over several reads is still rewritten into the current shape`, async (t) => {
    const token = 'data: {"id":"c1","object":"text_completion","choices":[{"index":0,"text":"hi","finish_reason":null}]}\n\n';
    const flat = 'data: {"object":"error","message":"engine fell over","type":"InternalServerError","param":null,"code":500}\n\n';
    // each case: the pieces the stream is cut into (written 30 ms apart)
    const cases: [string, string[]][] = [
      ['inside the event', [token, flat.slice(0, 40), flat.slice(40), 'data: [DONE]\n\n']],
      ['inside the marker', [token, flat.slice(0, 3), flat.slice(3, 15), flat.slice(15), 'data: [DONE]\n\n']],
      ['before the blank line', [token, flat.slice(0, -1), flat.slice(-1) + 'data: [DONE]\n\n']],
      ['token then the start of the error in one read', [token + flat.slice(0, 10), flat.slice(10) + 'data: [DONE]\n\n']],
    ];
    let current: string[] = [];
    const oldUrl = await rawEngine(t, (sock) => {
      const pieces = current;
      const hex = (x: string) => `${Buffer.byteLength(x).toString(16)}\r\n${x}\r\n`;
      sock.write('HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n');
      let i = 0;
      const next = () => {
        if (i < pieces.length) {
          sock.write(hex(pieces[i++]!));
          setTimeout(next, 30);
        } else sock.write('0\r\n\r\n');
      };
      next();
    });
    const { url } = await startTestRouter(t, {
      n: 1,
      pools: () => [{ name: 'p', models: ['open-model'], endpoints: [{ name: 'old', url: oldUrl }] }],
      extra: { scheduling: { scorers: [], picker: 'round-robin' }, proxy: { client } },
    });
    for (const [label, pieces] of cases) {
      current = pieces;
      const res = await fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'open-model', prompt: 'hi', max_tokens: 4, stream: true }),
      });
      const text = await res.text();
      const events = text.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
      t.same(events.length, 3, `${label}: token, error, [DONE] (${JSON.stringify(text)})`);
      t.equal(JSON.parse(events[0]!).choices[0].text, 'hi', `${label}: the token event unchanged`);
      t.same(JSON.parse(events[1]!), { error: { message: 'engine fell over', type: 'server_error', param: null, code: null } }, `${label}: the error in the current shape`);
      t.equal(events[2], '[DONE]', `${label}: then [DONE]`);
    }
  });

  t.test(`${client}: a plugin that throws while a retry is picked: 500 with OpenAI error JSON, the router keeps serving`, async (t) => {
    const { registry } = await import('../../src/scheduler/plugins/index.js');
    let calls = 0;
    registry.register({
      kind: 'scorer',
      type: `test-throws-on-second-call-${client}`,
      validate: () => [],
      create: () => ({
        type: `test-throws-on-second-call-${client}`,
        name: `test-throws-on-second-call-${client}`,
        score: (_ctx: unknown, eps: readonly unknown[]) => {
          if (++calls === 2) throw new Error('scorer bug on the retry');
          return new Float64Array(eps.length);
        },
      }),
    });
    const badUrl = await rawEngine(t, (sock) => {
      sock.write('HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}');
    });
    const { url } = await startTestRouter(t, {
      n: 1,
      // the failing endpoint first, so round-robin's first pick lands on it and the retry picks again
      pools: (urls) => [{ name: 'p', models: ['open-model'], endpoints: [{ name: 'bad', url: badUrl }, { name: 'e0', url: urls[0] }] }],
      extra: { scheduling: { filters: ['model'], scorers: [{ type: `test-throws-on-second-call-${client}`, weight: 1 }], picker: 'round-robin' }, proxy: { client } },
    });
    const post = () =>
      fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'open-model', prompt: 'hi', max_tokens: 2 }) });
    const r1 = await post();
    const j1 = await r1.json();
    t.equal(r1.status, 500, 'the throw on the retry path is answered with 500');
    t.match(j1, { error: { message: /internal error: scorer bug on the retry/, type: String } }, 'as OpenAI error JSON');
    t.equal(calls, 2, 'the first pick went to the failing endpoint, the retry pick threw');
    const r2 = await post();
    await r2.text();
    t.equal(r2.status, 200, 'the next request is served: the process did not crash');
  });
}
