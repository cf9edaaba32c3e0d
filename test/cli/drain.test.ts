// Drains of a real `switchyard serve` process (needs dist/) on real signals, in
// front of a real simulated engine with slow token pacing. The case is
// a 30 s stream with a 60 s grace (finishes) and a 1 s grace (cut with an SSE
// error); scaled down here 10x: a 3 s stream (30 tokens at 100 ms) with a 6 s
// grace and with a 1 s grace.
import t from 'tap';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect } from 'node:net';
import { startFleet } from '../../src/sim/index.js';
import { spawnServe } from '../support/router-util.js';
import { get, send, sleep, sseData } from '../support/sim-util.js';

async function slowSim(t: Tap.Test) {
  const fleet = await startFleet(1, { models: ['m'], itlMs: 100, prefillOverheadMs: 0 });
  t.teardown(() => fleet.close());
  return fleet;
}

function configFile(url: string, shutdown: string): string {
  const dir = mkdtempSync(join(tmpdir(), 'swy-drain-'));
  const file = join(dir, 'router.yaml');
  writeFileSync(
    file,
    `apiVersion: switchyard/v1\nkind: Router\nlisten: { host: 127.0.0.1, port: 0 }\npools:\n  - { name: p, models: [m], endpoints: [{ name: e0, url: "${url}" }] }\nshutdown: ${shutdown}\n`,
  );
  return file;
}

const stream = (url: string, n = 30) => send(url, 'POST', '/v1/completions', { model: 'm', prompt: 'hello', max_tokens: n, stream: true, ignore_eos: true });

t.test('SIGTERM during a 3 s stream with a 6 s grace: the stream runs to its end, then exit 0', async (t) => {
  const fleet = await slowSim(t);
  const { child, url, out, exited } = await spawnServe(t, ['--config', configFile(fleet.urls[0], '{ graceMs: 6000 }')]);
  const s = stream(url);
  await s.first;
  const t0 = Date.now();
  child.kill('SIGTERM');
  const r = await s.done;
  t.equal(r.status, 200);
  t.notOk(r.error, 'no reset');
  const events = sseData(r.body);
  t.equal(events.at(-1), '[DONE]');
  t.notMatch(r.body, /"error"/, 'no error event');
  t.ok(events.length >= 30, `every token arrived (${events.length} events)`);
  t.same(await exited, [0, null]);
  t.ok(Date.now() - t0 < 5500, 'exited once the stream was over, not at the grace end');
  t.match(out(), /"msg":"shutting down: \/readyz answers 503"/);
  t.notMatch(out(), /request\(s\) still in flight ended/);
});

t.test('SIGTERM during a 3 s stream with a 1 s grace: the stream ends with an SSE error event, a non-streamed answer with a 503', async (t) => {
  const fleet = await slowSim(t);
  const { child, url, out, exited } = await spawnServe(t, ['--config', configFile(fleet.urls[0], '{ graceMs: 1000 }')]);
  const s = stream(url);
  const whole = send(url, 'POST', '/v1/completions', { model: 'm', prompt: 'hello', max_tokens: 30, ignore_eos: true });
  await s.first;
  const t0 = Date.now();
  child.kill('SIGTERM');
  const [r, w] = await Promise.all([s.done, whole.done]);
  const took = Date.now() - t0;
  t.equal(r.status, 200);
  t.notOk(r.error, `the stream ended cleanly (chunked terminator), not with a reset: ${r.error}`);
  t.ok(took >= 900 && took < 2500, `cut at the grace end (${took} ms)`);
  const events = sseData(r.body);
  t.equal(events.at(-1), '[DONE]', 'the stream still ends with [DONE]');
  const err = JSON.parse(events.at(-2)!);
  t.same(Object.keys(err.error).sort(), ['code', 'message', 'param', 'type'], 'OpenAI error shape');
  t.equal(err.error.code, 'router_shutting_down');
  t.equal(err.error.type, 'server_error');
  t.match(err.error.message, /1000 ms drain grace/);
  t.ok(events.length > 3 && events.length < 30, `some tokens came before the cut (${events.length} events)`);
  t.equal(w.status, 503, w.body);
  t.equal(JSON.parse(w.body).error.code, 'router_shutting_down');
  t.same(await exited, [0, null]);
  const line = out()
    .split('\n')
    .find((l) => l.includes('still in flight ended'));
  t.ok(line, 'the cut is logged');
  const j = JSON.parse(line!);
  t.equal(j.cut, 2);
  t.equal(j.request_ids.length, 2);
  t.equal(j.level, 'warn', 'level names');
  t.match(j.time, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/, 'ISO time');
});

t.test('drainDelayMs: /readyz 503 at once, requests still served during the delay, then connections refused', async (t) => {
  const fleet = await slowSim(t);
  const { child, url, exited } = await spawnServe(t, ['--config', configFile(fleet.urls[0], '{ graceMs: 5000, drainDelayMs: 1500 }')]);
  const s = stream(url, 25); // 2.5 s: runs past the delay
  await s.first;
  child.kill('SIGTERM');
  await sleep(200);
  const ready = await get(url, '/readyz');
  t.equal(ready.status, 503, 'readiness is false at once');
  const during = await send(url, 'POST', '/v1/completions', { model: 'm', prompt: 'x', max_tokens: 1 }).done;
  t.equal(during.status, 200, 'a new request during the delay is served');
  await sleep(1600);
  const port = Number(new URL(url).port);
  const refused = await new Promise<string>((resolve) => {
    const c = connect(port, '127.0.0.1');
    c.once('connect', () => {
      c.destroy();
      resolve('connected');
    });
    c.once('error', (e: NodeJS.ErrnoException) => resolve(e.code ?? e.message));
  });
  t.equal(refused, 'ECONNREFUSED', 'after the delay no new connection is accepted');
  const r = await s.done;
  t.equal(sseData(r.body).at(-1), '[DONE]');
  t.notMatch(r.body, /"error"/, 'the stream in flight finished within the grace');
  t.same(await exited, [0, null]);
});

t.test('a second signal (after the 1 s repeat window) ends the streams with an SSE error at once', async (t) => {
  const fleet = await slowSim(t);
  const { child, url, out, exited } = await spawnServe(t, ['--config', configFile(fleet.urls[0], '{ graceMs: 60000 }')]);
  const s = stream(url, 60); // 6 s
  await s.first;
  child.kill('SIGINT');
  await sleep(1200);
  const t0 = Date.now();
  child.kill('SIGINT');
  const r = await s.done;
  t.same(await exited, [130, null]);
  t.ok(Date.now() - t0 < 1500, `at once (${Date.now() - t0} ms)`);
  t.notOk(r.error, 'not a reset');
  const events = sseData(r.body);
  t.equal(events.at(-1), '[DONE]');
  t.equal(JSON.parse(events.at(-2)!).error.code, 'router_shutting_down');
  t.match(out(), /second signal: stopping now/);
});

t.test('the native front end (server.frontEnd: native): the same cut at the grace end, the outcomes counted', async (t) => {
  const fleet = await slowSim(t);
  const file = configFile(fleet.urls[0], '{ graceMs: 1000 }\nserver: { frontEnd: native }');
  const { child, url, out, exited } = await spawnServe(t, ['--config', file]);
  const ok = await send(url, 'POST', '/v1/completions', { model: 'm', prompt: 'hi', max_tokens: 1 }).done;
  t.equal(ok.status, 200);
  const { scrape, metric } = await import('../support/sim-util.js');
  t.equal(metric(await scrape(url), 'switchyard_request_outcomes_total', { model: 'm', outcome: 'ok' }), 1, 'outcomes on the native front end');
  const s = stream(url);
  const whole = send(url, 'POST', '/v1/completions', { model: 'm', prompt: 'hello', max_tokens: 30, ignore_eos: true });
  await s.first;
  child.kill('SIGTERM');
  const [r, w] = await Promise.all([s.done, whole.done]);
  t.notOk(r.error, `the stream ended cleanly: ${r.error}`);
  const events = sseData(r.body);
  t.equal(events.at(-1), '[DONE]');
  t.equal(JSON.parse(events.at(-2)!).error.code, 'router_shutting_down');
  t.equal(w.status, 503, w.body);
  t.same(await exited, [0, null]);
  t.match(out(), /"cut":2/);
});

/** The events of a Responses stream (`event: <type>` + `data: <json>`), parsed. */
function responsesEvents(body: string): { event: string; data: any }[] {
  const out: { event: string; data: any }[] = [];
  for (const block of body.split('\n\n')) {
    if (block.trim() === '') continue;
    const lines = block.split('\n');
    const ev = lines.find((l) => l.startsWith('event: '));
    const data = lines.find((l) => l.startsWith('data: '));
    if (ev === undefined || data === undefined) throw new Error(`not a Responses SSE event: ${JSON.stringify(block)}`);
    out.push({ event: ev.slice(7), data: JSON.parse(data.slice(6)) });
  }
  return out;
}

for (const frontEnd of ['uws', 'native'] as const) {
  t.test(`a Responses stream cut at the grace end ends with error + response.failed, in the Responses shape (${frontEnd} front end)`, async (t) => {
    const fleet = await slowSim(t);
    const file = configFile(fleet.urls[0], `{ graceMs: 1000 }${frontEnd === 'native' ? '\nserver: { frontEnd: native }' : ''}`);
    const { child, url, out, exited } = await spawnServe(t, ['--config', file]);
    const s = send(url, 'POST', '/v1/responses', { model: 'm', input: 'tell me a long story', max_output_tokens: 30, stream: true, store: false });
    await s.first;
    const t0 = Date.now();
    child.kill('SIGTERM');
    const r = await s.done;
    const took = Date.now() - t0;
    t.equal(r.status, 200);
    t.notOk(r.error, `the stream ended cleanly, not with a reset: ${r.error}`);
    t.ok(took >= 900 && took < 2500, `cut at the grace end (${took} ms)`);
    t.notMatch(r.body, /\[DONE\]/, 'no chat-shaped [DONE]');
    const evs = responsesEvents(r.body);
    t.same(evs.slice(0, 2).map((e) => e.event), ['response.created', 'response.in_progress']);
    t.ok(evs.some((e) => e.event === 'response.output_text.delta'), 'some text came before the cut');
    t.same(evs.slice(-2).map((e) => e.event), ['error', 'response.failed'], 'the last two events');
    t.same(evs.map((e) => e.data.sequence_number), evs.map((_, i) => i), 'sequence numbers run on without a hole');
    const err = evs.at(-2)!.data;
    t.equal(err.type, 'error');
    t.equal(err.code, 'router_shutting_down');
    t.match(err.message, /1000 ms drain grace/);
    const failed = evs.at(-1)!.data.response;
    t.equal(failed.status, 'failed');
    t.same(failed.error, { code: 'router_shutting_down', message: err.message });
    const text = evs.filter((e) => e.event === 'response.output_text.delta').map((e) => e.data.delta).join('');
    t.equal(failed.output[0]?.content[0]?.text, text, 'the failed response holds the text streamed so far');
    t.same(await exited, [0, null]);
    t.match(out(), /still in flight ended/);
  });
}
