// Scenario `canary`: a weighted model rewrite (#36). One simulated engine
// serving v1 and v2 (--time-scale 0: answers at once), a router with the rule
// `chat → v1 ×90, v2 ×10` (--share sets v2's percentage). --requests (10,000)
// chat completions for `chat` in conversations of 1 to 7 turns (a session
// header; the turn count cycles, so conversations differ in length), 32 at a
// time. Reported: v2's share of the requests (from the answers' `model`)
// against the rule's, in points; conversations that saw both versions (must
// be 0). Then the same share measured after a live change of the weights
// (the rule rewritten in place through the reload path: 10 % → 50 %) over a
// second batch of new conversations, with the first batch's conversations
// continuing (they must keep their version). Floor: within ±1 point, no
// conversation split.
//
//   node dist/bench/system/canary.js [--requests 10000] [--share 10]
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Pool } from 'undici';
import { startEngine } from '../../src/sim/index.js';
import { loadConfigFile } from '../../src/config/load.js';
import { API_VERSION } from '../../src/config/schema.js';
import { registry } from '../../src/scheduler/plugins/index.js';
import { startRouter } from '../../src/server/router.js';
import { option, runMain } from '../lib/proc.js';
import { fmt } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const argv = process.argv.slice(2);
const REQUESTS = Number(option(argv, '--requests') ?? '10000');
const SHARE = Number(option(argv, '--share') ?? '10');

const doc = (url: string, v2: number) =>
  JSON.stringify({
    apiVersion: API_VERSION,
    kind: 'Router',
    pools: [{ name: 'p', models: ['v1', 'v2'], endpoints: [{ name: 'e0', url }] }],
    logging: { level: 'silent' },
    modelRewrites: [{ model: 'chat', targets: [{ model: 'v1', weight: 100 - v2 }, { model: 'v2', weight: v2 }] }],
  });

/** Session keys of `n` requests: conversations of 1..7 turns, turns interleaved 32 at a time as clients would. */
function sessions(prefix: string, n: number): string[] {
  const keys: string[] = [];
  for (let s = 0; keys.length < n; s++) for (let k = 0; k < 1 + (s % 7) && keys.length < n; k++) keys.push(`${prefix}-${s}`);
  return keys;
}

async function run(pool: Pool, keys: readonly string[], seen: Map<string, Set<string>>): Promise<number> {
  let next = 0;
  let v2 = 0;
  await Promise.all(
    Array.from({ length: 32 }, async () => {
      while (next < keys.length) {
        const key = keys[next++]!;
        const res = await pool.request({
          path: '/v1/chat/completions',
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-session-id': key },
          body: JSON.stringify({ model: 'chat', messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 }),
        });
        const model = (JSON.parse(await res.body.text()) as { model: string }).model;
        if (model === 'v2') v2++;
        let s = seen.get(key);
        if (s === undefined) seen.set(key, (s = new Set()));
        s.add(model);
      }
    }),
  );
  return v2;
}

runMain(async () => {
  const engine = await startEngine({ timeScale: 0, models: ['v1', 'v2'] });
  const dir = mkdtempSync(join(tmpdir(), 'swy-canary-'));
  const file = join(dir, 'router.json');
  writeFileSync(file, doc(engine.url, SHARE));
  const validate = (kind: 'filter' | 'scorer' | 'picker', s: { type: string; params: Record<string, unknown> }) => registry.validate(kind, s.type, s.params);
  const router = await startRouter(await loadConfigFile(file, validate), { port: 0, host: '127.0.0.1', configFile: file, validatePlugin: validate });
  const pool = new Pool(router.url, { connections: 32 });
  const seen = new Map<string, Set<string>>();
  const first = sessions('a', REQUESTS);
  const v2a = await run(pool, first, seen);
  const shareA = (v2a * 100) / first.length;
  // live change: SHARE → 50 %, new conversations plus the old ones continuing
  const before = new Map([...seen].map(([k, s]) => [k, [...s][0]!]));
  writeFileSync(file, doc(engine.url, 50));
  const r = await router.reload!();
  if (!r.ok) throw new Error('reload refused');
  const second = sessions('b', REQUESTS);
  const seenB = new Map<string, Set<string>>();
  const v2b = await run(pool, second, seenB);
  const shareB = (v2b * 100) / second.length;
  const cont = [...before.keys()].slice(0, 2000);
  await run(pool, cont, seen);
  const kept = cont.filter((k) => seen.get(k)!.size === 1 && seen.get(k)!.has(before.get(k)!)).length;
  const split = [...seen.values(), ...seenB.values()].filter((s) => s.size > 1).length;
  console.log(`| phase | requests | conversations | v2 share % | rule % | off by (points) |`);
  console.log(`|---|---|---|---|---|---|`);
  console.log(`| ${SHARE} % canary | ${first.length} | ${new Set(first).size} | ${fmt(shareA, 2)} | ${SHARE} | ${fmt(Math.abs(shareA - SHARE), 2)} |`);
  console.log(`| after a live change to 50 % (new conversations) | ${second.length} | ${new Set(second).size} | ${fmt(shareB, 2)} | 50 | ${fmt(Math.abs(shareB - 50), 2)} |`);
  console.log(`conversations split: ${split}; conversations begun before the change that kept their version after it: ${kept} of ${cont.length}`);
  console.log(`floor (±1 point, no split): ${Math.abs(shareA - SHARE) <= 1 && Math.abs(shareB - 50) <= 1 && split === 0 ? 'met' : 'NOT met'}`);
  await pool.close();
  await router.close(200);
  await engine.close();
});
