// Prefill/decode legs (vLLM NIXL-style kv_transfer_params) on simulated engines.
import t from 'tap';
import { startEngine } from '../src/sim/index.js';
import { post } from './sim-util.js';

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
  t.ok(d.firstByteMs < 30, `decode leg starts without the prefill (${d.firstByteMs.toFixed(0)} ms)`);
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
