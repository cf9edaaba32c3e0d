// Failure injection: every kind, over loopback, and that failed requests free
// their resources.
import t from 'tap';
import { startEngine } from '../../src/sim/index.js';
import { post, sseData } from '../support/sim-util.js';

const chat = { messages: [{ role: 'user', content: 'tell me a story' }], max_tokens: 10 };

t.test('500, 429, 503: immediate errors in the OpenAI shape', async (t) => {
  for (const kind of ['500', '429', '503'] as const) {
    const e = await startEngine({ timeScale: 0, failureRate: 1, failureKinds: [kind] });
    const r = await post(e.url, '/v1/chat/completions', chat, { 'x-request-id': `f-${kind}` });
    t.equal(r.status, Number(kind), `kind ${kind}`);
    t.equal(r.headers['x-request-id'], `f-${kind}`);
    const j = JSON.parse(r.body);
    t.equal(j.error.code, Number(kind));
    t.match(j.error.message, /injected/);
    t.equal(j.error.type, { '500': 'InternalServerError', '429': 'RateLimitError', '503': 'ServiceUnavailableError' }[kind]);
    if (kind === '429') t.equal(r.headers['retry-after'], '1');
    t.equal(e.stats().running + e.stats().waiting, 0);
    await e.close();
  }
});

t.test('reset-mid-stream: some chunks, then the connection drops; resources freed', async (t) => {
  const e = await startEngine({ timeScale: 0.01, itlMs: 10, failureRate: 1, failureKinds: ['reset-mid-stream'] });
  t.teardown(() => e.close());
  const r = await post(e.url, '/v1/chat/completions', { ...chat, stream: true });
  t.equal(r.status, 200);
  t.ok(r.error, `the response broke (${r.error})`);
  t.notOk(r.body.includes('[DONE]'), 'no [DONE]');
  const chunks = r.body.split('\n\n').filter((x) => x.startsWith('data: {'));
  t.equal(chunks.length, 1 + 5, 'role chunk and half of the 10 tokens');
  await t.rejects(post(e.url, '/v1/chat/completions', chat), 'non-stream: the connection drops with no response');
  t.equal(e.stats().running, 0);
  t.equal(e.stats().kvUsedBlocks, 0);
  t.equal(e.stats().aborted, 2);
});

t.test('error-mid-stream: an error event then [DONE], status already 200', async (t) => {
  const e = await startEngine({ timeScale: 0, failureRate: 1, failureKinds: ['error-mid-stream'] });
  t.teardown(() => e.close());
  const r = await post(e.url, '/v1/completions', { prompt: 'x', max_tokens: 8, stream: true });
  t.equal(r.status, 200);
  const ev = sseData(r.body);
  t.equal(ev.at(-1), '[DONE]');
  const err = JSON.parse(ev.at(-2)!);
  t.equal(err.error.code, 500);
  t.equal(ev.length, 4 + 2, 'half the tokens, the error, [DONE]');
  const ns = await post(e.url, '/v1/completions', { prompt: 'x', max_tokens: 8 });
  t.equal(ns.status, 500);
  t.equal(e.stats().running, 0);
});

t.test('slow-first-byte: the first byte comes after the configured real delay', async (t) => {
  const e = await startEngine({ timeScale: 0, failureRate: 1, failureKinds: ['slow-first-byte'], slowFirstByteMs: 150 });
  t.teardown(() => e.close());
  const r = await post(e.url, '/v1/completions', { prompt: 'x', max_tokens: 3, stream: true });
  t.equal(r.status, 200);
  t.ok(r.firstByteMs >= 140, `first byte after ${r.firstByteMs.toFixed(0)} ms`);
  t.equal(sseData(r.body).at(-1), '[DONE]');
  e.setFailures(0);
  const fast = await post(e.url, '/v1/completions', { prompt: 'x', max_tokens: 3 });
  t.ok(fast.firstByteMs < 100, 'failure injection switched off at run time');
});

t.test('failure rate draws the configured fraction, seeded', async (t) => {
  const e = await startEngine({ timeScale: 0, failureRate: 0.3, failureKinds: ['503'], seed: 7 });
  t.teardown(() => e.close());
  let failed = 0;
  for (let i = 0; i < 200; i++) if ((await post(e.url, '/v1/completions', { prompt: 'x', max_tokens: 1 })).status === 503) failed++;
  t.ok(failed > 35 && failed < 85, `${failed}/200 failed at rate 0.3`);
  t.throws(() => e.setFailures(2), /failureRate/);
});
