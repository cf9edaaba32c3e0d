// Prefill/decode legs (vLLM NIXL-style kv_transfer_params) on simulated engines.
import t from 'tap';
import { startEngine } from '../../src/sim/index.js';
import { metric, post, scrape, sseData } from '../support/sim-util.js';

t.test('prefill leg returns kv_transfer_params; decode leg skips the per-token prefill', async (t) => {
  const opts = { timeScale: 0.2, prefillOverheadMs: 1, prefillUsPerToken: 1000, itlMs: 1 };
  const prefill = await startEngine({ ...opts, role: 'prefill' });
  const decode = await startEngine({ ...opts, role: 'decode' });
  t.teardown(() => Promise.all([prefill.close(), decode.close()]));
  const prompt = 'z'.repeat(1000); // 250 tokens: 250 model ms of prefill = 50 ms wall
  const p = await post(
    prefill.url,
    '/v1/completions',
    {
      prompt,
      max_tokens: 1,
      stream: false,
      kv_transfer_params: { do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null },
    },
    { 'x-request-id': 'pd-1' },
  );
  t.equal(p.status, 200);
  const pj = JSON.parse(p.body);
  t.equal(pj.usage.completion_tokens, 1);
  const kv = pj.kv_transfer_params;
  t.match(kv, { do_remote_prefill: true, do_remote_decode: false, remote_request_id: 'cmpl-pd-1', remote_host: '127.0.0.1', remote_port: prefill.port, tp_size: 1 });
  t.equal(kv.remote_block_ids.length, 15);
  t.type(kv.remote_engine_id, 'string');
  t.ok(p.firstByteMs >= 45, `prefill leg pays the prefill (${p.firstByteMs.toFixed(0)} ms)`);

  const d = await post(decode.url, '/v1/completions', { prompt, max_tokens: 4, stream: true, kv_transfer_params: kv }, { 'x-request-id': 'pd-1' });
  t.equal(d.status, 200);
  t.equal(d.headers['x-request-id'], 'pd-1');
  // in model time (the engine's own TTFT histogram, free of this machine's load): the prefill's overhead only
  const ttft = metric(await scrape(decode.url), 'vllm:time_to_first_token_seconds_sum');
  t.ok(ttft < 0.01, `decode leg starts without the prefill (${(ttft * 1000).toFixed(1)} model ms; the prefill would be 250)`);
  t.ok(d.body.endsWith('data: [DONE]\n\n'));
  // A plain request has no kv_transfer_params.
  const plain = JSON.parse((await post(decode.url, '/v1/completions', { prompt: 'x', max_tokens: 1 })).body);
  t.notOk('kv_transfer_params' in plain);
  // SGLang-style bootstrap fields are accepted and ignored.
  const sg = await post(decode.url, '/v1/completions', { prompt: 'x', max_tokens: 1, bootstrap_host: '10.0.0.1', bootstrap_port: 8998, bootstrap_room: 12345 });
  t.equal(sg.status, 200);
  const bad = await post(decode.url, '/v1/completions', { prompt: 'x', kv_transfer_params: 'nope' });
  t.equal(bad.status, 400);
  t.equal(JSON.parse(bad.body).error.param, 'kv_transfer_params');
});

t.test('P/D rules: roles, transfers that must exist on a live prefill engine, loading, graceful drain', async (t) => {
  const opts = { timeScale: 0 };
  const prefill = await startEngine({ ...opts, role: 'prefill' });
  const decode = await startEngine({ ...opts, role: 'decode' });
  const both = await startEngine({ ...opts, role: 'both', kvTransferTtlMs: 50 });
  t.teardown(() => Promise.all([prefill.close(), decode.close(), both.close()]));
  const PREFILL_KV = { do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null };
  const prompt = 'q'.repeat(400);
  // a decode engine cannot produce, a prefill engine cannot consume
  const r1 = await post(decode.url, '/v1/completions', { prompt, max_tokens: 1, kv_transfer_params: PREFILL_KV });
  t.equal(r1.status, 400);
  t.match(JSON.parse(r1.body).error, { param: 'kv_transfer_params', message: /KV consumer/ });
  const p = JSON.parse((await post(prefill.url, '/v1/completions', { prompt, max_tokens: 1, kv_transfer_params: PREFILL_KV }, { 'x-request-id': 'tx-1' })).body);
  const r2 = await post(prefill.url, '/v1/completions', { prompt, max_tokens: 2, kv_transfer_params: p.kv_transfer_params });
  t.equal(r2.status, 400, 'a prefill engine refuses do_remote_prefill');
  // the decode reads the transfer once: a second read of the same transfer fails as an unknown one
  const d1 = await post(decode.url, '/v1/completions', { prompt, max_tokens: 2, kv_transfer_params: p.kv_transfer_params });
  t.equal(d1.status, 200);
  const d2 = await post(decode.url, '/v1/completions', { prompt, max_tokens: 2, kv_transfer_params: p.kv_transfer_params });
  t.equal(d2.status, 500, 'a transfer already read');
  t.match(JSON.parse(d2.body).error.message, /KV transfer .* failed: .*no KV transfer/);
  const forged = { ...p.kv_transfer_params, remote_request_id: 'cmpl-never-happened' };
  t.equal((await post(decode.url, '/v1/completions', { prompt, max_tokens: 2, kv_transfer_params: forged })).status, 500, 'an unknown transfer');
  // expired: the both-role engine holds transfers 50 ms
  const pb = JSON.parse((await post(both.url, '/v1/completions', { prompt, max_tokens: 1, kv_transfer_params: PREFILL_KV })).body);
  await new Promise((r) => setTimeout(r, 80));
  t.equal((await post(decode.url, '/v1/completions', { prompt, max_tokens: 2, kv_transfer_params: pb.kv_transfer_params })).status, 500, 'an expired transfer');
  // the prefill engine gone
  const pc = JSON.parse((await post(prefill.url, '/v1/completions', { prompt, max_tokens: 1, kv_transfer_params: PREFILL_KV })).body);
  await prefill.close();
  const gone = await post(decode.url, '/v1/completions', { prompt, max_tokens: 2, kv_transfer_params: pc.kv_transfer_params });
  t.equal(gone.status, 500);
  t.match(JSON.parse(gone.body).error.message, /cannot reach the prefill engine/);
  // SGLang: a prefill server (as a decode one: test/pd-sglang.test.ts) needs a bootstrap room
  const sg = await startEngine({ ...opts, engine: 'sglang', role: 'prefill' });
  t.teardown(() => sg.close());
  const noRoom = await post(sg.url, '/v1/completions', { prompt, max_tokens: 1 }, { 'x-request-id': 'nr' });
  t.equal(noRoom.status, 400);
  t.equal(JSON.parse(noRoom.body).error.message, "Invalid request: Disaggregated request received without bootstrap room id. req.rid='nr'");
  t.equal((await post(sg.url, '/v1/completions', { prompt, max_tokens: 1, bootstrap_host: '127.0.0.1', bootstrap_port: 8998, bootstrap_room: 7 })).status, 200);
});

t.test('loading and graceful drain', async (t) => {
  const e = await startEngine({ timeScale: 1, itlMs: 10, prefillOverheadMs: 1, loadingMs: 3000 });
  t.teardown(() => e.close());
  const h = await fetch(`${e.url}/health`);
  t.equal(h.status, 503, 'not ready while loading');
  t.equal((await post(e.url, '/v1/completions', { prompt: 'x', max_tokens: 1 })).status, 503);
  const t0 = Date.now();
  while ((await fetch(`${e.url}/health`)).status !== 200 && Date.now() - t0 < 6000) await new Promise((r) => setTimeout(r, 50));
  t.equal((await fetch(`${e.url}/health`)).status, 200, 'ready once loaded');
  const long = post(e.url, '/v1/completions', { prompt: 'x', max_tokens: 30, stream: true });
  await new Promise((r) => setTimeout(r, 50));
  const drained = e.drain(5000);
  await new Promise((r) => setTimeout(r, 20));
  t.equal((await post(e.url, '/v1/completions', { prompt: 'y', max_tokens: 1 })).status, 503, 'no new requests while draining');
  const r = await long;
  t.equal(r.status, 200);
  t.ok(r.body.endsWith('data: [DONE]\n\n'), 'the request in flight finished');
  await drained;
});

t.test('SGLang bootstrap: a decode leg pairs with the prefill of its room on the prefill engine its bootstrap fields name', async (t) => {
  const opts = { engine: 'sglang' as const, timeScale: 0.2, prefillOverheadMs: 1, prefillUsPerToken: 1000, itlMs: 1, bootstrapTimeoutMs: 400 };
  const prefill = await startEngine({ ...opts, role: 'prefill' });
  const other = await startEngine({ ...opts, role: 'prefill' });
  const decode = await startEngine({ ...opts, role: 'decode', kvTransferTtlMs: 60_000 });
  t.teardown(() => Promise.all([prefill.close(), other.close(), decode.close()]));
  const prompt = 'b'.repeat(1000); // 250 tokens: 250 model ms of prefill = 50 ms wall
  const boot = (e: { port: number }, room: number) => ({ bootstrap_host: '127.0.0.1', bootstrap_port: e.port, bootstrap_room: room });

  // both legs at once (as the router sends them): decode waits for the prefill, then decodes without prefilling
  const [p, d] = await Promise.all([
    post(prefill.url, '/v1/completions', { prompt, max_tokens: 8, stream: true, ...boot(prefill, 4242) }, { 'x-request-id': 'sg-a' }),
    post(decode.url, '/v1/completions', { prompt, max_tokens: 8, stream: true, ...boot(prefill, 4242) }, { 'x-request-id': 'sg-a' }),
  ]);
  t.equal(p.status, 200);
  t.equal(sseData(p.body).filter((x) => x !== '[DONE]' && JSON.parse(x).choices[0]?.text).length, 1, 'the prefill server computes the prompt and one token, no more');
  t.equal(d.status, 200);
  t.equal(sseData(d.body).filter((x) => x !== '[DONE]' && JSON.parse(x).choices[0]?.text).length, 8, 'decode answers the whole completion');
  t.ok(d.totalMs >= 45, `decode waited for the prefill (${d.totalMs.toFixed(0)} ms)`);
  const ttft = metric(await scrape(decode.url), 'sglang:time_to_first_token_seconds_sum');
  // a decode leg that prefilled would report >= 250 model ms; one that skipped it reports the first
  // decode step plus scheduling delay, which a loaded machine stretches (x5 in model time at this
  // timeScale: a CI run saw 33 model ms), so the bound is half the prefill, not a few ms
  t.ok(ttft < 0.125, `decode skipped the prefill (${(ttft * 1000).toFixed(1)} model ms; the prefill is 250)`);

  // the decode leg first, its prefill a moment later: it still pairs
  const late = post(decode.url, '/v1/completions', { prompt, max_tokens: 2, ...boot(prefill, 7) });
  await new Promise((r) => setTimeout(r, 100));
  t.equal((await post(prefill.url, '/v1/completions', { prompt, max_tokens: 2, ...boot(prefill, 7) })).status, 200);
  t.equal((await late).status, 200, 'a decode leg that arrives first waits for its room');

  // a room read once cannot be read again
  const again = await post(decode.url, '/v1/completions', { prompt, max_tokens: 2, ...boot(prefill, 7) });
  t.equal(again.status, 500);
  t.match(JSON.parse(again.body).error, {
    type: 'InternalServerError',
    message: /^Decode transfer failed for request .* bootstrap_room=7 with exception KVTransferError\(bootstrap_room=7\): Failed to get kvcache from prefill instance, it might be dead/,
  });

  // a room that exists on another prefill engine does not exist on the one named
  const [, wrong] = await Promise.all([
    post(other.url, '/v1/completions', { prompt, max_tokens: 2, ...boot(other, 99) }),
    post(decode.url, '/v1/completions', { prompt, max_tokens: 2, ...boot(prefill, 99) }),
  ]);
  t.equal(wrong.status, 500, 'the room of another prefill engine');
  t.match(JSON.parse(wrong.body).error.message, /no prefill request with this bootstrap room arrived/);

  // an unknown room: 500 after the bootstrap wait
  const unknown = await post(decode.url, '/v1/completions', { prompt, max_tokens: 2, ...boot(prefill, 123456789) });
  t.equal(unknown.status, 500, 'an unknown room');
  t.ok(unknown.totalMs >= 350, 'after waiting for it');

  // the prefill failing: its decode side fails at once, without waiting out the timeout
  prefill.setFailures(1, ['500']);
  const [pf, df] = await Promise.all([
    post(prefill.url, '/v1/completions', { prompt, max_tokens: 2, ...boot(prefill, 5) }),
    post(decode.url, '/v1/completions', { prompt, max_tokens: 2, ...boot(prefill, 5) }),
  ]);
  t.equal(pf.status, 500);
  t.equal(df.status, 500);
  t.match(JSON.parse(df.body).error.message, /KVTransferError\(bootstrap_room=5\)/);
  prefill.setFailures(0);

  // the prefill engine gone
  const gone = await startEngine({ ...opts, role: 'prefill' });
  const port = gone.port;
  await gone.close();
  const g = await post(decode.url, '/v1/completions', { prompt, max_tokens: 2, ...boot({ port }, 1) });
  t.equal(g.status, 500);
  t.match(JSON.parse(g.body).error.message, /Failed to get prefill server info/);

  // bad bootstrap fields: 400
  const bad = await post(decode.url, '/v1/completions', { prompt, max_tokens: 2, bootstrap_room: 'x', bootstrap_host: '127.0.0.1', bootstrap_port: prefill.port });
  t.equal(bad.status, 400);
  t.equal(JSON.parse(bad.body).error.param, 'bootstrap_room');
  const nohost = await post(decode.url, '/v1/completions', { prompt, max_tokens: 2, bootstrap_room: 3 });
  t.equal(nohost.status, 400);
  t.equal(JSON.parse(nohost.body).error.param, 'bootstrap_host');
});

t.test('SGLang bootstrap: an expired room fails its decode leg', async (t) => {
  const opts = { engine: 'sglang' as const, timeScale: 0, bootstrapTimeoutMs: 200 };
  const prefill = await startEngine({ ...opts, role: 'prefill', kvTransferTtlMs: 30 });
  const decode = await startEngine({ ...opts, role: 'decode' });
  t.teardown(() => Promise.all([prefill.close(), decode.close()]));
  const b = { bootstrap_host: '127.0.0.1', bootstrap_port: prefill.port, bootstrap_room: 11 };
  t.equal((await post(prefill.url, '/v1/completions', { prompt: 'q'.repeat(400), max_tokens: 2, ...b })).status, 200);
  await new Promise((r) => setTimeout(r, 60));
  const d = await post(decode.url, '/v1/completions', { prompt: 'q'.repeat(400), max_tokens: 2, ...b });
  t.equal(d.status, 500);
  t.match(JSON.parse(d.body).error.message, /KVTransferError\(bootstrap_room=11\).*expired/);
});

t.test('the P/D side doors bound their bodies: a body over max-body-bytes is a 413, the engine serves on', async (t) => {
  const e = await startEngine({ timeScale: 0, maxBodyBytes: 4096 });
  t.teardown(() => e.close());
  for (const path of ['/internal/kv_transfer/pull', '/internal/bootstrap/room']) {
    const big = await post(e.url, path, { remote_request_id: 'x'.repeat(10_000), bootstrap_room: 1 });
    t.equal(big.status, 413, path);
    t.equal(JSON.parse(big.body).error.code, 413);
  }
  const small = await post(e.url, '/internal/kv_transfer/pull', { remote_request_id: 'none' });
  t.equal(small.status, 404, 'a small body is read as before');
  t.equal((await post(e.url, '/v1/completions', { prompt: 'hi', max_tokens: 1 })).status, 200);
});
