// Routing over loopback against a simulated fleet: a long shared prefix keeps
// landing on the endpoint that holds it, while different prefixes spread
// across the fleet; the round-robin baseline shows the contrast.
import t from 'tap';
import { startTestRouter } from '../support/router-util.js';

function setup(t: Tap.Test, scheduling?: unknown) {
  return startTestRouter(t, { n: 4, fleet: { timeScale: 0.05, seed: 7 }, extra: scheduling === undefined ? {} : { scheduling } });
}

const GROUPS = 6; // not a multiple of the fleet size, so round-robin rotates
const ROUNDS = 6;
function systemPrompt(g: number): string {
  // ~2 KB of text unique to the group: 30+ prefix-index blocks
  let s = `You are assistant number ${g}. `;
  for (let i = 0; s.length < 2000; i++) s += `Rule ${i} of group ${g}: answer politely and precisely, citing sources. `;
  return s;
}

async function runWorkload(url: string): Promise<string[][]> {
  const where: string[][] = Array.from({ length: GROUPS }, () => []);
  for (let r = 0; r < ROUNDS; r++) {
    // one request per group per round, all groups concurrently
    await Promise.all(
      Array.from({ length: GROUPS }, async (_, g) => {
        const res = await fetch(`${url}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({
            model: 'open-model',
            max_tokens: 4,
            messages: [
              { role: 'system', content: systemPrompt(g) },
              { role: 'user', content: `question ${r} for group ${g}` },
            ],
          }),
        });
        await res.arrayBuffer();
        if (res.status !== 200) throw new Error(`status ${res.status}`);
        where[g].push(res.headers.get('x-switchyard-endpoint')!);
      }),
    );
  }
  return where;
}

function affinity(where: string[][]): number {
  // share of follow-up requests that landed where the group's first request went
  let same = 0;
  let total = 0;
  for (const w of where) {
    for (let i = 1; i < w.length; i++) {
      total++;
      if (w[i] === w[0]) same++;
    }
  }
  return same / total;
}

t.test('a shared prefix sticks to its endpoint; different prefixes spread (default profile)', async (t) => {
  const { router } = await setup(t);
  const where = await runWorkload(router.url);
  const aff = affinity(where);
  t.ok(aff >= 0.9, `follow-ups on the prefix holder: ${(aff * 100).toFixed(0)} % (want >= 90 %)`);
  const perEndpoint = new Map<string, number>();
  for (const w of where) perEndpoint.set(w[0], (perEndpoint.get(w[0]) ?? 0) + 1);
  t.ok(perEndpoint.size >= 3, `the ${GROUPS} prefixes use ${perEndpoint.size} of 4 endpoints (want >= 3)`);
  t.ok(Math.max(...perEndpoint.values()) <= 3, `no endpoint holds more than 3 of ${GROUPS} prefixes: ${JSON.stringify([...perEndpoint])}`);
  const metrics = await (await fetch(`${router.url}/metrics`)).text();
  const ratio = Number(/^switchyard_prefix_match_ratio (\S+)$/m.exec(metrics)?.[1]);
  t.ok(ratio > 0.6, `router-reported prefix match ratio ${ratio.toFixed(2)} > 0.6`);
});

t.test('baseline: round-robin ignores prefixes', async (t) => {
  const { router } = await setup(t, { picker: 'round-robin', scorers: [] });
  const where = await runWorkload(router.url);
  const aff = affinity(where);
  t.ok(aff < 0.6, `round-robin keeps only ${(aff * 100).toFixed(0)} % of follow-ups on the first endpoint`);
});

t.test('without the prefix-cache scorer, affinity is lost (the scorer is what keeps it)', async (t) => {
  const { router } = await setup(t, { scorers: [{ type: 'queue', weight: 2 }, { type: 'kv-cache-utilization', weight: 2 }] });
  const where = await runWorkload(router.url);
  const aff = affinity(where);
  t.ok(aff < 0.8, `queue + kv only: ${(aff * 100).toFixed(0)} % of follow-ups on the first endpoint`);
});
