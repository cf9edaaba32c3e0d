// API keys on the Envoy ext_proc transport (the grpc-js client plays Envoy,
// testkit/envoy-client.ts): a request without a known key is answered 401
// (ImmediateResponse, OpenAI's body), a known key is picked, and the decision
// removes the client's Authorization (or replaces it with the pool's
// upstreamAuth key) before Envoy forwards the request to the engine.
import t from 'tap';
import { createHash } from 'node:crypto';
import { startTestRouter } from '../support/router-util.js';
import { decide, extProcClient, EnvoyStream, headerMap } from '../../testkit/envoy-client.js';

const sha = (k: string) => createHash('sha256').update(k).digest('hex');
const KEY = 'sk-extproc-tenant-a';
const chat = JSON.stringify({ model: 'open-model', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] });

/** One buffered decision, returning the raw answer that carries the header mutation. */
async function mutation(client: ReturnType<typeof extProcClient>, headers: Record<string, string>) {
  const s = new EnvoyStream(client);
  s.send({ request_headers: { headers: headerMap({ ':method': 'POST', ':path': '/v1/chat/completions', 'content-type': 'application/json', ...headers }), end_of_stream: false }, protocol_config: { request_body_mode: 2, response_body_mode: 0 } });
  await s.next();
  s.send({ request_body: { body: Buffer.from(chat), end_of_stream: true } });
  const a = await s.next();
  s.end();
  const hm = (a.request_body as { response?: { header_mutation?: { set_headers?: { header: { key: string; raw_value?: Buffer } }[]; remove_headers?: string[] } } }).response?.header_mutation;
  return { set: Object.fromEntries((hm?.set_headers ?? []).map((x) => [x.header.key, x.header.raw_value?.toString() ?? ''])), remove: hm?.remove_headers ?? [] };
}

t.test('ext_proc: 401 without a known key; the client key never goes on to the engine', async (t) => {
  process.env.SWY_TEST_EXTPROC_ENGINE_KEY = 'engine-key-9';
  t.teardown(() => delete process.env.SWY_TEST_EXTPROC_ENGINE_KEY);
  for (const upstreamAuth of [undefined, 'SWY_TEST_EXTPROC_ENGINE_KEY']) {
    const r = await startTestRouter(t, {
      n: 1,
      pools: (urls) => [{ name: 'p', models: ['open-model'], ...(upstreamAuth ? { upstreamAuth } : {}), endpoints: urls.map((url, i) => ({ name: `e${i}`, url })) }],
      extra: { extProc: { host: '127.0.0.1', port: 0 }, auth: { keys: [{ digest: sha(KEY), tenant: 'a' }] } },
    });
    const client = extProcClient(`127.0.0.1:${r.router.extProc!.port}`);
    t.teardown(() => client.close());
    for (const headers of [{}, { authorization: 'Bearer sk-wrong' }, { authorization: 'Basic x' }]) {
      const d = await decide(client, chat, { headers });
      t.equal(d.picked, false, `refused: ${JSON.stringify(headers)}`);
      if (!d.picked) {
        t.equal(d.status, 401);
        t.match(JSON.parse(d.body).error, { type: 'invalid_request_error', code: 'invalid_api_key' });
        d.stream.end();
      }
    }
    const ok = await decide(client, chat, { headers: { authorization: `Bearer ${KEY}` } });
    t.equal(ok.picked, true, 'a known key is picked');
    ok.stream.end();
    const m = await mutation(client, { authorization: `Bearer ${KEY}` });
    if (upstreamAuth === undefined) {
      t.same(m.remove, ['authorization'], 'the client Authorization is removed');
      t.notOk('authorization' in m.set);
    } else {
      t.equal(m.set.authorization, 'Bearer engine-key-9', "replaced by the pool's key");
      t.same(m.remove, []);
    }
  }
});
