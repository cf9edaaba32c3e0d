// Conformance of every error answer the router writes with OpenAI's Error
// object, as OpenAI's API reference and OpenAPI description define it:
//   Error: { code: string | null, message: string, param: string | null, type: string }, all four required,
//   returned as {"error": Error} (ErrorResponse), and in a chat stream as an event `data: {"error": Error}`.
// `type` is from OpenAI's vocabulary (invalid_request_error for 4xx, `requests`
// for rate limits, server_error for 5xx), never an SDK class name; `code` is
// never the HTTP status. Paths: a body that is not JSON (400), an unknown model
// (404), a body over the limit (413), a full queue (429), an engine that
// resets (502), no ready endpoint (503), engines' own 4xx/5xx relayed (vLLM's
// nested shape with an integer code and a class-name type, older vLLM's flat
// shape), a stream whose engine fails mid-way, a stream carrying an engine's
// error event, and a batch's error file line.
import t from 'tap';
import type { Socket } from 'node:net';
import OpenAI, { toFile } from 'openai';
import { startBatchRouter } from '../support/batch-util.js';
import { listenRaw, startTestRouter } from '../support/router-util.js';

const OPENAI_TYPES = ['invalid_request_error', 'requests', 'tokens', 'server_error', 'permission_error', 'insufficient_quota'];

/** Checks `body` is {"error": Error} field by field; returns the Error. */
function checkError(t: Tap.Test, body: unknown, what: string, status: number): Record<string, unknown> {
  t.ok(typeof body === 'object' && body !== null && !Array.isArray(body), `${what}: a JSON object`);
  const top = body as Record<string, unknown>;
  t.same(Object.keys(top), ['error'], `${what}: only "error" at the top`);
  const e = top.error as Record<string, unknown>;
  t.ok(typeof e === 'object' && e !== null, `${what}: error is an object`);
  t.same(Object.keys(e).sort(), ['code', 'message', 'param', 'type'], `${what}: exactly code, message, param, type`);
  t.type(e.message, 'string', `${what}: message a string`);
  t.ok((e.message as string).length > 0, `${what}: message not empty`);
  t.type(e.type, 'string', `${what}: type a string`);
  t.ok(OPENAI_TYPES.includes(e.type as string), `${what}: type ${JSON.stringify(e.type)} in OpenAI's vocabulary`);
  if (status >= 500) t.equal(e.type, 'server_error', `${what}: a 5xx is a server_error`);
  else if (status === 429) t.ok(e.type === 'requests' || e.type === 'tokens', `${what}: a 429 is a rate limit type`);
  else t.equal(e.type, 'invalid_request_error', `${what}: a 4xx is an invalid_request_error`);
  t.ok(e.code === null || typeof e.code === 'string', `${what}: code a string or null (got ${JSON.stringify(e.code)})`);
  t.ok(e.param === null || typeof e.param === 'string', `${what}: param a string or null`);
  return e;
}

async function post(url: string, path: string, body: string | object, headers: Record<string, string> = {}): Promise<{ status: number; text: string; type: string }> {
  const r = await fetch(url + path, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: typeof body === 'string' ? body : JSON.stringify(body) });
  return { status: r.status, text: await r.text(), type: r.headers.get('content-type') ?? '' };
}

/** A raw engine: GETs (health, metrics) get an empty 200; POSTs go to `onPost`. */
async function rawEngine(t: Tap.Test, onPost: (sock: Socket) => void): Promise<string> {
  const { port } = await listenRaw(t, (sock) =>
    sock.on('data', (b: Buffer) => {
      if (b.toString('latin1', 0, 4) === 'GET ') sock.write('HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n');
      else if (b.toString('latin1', 0, 5) === 'POST ') onPost(sock);
    }),
  );
  return `http://127.0.0.1:${port}`;
}

const answer = (status: string, body: string) => `HTTP/1.1 ${status}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;

t.test("the router's own errors: 400, 404, 413", async (t) => {
  const { url } = await startTestRouter(t, { n: 1, extra: { limits: { maxBodyBytes: 4096 } } });
  const bad = await post(url, '/v1/chat/completions', '{not json');
  t.equal(bad.status, 400);
  checkError(t, JSON.parse(bad.text), '400 parse error', 400);

  const nf = await post(url, '/v1/chat/completions', { model: 'no-such-model', messages: [{ role: 'user', content: 'hi' }] });
  t.equal(nf.status, 404);
  const e = checkError(t, JSON.parse(nf.text), '404 model', 404);
  t.equal(e.param, 'model', '404: param names the model field');
  t.equal(e.code, 'model_not_found', "404: OpenAI's code for an unknown model");

  const big = await post(url, '/v1/completions', { model: 'open-model', prompt: 'x'.repeat(8192) });
  t.equal(big.status, 413);
  checkError(t, JSON.parse(big.text), '413 body too large', 413);

  const field = await post(url, '/v1/chat/completions', { model: 'open-model', messages: 'not a list' });
  t.equal(field.status, 400);
  t.equal(checkError(t, JSON.parse(field.text), '400 bad field', 400).param, 'messages', '400: param names the field');
});

t.test('429: a full queue', async (t) => {
  const held: Socket[] = [];
  let holding = true;
  // never answers while holding: the first request holds the only slot; then every request is reset
  const engine = await rawEngine(t, (sock) => (holding ? held.push(sock) : sock.destroy()));
  const { url } = await startTestRouter(t, {
    n: 1,
    extraEndpoints: [{ name: 'slow', url: engine }],
    pools: () => [{ name: 'p', models: ['open-model'], endpoints: [{ name: 'slow', url: engine }] }],
    extra: { flowControl: { enabled: true, saturation: { maxConcurrency: 1 }, admission: { mode: 'off' }, limits: { maxRequests: 1 } } },
  });
  const body = { model: 'open-model', prompt: 'hello there', max_tokens: 2 };
  const first = post(url, '/v1/completions', body).catch(() => null);
  await new Promise((r) => setTimeout(r, 150));
  const second = post(url, '/v1/completions', body).catch(() => null);
  await new Promise((r) => setTimeout(r, 100));
  const third = await post(url, '/v1/completions', body);
  t.equal(third.status, 429, third.text);
  const e = checkError(t, JSON.parse(third.text), '429 queue full', 429);
  t.equal(e.code, 'rate_limit_exceeded');
  holding = false;
  for (const s of held) s.destroy();
  await Promise.all([first, second]);
});

t.test('502 and 503 from the router; engine errors relayed in OpenAI shape', async (t) => {
  const reset = await rawEngine(t, (sock) => sock.destroy());
  const r1 = await startTestRouter(t, { n: 1, pools: () => [{ name: 'p', models: ['open-model'], endpoints: [{ name: 'reset', url: reset }] }], extra: { proxy: { maxRetries: 0 } } });
  const bg = await post(r1.url, '/v1/completions', { model: 'open-model', prompt: 'hi', max_tokens: 2 });
  t.equal(bg.status, 502, bg.text);
  checkError(t, JSON.parse(bg.text), '502 upstream reset', 502);
  const after = await post(r1.url, '/v1/completions', { model: 'open-model', prompt: 'hi', max_tokens: 2 });
  if (after.status === 503) checkError(t, JSON.parse(after.text), '503 no ready endpoint', 503);
  else t.equal(after.status, 502, 'the breaker may still let it through');

  const bodies: Record<string, [string, string]> = {
    vllm400: ['400 Bad Request', '{"error":{"message":"max_tokens is too large","type":"BadRequestError","param":"max_tokens","code":400}}'],
    flat404: ['404 Not Found', '{"object":"error","message":"The model `x` does not exist.","type":"NotFoundError","param":null,"code":404}'],
    sglang503: ['503 Service Unavailable', '{"error":{"message":"engine overloaded","type":"ServiceUnavailableError","param":null,"code":503}}'],
    fastapi422: ['422 Unprocessable Entity', '{"detail":"field required"}'],
  };
  let which = 'vllm400';
  const engine = await rawEngine(t, (sock) => {
    const [st, b] = bodies[which]!;
    sock.write(answer(st, b));
  });
  const r2 = await startTestRouter(t, { n: 1, pools: () => [{ name: 'p', models: ['open-model'], endpoints: [{ name: 'raw', url: engine }] }], extra: { proxy: { maxRetries: 0 } } });
  for (const k of Object.keys(bodies)) {
    which = k;
    const r = await post(r2.url, '/v1/completions', { model: 'open-model', prompt: 'hi', max_tokens: 2 });
    const status = Number(bodies[k]![0].slice(0, 3));
    t.equal(r.status, status, `${k}: the engine's status`);
    const e = checkError(t, JSON.parse(r.text), `relayed ${k}`, status);
    const src = JSON.parse(bodies[k]![1]);
    const msg = src.error?.message ?? src.message ?? src.detail;
    t.equal(e.message, msg, `${k}: the engine's message kept`);
    if (k === 'vllm400') t.equal(e.param, 'max_tokens', `${k}: the engine's param kept`);
  }
});

t.test('streams: an engine failing mid-way, and an engine error event', async (t) => {
  let mode = 'reset';
  const engine = await rawEngine(t, (sock) => {
    sock.write('HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n');
    const ev = (s: string) => `${Buffer.byteLength(s).toString(16)}\r\n${s}\r\n`;
    sock.write(ev('data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n'));
    if (mode === 'reset') setTimeout(() => sock.destroy(), 30);
    else {
      sock.write(ev('data: {"error":{"message":"decode failed","type":"InternalServerError","param":null,"code":500}}\n\n'));
      sock.write(ev('data: [DONE]\n\n') + '0\r\n\r\n');
    }
  });
  const { url } = await startTestRouter(t, { n: 1, pools: () => [{ name: 'p', models: ['open-model'], endpoints: [{ name: 'raw', url: engine }] }], extra: { proxy: { maxRetries: 0 } } });
  for (const m of ['reset', 'event']) {
    mode = m;
    const r = await post(url, '/v1/chat/completions', { model: 'open-model', stream: true, messages: [{ role: 'user', content: 'hi' }] }).catch((err: Error) => ({ status: 0, text: String(err), type: '' }));
    t.equal(r.status, 200, `${m}: the stream's head went out`);
    const events = r.text.split('\n\n').filter((s) => s.startsWith('data: ') && s !== 'data: [DONE]').map((s) => JSON.parse(s.slice(6)));
    const errs = events.filter((e) => e.error !== undefined);
    t.equal(errs.length, 1, `${m}: one error event (${r.text.slice(0, 300)})`);
    if (errs.length === 1) checkError(t, errs[0], `${m}: the stream's error event`, m === 'reset' ? 502 : 500);
  }
});

t.test('a batch error line has the same Error as the interactive answer', async (t) => {
  const { router } = await startBatchRouter(t);
  const body = { model: 'no-such-model', messages: [{ role: 'user', content: 'hello' }], max_tokens: 4 };
  const live = await post(router.url, '/v1/chat/completions', body);
  t.equal(live.status, 404);
  const liveErr = checkError(t, JSON.parse(live.text), 'interactive 404', 404);

  const client = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: 'k', maxRetries: 0 });
  const line = JSON.stringify({ custom_id: 'unknown-model', method: 'POST', url: '/v1/chat/completions', body });
  const file = await client.files.create({ file: await toFile(Buffer.from(line + '\n'), 'in.jsonl'), purpose: 'batch' });
  const created = await client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  let done = created;
  for (const end = Date.now() + 30000; done.status !== 'completed' && done.status !== 'failed' && Date.now() < end; ) {
    await new Promise((r) => setTimeout(r, 50));
    done = await client.batches.retrieve(created.id);
  }
  t.equal(done.status, 'completed');
  t.ok(done.error_file_id, 'an error file');
  const errs = (await (await client.files.content(done.error_file_id!)).text()).trim().split('\n').map((l) => JSON.parse(l));
  t.equal(errs.length, 1);
  t.equal(errs[0].response.status_code, 404);
  const lineErr = checkError(t, errs[0].response.body, 'batch error line', 404);
  t.same(lineErr, liveErr, 'the same Error in the error file as interactively');
});
