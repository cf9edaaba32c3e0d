// The simulator's two HTTP servers (src/sim/http.ts): node:http (every Node release) and uWebSockets.js
// (where its binary loads) answer the same way, over loopback. uWS is skipped where it does not load.
import t from 'tap';
import net from 'node:net';
import { startEngine } from '../../src/sim/index.js';
import { resolveSimOptions, SimOptionError } from '../../src/sim/options.js';
import { uwsProblem } from '../../src/uws.js';
import { post, send, sseData } from '../support/sim-util.js';

const chat = { model: 'open-model', messages: [{ role: 'user', content: 'hello there' }], max_tokens: 6 };

/** Writes raw bytes on a fresh connection; resolves with what came back once the server closes or after ms. */
function raw(url: string, bytes: string | Buffer, ms = 800): Promise<string> {
  const u = new URL(url);
  return new Promise((resolve) => {
    const got: Buffer[] = [];
    const s = net.connect(Number(u.port), u.hostname, () => s.write(bytes));
    const done = () => {
      clearTimeout(timer);
      s.destroy();
      resolve(Buffer.concat(got).toString('latin1'));
    };
    const timer = setTimeout(done, ms);
    s.on('data', (b) => got.push(b));
    s.on('error', () => {});
    s.on('close', done);
  });
}

t.test('frontEnd option: auto, uws, node; anything else names the option', async (t) => {
  t.equal(resolveSimOptions({}).frontEnd, 'auto');
  t.throws(() => resolveSimOptions({ frontEnd: 'h2' as never }), new SimOptionError('frontEnd', 'expected auto, uws or node, got "h2"'));
  const e = await startEngine({ timeScale: 0 });
  t.teardown(() => e.close());
  t.equal(e.frontEnd, uwsProblem() === null ? 'uws' : 'node', 'auto: uWS where its binary loads, else node:http');
});

for (const frontEnd of ['node', 'uws'] as const) {
  t.test(`frontEnd ${frontEnd}`, { skip: frontEnd === 'uws' && uwsProblem() !== null ? `uWS does not load here: ${uwsProblem()}` : false }, async (t) => {
    const e = await startEngine({ timeScale: 0, frontEnd, maxBodyBytes: 4096 });
    t.teardown(() => e.close());
    t.equal(e.frontEnd, frontEnd);

    const r = await post(e.url, '/v1/chat/completions', chat, { 'x-request-id': 'rid-1' });
    t.equal(r.status, 200);
    t.equal(r.headers['content-type'], 'application/json');
    t.equal(r.headers['x-request-id'], 'rid-1');
    const j = JSON.parse(r.body);
    t.equal(j.object, 'chat.completion');
    t.equal(j.usage.completion_tokens, 6);

    const s = await post(e.url, '/v1/chat/completions', { ...chat, stream: true, stream_options: { include_usage: true } });
    t.equal(s.status, 200);
    t.match(s.headers['content-type'], /^text\/event-stream/);
    const events = sseData(s.body);
    t.equal(events.at(-1), '[DONE]');
    t.equal(JSON.parse(events.at(-2)!).usage.completion_tokens, 6, 'the usage chunk before [DONE]');
    t.equal(events.length, 1 + 6 + 1 + 1, 'role chunk, six tokens, usage, [DONE]');

    // a query string does not change the route
    t.equal((await send(e.url, 'GET', '/health?x=1').done).status, 200);
    const models = await send(e.url, 'GET', '/v1/models').done;
    t.equal(JSON.parse(models.body).data[0].id, 'open-model');

    const nf = await send(e.url, 'GET', '/nope').done;
    t.equal(nf.status, 404);
    t.same(JSON.parse(nf.body).error.message, 'no route for GET /nope');
    const na = await send(e.url, 'GET', '/v1/chat/completions').done;
    t.equal(na.status, 405);
    t.equal(JSON.parse(na.body).error.message, 'method GET not allowed on /v1/chat/completions');

    // HEAD gets no body: the next request on the same connection is read as its own answer
    const two = await raw(e.url, 'HEAD /nope HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n');
    t.match(two, /^HTTP\/1\.1 404 [^\r]*\r\n[\s\S]*?\r\n\r\nHTTP\/1\.1 200 /, 'HEAD answered without a body, then the GET');

    // an x-request-id with a byte >= 0x80 comes back as the same bytes (inside the value: uWS trims them at its ends)
    const echo = await raw(e.url, Buffer.from('GET /health HTTP/1.1\r\nHost: x\r\nx-request-id: caf\xe9-1\r\nConnection: close\r\n\r\n', 'latin1'));
    t.match(echo, /\r\nx-request-id: caf\xe9-1\r\n/i);

    // a body over maxBodyBytes: 413 in the OpenAI shape
    const big = await post(e.url, '/v1/chat/completions', { ...chat, pad: 'x'.repeat(10_000) });
    t.equal(big.status, 413);
    t.match(JSON.parse(big.body).error.message, /exceeds 4096 bytes/);

    // a client that leaves mid-stream is seen: the request is aborted and its blocks freed
    const slow = await startEngine({ timeScale: 1, itlMs: 50, frontEnd });
    t.teardown(() => slow.close());
    const p = send(slow.url, 'POST', '/v1/chat/completions', { ...chat, stream: true, max_tokens: 200 });
    await p.first;
    p.destroy();
    await p.done;
    for (let i = 0; i < 100 && slow.stats().aborted === 0; i++) await new Promise((r) => setTimeout(r, 10));
    t.equal(slow.stats().aborted, 1, 'aborted once');
    t.equal(slow.stats().running, 0);
    t.equal(slow.stats().kvUsedBlocks, 0);
  });

  t.test(`frontEnd ${frontEnd}: reset-mid-stream cuts the connection`, { skip: frontEnd === 'uws' && uwsProblem() !== null }, async (t) => {
    const e = await startEngine({ timeScale: 0.01, itlMs: 10, failureRate: 1, failureKinds: ['reset-mid-stream'], frontEnd });
    t.teardown(() => e.close());
    const r = await post(e.url, '/v1/chat/completions', { ...chat, stream: true, max_tokens: 10 });
    t.equal(r.status, 200);
    t.ok(r.error, `the response broke (${r.error})`);
    t.notOk(r.body.includes('[DONE]'));
    t.equal(e.stats().running, 0);
  });

  t.test(`frontEnd ${frontEnd}: a port in use is a clear error`, { skip: frontEnd === 'uws' && uwsProblem() !== null }, async (t) => {
    const e = await startEngine({ timeScale: 0, frontEnd });
    t.teardown(() => e.close());
    await t.rejects(startEngine({ port: e.port, frontEnd }), /switchyard sim: cannot listen on 127\.0\.0\.1:\d+/);
  });
}
