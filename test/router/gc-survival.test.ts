// What a request leaves to the old generation once V8 has run a full GC. A
// router under load runs one sooner or later; before, from that moment on,
// each request's whole object graph (~1.2 KB) survived the scavenges and was
// promoted, because the tables that had held it (a Map of the native front
// end's requests in flight, rebuilt by V8 every few dozen requests) lingered
// in the old generation as roots of the young one (src/id-table.ts). With
// token limits per day, each answer's remaining-tokens count added a new
// entry to V8's number-to-string cache, which keeps its strings until they
// are promoted (src/limits/limiter.ts, digits()). A real router process
// (compiled code, its own heap: test/support/gc-probe.mjs inside it) over a
// real simulated engine: a full GC, then requests over 16 kept-alive
// connections, and the bytes its scavenges promoted per request.
import t from 'tap';
import { randomBytes, createHash } from 'node:crypto';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Pool } from 'undici';
import { startFleet } from '../../src/sim/index.js';
import { API_VERSION } from '../../src/config/schema.js';
import { spawnProbedServe, type ProbedServe } from '../support/loop-stall.js';

const GC_PROBE = new URL('../support/gc-probe.mjs', import.meta.url).href;
const BODY = JSON.stringify({ model: 'open-model', prompt: 'Say hello to the benchmark.', max_tokens: 1 });

function ask(r: ProbedServe, what: 'full' | 'start' | 'stop'): Promise<Record<string, number>> {
  const want = what === 'full' ? 'full' : what === 'start' ? 'started' : 'stats';
  return new Promise((resolve) => {
    const on = (m: { gcprobe?: string }) => {
      if (m?.gcprobe !== want) return;
      r.child.off('message', on);
      resolve(m as Record<string, number>);
    };
    r.child.on('message', on);
    r.child.send({ gcprobe: what });
  });
}

/** `n` completions over `connections` kept-alive connections; the count answered 200. */
async function load(pool: Pool, n: number, connections: number, auth: string): Promise<number> {
  let next = 0;
  let ok = 0;
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (auth !== '') headers.authorization = `Bearer ${auth}`;
  const worker = async () => {
    while (next < n) {
      next++;
      const res = await pool.request({ method: 'POST', path: '/v1/completions', headers, body: BODY });
      await res.body.text();
      if (res.statusCode === 200) ok++;
    }
  };
  await Promise.all(Array.from({ length: connections }, worker));
  return ok;
}

async function promotedPerRequest(t: Tap.Test, extra: Record<string, unknown>, auth: string): Promise<number> {
  const engines = await startFleet(1, { timeScale: 0 });
  t.teardown(() => engines.close());
  const router = await spawnProbedServe(
    t,
    { apiVersion: API_VERSION, kind: 'Router', pools: [{ name: 'p', models: ['open-model'], endpoints: [{ name: 'e0', url: engines.urls[0]! }] }], logging: { level: 'info' }, ...extra },
    {},
    // a young generation of 8 MB (16 MB by default): a dozen scavenges in a short run; V8 sizes its
    // number-to-string cache from it, and at 4 MB the cache's promotions did not show (measured)
    ['--expose-gc', '--max-semi-space-size=8', '--import', GC_PROBE],
  );
  const pool = new Pool(router.url, { connections: 16, pipelining: 1 });
  t.teardown(() => pool.close());
  t.equal(await load(pool, 3000, 16, auth), 3000, 'warm-up answered');
  await ask(router, 'full');
  await ask(router, 'start');
  const n = 24_000;
  const ok = await load(pool, n, 16, auth);
  const s = await ask(router, 'stop');
  t.equal(ok, n, 'every request answered 200');
  const per = s.promoted! / n;
  t.comment(`${s.scavenges} scavenges, ${s.fulls} full GCs, ${s.promoted} bytes promoted: ${per.toFixed(1)} bytes a request`);
  t.ok(s.scavenges! >= 5, 'the requests ran through several scavenges');
  return per;
}

t.test('after a full GC, a request on the default router promotes next to nothing', async (t) => {
  const per = await promotedPerRequest(t, {}, '');
  // measured: ~1,000-1,100 bytes a request with the Map; ~6 with the id table
  t.ok(per < 100, `promoted ${per.toFixed(1)} bytes a request (bound 100)`);
});

t.test('with auth and token limits per day, the rate-limit headers promote nothing either', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'swy-gc-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const key = `sk-${randomBytes(24).toString('hex')}`;
  const file = join(dir, 'keys.txt');
  writeFileSync(file, `${createHash('sha256').update(key).digest('hex')} tenant-a\n`);
  const per = await promotedPerRequest(
    t,
    { auth: { keysFile: file }, rateLimits: { defaultTenant: { requestsPerMinute: 100_000_000, tokensPerDay: 1_000_000_000 }, defaultKey: { tokensPerMinute: 1_000_000_000 } } },
    key,
  );
  // measured: ~32 bytes a request with the counts through the number cache, ~8 without; 21 seen once in a
  // fresh-clone CI run (2026-12-07), so the bound leaves that room and still fails the number-cache path
  t.ok(per < 26, `promoted ${per.toFixed(1)} bytes a request (bound 26)`);
});
