// Issue 34, item 4: a pool with prefill endpoints and no `disaggregation`
// block gets the block's defaults (as if `disaggregation: {}` were written),
// so its prefill endpoints take the prefill legs of long prompts instead of
// sitting idle. The rule lives in the config layer (src/config/schema.ts), so
// `check` prints the block and `serve` uses it: both run here, `check` as the
// real binary, `serve` as the router over real simulated engines.
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { stringify } from 'yaml';
import { startEngine } from '../../src/sim/index.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { startRouter } from '../../src/server/router.js';
import { validatePlugin } from '../support/router-util.js';
import { post } from '../support/sim-util.js';

const BIN = fileURLToPath(new URL('../../bin/switchyard.js', import.meta.url));
const doc = (p: string, d: string) => ({
  apiVersion: API_VERSION,
  kind: 'Router',
  logging: { level: 'silent' },
  pools: [{ name: 'p', models: ['open-model'], endpoints: [{ name: 'p0', url: p, role: 'prefill' }, { name: 'd0', url: d, role: 'decode' }] }],
});

t.test('check prints the disaggregation defaults for a pool with prefill endpoints and no block; none without prefill endpoints', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'swy-pd-default-'));
  const with_ = join(dir, 'with.yaml');
  writeFileSync(with_, stringify(doc('http://127.0.0.1:1', 'http://127.0.0.1:2')));
  const r = spawnSync(process.execPath, [BIN, 'check', '--config', with_], { encoding: 'utf8', timeout: 30_000 });
  t.equal(r.status, 0, r.stderr);
  const block = r.stdout.slice(r.stdout.search(/^disaggregation:$/m));
  t.ok(block.startsWith('disaggregation:'), 'the block is printed');
  t.match(block, /^ {2}mode: auto$/m, 'with its defaults');
  t.match(block, /^ {2}thresholdTokens: 256$/m);
  const without = join(dir, 'without.yaml');
  const plain = doc('http://127.0.0.1:1', 'http://127.0.0.1:2');
  (plain.pools[0]!.endpoints as { role?: string }[]).forEach((e) => delete e.role);
  writeFileSync(without, stringify(plain));
  const r2 = spawnSync(process.execPath, [BIN, 'check', '--config', without], { encoding: 'utf8', timeout: 30_000 });
  t.equal(r2.status, 0, r2.stderr);
  t.notMatch(r2.stdout, /^disaggregation:/m, 'no prefill endpoints: no disaggregation');
});

t.test('serve: the prefill endpoint of such a pool takes the prefill leg of a long prompt', async (t) => {
  const p0 = await startEngine({ timeScale: 0, role: 'prefill' });
  const d0 = await startEngine({ timeScale: 0, role: 'decode' });
  const cfg = validateConfig(doc(p0.url, d0.url), validatePlugin);
  t.ok(cfg.disaggregation, 'the validated config has the block');
  const r = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(async () => {
    await r.close(200);
    await Promise.all([p0.close(), d0.close()]);
  });
  const long = 'please summarise this long document. '.repeat(120);
  const res = await post(r.url, '/v1/chat/completions', { model: 'open-model', messages: [{ role: 'user', content: long }], max_tokens: 3 });
  t.equal(res.status, 200, res.body);
  t.equal(res.headers['x-switchyard-prefill-endpoint'], 'p0');
  t.equal(p0.stats().finished, 1, 'the prefill engine ran the prefill leg');
  t.equal(d0.stats().finished, 1);
});
