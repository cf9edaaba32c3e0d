// Misconfiguration caught at start and at reload: an engine that serves
// another model than its pool's keeps /readyz at 503 with the reason (a real
// `switchyard serve` process over a real sim), a URL with port 0 is a config
// error naming its field, and admin-API changes say they are in memory only
// (a reload brings the file's endpoints back).
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadConfigFile } from '../../src/config/load.js';
import { startFleet } from '../../src/sim/index.js';
import { startRouter } from '../../src/server/router.js';
import { spawnServe, validatePlugin } from '../support/router-util.js';
import { get, metric, scrape, send, sleep } from '../support/sim-util.js';

const bin = fileURLToPath(new URL('../../bin/switchyard.js', import.meta.url));

async function readyz(url: string, want: number, ms = 5000) {
  const end = Date.now() + ms;
  let r = await get(url, '/readyz');
  while (r.status !== want && Date.now() < end) {
    await sleep(50);
    r = await get(url, '/readyz');
  }
  return r;
}

t.test('serve --upstream in front of an engine that serves another model: /readyz 503 with the reason, logged, in /metrics; requests not sent there', async (t) => {
  const fleet = await startFleet(1, { models: ['other-model'], timeScale: 0 });
  t.teardown(() => fleet.close());
  const { url, out, child, exited } = await spawnServe(t, ['--upstream', fleet.urls[0], '--model', 'llama-3-8b', '--port', '0']);
  const r = await readyz(url, 503);
  t.equal(r.status, 503, r.body);
  const body = JSON.parse(r.body);
  t.same(body.models_without_ready_endpoint, ['llama-3-8b']);
  t.match(body.reasons['llama-3-8b'][0], /^e0: the engine does not serve "llama-3-8b"/, 'the reason names the endpoint and the model');
  await sleep(300); // it stays so: the engine answers /health, but not for this model
  t.equal((await get(url, '/readyz')).status, 503, 'still not ready');
  const e = await scrape(url);
  t.equal(metric(e, 'switchyard_endpoint_model_missing', { endpoint: 'e0', model: 'llama-3-8b' }), 1);
  t.equal(metric(e, 'switchyard_endpoint_ready', { endpoint: 'e0' }), 1, 'the endpoint itself is healthy');
  const line = out()
    .split('\n')
    .find((l) => l.includes('"endpoint.model_mismatch"'));
  t.ok(line, 'logged');
  t.same(JSON.parse(line!).served, ['other-model'], 'with what the engine serves');
  const req = await send(url, 'POST', '/v1/chat/completions', { model: 'llama-3-8b', messages: [{ role: 'user', content: 'hi' }] }).done;
  t.equal(req.status, 503, `not the engine's 404 passed off as the router's: ${req.body}`);
  t.match(JSON.parse(req.body).error.message, /no ready endpoint for model `llama-3-8b`/);
  child.kill('SIGTERM');
  t.same(await exited, [0, null]);
});

t.test('a reload that fixes the model makes the router ready', async (t) => {
  const fleet = await startFleet(1, { models: ['other-model'], timeScale: 0 });
  t.teardown(() => fleet.close());
  const file = join(mkdtempSync(join(tmpdir(), 'swy-ready-')), 'router.yaml');
  const cfg = (model: string) => `apiVersion: switchyard/v1\nkind: Router\nlisten: { host: 127.0.0.1, port: 0 }\ndataLayer: { healthIntervalMs: 100 }\npools:\n  - { name: p, models: [${model}], endpoints: [{ name: e0, url: "${fleet.urls[0]}" }] }\n`;
  writeFileSync(file, cfg('llama-3-8b'));
  const { url, child, exited } = await spawnServe(t, ['--config', file]);
  t.equal((await readyz(url, 503)).status, 503);
  writeFileSync(file, cfg('other-model'));
  child.kill('SIGHUP');
  const r = await readyz(url, 200);
  t.equal(r.status, 200, r.body);
  const ok = await send(url, 'POST', '/v1/completions', { model: 'other-model', prompt: 'hi', max_tokens: 2 }).done;
  t.equal(ok.status, 200);
  child.kill('SIGTERM');
  t.same(await exited, [0, null]);
});

t.test('an endpoint URL with port 0 is a config error naming its field (check, serve --upstream)', async (t) => {
  const file = join(mkdtempSync(join(tmpdir(), 'swy-ready-')), 'router.yaml');
  writeFileSync(file, 'apiVersion: switchyard/v1\nkind: Router\npools:\n  - { name: p, models: [m], endpoints: [{ url: "http://10.0.0.5:8000" }, { url: "http://10.0.0.6:0" }] }\n');
  const c = spawnSync(process.execPath, [bin, 'check', '--config', file], { encoding: 'utf8' });
  t.equal(c.status, 2);
  t.match(c.stderr, /^pools\[0\]\.endpoints\[1\]\.url: port 0 is not a port an engine listens on/m);
  const s = spawnSync(process.execPath, [bin, 'serve', '--upstream', 'http://127.0.0.1:0'], { encoding: 'utf8' });
  t.equal(s.status, 2);
  t.match(s.stderr, /url: port 0 is not a port an engine listens on/);
  const p = spawnSync(process.execPath, [bin, 'serve', '--print-config'], { encoding: 'utf8' });
  t.equal(p.status, 0, `the embedded default still prints (its engines' ports chosen at start): ${p.stderr}`);
});

t.test('admin API changes say they are in memory only, and a reload brings the file endpoints back', async (t) => {
  const fleet = await startFleet(3, { models: ['m'], timeScale: 0 });
  t.teardown(() => fleet.close());
  const file = join(mkdtempSync(join(tmpdir(), 'swy-ready-')), 'router.yaml');
  writeFileSync(
    file,
    `apiVersion: switchyard/v1\nkind: Router\nlogging: { level: silent }\nadmin: { drainGraceMs: 1000 }\npools:\n  - { name: p, models: [m], endpoints: [{ name: a, url: "${fleet.urls[0]}" }, { name: b, url: "${fleet.urls[1]}" }] }\n`,
  );
  const router = await startRouter(await loadConfigFile(file, validatePlugin), { port: 0, host: '127.0.0.1', adminPort: 0, configFile: file, validatePlugin });
  t.teardown(() => router.close(100));
  const admin = router.admin!.url;
  const added = await send(admin, 'POST', '/admin/endpoints', { pool: 'p', name: 'c', url: fleet.urls[2] }).done;
  t.equal(added.status, 201, added.body);
  t.equal(added.headers['x-switchyard-persisted'], 'false');
  const ab = JSON.parse(added.body);
  t.equal(ab.persisted, false);
  t.match(ab.note, /in memory only: a restart loses this change/);
  const removed = await send(admin, 'DELETE', '/admin/endpoints/b?wait=1').done;
  t.equal(removed.status, 200, removed.body);
  t.equal(JSON.parse(removed.body).persisted, false);
  t.equal(removed.headers['x-switchyard-persisted'], 'false');
  const names = async () => (JSON.parse((await get(admin, '/admin/endpoints')).body).endpoints as { name: string; state: string }[]).filter((e) => e.state === 'active').map((e) => e.name).sort();
  t.same(await names(), ['a', 'c']);
  const r = await send(admin, 'POST', '/admin/reload').done;
  t.equal(r.status, 200, r.body);
  t.same(await names(), ['a', 'b', 'c'], 'the file endpoint removed through the API is back; the one added through the API stays');
});

t.test('a batch block whose Redis is down: serve exits 1 with one message naming the block and the address (password hidden)', async (t) => {
  const file = join(mkdtempSync(join(tmpdir(), 'swy-ready-')), 'router.yaml');
  writeFileSync(
    file,
    'apiVersion: switchyard/v1\nkind: Router\nlisten: { host: 127.0.0.1, port: 0 }\npools:\n  - { name: p, models: [m], endpoints: [{ url: "http://127.0.0.1:9" }] }\nbatch: { redis: "redis://:s3cret-pw@127.0.0.1:1" }\n',
  );
  const r = spawnSync(process.execPath, [bin, 'serve', '--config', file], { encoding: 'utf8', timeout: 30_000 });
  t.equal(r.status, 1);
  const line = r.stdout.split('\n').find((l) => l.includes('failed to start'));
  t.ok(line, r.stdout.slice(-500));
  t.match(JSON.parse(line!).msg, /^the router failed to start: batch: cannot use the Redis at redis:\/\/:\*\*\*@127\.0\.0\.1:1 \(batch\.redis\): /);
  t.notMatch(r.stdout + r.stderr, /s3cret-pw/, 'the password is not printed');
});
