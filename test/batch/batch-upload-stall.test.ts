// F6 (issue #30): a 64 MiB JSONL upload does not stall the router's event
// loop. The router runs as `switchyard serve` in its own process (the probe of
// test/support/loop-probe.mjs inside it); the upload comes from curl, another
// process, as a client's does. The router's worst stall while the upload is
// received, checked and stored must stay within 50 ms (the loop's own part:
// the wall-clock gap less the time the kernel kept its thread waiting for a
// CPU, which on this shared machine no code can remove; the wall-clock figure
// is printed beside it), the best of three uploads; on a machine so contended
// that the baseline takes over 200 ms, a quarter of it (stallBound). The
// baseline, measured in the same run: the same JSONL check run on a loop (what
// the code before the worker did: 0.5-2 s).
import t from 'tap';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { measureRounds, spawnBatchRouter, stallBound } from '../support/loop-stall.js';
import { checkJsonl } from '../../src/batch/jsonl.js';

const curlUpload = (url: string, path: string) =>
  new Promise<{ status: number; body: { id?: string; bytes?: number } }>((resolve, reject) => {
    const c = spawn('curl', ['-sS', '-w', '\n%{http_code}', '-F', 'purpose=batch', '-F', `file=@${path}`, `${url}/v1/files`]);
    let text = '';
    c.stdout.on('data', (d: Buffer) => (text += d.toString()));
    c.on('error', reject);
    c.on('close', () => resolve({ status: Number(text.slice(text.lastIndexOf('\n') + 1)), body: JSON.parse(text.slice(0, text.lastIndexOf('\n'))) }));
  });

t.test('a 64 MiB upload: the loop never stalls more than 50 ms', async (t) => {
  const router = await spawnBatchRouter(t, { maxFileBytes: 80 * 1024 * 1024 });

  const line = (i: number) => JSON.stringify({ custom_id: `r-${i}`, method: 'POST', url: '/v1/chat/completions', body: { model: 'open-model', messages: [{ role: 'user', content: `hello ${i} ${'x'.repeat(100)}` }] } }) + '\n';
  const big = Buffer.allocUnsafe(64 * 1024 * 1024 + 4096);
  let size = 0;
  for (let i = 0; size < 64 * 1024 * 1024; i++) size += big.write(line(i), size);
  const dir = mkdtempSync(join(tmpdir(), 'swy-upload-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const path = join(dir, 'big.jsonl');
  writeFileSync(path, big.subarray(0, size));

  // warm the worker with a small upload over the threshold first (its start is not the upload's cost)
  const warm = join(dir, 'warm.jsonl');
  writeFileSync(warm, line(0).repeat(12_000));
  t.equal((await curlUpload(router.url, warm)).status, 200);

  // the best of three uploads counts (a round can lose its core to another process mid-GC)
  const { best } = await measureRounds(t, router, 3, 'upload', () => curlUpload(router.url, path), (res) => {
    t.equal(res.status, 200, 'stored');
    t.ok(res.body.bytes !== undefined && res.body.bytes >= 64 * 1024 * 1024, `${res.body.bytes} bytes`);
  });
  // the baseline: the JSONL check on a loop (this one), as the code before the worker ran it
  const t0 = performance.now();
  t.equal(checkJsonl(big.subarray(0, size)), null);
  const onLoop = performance.now() - t0;
  t.comment(`the same check on a loop: ${onLoop.toFixed(0)} ms`);
  const bound = stallBound(onLoop);
  t.ok(best.own <= bound, `the router loop's worst own stall ${best.own.toFixed(1)} ms ≤ ${bound.toFixed(0)} ms (wall ${best.wall.toFixed(1)} ms)`);

  // a bad line deep in a large file is still found (the worker's answer)
  const bad = join(dir, 'bad.jsonl');
  writeFileSync(bad, line(0).repeat(12_000) + '{nope\n');
  const br = await curlUpload(router.url, bad);
  t.equal(br.status, 400);
  t.match(br.body, { error: { param: 'file', message: /line 12001/ } });
});
