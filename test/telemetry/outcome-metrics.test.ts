// Outcome metrics of a real `switchyard serve` process (needs dist/), read
// from its /metrics: every way a request ends is counted under its outcome
// (a killed engine mid-stream as mid_stream_failure, not as a 200), with the
// end-to-end duration and router-side TTFT histograms per model and upstream
// errors by kind. The killed engine is a real `switchyard sim` process
// SIGKILLed while it streams.
import t from 'tap';
import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect } from 'node:net';
import { fileURLToPath } from 'node:url';
import { startFleet } from '../../src/sim/index.js';
import { spawnServe } from '../support/router-util.js';
import { metric, scrape, send, sleep, sseData } from '../support/sim-util.js';

const bin = fileURLToPath(new URL('../../bin/switchyard.js', import.meta.url));

async function simProcess(t: Tap.Test, args: string[]): Promise<{ url: string; child: ReturnType<typeof spawn> }> {
  const child = spawn(process.execPath, [bin, 'sim', '--port', '0', ...args], { stdio: ['ignore', 'pipe', 'inherit'] });
  t.teardown(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  });
  const url = await new Promise<string>((resolve, reject) => {
    let out = '';
    child.stdout!.on('data', (c: Buffer) => {
      out += c.toString();
      const m = /on (http:\/\/127\.0\.0\.1:\d+)/.exec(out);
      if (m) resolve(m[1]!);
    });
    setTimeout(() => reject(new Error(`no listening line: ${out}`)), 10_000);
  });
  return { url, child };
}

t.test('outcomes: ok, mid-stream failure (engine SIGKILLed), upstream error, client error, rejected, cancelled, timeout; duration and TTFT histograms', async (t) => {
  const sim = await simProcess(t, ['--model', 'm', '--itl-ms', '50']);
  const failing = await startFleet(1, { models: ['f'], timeScale: 0, failureRate: 1, failureKinds: ['500'] });
  t.teardown(() => failing.close());
  const dir = mkdtempSync(join(tmpdir(), 'swy-outcomes-'));
  const file = join(dir, 'router.yaml');
  writeFileSync(
    file,
    `apiVersion: switchyard/v1\nkind: Router\nlisten: { host: 127.0.0.1, port: 0 }\nshutdown: { graceMs: 500 }\n` +
      `proxy: { maxRetries: 0 }\nlimits: { requestBodyTimeoutMs: 300 }\ndataLayer: { breakerFailures: 100 }\n` +
      `flowControl: { saturation: { maxConcurrency: 1 }, ttl: "200ms" }\n` +
      `pools:\n  - { name: p, models: [m], endpoints: [{ name: e0, url: "${sim.url}" }] }\n` +
      `  - { name: q, models: [f], endpoints: [{ name: bad, url: "${failing.urls[0]}" }] }\n` +
      `  - { name: z, models: [gone], endpoints: [{ name: dead, url: "http://127.0.0.1:1" }] }\n`,
  );
  const { url } = await spawnServe(t, ['--config', file]);

  // ok: two answers
  for (const stream of [false, true]) {
    const r = await send(url, 'POST', '/v1/completions', { model: 'm', prompt: 'hi', max_tokens: 2, stream }).done;
    t.equal(r.status, 200);
  }
  // client_error: a body that is not JSON
  t.equal((await send(url, 'POST', '/v1/completions', '{nope').done).status, 400);
  // upstream_error: the engine answers 500 (no retries)
  t.equal((await send(url, 'POST', '/v1/completions', { model: 'f', prompt: 'hi', max_tokens: 2 }).done).status, 500);
  // unavailable: no endpoint of the model is up
  const none = await send(url, 'POST', '/v1/completions', { model: 'gone', prompt: 'hi', max_tokens: 2 }).done;
  t.ok(none.status >= 500, `no endpoint: ${none.status} ${none.body}`);
  // timeout: a body that never arrives (408)
  const port = Number(new URL(url).port);
  const slow = await new Promise<string>((resolve) => {
    const c = connect(port, '127.0.0.1', () => c.write('POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{"mo'));
    let got = '';
    c.on('data', (b) => (got += b.toString()));
    c.on('close', () => resolve(got));
    c.on('error', () => {});
  });
  t.match(slow, /^HTTP\/1\.1 408 /);
  // rejected: the one slot of e0 (maxConcurrency 1) is taken, the next request waits past its ttl (429)
  const gone = send(url, 'POST', '/v1/completions', { model: 'm', prompt: 'hi', max_tokens: 100, stream: true });
  await gone.first;
  const shed = await send(url, 'POST', '/v1/completions', { model: 'm', prompt: 'second', max_tokens: 2 }).done;
  t.equal(shed.status, 429, shed.body);
  // cancelled: the client leaves mid-stream
  gone.destroy();
  await gone.done.catch(() => {});
  await sleep(100);

  // mid_stream_failure: the engine process is killed while it streams
  const s = send(url, 'POST', '/v1/completions', { model: 'm', prompt: 'hello', max_tokens: 200, stream: true });
  await s.first;
  await sleep(150);
  sim.child.kill('SIGKILL');
  const r = await s.done;
  t.equal(r.status, 200, 'the head had gone out');
  const last = sseData(r.body).at(-2)!;
  t.match(JSON.parse(last).error.message, /failed mid-response/, 'the client got the stream-failed event');

  const e = await scrape(url);
  const out = (model: string, outcome: string) => metric(e, 'switchyard_request_outcomes_total', { model, outcome });
  t.equal(out('m', 'ok'), 2, 'ok');
  t.equal(out('m', 'mid_stream_failure'), 1, 'the killed engine: a mid-stream failure');
  t.equal(out('m', 'cancelled'), 1, 'cancelled');
  t.equal(metric(e, 'switchyard_request_outcomes_total', { model: 'm', outcome: 'rejected', reason: shed.headers['x-switchyard-dropped-reason'] as string }), 1, `rejected, with the gate's reason (${shed.headers['x-switchyard-dropped-reason']})`);
  t.equal(out('f', 'upstream_error'), 1, 'upstream error');
  // with flow control the gate answers for a model without a ready endpoint (a rejection with its reason)
  t.equal(metric(e, 'switchyard_request_outcomes_total', { model: 'gone', outcome: 'rejected', reason: none.headers['x-switchyard-dropped-reason'] as string }), 1, `no endpoint: rejected by the gate (${none.headers['x-switchyard-dropped-reason']})`);
  t.equal(out('', 'client_error'), 1, 'client error (no model known)');
  t.equal(out('', 'timeout'), 1, 'timeout (408)');
  t.equal(metric(e, 'switchyard_upstream_errors_total', { endpoint: 'e0', kind: 'mid_stream' }), 1, 'upstream errors by kind: mid_stream');
  t.equal(metric(e, 'switchyard_upstream_errors_total', { endpoint: 'bad', kind: 'http_5xx' }), 1, 'and http_5xx');
  t.equal(metric(e, 'switchyard_request_duration_seconds_count', { model: 'm' }), 5, 'duration per model: every request of m');
  t.equal(metric(e, 'switchyard_request_ttft_seconds_count', { model: 'm' }), 4, 'TTFT per model: those whose first bytes went out');
  t.ok(metric(e, 'switchyard_request_duration_seconds_sum', { model: 'm' }) > 0.15, 'durations measured');
});

t.test('unavailable: without flow control the router answers 503 itself when no endpoint of the model is ready', async (t) => {
  const { startTestRouter } = await import('../support/router-util.js');
  const { url } = await startTestRouter(t, { n: 1, pools: (urls) => [{ name: 'p', models: ['open-model'], endpoints: [{ name: 'e0', url: urls[0] }] }, { name: 'z', models: ['gone'], endpoints: [{ name: 'dead', url: 'http://127.0.0.1:1' }] }] });
  const r = await send(url, 'POST', '/v1/completions', { model: 'gone', prompt: 'hi', max_tokens: 2 }).done;
  t.equal(r.status, 503, r.body);
  const e = await scrape(url);
  t.equal(metric(e, 'switchyard_request_outcomes_total', { model: 'gone', outcome: 'unavailable' }), 1);
  t.equal(metric(e, 'switchyard_request_duration_seconds_count', { model: 'gone' }), 1);
  t.equal(metric(e, 'switchyard_request_ttft_seconds_count', { model: 'gone' }), 0, 'no first byte of an answer: no TTFT (the error is not a token)');
});
