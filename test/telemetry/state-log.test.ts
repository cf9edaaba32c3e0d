// The state-change log and the access log of a real `switchyard serve`
// process (needs dist/), read from its stdout: one JSON line per change with
// a stable `event` field, level names and ISO times; the access log's line
// per request with no key or body in it. Real sims on loopback, real signals.
import t from 'tap';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startEngine, startFleet } from '../../src/sim/index.js';
import { spawnServe } from '../support/router-util.js';
import { send, sleep } from '../support/sim-util.js';

interface Line {
  level: string;
  time: string;
  msg: string;
  event?: string;
  [k: string]: unknown;
}

function lines(out: string): Line[] {
  return out
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as Line);
}

async function until(out: () => string, pred: (l: Line) => boolean, ms = 8000): Promise<Line | undefined> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    const hit = lines(out()).find(pred);
    if (hit) return hit;
    await sleep(25);
  }
  return undefined;
}

t.test('endpoint up/down (refused, DNS), breaker open, upstream errors, reload applied/refused, draining/removed, access log', async (t) => {
  const good = await startFleet(1, { models: ['m'], timeScale: 0 });
  t.teardown(() => good.close());
  const bad = await startFleet(1, { models: ['m'], timeScale: 0, failureRate: 1, failureKinds: ['500'] });
  t.teardown(() => bad.close());
  const dir = mkdtempSync(join(tmpdir(), 'swy-log-'));
  const file = join(dir, 'router.yaml');
  const cfg = (endpoints: string, extra = '') =>
    `apiVersion: switchyard/v1\nkind: Router\nlisten: { host: 127.0.0.1, port: 0 }\n` +
    `dataLayer: { healthIntervalMs: 100, breakerFailures: 2, breakerCooldownMs: 60000 }\n` +
    `logging: { level: info, access: true }\nshutdown: { graceMs: 1000 }\n` +
    `pools:\n  - name: p\n    models: [m]\n    endpoints:\n${endpoints}${extra}`;
  const eps = {
    good: `      - { name: good, url: "${good.urls[0]}" }\n`,
    bad: `      - { name: bad, url: "${bad.urls[0]}" }\n`,
    dead: `      - { name: dead, url: "http://127.0.0.1:1" }\n`,
    nx: `      - { name: nx, url: "http://no-such-host.invalid:8000" }\n`,
  };
  writeFileSync(file, cfg(eps.good + eps.bad + eps.dead + eps.nx));
  const { child, url, out, exited } = await spawnServe(t, ['--config', file]);

  const find = (pred: (l: Line) => boolean) => until(out, pred);
  const up = await find((l) => l.event === 'endpoint.up' && l.endpoint === 'good');
  t.ok(up, 'endpoint.up for the live engine');
  t.equal(up?.level, 'info');
  t.match(up?.time, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/, 'ISO time');
  t.equal(up?.url, good.urls[0]);
  const dead = await find((l) => l.event === 'endpoint.down' && l.endpoint === 'dead');
  t.match(dead?.reason, /ECONNREFUSED/, 'a dead port: the reason says refused');
  t.equal(dead?.level, 'warn');
  const nx = await find((l) => l.event === 'endpoint.down' && l.endpoint === 'nx');
  t.match(nx?.reason, /ENOTFOUND|EAI_AGAIN/, 'an unresolvable host: the reason is the DNS error');

  // requests: the one answering 500 fails into retries, its breaker opens.
  // Which endpoint a fresh prompt goes to is the scheduler's choice (ties and
  // the learned speeds decide), so send until the breaker has seen its two
  // failures in a row; at least 12, at most 80.
  const isBreaker = (l: Line) => l.event === 'endpoint.breaker_open' && l.endpoint === 'bad';
  let sent = 0;
  let statuses = 0;
  while (sent < 80 && (sent < 12 || !lines(out()).some(isBreaker))) {
    const i = sent++;
    const r = await send(url, 'POST', '/v1/completions', { model: 'm', prompt: `hi ${i}`, max_tokens: 3, stream: i % 2 === 0 }, { authorization: 'Bearer sk-very-secret-key', 'x-request-id': `req-${i}` }).done;
    if (r.status === 200) statuses++;
    else t.fail(`request ${i}: ${r.status} ${r.body.slice(0, 200)}`);
  }
  t.equal(statuses, sent, `every request answered 200 (${sent} sent)`);
  const breaker = await find(isBreaker);
  t.ok(breaker, 'breaker open logged');
  const upstream = lines(out()).filter((l) => l.event === 'endpoint.upstream_error' && l.endpoint === 'bad');
  t.equal(upstream.length, 1, 'upstream errors rate-limited: one line for several failures');
  t.match(upstream[0]?.error, /HTTP 500/);

  // the access log: one line per request
  await until(out, () => lines(out()).filter((l) => l.event === 'access').length >= sent); // written off the loop: the last may trail its answer
  const access = lines(out()).filter((l) => l.event === 'access');
  t.equal(access.length, sent, 'one access line per request');
  const a = access.find((l) => l.id === 'req-0')!;
  t.equal(a.level, 'info');
  t.equal(a.method, 'POST');
  t.equal(a.path, '/v1/completions');
  t.equal(a.status, 200);
  t.equal(a.endpoint, 'good');
  t.equal(a.model, 'm');
  t.equal(typeof a.duration_ms, 'number');
  t.equal(typeof a.ttft_ms, 'number');
  t.equal(access.find((l) => l.id === 'req-1')?.tokens, 3, 'tokens from the (non-streamed) answer');
  t.equal(a.tenant, '');
  t.ok(access.some((l) => (l.retries as number) > 0), 'retries counted (the 500s were retried)');
  t.notMatch(out(), /sk-very-secret-key/, 'no key in the log');
  t.notMatch(out(), /hi 0/, 'no body in the log');

  // reload: dead removed → draining, removed, applied; then an invalid file → refused
  writeFileSync(file, cfg(eps.good + eps.bad + eps.nx));
  child.kill('SIGHUP');
  const applied = await find((l) => l.event === 'config.reload_applied');
  t.same(applied?.removed, ['dead']);
  t.ok(await find((l) => l.event === 'endpoint.draining' && l.endpoint === 'dead'), 'draining logged');
  t.ok(await find((l) => l.event === 'endpoint.removed' && l.endpoint === 'dead'), 'removed logged');
  writeFileSync(file, cfg(eps.good, '    bogus: 1\n'));
  child.kill('SIGHUP');
  const refused = await find((l) => l.event === 'config.reload_refused');
  t.match(JSON.stringify(refused?.issues), /pools\[0\]\.bogus/);

  // the live engine goes away: endpoint.down with the reason
  await good.close();
  const gone = await find((l) => l.event === 'endpoint.down' && l.endpoint === 'good');
  t.match(gone?.reason, /ECONNREFUSED|ECONNRESET|socket/i);
  const events = lines(out()).filter((l) => l.event?.startsWith('endpoint.'));
  t.equal(events.filter((l) => l.event === 'endpoint.down' && l.endpoint === 'dead').length, 1, 'one line per change, not per check');

  child.kill('SIGTERM');
  t.same(await exited, [0, null]);
});

t.test('KV-event stream connect and disconnect are logged (precise pool)', async (t) => {
  const e = await startEngine({ models: ['m'], timeScale: 0, kvEventsConfig: { enable_kv_cache_events: true, publisher: 'zmq', endpoint: 'tcp://127.0.0.1:*', replay_endpoint: 'tcp://127.0.0.1:*' } });
  let closed = false;
  t.teardown(() => (closed ? undefined : e.close()));
  const dir = mkdtempSync(join(tmpdir(), 'swy-log-'));
  const file = join(dir, 'router.yaml');
  writeFileSync(
    file,
    `apiVersion: switchyard/v1\nkind: Router\nlisten: { host: 127.0.0.1, port: 0 }\nshutdown: { graceMs: 500 }\npools:\n  - name: p\n    models: [m]\n    prefix: { mode: precise, blockTokens: 16, tokenizer: { type: sim } }\n` +
      `    endpoints:\n      - { name: e0, url: "${e.url}", kvEvents: { endpoint: "${e.kvEvents!.endpoint}", replayEndpoint: "${e.kvEvents!.replayEndpoint}" } }\n`,
  );
  const { child, out, exited } = await spawnServe(t, ['--config', file]);
  const connected = await until(out, (l) => l.event === 'kv_events.connected');
  t.equal(connected?.endpoint, 'e0');
  t.equal(connected?.zmq, e.kvEvents!.endpoint);
  t.equal(connected?.level, 'info');
  closed = true;
  await e.close();
  const lost = await until(out, (l) => l.event === 'kv_events.disconnected');
  t.equal(lost?.endpoint, 'e0');
  t.equal(lost?.level, 'warn');
  child.kill('SIGTERM');
  t.same(await exited, [0, null]);
});

t.test('a leader change is logged: the standby of a pair takes over when the active dies', async (t) => {
  const { startRedis } = await import('../support/redis-util.js');
  const redis = await startRedis(t);
  const fleet = await startFleet(1, { models: ['m'], timeScale: 0 });
  t.teardown(() => fleet.close());
  const dir = mkdtempSync(join(tmpdir(), 'swy-log-'));
  const file = join(dir, 'router.yaml');
  writeFileSync(
    file,
    `apiVersion: switchyard/v1\nkind: Router\nlisten: { host: 127.0.0.1, port: 0 }\nshutdown: { graceMs: 500 }\n` +
      `ha: { mode: standby, redis: "${redis.url}", leaseTtlMs: 1000, renewIntervalMs: 200 }\n` +
      `pools:\n  - { name: p, models: [m], endpoints: [{ name: e0, url: "${fleet.urls[0]}" }] }\n`,
  );
  const a = await spawnServe(t, ['--config', file]);
  t.ok(await until(a.out, (l) => l.msg === 'high availability: started as active'), 'the first one leads');
  const b = await spawnServe(t, ['--config', file]);
  t.ok(await until(b.out, (l) => l.msg === 'high availability: started as standby'), 'the second one stands by');
  a.child.kill('SIGKILL');
  const change = await until(b.out, (l) => l.event === 'ha.leader_change');
  t.equal(change?.to, 'active');
  t.equal(change?.from, 'standby');
  t.equal(change?.level, 'info');
  t.ok((change?.fence as number) > 0, 'with its fencing token');
  b.child.kill('SIGTERM');
  t.same(await b.exited, [0, null]);
});

t.test('serve without --config or --upstream warns that it serves simulated engines (a container image run without arguments)', async (t) => {
  const { child, out, exited } = await spawnServe(t, ['--port', '0']);
  const w = await until(out, (l) => l.event === 'serve.simulated');
  t.equal(w?.level, 'warn');
  t.match(w?.msg, /SIMULATED engines/);
  t.equal((w?.engines as string[]).length, 4);
  child.kill('SIGTERM');
  t.same(await exited, [0, null]);
});

t.test('the access log bounds what the client wrote: a huge model name is cut', async (t) => {
  const fleet = await startFleet(1, { models: ['m'], timeScale: 0 });
  t.teardown(() => fleet.close());
  const file = join(mkdtempSync(join(tmpdir(), 'swy-log-')), 'router.yaml');
  writeFileSync(file, `apiVersion: switchyard/v1\nkind: Router\nlisten: { host: 127.0.0.1, port: 0 }\nlogging: { access: true }\npools:\n  - { name: p, models: [m], endpoints: [{ name: e0, url: "${fleet.urls[0]}" }] }\n`);
  const { child, url, out, exited } = await spawnServe(t, ['--config', file]);
  const huge = 'x'.repeat(1_000_000);
  const r = await send(url, 'POST', '/v1/completions', { model: huge, prompt: 'hi' }).done;
  t.equal(r.status, 404);
  const line = await until(out, (l) => l.event === 'access');
  t.ok(line, 'logged');
  t.ok((line!.model as string).length <= 257, `the model cut to 256 characters (${(line!.model as string).length})`);
  t.ok(out().length < 100_000, 'the log did not take the megabyte');
  child.kill('SIGTERM');
  t.same(await exited, [0, null]);
});
