// Scenario `fairness`: does one tenant's burst blow up another tenant's latency?
//
// A simulated fleet of limited capacity (its own process), and two routers in
// their own processes over two identical fleets: one with flow control on, one
// with the same `flowControl` block but `enabled: false` (first come, first
// served). Two tenants:
//   premium:     `x-tenant-id: payments` (declared premium, minShare 0.30), a
//                steady open-loop stream of streaming completions;
//   best-effort: API key `sk-internal-tools` (mapped to tenant internal-tools,
//                declared best-effort), 60 requests at once.
// Each round runs a quiet phase (premium only) and a loud phase (the same
// premium stream, the burst fired a little after it starts), on each router in
// turn (on, off, on, off, ...), so both see the same machine noise. Premium
// samples of all rounds are pooled per phase; the figure of merit is
// premium p95 (loud) / premium p95 (quiet) for each router.
//
//
// With --documented the routers run exactly the flowControl block of
// docs/flow-control.md (read from the doc: probabilistic admission at 0.85, no
// saturation settings, so the engines' batch limit is the router's to learn)
// and the best-effort tenant names itself with `x-tenant-id: internal-tools`
// (the documented block maps no API keys). The figure of merit is then held
// per round: premium p95 with the burst <= 1.5x its p95 without it in each
// round, not only pooled.
//
//   node dist/bench/fairness.js [--rounds 5] [--engines 2] [--slots 4] [--burst 60]
//                               [--premium 30] [--gap-ms 80] [--max-tokens 5] [--documented]
//                               [--quick] [--json out.json]
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Pool } from 'undici';
import { CLI, freePort, freePortRange, simRouterYaml, start, waitReady, type Proc, option } from '../lib/proc.js';
import { fmt, quantile } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

interface Sample {
  status: number;
  /** Time to the first generated text, ms (NaN when the request failed). */
  ttft: number;
  /** Time to the end of the response, ms. */
  e2e: number;
}

interface Phase {
  premium: Sample[];
  burst: Sample[];
}

interface Shape {
  rounds: number;
  engines: number;
  slots: number;
  burst: number;
  premium: number;
  gapMs: number;
  burstAtMs: number;
  maxTokens: number;
  itlMs: number;
  prefillOverheadMs: number;
  /** Routers run docs/flow-control.md's block as it stands (no saturation settings). */
  documented: boolean;
}

interface Target {
  mode: 'on' | 'off';
  url: string;
  sim: Proc;
  router: Proc;
  premium: Pool;
  burst: Pool;
  burstHeaders: Record<string, string>;
  quiet: Sample[];
  loudPremium: Sample[];
  loudBurst: Sample[];
  rounds: Array<{ quietP95: number; loudP95: number }>;
  flow: FlowCounters;
}

/** From the router's own /metrics at the end of the run: did flow control act? */
interface FlowCounters {
  /** switchyard_flow_dispatched_total summed per flow. */
  dispatched: Record<string, number>;
  /** Mean queue wait per band, ms (switchyard_flow_queue_wait_seconds sum / count). */
  meanWaitMs: Record<string, number>;
}

export interface FairnessRow {
  mode: 'on' | 'off';
  premiumQuiet: Stats;
  premiumLoud: Stats;
  burst: Stats & { completed: number; sent: number; rejected: number };
  ratio: number;
  roundRatios: number[];
  flow: FlowCounters;
}

interface Stats {
  n: number;
  ok: number;
  p50: number;
  p95: number;
  ttftP50: number;
  ttftP95: number;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** One streaming completion; TTFT is the arrival of the first SSE event carrying generated text. */
async function call(pool: Pool, headers: Record<string, string>, body: string): Promise<Sample> {
  const t0 = performance.now();
  let ttft = NaN;
  try {
    const r = await pool.request({ method: 'POST', path: '/v1/completions', headers, body });
    if (r.statusCode !== 200) {
      await r.body.dump();
      return { status: r.statusCode, ttft: NaN, e2e: performance.now() - t0 };
    }
    let tail = '';
    for await (const chunk of r.body) {
      if (ttft === ttft) continue; // only the first text event matters; drain the rest
      tail += (chunk as Buffer).toString('utf8');
      let nl: number;
      while (ttft !== ttft && (nl = tail.indexOf('\n\n')) >= 0) {
        const ev = tail.slice(0, nl);
        tail = tail.slice(nl + 2);
        if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
        const j = JSON.parse(ev.slice(6)) as { choices?: Array<{ text?: string }> };
        if (j.choices?.[0]?.text) ttft = performance.now() - t0;
      }
    }
    return { status: 200, ttft, e2e: performance.now() - t0 };
  } catch {
    return { status: 0, ttft: NaN, e2e: performance.now() - t0 };
  }
}

const PREMIUM_HEADERS = { 'content-type': 'application/json', 'x-tenant-id': 'payments' };
const BURST_HEADERS = { 'content-type': 'application/json', authorization: 'Bearer sk-internal-tools' };
/** The documented block maps no API keys: the best-effort tenant names itself. */
const BURST_HEADERS_DOCUMENTED = { 'content-type': 'application/json', 'x-tenant-id': 'internal-tools' };

/** The flowControl block of docs/flow-control.md's "Configuration" section, as the doc shows it. */
function documentedBlock(): string {
  const candidates = [new URL('../../docs/flow-control.md', import.meta.url), new URL('../../../docs/flow-control.md', import.meta.url)];
  const file = candidates.find((u) => existsSync(u));
  if (!file) throw new Error('fairness: docs/flow-control.md not found');
  const m = /## Configuration\s+```yaml\n(flowControl:[\s\S]*?)```/.exec(readFileSync(file, 'utf8'));
  if (!m) throw new Error('fairness: docs/flow-control.md has no yaml flowControl block under "## Configuration"');
  return m[1]!;
}

/** Premium: `n` requests, one every `gapMs` (open loop); with `burst` > 0, that many best-effort requests at once at `burstAtMs`. */
async function phase(t: Target, s: Shape, burst: number, tag: string): Promise<Phase> {
  const body = (who: string, i: number) =>
    JSON.stringify({ model: 'open-model', prompt: `${who} ${tag} request ${i}: summarise the ledger`, max_tokens: s.maxTokens, stream: true });
  const premium: Promise<Sample>[] = [];
  let burstDone: Promise<Sample[]> = Promise.resolve([]);
  let fired = burst === 0;
  const t0 = performance.now();
  for (let i = 0; i < s.premium; i++) {
    // sleep to the next slot of the schedule (not `gapMs` after the previous send), so timer lag does not thin the stream
    const due = i * s.gapMs;
    if (!fired && due >= s.burstAtMs) {
      const wait = t0 + s.burstAtMs - performance.now();
      if (wait > 0) await sleep(wait);
      fired = true;
      burstDone = Promise.all(Array.from({ length: burst }, (_, k) => call(t.burst, t.burstHeaders, body('best-effort', k))));
    }
    const wait = t0 + due - performance.now();
    if (wait > 0) await sleep(wait);
    premium.push(call(t.premium, PREMIUM_HEADERS, body('premium', i)));
  }
  return { premium: await Promise.all(premium), burst: await burstDone };
}

function stats(xs: Sample[]): Stats {
  const ok = xs.filter((x) => x.status === 200);
  const e2e = ok.map((x) => x.e2e);
  const ttft = ok.map((x) => x.ttft).filter((x) => x === x);
  return { n: xs.length, ok: ok.length, p50: quantile(e2e, 0.5), p95: quantile(e2e, 0.95), ttftP50: quantile(ttft, 0.5), ttftP95: quantile(ttft, 0.95) };
}

function routerYaml(port: number, base: number, s: Shape, enabled: boolean): string {
  const head = simRouterYaml(port, base, s.engines).trimEnd();
  if (s.documented) {
    const block = documentedBlock();
    if (!/^  enabled: true$/m.test(block)) throw new Error('fairness: the documented block no longer has `enabled: true`');
    return `${head}
${enabled ? block : block.replace(/^  enabled: true$/m, '  enabled: false')}`;
  }
  // The router treats an endpoint with `slots` requests in flight as saturated
  // (the engine's own batch size), and best-effort may use 3/4 of the pool
  // (maxUtilisation 0.75), keeping the rest for premium arrivals. Admission
  // shedding is off, so the whole burst is queued and completes.
  return `${head}
flowControl:
  enabled: ${enabled}
  flows:
    - { id: "tenant:payments", priority: premium, minShare: 0.30 }
    - { id: "tenant:internal-tools", priority: best-effort }
  tenants: { "sk-internal-tools": internal-tools }
  admission: { mode: "off", maxUtilisation: 0.75 }
  saturation: { maxConcurrency: ${s.slots} }
`;
}

async function startTarget(mode: 'on' | 'off', s: Shape, dir: string): Promise<Target> {
  const base = await freePortRange(s.engines);
  const sim = start(`sim-${mode}`, process.execPath, [
    CLI, 'sim', '--fleet', String(s.engines), '--base-port', String(base),
    '--max-num-seqs', String(s.slots), '--itl-ms', String(s.itlMs), '--prefill-overhead-ms', String(s.prefillOverheadMs),
    '--prefill-us-per-token', '0', '--seed', '11',
  ]);
  let router: Proc | undefined;
  try {
    for (let i = 0; i < s.engines; i++) await waitReady(`http://127.0.0.1:${base + i}/health`);
    const port = await freePort();
    const cfg = join(dir, `router-${mode}.yaml`);
    writeFileSync(cfg, routerYaml(port, base, s, mode === 'on'));
    router = start(`router-${mode}`, process.execPath, [CLI, 'serve', '--config', cfg]);
    const url = `http://127.0.0.1:${port}`;
    await waitReady(`${url}/readyz`);
    return {
      mode, url, sim, router,
      premium: new Pool(url, { connections: 64 }),
      burst: new Pool(url, { connections: Math.max(64, s.burst) }),
      burstHeaders: s.documented ? BURST_HEADERS_DOCUMENTED : BURST_HEADERS,
      quiet: [], loudPremium: [], loudBurst: [], rounds: [], flow: { dispatched: {}, meanWaitMs: {} },
    };
  } catch (e) {
    await router?.stop();
    await sim.stop();
    throw e;
  }
}

async function scrapeFlow(url: string): Promise<FlowCounters> {
  const out: FlowCounters = { dispatched: {}, meanWaitMs: {} };
  const r = await fetch(`${url}/metrics`);
  const text = await r.text();
  const sums: Record<string, number> = {};
  const counts: Record<string, number> = {};
  for (const line of text.split('\n')) {
    let m = /^switchyard_flow_dispatched_total\{.*flow="([^"]*)".*\} (\S+)$/.exec(line);
    if (m) out.dispatched[m[1]!] = (out.dispatched[m[1]!] ?? 0) + Number(m[2]);
    m = /^switchyard_flow_queue_wait_seconds_(sum|count)\{.*band="([^"]*)".*\} (\S+)$/.exec(line);
    if (m) (m[1] === 'sum' ? sums : counts)[m[2]!] = Number(m[3]);
  }
  for (const band of Object.keys(counts)) if (counts[band]! > 0) out.meanWaitMs[band] = (sums[band]! / counts[band]!) * 1000;
  return out;
}

async function stopTarget(t: Target): Promise<void> {
  await Promise.allSettled([t.premium.close(), t.burst.close()]);
  await t.router.stop();
  await t.sim.stop();
}

export async function measureFairness(argv: string[]): Promise<{ shape: Shape; rows: FairnessRow[] }> {
  const arg = (name: string) => option(argv, name);
  const num = (name: string, dflt: number, min: number): number => {
    const v = arg(name);
    if (v === undefined) return dflt;
    const n = Number(v);
    if (!Number.isInteger(n) || n < min) throw new Error(`fairness: ${name} must be an integer >= ${min}, got ${JSON.stringify(v)}`);
    return n;
  };
  const quick = argv.includes('--quick');
  const s: Shape = {
    rounds: num('--rounds', quick ? 1 : 5, 1),
    engines: num('--engines', 2, 1),
    slots: num('--slots', 4, 1),
    burst: num('--burst', 60, 1),
    premium: num('--premium', 30, 2),
    gapMs: num('--gap-ms', 80, 1),
    burstAtMs: 200,
    maxTokens: num('--max-tokens', 5, 1),
    itlMs: 20,
    prefillOverheadMs: 2,
    documented: argv.includes('--documented'),
  };
  const verbose = argv.includes('--verbose');
  const dir = mkdtempSync(join(tmpdir(), 'swy-fairness-'));
  const targets: Target[] = [];
  try {
    targets.push(await startTarget('on', s, dir));
    targets.push(await startTarget('off', s, dir));
    // warm-up: connections, JIT, first scrapes; with --documented also a small
    // burst (twice the fleet's slots), so each engine queues once and the
    // router has learnt its batch limit before the measured rounds
    for (const t of targets) {
      await phase(t, { ...s, premium: 8, gapMs: 20, burstAtMs: 0 }, s.documented ? 2 * s.engines * s.slots : 0, 'warm');
      await sleep(200);
    }
    for (let round = 0; round < s.rounds; round++) {
      for (const t of targets) {
        const quiet = await phase(t, s, 0, `q${round}`);
        await sleep(300);
        const loud = await phase(t, s, s.burst, `l${round}`);
        await sleep(300);
        t.quiet.push(...quiet.premium);
        t.loudPremium.push(...loud.premium);
        t.loudBurst.push(...loud.burst);
        const r = { quietP95: stats(quiet.premium).p95, loudP95: stats(loud.premium).p95 };
        t.rounds.push(r);
        if (verbose) {
          const b = stats(loud.burst);
          console.error(
            `fairness round ${round} flow control ${t.mode}: premium p95 ${fmt(r.quietP95)} ms quiet, ${fmt(r.loudP95)} ms with burst ` +
              `(x${fmt(r.loudP95 / r.quietP95, 2)}); burst ${b.ok}/${b.n} ok, p95 ${fmt(b.p95)} ms`,
          );
        }
      }
    }
    for (const t of targets) t.flow = await scrapeFlow(t.url);
  } finally {
    await Promise.allSettled(targets.map(stopTarget));
    rmSync(dir, { recursive: true, force: true });
  }
  const rows = targets.map((t): FairnessRow => {
    const premiumQuiet = stats(t.quiet);
    const premiumLoud = stats(t.loudPremium);
    const b = stats(t.loudBurst);
    return {
      mode: t.mode,
      premiumQuiet,
      premiumLoud,
      burst: { ...b, completed: b.ok, sent: b.n, rejected: t.loudBurst.filter((x) => x.status === 429).length },
      ratio: premiumLoud.p95 / premiumQuiet.p95,
      roundRatios: t.rounds.map((r) => r.loudP95 / r.quietP95),
      flow: t.flow,
    };
  });
  const json = arg('--json');
  if (json) writeFileSync(json, JSON.stringify({ shape: s, rows }, null, 2));
  return { shape: s, rows };
}

export function fairnessMarkdown(shape: Shape, rows: FairnessRow[]): string {
  const s = shape;
  let md = s.documented ? '## Fairness with the documented flowControl block\n\n' : '## Fairness (flow control)\n\n';
  const routerCfg = s.documented
    ? `router \`serve --config\` with exactly docs/flow-control.md's flowControl block (probabilistic admission, maxUtilisation 0.85, ` +
      `no saturation settings: the engines' batch limit is learnt; a warm-up burst of ${2 * s.engines * s.slots} makes each engine queue once)`
    : `router \`serve --config\` with saturation.maxConcurrency ${s.slots}, admission mode off, maxUtilisation 0.75`;
  const burstWho = s.documented ? '`x-tenant-id: internal-tools`, declared best-effort' : 'API key mapped to tenant internal-tools';
  md +=
    `Fleet: ${s.engines} simulated vLLM engine(s) (\`switchyard sim --fleet ${s.engines}\`), --max-num-seqs ${s.slots} each, ` +
    `ITL ${s.itlMs} ms, prefill ${s.prefillOverheadMs} ms; ${routerCfg}; each router, sim fleet and the load generator in its own process. ` +
    `Premium (\`x-tenant-id: payments\`, declared premium, minShare 0.30): ${s.premium} streaming completions of ${s.maxTokens} tokens, ` +
    `one every ${s.gapMs} ms per phase; best-effort (${burstWho}): ${s.burst} requests at once, ` +
    `${s.burstAtMs} ms into the loud phase. ${s.rounds} round(s) of (quiet, loud) per router, the two routers alternating; ` +
    `premium samples pooled over rounds. Latencies in ms; "off" is the same config with \`enabled: false\` (first come, first served).\n\n`;
  md += '| flow control | premium p50 / p95, no burst | premium TTFT p50 / p95, no burst | premium p50 / p95, with burst | premium TTFT p50 / p95, with burst | premium ok | burst completed (all rounds) | burst p50 / p95 | burst TTFT p50 / p95 | premium p95 ratio (burst / no burst) |\n';
  md += '|---|---|---|---|---|---|---|---|---|---|\n';
  for (const r of rows) {
    const q = r.premiumQuiet;
    const l = r.premiumLoud;
    const b = r.burst;
    md +=
      `| ${r.mode} | ${fmt(q.p50)} / ${fmt(q.p95)} | ${fmt(q.ttftP50)} / ${fmt(q.ttftP95)} | ${fmt(l.p50)} / ${fmt(l.p95)} | ` +
      `${fmt(l.ttftP50)} / ${fmt(l.ttftP95)} | ${q.ok + l.ok}/${q.n + l.n} | ${b.completed}/${b.sent}${b.rejected ? ` (${b.rejected} × 429)` : ''} | ` +
      `${fmt(b.p50)} / ${fmt(b.p95)} | ${fmt(b.ttftP50)} / ${fmt(b.ttftP95)} | **${fmt(r.ratio, 2)}×** (rounds: ${r.roundRatios.map((x) => fmt(x, 2)).join(', ')}) |\n`;
  }
  md += '\nFrom each router\'s /metrics at the end of the run (warm-up included): ';
  md += rows
    .map((r) => {
      const d = Object.entries(r.flow.dispatched).map(([f, n]) => `${f} ${n}`).join(', ');
      const w = Object.entries(r.flow.meanWaitMs).map(([b, ms]) => `${b} ${fmt(ms)} ms`).join(', ');
      return `${r.mode}: flow-control dispatches ${d || 'none'}; mean queue wait ${w || '—'}`;
    })
    .join('; ') + '.\n';
  const on = rows.find((r) => r.mode === 'on');
  const off = rows.find((r) => r.mode === 'off');
  if (on && off) {
    md +=
      `\nPremium p95 with the burst / without it: **${fmt(on.ratio, 2)}× with flow control on** (target ≤ 1.5×: ` +
      `${on.ratio <= 1.5 ? 'met' : 'not met'} pooled, ${on.roundRatios.filter((x) => x <= 1.5).length} of ${on.roundRatios.length} rounds), ` +
      `**${fmt(off.ratio, 2)}× with it off**; the burst completed ` +
      `${on.burst.completed}/${on.burst.sent} (on) and ${off.burst.completed}/${off.burst.sent} (off) over ${s.rounds} round(s). ` +
      `The price of isolation is paid by the burst: its p95 is ${fmt(on.burst.p95)} ms on vs ${fmt(off.burst.p95)} ms off ` +
      `(best-effort is let through only while the least-loaded engine is below 75% of its slots, and waits in the router's queue otherwise).\n`;
  }
  return md + '\n';
}

/** Runs the scenario and returns its markdown section (used by bench/run.ts). */
export async function runFairness(argv: string[]): Promise<string> {
  const { shape, rows } = await measureFairness(argv);
  return fairnessMarkdown(shape, rows);
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const t0 = performance.now();
  const md = await runFairness(process.argv.slice(2));
  console.log(md);
  console.error(`fairness: ${fmt((performance.now() - t0) / 1000)} s`);
}
