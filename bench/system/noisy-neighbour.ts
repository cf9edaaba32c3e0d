// Scenario `noisy-neighbour`: when a band must shed, is it the flooding flow
// that loses requests, or whoever arrives next?
//
// Three simulated fleets (`switchyard sim --fleet 2 --max-num-seqs 4`), one
// router in front of each, identical `flowControl` blocks (enabled,
// admission.mode utilisation, saturation.maxConcurrency 4) except:
//   fair     the defaults: flow-aware shedding (the flow furthest over its
//            fair share is shed) and sparse flows first (newFlowQuantum 16);
//   fair-q0  flow-aware shedding, fairness.newFlowQuantum 0 (no new-flow rule);
//   arrival  admission.shedding: arrival and newFlowQuantum 0: the arriving
//            request is shed, flow-blind, as before issue 19 (the baseline).
// `--modes fair,arrival` runs a subset. All three tenants are in band `standard`.
// Each round, on each router in turn:
//   alone: tenants b and c send 10 requests each at once (the baseline);
//   loud:  tenant a sends 60 at once; 300 ms later b and c send 10 each.
// Figures: sheds per tenant (429 rejected-*), b and c's p95 latency in the
// loud phase over their p95 alone, a's part of all sheds.
//
// Variants that make the band shed (in this tree the exact run above never
// pushes the standard band past maxUtilisation: lower bands stop at it):
//   --premium K   K closed-loop clients of a premium tenant run through both
//                 phases, so the pool's utilisation crosses maxUtilisation and
//                 utilisation admission sheds the standard band (the
//                 mode is pinned to `utilisation`, the rule before issue 34:
//                 the default `probabilistic` holds a burst this short
//                 rather than shedding it, docs/flow-control.md "Admission");
//   --limit N     limits.bands.standard.maxRequests N: the band's queue is full
//                 and must shed to take a new request (rejected-capacity).
//
//   node dist/bench/noisy-neighbour.js [--rounds 3] [--burst 60] [--others 10] [--max-tokens 10]
//                                      [--premium K] [--limit N] [--modes fair,fair-q0,arrival] [--json out.json]
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Pool } from 'undici';
import { CLI, freePort, freePortRange, simRouterYaml, start, waitReady, type Proc, option } from '../lib/proc.js';
import { fmt, quantile } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const MODES = ['fair', 'fair-q0', 'arrival'] as const;
type Mode = (typeof MODES)[number];

interface Sample {
  status: number;
  ms: number;
}

interface Shape {
  rounds: number;
  burst: number;
  others: number;
  maxTokens: number;
  gapMs: number;
  premium: number;
  limit: number;
}

interface Target {
  mode: Mode;
  sim: Proc;
  router: Proc;
  pool: Pool;
  alone: { b: Sample[]; c: Sample[] };
  loud: { a: Sample[]; b: Sample[]; c: Sample[] };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function call(pool: Pool, tenant: string, i: number, maxTokens: number): Promise<Sample> {
  const t0 = performance.now();
  try {
    const r = await pool.request({
      method: 'POST',
      path: '/v1/completions',
      headers: { 'content-type': 'application/json', 'x-tenant-id': tenant },
      body: JSON.stringify({ model: 'open-model', prompt: `tenant ${tenant} request ${i}: summarise the ledger`, max_tokens: maxTokens }),
    });
    await r.body.dump();
    return { status: r.statusCode, ms: performance.now() - t0 };
  } catch {
    return { status: 0, ms: performance.now() - t0 };
  }
}

const burst = (t: Target, tenant: string, n: number, s: Shape, tag: string) =>
  Promise.all(Array.from({ length: n }, (_, i) => call(t.pool, tenant, i + n * tag.length, s.maxTokens)));

function routerYaml(port: number, base: number, mode: Mode, s: Shape): string {
  return `${simRouterYaml(port, base, 2)}flowControl:
  enabled: true
  admission: { mode: utilisation, shedding: ${mode === 'arrival' ? 'arrival' : 'fair'} }
${mode === 'fair' ? '' : `  fairness: { newFlowQuantum: 0 }
`}  saturation: { maxConcurrency: 4 }
  flows: [{ id: "tenant:p", priority: premium }]
${s.limit > 0 ? `  limits: { bands: { standard: { maxRequests: ${s.limit} } } }
` : ''}`;
}

async function startTarget(mode: Mode, s: Shape, dir: string): Promise<Target> {
  const base = await freePortRange(2);
  const sim = start(`sim-${mode}`, process.execPath, [
    CLI, 'sim', '--fleet', '2', '--base-port', String(base), '--max-num-seqs', '4', '--itl-ms', '20',
    '--prefill-overhead-ms', '2', '--prefill-us-per-token', '0', '--seed', '7',
  ]);
  try {
    for (let i = 0; i < 2; i++) await waitReady(`http://127.0.0.1:${base + i}/health`);
    const port = await freePort();
    const cfg = join(dir, `router-${mode}.yaml`);
    writeFileSync(cfg, routerYaml(port, base, mode, s));
    const router = start(`router-${mode}`, process.execPath, [CLI, 'serve', '--config', cfg]);
    const url = `http://127.0.0.1:${port}`;
    await waitReady(`${url}/readyz`);
    return { mode, sim, router, pool: new Pool(url, { connections: 128 }), alone: { b: [], c: [] }, loud: { a: [], b: [], c: [] } };
  } catch (e) {
    await sim.stop();
    throw e;
  }
}

interface TenantStats {
  sent: number;
  shed: number;
  p50: number;
  p95: number;
}

function tstats(xs: Sample[]): TenantStats {
  const ok = xs.filter((x) => x.status === 200).map((x) => x.ms);
  return { sent: xs.length, shed: xs.filter((x) => x.status === 429).length, p50: quantile(ok, 0.5), p95: quantile(ok, 0.95) };
}

export interface NoisyRow {
  mode: Mode;
  aloneB: TenantStats;
  aloneC: TenantStats;
  a: TenantStats;
  b: TenantStats;
  c: TenantStats;
  /** b and c's loud p95 over their alone p95. */
  bRatio: number;
  cRatio: number;
  /** a's part of all sheds in the loud phase (NaN: nothing was shed). */
  aShare: number;
}

export async function measureNoisy(argv: string[]): Promise<{ shape: Shape; rows: NoisyRow[] }> {
  const num = (name: string, dflt: number) => {
    const v = option(argv, name);
    const n = v === undefined ? dflt : Number(v);
    if (!Number.isInteger(n) || n < 1) throw new Error(`noisy-neighbour: ${name} must be a positive integer, got ${v}`);
    return n;
  };
  const s: Shape = {
    rounds: num('--rounds', 3), burst: num('--burst', 60), others: num('--others', 10), maxTokens: num('--max-tokens', 10), gapMs: 300,
    premium: option(argv, '--premium') === undefined ? 0 : num('--premium', 0),
    limit: option(argv, '--limit') === undefined ? 0 : num('--limit', 0),
  };
  const modes = (option(argv, '--modes') ?? MODES.join(',')).split(',') as Mode[];
  for (const m of modes) if (!MODES.includes(m)) throw new Error(`noisy-neighbour: --modes takes ${MODES.join(', ')}, got ${m}`);
  const dir = mkdtempSync(join(tmpdir(), 'swy-noisy-'));
  const targets: Target[] = [];
  try {
    for (const m of modes) targets.push(await startTarget(m, s, dir));
    // warm-up: connections, JIT, a first queueing so each router learns the engines' batch limit
    for (const t of targets) {
      await burst(t, 'warm', 16, s, 'w');
      await sleep(300);
    }
    for (let round = 0; round < s.rounds; round++) {
      for (const t of targets) {
        const tag = `r${round}`;
        // the premium tenant's closed-loop clients, for the whole round
        let stop = false;
        const premium = Array.from({ length: s.premium }, async (_, k) => {
          for (let i = 0; !stop; i++) await call(t.pool, 'p', k * 100000 + i, s.maxTokens);
        });
        await sleep(s.premium > 0 ? 300 : 0);
        // b's burst goes out first in even rounds, c's in odd ones: the first to reach the router takes the free slots
        const pair = (suffix: string) =>
          round % 2 === 0
            ? Promise.all([burst(t, 'b', s.others, s, tag + suffix), burst(t, 'c', s.others, s, tag + suffix)])
            : Promise.all([burst(t, 'c', s.others, s, tag + suffix), burst(t, 'b', s.others, s, tag + suffix)]).then(([c, b]) => [b, c] as const);
        const [b0, c0] = await pair('x');
        t.alone.b.push(...b0);
        t.alone.c.push(...c0);
        await sleep(400);
        const a = burst(t, 'a', s.burst, s, tag + 'yy');
        await sleep(s.gapMs);
        const [b1, c1] = await pair('yyy');
        t.loud.a.push(...(await a));
        t.loud.b.push(...b1);
        t.loud.c.push(...c1);
        stop = true;
        await Promise.all(premium);
        await sleep(400);
      }
    }
  } finally {
    await Promise.allSettled(targets.map(async (t) => {
      await t.pool.close();
      await t.router.stop();
      await t.sim.stop();
    }));
    rmSync(dir, { recursive: true, force: true });
  }
  const rows = targets.map((t): NoisyRow => {
    const a = tstats(t.loud.a);
    const b = tstats(t.loud.b);
    const c = tstats(t.loud.c);
    const aloneB = tstats(t.alone.b);
    const aloneC = tstats(t.alone.c);
    const sheds = a.shed + b.shed + c.shed;
    return { mode: t.mode, aloneB, aloneC, a, b, c, bRatio: b.p95 / aloneB.p95, cRatio: c.p95 / aloneC.p95, aShare: sheds > 0 ? a.shed / sheds : NaN };
  });
  const json = option(argv, '--json');
  if (json) writeFileSync(json, JSON.stringify({ shape: s, rows }, null, 2));
  return { shape: s, rows };
}

export function noisyMarkdown(s: Shape, rows: NoisyRow[]): string {
  const variant = s.premium > 0 ? `, with ${s.premium} closed-loop premium clients` : s.limit > 0 ? `, with limits.bands.standard.maxRequests ${s.limit}` : ' (the issue\'s run)';
  let md = `## Noisy neighbour: flow-aware shedding${variant}\n\n`;
  md +=
    `Simulated fleets (\`switchyard sim --fleet 2 --max-num-seqs 4\`, ITL 20 ms), a router in front of each with ` +
    `\`flowControl: { enabled: true, admission: { mode: utilisation }, saturation: { maxConcurrency: 4 } }\` (admission mode utilisation at 0.85, the rule before issue 34): ` +
    `\`fair\` = the defaults (flow-aware shedding, sparse flows first with \`newFlowQuantum: 16\`), ` +
    `\`fair-q0\` = flow-aware shedding with \`fairness.newFlowQuantum: 0\`, ` +
    `\`arrival\` = \`admission.shedding: arrival\` and \`newFlowQuantum: 0\` (flow-blind, the behaviour before issue 19); each in its own process. ` +
    (s.premium > 0 ? `A premium tenant (declared premium) runs ${s.premium} closed-loop clients through both phases. ` : '') +
    (s.limit > 0 ? `The standard band's queue holds at most ${s.limit} requests. ` : '') +
    `All tenants in band standard (\`x-tenant-id\`), completions of ${s.maxTokens} tokens. Per round and router: b and c send ` +
    `${s.others} each at once (alone; b first in even rounds, c in odd ones); then a sends ${s.burst} at once and ${s.gapMs} ms later b and c send ${s.others} each (loud). ` +
    `${s.rounds} round(s), routers alternating; samples pooled. Latencies in ms (served requests).\n\n`;
  const share = (r: NoisyRow) => (Number.isNaN(r.aShare) ? '— (no sheds)' : `${fmt(100 * r.aShare)} %`);
  md += '| router | a shed | b shed | c shed | a part of sheds | b p95 alone → loud | c p95 alone → loud | b, c p95 ratio |\n';
  md += '|---|---|---|---|---|---|---|---|\n';
  for (const r of rows) {
    md +=
      `| ${r.mode} | ${r.a.shed}/${r.a.sent} | ${r.b.shed}/${r.b.sent} | ${r.c.shed}/${r.c.sent} | ${share(r)} | ` +
      `${fmt(r.aloneB.p95)} → ${fmt(r.b.p95)} | ${fmt(r.aloneC.p95)} → ${fmt(r.c.p95)} | **${fmt(r.bRatio, 2)}×, ${fmt(r.cRatio, 2)}×** |\n`;
  }
  md += '\n';
  for (const f of rows) {
    const bShed = f.b.shed / f.b.sent;
    const cShed = f.c.shed / f.c.sent;
    // with no sheds at all, "a takes ≥ 90 % of the sheds" holds vacuously: said so, not counted as a measurement
    const noSheds = Number.isNaN(f.aShare);
    const met = bShed <= 0.1 && cShed <= 0.1 && f.bRatio <= 1.5 && f.cRatio <= 1.5 && (noSheds || f.aShare >= 0.9);
    md +=
      `Floors (${f.mode}): b and c shed ≤ 10 % (${fmt(100 * bShed)} %, ${fmt(100 * cShed)} %), their p95 within 1.5× of alone ` +
      `(${fmt(f.bRatio, 2)}×, ${fmt(f.cRatio, 2)}×), a takes ≥ 90 % of the sheds (${noSheds ? 'nothing shed' : `${fmt(100 * f.aShare)} %`}): ` +
      `**${met ? 'met' : 'not met'}**.\n`;
  }
  return md + '\n';
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const t0 = performance.now();
  const { shape, rows } = await measureNoisy(process.argv.slice(2));
  console.log(noisyMarkdown(shape, rows));
  console.error(`noisy-neighbour: ${fmt((performance.now() - t0) / 1000)} s`);
}
