// Request bodies that cost far more to parse than their size: deeply nested
// JSON is refused before JSON.parse (400), and large bodies are parsed in a
// worker thread, so one client cannot stall the event loop that serves the
// others (a 16 MB body of 8 M nested arrays held it ~4 s and grew the heap by
// ~1 GB; health checks then timed out and unrelated pools answered 503).
import t from 'tap';
import { request } from 'node:http';
import { maxStall, startTestRouter } from '../support/router-util.js';
import { startScriptedEngine } from '../../testkit/scripted-engine.js';

function postRaw(url: string, path: string, body: Buffer): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const u = new URL(url);
    const req = request(
      { host: u.hostname, port: u.port, path, method: 'POST', headers: { 'content-type': 'application/json', 'content-length': body.length } },
      (res) => {
        const parts: Buffer[] = [];
        res.on('data', (b: Buffer) => parts.push(b));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(parts).toString() }));
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

t.test('nesting deeper than 128 levels is a 400 naming the limit, small or large', async (t) => {
  const { url } = await startTestRouter(t, { n: 1 });
  const small = Buffer.from(`{"model":"open-model","messages":${'['.repeat(200)}${']'.repeat(200)}}`);
  const r = await postRaw(url, '/v1/chat/completions', small);
  t.equal(r.status, 400);
  t.match(JSON.parse(r.text), { error: { code: null, type: 'invalid_request_error', message: /deeper than 128/ } });
  // brackets inside strings do not count
  const inStrings = Buffer.from(JSON.stringify({ model: 'open-model', messages: [{ role: 'user', content: '['.repeat(5000) + '"\\' }], max_tokens: 1 }));
  t.equal((await postRaw(url, '/v1/chat/completions', inStrings)).status, 200, 'brackets in a string are text');
  const ok = Buffer.from(JSON.stringify({ model: 'open-model', prompt: 'x', max_tokens: 1, extra: JSON.parse('['.repeat(100) + ']'.repeat(100)) }));
  t.equal((await postRaw(url, '/v1/completions', ok)).status, 200, '100 levels are fine');
});

t.test('a 16 MB body of nested arrays does not stall the event loop or balloon the heap', async (t) => {
  const { url, router } = await startTestRouter(t, { n: 1 });
  const n = 16 * 1024 * 1024 - 64; // under the default 16 MiB limit
  const body = Buffer.alloc(n);
  const head = Buffer.from('{"model":"open-model","messages":');
  head.copy(body);
  const half = Math.floor((n - head.length) / 2);
  body.fill(0x5b, head.length, head.length + half);
  body.fill(0x5d, head.length + half);
  const heap0 = process.memoryUsage().heapUsed;
  const [r, stall] = await maxStall(() => postRaw(url, '/v1/chat/completions', body));
  const grew = (process.memoryUsage().heapUsed - heap0) / 1e6;
  t.equal(r.status, 400, 'refused');
  // ~4 s before (8 M levels parsed on the loop); the bound leaves room for a loaded CI machine
  t.ok(stall < 1000, `longest event-loop stall ${stall.toFixed(0)} ms`);
  t.ok(grew < 200, `heap grew ${grew.toFixed(0)} MB`);
  const h = await maxStall(() => fetch(`${url}/healthz`).then((x) => x.status));
  t.equal(h[0], 200, 'the router still answers');
  t.ok(router.core.director.offloadedParses >= 1, 'parsed off the event loop');
});

t.test('a large legitimate body is parsed off the loop and relayed as the client sent it', async (t) => {
  // the JavaScript path (limits.bodyScan: javascript): the native scan would read this body on the loop
  const { url, router } = await startTestRouter(t, { n: 1, fleet: { timeScale: 0, maxModelLen: 1 << 20 }, extra: { limits: { bodyScan: 'javascript' } } });
  const text = 'lorem ipsum dolor sit amet '.repeat(12_000); // ~320 KB: over the 256 KiB offload threshold
  const body = Buffer.from(JSON.stringify({ model: 'open-model', messages: [{ role: 'user', content: text }], max_tokens: 2, user: 'u1' }));
  const before = router.core.director.offloadedParses;
  const r = await postRaw(url, '/v1/chat/completions', body);
  t.equal(r.status, 200, r.text.slice(0, 200));
  t.equal(JSON.parse(r.text).object, 'chat.completion');
  t.equal(router.core.director.offloadedParses, before + 1, 'one body parsed in the worker');
  // the same prompt again lands where its prefix is (the worker rendered the same prompt bytes)
  const again = await fetch(`${url}/v1/chat/completions`, { method: 'POST', body });
  t.equal(again.status, 200);
  const bad = await postRaw(url, '/v1/chat/completions', Buffer.from(JSON.stringify({ model: 'open-model', messages: 'x'.repeat(300_000) })));
  t.equal(bad.status, 400, 'a large body with a bad field gets the same 400 as a small one');
  t.match(JSON.parse(bad.text), { error: { param: 'messages' } });
  const unknown = await postRaw(url, '/v1/chat/completions', Buffer.from(JSON.stringify({ model: 'nope', messages: [{ role: 'user', content: text }] })));
  t.equal(unknown.status, 404, 'and an unknown model a 404');
});

for (const frontEnd of ['uws', 'native'] as const) {
  t.test(`${frontEnd} front end: a large body is scanned natively on the loop and the engine gets the client's bytes`, async (t) => {
    const eng = await startScriptedEngine('open-model');
    t.teardown(() => eng.close());
    const { url, router } = await startTestRouter(t, {
      n: 1,
      pools: () => [{ name: 'p', models: ['open-model'], endpoints: [{ name: 's0', url: eng.url }] }],
      extra: { server: { frontEnd }, sessions: { sources: ['user'] } },
    });
    // ~400 KB: a 100k-token agent prompt, with escapes, non-ASCII text and content parts; keys in an odd order
    const text = 'lorem ipsum dolor sit amet, "quoted"\n\tand é日本😀 '.repeat(8_000);
    const body = Buffer.from(
      `{ "messages": [{"content": ${JSON.stringify(text)}, "role": "system"}, {"role":"user","content":[{"type":"text","text":"hi \\u00e9"}]}],\n "max_tokens": 2, "user": "u1", "stream": false, "model": "open-model" }`,
    );
    const before = router.core.director.offloadedParses;
    const r = await postRaw(url, '/v1/chat/completions', body);
    t.equal(r.status, 200, r.text.slice(0, 200));
    t.equal(router.core.director.offloadedParses, before, 'no worker parse: the scan read it on the loop');
    t.equal(eng.raws.length, 1);
    t.ok(eng.raws[0]!.equals(body), 'the engine received exactly the bytes the client sent');
    // a bad body over the offload threshold still gets the JavaScript path's exact 400
    const bad = await postRaw(url, '/v1/chat/completions', Buffer.from(JSON.stringify({ model: 'open-model', messages: 'x'.repeat(300_000) })));
    t.equal(bad.status, 400);
    t.match(JSON.parse(bad.text), { error: { param: 'messages', message: "missing or invalid field 'messages' (a non-empty list of {role, content} objects)" } });
    const broken = await postRaw(url, '/v1/chat/completions', body.subarray(0, body.length - 1));
    t.equal(broken.status, 400);
    t.match(JSON.parse(broken.text), { error: { message: /^invalid JSON in request body: / } });
  });
}

for (const frontEnd of ['uws', 'native'] as const) {
  t.test(`${frontEnd} front end, bodyScan: javascript: a large body is parsed in the worker and the engine gets the client's bytes`, async (t) => {
    const eng = await startScriptedEngine('open-model');
    t.teardown(() => eng.close());
    const { url, router } = await startTestRouter(t, {
      n: 1,
      pools: () => [{ name: 'p', models: ['open-model'], endpoints: [{ name: 's0', url: eng.url }] }],
      extra: { server: { frontEnd }, limits: { bodyScan: 'javascript' } },
    });
    const text = 'lorem ipsum dolor sit amet, "quoted"\n\tand é日本😀 '.repeat(8_000); // ~400 KB: over the 256 KiB offload threshold
    const body = Buffer.from(`{"model":"open-model","messages":[{"role":"system","content":${JSON.stringify(text)}},{"role":"user","content":"next?"}],"max_tokens":2,"user":"u1"}`);
    const before = router.core.director.offloadedParses;
    const r = await postRaw(url, '/v1/chat/completions', body);
    t.equal(r.status, 200, r.text.slice(0, 200));
    t.equal(router.core.director.offloadedParses, before + 1, 'parsed in the worker');
    t.equal(eng.raws.length, 1);
    t.ok(eng.raws[0]!.equals(body), 'the engine received exactly the bytes the client sent');
    const bad = await postRaw(url, '/v1/chat/completions', Buffer.from(JSON.stringify({ model: 'open-model', messages: 'x'.repeat(300_000) })));
    t.equal(bad.status, 400);
    t.match(JSON.parse(bad.text), { error: { param: 'messages', message: "missing or invalid field 'messages' (a non-empty list of {role, content} objects)" } });
    t.equal(router.core.director.offloadedParses, before + 2, 'the bad one too');
  });

  t.test(`${frontEnd} front end: bodies in reused buffers never mix: concurrent requests of many sizes, each engine body is a client's`, async (t) => {
    // src/director/body-pool.ts: a flight gives its body's buffer back when it ends and the next request
    // of that size class writes into it; a buffer handed to two requests at once would show here
    const eng = await startScriptedEngine('open-model');
    t.teardown(() => eng.close());
    const { url, router } = await startTestRouter(t, {
      n: 1,
      pools: () => [{ name: 'p', models: ['open-model'], endpoints: [{ name: 's0', url: eng.url }] }],
      extra: { server: { frontEnd } },
    });
    const bodies: Buffer[] = [];
    for (let i = 0; i < 48; i++) {
      // 4 KB to ~600 KB, sizes that share classes, each body's text its own
      const n = [1_000, 9_000, 30_000, 70_000, 150_000][i % 5]! + i * 37;
      const text = `request ${i} `.padEnd(n, String.fromCharCode(97 + (i % 26)));
      bodies.push(Buffer.from(JSON.stringify({ model: 'open-model', messages: [{ role: 'user', content: text }], max_tokens: 1, user: `u${i}` })));
    }
    const allocated0 = router.core.director.bodies.allocated;
    for (let round = 0; round < 3; round++) {
      const rs = await Promise.all(bodies.slice(round * 16, round * 16 + 16).map((b) => postRaw(url, '/v1/chat/completions', b)));
      for (const r of rs) t.equal(r.status, 200, r.text.slice(0, 200));
    }
    // and once more, one at a time (the same buffers again and again)
    for (let i = 0; i < 8; i++) t.equal((await postRaw(url, '/v1/chat/completions', bodies[i]!)).status, 200);
    t.equal(eng.raws.length, 56);
    const sent = new Map<string, number>();
    for (const b of [...bodies, ...bodies.slice(0, 8)]) sent.set(b.toString('latin1'), (sent.get(b.toString('latin1')) ?? 0) + 1);
    let same = 0;
    for (const raw of eng.raws) {
      const k = raw.toString('latin1');
      const left = sent.get(k) ?? 0;
      if (left > 0) {
        same++;
        sent.set(k, left - 1);
      }
    }
    t.equal(same, 56, 'every body the engine got is one a client sent, each once');
    const allocated = router.core.director.bodies.allocated - allocated0;
    t.ok(allocated < 40, `buffers were reused: ${allocated} allocated for 56 pooled-size bodies`);
  });
}
