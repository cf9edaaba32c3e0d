// Scenario `lora-affinity`: adapter-aware routing against adapter-blind
// routing on a fleet serving many LoRA adapters (#36).
//
// 8 engines, each holding all 32 adapters (--lora), 4 GPU adapter slots each
// (--max-loras 4); bringing an adapter into a slot costs --lora-load-ms of the
// engine's compute (running decodes wait too). Requests name an adapter drawn
// from a Zipf popularity (s = 1) and arrive as a Poisson process at --rate
// (same seed, so the same arrivals and adapters in both arms), each a streamed
// chat completion with a unique prompt (no prefix shared) and --tokens output
// tokens. Arms, each on a fresh fleet and a fresh router (in this process):
//
//   blind   the default scorers: prefix-cache 3, queue 2, kv-cache-utilization 2
//           (prefix + load; the adapter plays no part in the pick), no adapter hold;
//   aware   the same plus lora-affinity (weight --weight, 10: above the other weights' sum, so a replica with the adapter active and room wins over load differences),
//           and the router-side adapter hold (adapterQueue, on by default: a request no engine has
//           a slot for waits in the router);
//   aware-nohold  aware with adapterQueue.enabled: false (such a request waits in an engine's queue).
//
// Reported per arm: adapter loads per 1,000 requests (the engines' own count
// of slot loads), the router's misses per 1,000 (sent where the adapter was
// not active), requests held in the router per 1,000, client TTFT p50/p90 (from the scheduled send time, open loop).
// Floors (issue #36): loads ≥ 3× fewer, TTFT p90 ≥ 1.5× lower with affinity.
// --engine sim (src/sim) or model (testkit/reference/engine-model.ts: a second,
// independent engine model with the same adapter parameters).
//
//   flock /tmp/switchyard-bench.lock node dist/bench/system/lora-affinity.js [--engine sim|model] [--rate 150] [--requests 3000] [--tokens 16] [--lora-load-ms 40] [--weight 10] [--arms blind,aware,aware-nohold]
import { performance } from 'node:perf_hooks';
import { Pool } from 'undici';
import { startFleet, type SimEngine } from '../../src/sim/index.js';
import { EngineModel } from '../../testkit/reference/engine-model.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { registry } from '../../src/scheduler/plugins/index.js';
import { startRouter } from '../../src/server/router.js';
import { option, runMain } from '../lib/proc.js';
import { expGap, fmt, quantile, rng } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const argv = process.argv.slice(2);
const ENGINE = option(argv, '--engine') ?? 'sim';
const RATE = Number(option(argv, '--rate') ?? '150');
const REQUESTS = Number(option(argv, '--requests') ?? '3000');
const TOKENS = Number(option(argv, '--tokens') ?? '16');
const LOAD_MS = Number(option(argv, '--lora-load-ms') ?? '40');
const WEIGHT = Number(option(argv, '--weight') ?? '10');
/** The arms to run, in this order (a later arm runs on a machine the earlier ones warmed: swap the order to see it). */
const ARMS = (option(argv, '--arms') ?? 'blind,aware,aware-nohold').split(',') as ArmName[];
type ArmName = 'blind' | 'aware' | 'aware-nohold';
for (const a of ARMS) if (!['blind', 'aware', 'aware-nohold'].includes(a)) throw new Error(`--arms: unknown arm "${a}" (blind, aware, aware-nohold)`);
const ENGINES = 8;
const ADAPTERS = Array.from({ length: 32 }, (_, i) => `adapter-${i}`);
const MAX_LORAS = 4;

/** The arrivals: send times (ms from start) and adapters, the same for both arms. */
function schedule(): { at: number; adapter: string }[] {
  const r = rng(36);
  const w = ADAPTERS.map((_, i) => 1 / (i + 1));
  const total = w.reduce((a, b) => a + b, 0);
  const out: { at: number; adapter: string }[] = [];
  let t = 0;
  for (let i = 0; i < REQUESTS; i++) {
    t += expGap(r, RATE) * 1000;
    let u = r() * total;
    let k = 0;
    while (u > w[k]! && k < w.length - 1) u -= w[k++]!;
    out.push({ at: t, adapter: ADAPTERS[k]! });
  }
  return out;
}

interface Fleet {
  urls: string[];
  loads(): number;
  close(): Promise<void>;
}

async function fleet(): Promise<Fleet> {
  if (ENGINE === 'model') {
    const es = Array.from({ length: ENGINES }, () => new EngineModel({ port: 0, adapters: ADAPTERS, maxLoras: MAX_LORAS, loraLoadMs: LOAD_MS, prefillMs: 2, itlMs: 10, maxRunning: 32 }));
    const urls = await Promise.all(es.map((e) => e.listen()));
    return { urls, loads: () => es.reduce((s, e) => s + e.loraLoads, 0), close: async () => void (await Promise.all(es.map((e) => e.close()))) };
  }
  const f = await startFleet(ENGINES, { loras: ADAPTERS, maxLoras: MAX_LORAS, loraLoadMs: LOAD_MS, prefillOverheadMs: 2, prefillUsPerToken: 20, itlMs: 10, maxNumSeqs: 32, timeScale: 1 });
  return { urls: f.urls, loads: () => f.engines.reduce((s: number, e: SimEngine) => s + e.stats().loraLoads, 0), close: () => f.close() };
}

interface ArmResult {
  arm: string;
  loadsPer1k: number;
  missesPer1k: number;
  heldPer1k: number;
  p50: number;
  p90: number;
  errors: number;
}

async function arm(name: ArmName, plan: { at: number; adapter: string }[]): Promise<ArmResult> {
  const f = await fleet();
  const scorers: unknown[] = [
    { type: 'prefix-cache', weight: 3 },
    { type: 'queue', weight: 2 },
    { type: 'kv-cache-utilization', weight: 2 },
  ];
  if (name !== 'blind') scorers.push({ type: 'lora-affinity', weight: WEIGHT });
  const cfg = validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [{ name: 'p', models: ['open-model'], endpoints: f.urls.map((url, i) => ({ name: `e${i}`, url })) }],
      scheduling: { scorers },
      logging: { level: 'silent' },
      adapterQueue: { enabled: name === 'aware' },
    },
    (kind, s) => registry.validate(kind, s.type, s.params),
  );
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  const pool = new Pool(router.url, { connections: 512, pipelining: 1 });
  const ttft: number[] = [];
  let errors = 0;
  const why = new Map<string, number>();
  const t0 = performance.now() + 50;
  await Promise.all(
    plan.map(async ({ at, adapter }, i) => {
      const wait = t0 + at - performance.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      const sent = t0 + at;
      try {
        const res = await pool.request({
          path: '/v1/chat/completions',
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ model: adapter, messages: [{ role: 'user', content: `request ${i}: ${Math.random().toString(36)} summarise the ticket` }], max_tokens: TOKENS, stream: true }),
        });
        let first = true;
        for await (const chunk of res.body as AsyncIterable<Buffer>) {
          if (first && chunk.includes('"content"')) {
            ttft.push(performance.now() - sent);
            first = false;
          }
        }
        if (res.statusCode !== 200) {
          errors++;
          why.set(`HTTP ${res.statusCode}`, (why.get(`HTTP ${res.statusCode}`) ?? 0) + 1);
        }
      } catch (err) {
        errors++;
        const k = (err as Error).message.slice(0, 80);
        why.set(k, (why.get(k) ?? 0) + 1);
      }
    }),
  );
  const m = await (await pool.request({ path: '/metrics', method: 'GET' })).body.text();
  let misses = 0;
  let held = 0;
  for (const line of m.split('\n')) {
    if (line.startsWith('switchyard_adapter_misses_total{')) misses += Number(line.slice(line.lastIndexOf(' ') + 1));
    if (line.startsWith('switchyard_adapter_held_total{')) held += Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  const loads = f.loads();
  if (why.size > 0) console.error(`${name}: errors`, Object.fromEntries(why));
  await pool.close();
  await router.close(200);
  await f.close();
  return { arm: name, loadsPer1k: (loads * 1000) / plan.length, missesPer1k: (misses * 1000) / plan.length, heldPer1k: (held * 1000) / plan.length, p50: quantile(ttft, 0.5), p90: quantile(ttft, 0.9), errors };
}

runMain(async () => {
  const plan = schedule();
  const runs: ArmResult[] = [];
  for (const a of ARMS) runs.push(await arm(a, plan));
  // an arm run more than once (--arms a,b,a,b: each order) is summarised by its mean
  const mean = (name: ArmName): ArmResult | undefined => {
    const rs = runs.filter((r) => r.arm === name);
    if (rs.length === 0) return undefined;
    const m = (k: 'loadsPer1k' | 'missesPer1k' | 'heldPer1k' | 'p50' | 'p90' | 'errors') => rs.reduce((x, r) => x + r[k], 0) / rs.length;
    return { arm: name, loadsPer1k: m('loadsPer1k'), missesPer1k: m('missesPer1k'), heldPer1k: m('heldPer1k'), p50: m('p50'), p90: m('p90'), errors: m('errors') };
  };
  const [blind, aware, nohold] = [mean('blind'), mean('aware'), mean('aware-nohold')];
  console.log(`engine ${ENGINE}: ${ENGINES} engines × ${MAX_LORAS} adapter slots, ${ADAPTERS.length} adapters (Zipf s=1), ${REQUESTS} requests at ${RATE}/s, ${TOKENS} tokens, load ${LOAD_MS} ms`);
  console.log('| arm | adapter loads / 1k req | router misses / 1k | held in the router / 1k | TTFT p50 ms | TTFT p90 ms | errors |');
  console.log('|---|---|---|---|---|---|---|');
  for (const r of runs) console.log(`| ${r.arm} | ${fmt(r.loadsPer1k)} | ${fmt(r.missesPer1k)} | ${fmt(r.heldPer1k)} | ${fmt(r.p50)} | ${fmt(r.p90)} | ${r.errors} |`);
  if (blind !== undefined && aware !== undefined) {
    const loadRatio = blind.loadsPer1k / Math.max(aware.loadsPer1k, 1e-9);
    const p90Ratio = blind.p90 / aware.p90;
    console.log(`loads: ${fmt(loadRatio, 2)}× fewer with affinity (floor 3×: ${loadRatio >= 3 ? 'met' : 'NOT met'}); TTFT p90: ${fmt(p90Ratio, 2)}× lower (floor 1.5×: ${p90Ratio >= 1.5 ? 'met' : 'NOT met'}); p50 ${fmt(blind.p50 / aware.p50, 2)}×`);
  }
  if (aware !== undefined && nohold !== undefined) console.log(`the hold (aware / aware-nohold): TTFT p50 ${fmt(aware.p50 / nohold.p50, 2)}×, p90 ${fmt(aware.p90 / nohold.p90, 2)}×, loads ${fmt(aware.loadsPer1k / Math.max(nohold.loadsPer1k, 1e-9), 2)}×`);
});
