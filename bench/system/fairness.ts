// Scenario `fairness`: does one tenant's burst blow up another tenant's latency?
//
// A simulated fleet of limited capacity (its own process), and two routers in
// their own processes over two identical fleets: one with flow control on, one
// with the same `flowControl` block but `enabled: false` (first come, first
// served). Two tenants:
//   premium:     API key `sk-payments` (tenant payments, declared premium, minShare 0.30), a
//                steady open-loop stream of streaming completions;
//   best-effort: API key `sk-internal-tools` (mapped to tenant internal-tools,
//                declared best-effort), 60 requests at once.
// Both tenants are identified by their keys (with keys configured the router
// ignores `x-tenant-id`); the bench stops after its warm-up if the premium
// flow dispatched nothing.
// Each round runs a quiet phase (premium only) and a loud phase (the same
// premium stream, the burst fired a little after it starts), on each router in
// turn (on, off, on, off, ...), so both see the same machine noise. Premium
// samples of all rounds are pooled per phase; the figure of merit is
// premium p95 (loud) / premium p95 (quiet) for each router.
//
//
// With --documented the routers run exactly the `auth` and flowControl block of
// docs/flow-control.md (read from the doc: probabilistic admission at 0.85, no
// saturation settings, so the engines' batch limit is the router's to learn),
// each key digest replaced by that of the bench's key for the same tenant.
// The figure of merit is then held
// per round: premium p95 with the burst <= 1.5x its p95 without it in each
// round, not only pooled.
//
// With --seed-script the routers run the seed's flowControl block as issue 34
// quotes it (premium minShare 0.30, best-effort, batch; admission
// probabilistic, maxUtilisation 0.85; x-tenant-id names the tenant), 10
// premium users trickling (--users 10, each a closed loop: send, read the
// answer, think --think-ms 50, for the phase's 2.4 s, which keeps the pool of
// 8 slots about full) and 60 best-effort requests at once; three routers: the default rule
// (`on`), the rule before (`admission.mode: utilisation`) and flow control off.
// Floors, in each round: premium p95 with the burst <= 1.5x its p95 alone AND
// >= 90 % of the burst served with no errors (a 429 is a shed, anything else
// not 200 an error).
//
// With --sustained: 2x the lower bands' capacity for --seconds (60), three
// tenants (premium light, best-effort 1.3x, batch 0.7x of the capacity the
// same run measures first with a closed loop), flow control on against off:
// premium p95 against its p95 alone, the router's queue (sampled from
// /metrics each second), and the shed fraction against the excess
// 1 - capacity / offered (floor: within ±10 % of it, relative).
//
// --engine sim (src/sim, serial prefill), model (testkit/reference/engine-model.ts,
// an independent engine model) or parallel (bench/lib/parallel-engine.ts, prefill
// in parallel up to its slots) for --seed-script and --sustained; all then
// send chat completions.
//
//   node dist/bench/fairness.js [--rounds 5] [--engines 2] [--slots 4] [--burst 60]
//                               [--premium 30] [--gap-ms 80] [--max-tokens 5] [--documented]
//                               [--arms on,noreserve,off] [--seed-script (arms also utilisation)] [--sustained [--seconds 60]]
//                               [--engine sim|model|parallel]
//                               [--quick] [--json out.json]
import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Pool } from 'undici';
import { CLI, ROOT, freePort, freePortRange, simRouterYaml, start, waitReady, type Proc, option } from '../lib/proc.js';
import { fmt, quantile } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

interface Sample {
  status: number;
  /** Time to the first generated text, ms (NaN when the request failed). */
  ttft: number;
  /** Time to the end of the response, ms. */
  e2e: number;
  /** When it was sent (performance.now()), set by the open loop. */
  at?: number;
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
  /** Routers run the seed's block (issue 34) and three arms: on, utilisation, off. */
  seedScript: boolean;
  /** The engines: the simulator or the independent engine model (seed script and sustained). */
  engine: EngineKind;
  /** Premium as closed-loop users (seed script): how many (0: the open-loop stream), and each one's think time. */
  users: number;
  thinkMs: number;
}

export type EngineKind = 'sim' | 'model' | 'parallel';
const ENGINE_NAMES: Record<EngineKind, string> = {
  sim: 'simulated vLLM (src/sim, serial prefill)',
  model: 'engine-model (testkit/reference/engine-model.ts)',
  parallel: 'parallel-prefill (bench/lib/parallel-engine.ts)',
};

/** on: the config as given (admission mode probabilistic); utilisation: the rule before; off: enabled: false. */
/** on: the default rules; noreserve: the same with `admission.reserveWindow: 0`; utilisation: the rule before issue 34; off: flow control disabled. */
export type Arm = 'on' | 'noreserve' | 'utilisation' | 'off';

interface Target {
  mode: Arm;
  url: string;
  sim: Proc;
  router: Proc;
  premium: Pool;
  burst: Pool;
  burstHeaders: Record<string, string>;
  premiumHeaders: Record<string, string>;
  quiet: Sample[];
  loudPremium: Sample[];
  loudBurst: Sample[];
  rounds: Array<{ quietP95: number; loudP95: number; burstOk: number; burstShed: number; burstErrors: number }>;
  flow: FlowCounters;
  /** Chat completions (seed script, sustained) or completions. */
  chat: boolean;
  /** The engines' ports: base, base + 1, ... */
  engineBase: number;
  engines: number;
}

/** From the router's own /metrics at the end of the run: did flow control act? */
interface FlowCounters {
  /** switchyard_flow_dispatched_total summed per flow. */
  dispatched: Record<string, number>;
  /** Mean queue wait per band, ms (switchyard_flow_queue_wait_seconds sum / count). */
  meanWaitMs: Record<string, number>;
  /** Each endpoint's batch limit as flow control counts it (switchyard_endpoint_batch_limit), `*` while still the probe. */
  batchLimits?: Record<string, string>;
}

export interface FairnessRow {
  mode: Arm;
  premiumQuiet: Stats;
  premiumLoud: Stats;
  burst: Stats & { completed: number; sent: number; rejected: number };
  ratio: number;
  roundRatios: number[];
  rounds: Target['rounds'];
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
async function call(pool: Pool, headers: Record<string, string>, body: string, path = '/v1/completions'): Promise<Sample> {
  const t0 = performance.now();
  let ttft = NaN;
  try {
    const r = await pool.request({ method: 'POST', path, headers, body });
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
        const j = JSON.parse(ev.slice(6)) as { choices?: Array<{ text?: string; delta?: { content?: string } }> };
        if (j.choices?.[0]?.text || j.choices?.[0]?.delta?.content) ttft = performance.now() - t0;
      }
    }
    return { status: 200, ttft, e2e: performance.now() - t0 };
  } catch {
    return { status: 0, ttft: NaN, e2e: performance.now() - t0 };
  }
}

// Identity comes from API keys wherever a tenant's band is above the default:
// with keys configured the router does not believe `x-tenant-id` (a client
// could claim premium with it), so a premium client that only named itself
// would be served in the default band and the bench would measure nothing.
const PREMIUM_KEY = 'sk-payments';
const BURST_KEY = 'sk-internal-tools';
const PREMIUM_HEADERS = { 'content-type': 'application/json', authorization: `Bearer ${PREMIUM_KEY}` };
const BURST_HEADERS = { 'content-type': 'application/json', authorization: `Bearer ${BURST_KEY}` };

/**
 * docs/flow-control.md's "Configuration" block (its `auth` keys and its
 * `flowControl` block) as the doc shows it, with each key's digest replaced by
 * the digest of this bench's key for that tenant (the doc's keys are not
 * published); the tenants, bands and every other field are the doc's.
 */
function documentedBlock(): string {
  const candidates = [new URL('../../docs/flow-control.md', import.meta.url), new URL('../../../docs/flow-control.md', import.meta.url)];
  const file = candidates.find((u) => existsSync(u));
  if (!file) throw new Error('fairness: docs/flow-control.md not found');
  const m = /## Configuration\s+```yaml\n([\s\S]*?)```/.exec(readFileSync(file, 'utf8'));
  if (!m || !/^flowControl:$/m.test(m[1]!)) throw new Error('fairness: docs/flow-control.md has no yaml flowControl block under "## Configuration"');
  const keys: Record<string, string> = { payments: PREMIUM_KEY, 'internal-tools': BURST_KEY };
  let replaced = 0;
  const block = m[1]!.replace(/digest: [0-9a-f]{64}, tenant: ([A-Za-z0-9._-]+)/g, (all, tenant: string) => {
    const key = keys[tenant];
    if (!key) return all;
    replaced++;
    return `digest: ${createHash('sha256').update(key).digest('hex')}, tenant: ${tenant}`;
  });
  if (replaced !== 2) throw new Error(`fairness: docs/flow-control.md's block should key tenants payments and internal-tools, found ${replaced} of them`);
  return block;
}

/** Premium: `n` requests, one every `gapMs` (open loop); with `burst` > 0, that many best-effort requests at once at `burstAtMs`. */
async function phase(t: Target, s: Shape, burst: number, tag: string): Promise<Phase> {
  const body = (who: string, i: number) =>
    t.chat
      ? JSON.stringify({ model: 'open-model', messages: [{ role: 'user', content: `${who} ${tag} request ${i}: summarise the ledger` }], max_tokens: s.maxTokens, stream: true })
      : JSON.stringify({ model: 'open-model', prompt: `${who} ${tag} request ${i}: summarise the ledger`, max_tokens: s.maxTokens, stream: true });
  const path = t.chat ? '/v1/chat/completions' : '/v1/completions';
  const premiumHeaders = t.premiumHeaders;
  const premium: Promise<Sample>[] = [];
  let burstDone: Promise<Sample[]> = Promise.resolve([]);
  let fired = burst === 0;
  const t0 = performance.now();
  if (s.users > 0) {
    // the seed script's premium users: each sends, reads the answer, thinks, and sends again, for the phase
    const until = t0 + s.premium * s.gapMs;
    let k = 0;
    const user = async (u: number): Promise<Sample[]> => {
      await sleep((u * s.thinkMs) / s.users); // staggered starts
      const out: Sample[] = [];
      while (performance.now() < until) {
        out.push(await call(t.premium, premiumHeaders, body(`premium-u${u}`, k++), path));
        await sleep(s.thinkMs);
      }
      return out;
    };
    const users = Array.from({ length: s.users }, (_, u) => user(u));
    if (burst > 0) {
      const wait = t0 + s.burstAtMs - performance.now();
      if (wait > 0) await sleep(wait);
      burstDone = Promise.all(Array.from({ length: burst }, (_, j) => call(t.burst, t.burstHeaders, body('best-effort', j), path)));
    }
    return { premium: (await Promise.all(users)).flat(), burst: await burstDone };
  }
  for (let i = 0; i < s.premium; i++) {
    // sleep to the next slot of the schedule (not `gapMs` after the previous send), so timer lag does not thin the stream
    const due = i * s.gapMs;
    if (!fired && due >= s.burstAtMs) {
      const wait = t0 + s.burstAtMs - performance.now();
      if (wait > 0) await sleep(wait);
      fired = true;
      burstDone = Promise.all(Array.from({ length: burst }, (_, k) => call(t.burst, t.burstHeaders, body('best-effort', k), path)));
    }
    const wait = t0 + due - performance.now();
    if (wait > 0) await sleep(wait);
    premium.push(call(t.premium, premiumHeaders, body('premium', i), path));
  }
  return { premium: await Promise.all(premium), burst: await burstDone };
}

function stats(xs: Sample[]): Stats {
  const ok = xs.filter((x) => x.status === 200);
  const e2e = ok.map((x) => x.e2e);
  const ttft = ok.map((x) => x.ttft).filter((x) => x === x);
  return { n: xs.length, ok: ok.length, p50: quantile(e2e, 0.5), p95: quantile(e2e, 0.95), ttftP50: quantile(ttft, 0.5), ttftP95: quantile(ttft, 0.95) };
}

/**
 * The seed's flowControl block as issue 34 quotes it: premium (minShare 0.30),
 * best-effort and batch tenants, probabilistic admission at 0.85; `arm`
 * utilisation names the rule before, off disables the block.
 */
export function seedBlock(arm: Arm): string {
  return `flowControl:
  enabled: ${arm !== 'off'}
  flows:
    - id: tenant:premium
      priority: premium
      minShare: 0.30
    - id: tenant:best-effort
      priority: best-effort
    - id: tenant:batch
      priority: batch
  admission:
    mode: ${arm === 'utilisation' ? 'utilisation' : 'probabilistic'}
    maxUtilisation: 0.85
${arm === 'noreserve' ? '    reserveWindow: 0\n' : ''}`;
}

const SEED_PREMIUM = { 'content-type': 'application/json', 'x-tenant-id': 'premium' };
const SEED_BURST = { 'content-type': 'application/json', 'x-tenant-id': 'best-effort' };
const SEED_BATCH = { 'content-type': 'application/json', 'x-tenant-id': 'batch' };

function routerYaml(port: number, base: number, s: Shape, arm: Arm): string {
  const enabled = arm !== 'off';
  const head = simRouterYaml(port, base, s.engines).trimEnd();
  if (s.seedScript) return `${head}
${seedBlock(arm)}`;
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
  tenants: { "${PREMIUM_KEY}": payments, "${BURST_KEY}": internal-tools }
  admission: { mode: "off", maxUtilisation: 0.75${arm === 'noreserve' ? ', reserveWindow: 0' : ''} }
  saturation: { maxConcurrency: ${s.slots} }
`;
}

/** The engine fleet in its own process: the simulator, or the independent engine model (chat only). */
export function startEngines(name: string, engine: EngineKind, n: number, base: number, slots: number, itlMs: number, prefillMs: number): Proc {
  if (engine === 'parallel') {
    // prefill in parallel up to the slots (bench/lib/parallel-engine.ts); no decode slowdown, as the others
    return start(name, process.execPath, [
      `${ROOT}/dist/bench/lib/parallel-engine.js`, '--fleet', String(n), '--base-port', String(base),
      '--slots', String(slots), '--itl-ms', String(itlMs), '--prefill-ms', String(prefillMs), '--us-per-token', '0', '--decode-slowdown', '0',
    ]);
  }
  if (engine === 'model') {
    return start(name, process.execPath, [
      `${ROOT}/dist/testkit/reference/engine-model.js`, '--fleet', String(n), '--base-port', String(base),
      '--max-running', String(slots), '--itl-ms', String(itlMs), '--prefill-ms', String(prefillMs), '--prefill-us-per-block', '0',
    ]);
  }
  return start(name, process.execPath, [
    CLI, 'sim', '--fleet', String(n), '--base-port', String(base),
    '--max-num-seqs', String(slots), '--itl-ms', String(itlMs), '--prefill-overhead-ms', String(prefillMs),
    '--prefill-us-per-token', '0', '--seed', '11',
  ]);
}

async function startTarget(mode: Arm, s: Shape, dir: string): Promise<Target> {
  const base = await freePortRange(s.engines);
  const sim = startEngines(`${s.engine}-${mode}`, s.engine, s.engines, base, s.slots, s.itlMs, s.prefillOverheadMs);
  let router: Proc | undefined;
  try {
    for (let i = 0; i < s.engines; i++) await waitReady(`http://127.0.0.1:${base + i}/health`);
    const port = await freePort();
    const cfg = join(dir, `router-${mode}.yaml`);
    writeFileSync(cfg, routerYaml(port, base, s, mode));
    router = start(`router-${mode}`, process.execPath, [CLI, 'serve', '--config', cfg]);
    const url = `http://127.0.0.1:${port}`;
    await waitReady(`${url}/readyz`);
    return {
      mode, url, sim, router,
      premium: new Pool(url, { connections: 64 }),
      // --sustained (burst 0) keeps up to a minute of overload open at once
      burst: new Pool(url, { connections: s.burst === 0 ? 4096 : Math.max(64, s.burst) }),
      burstHeaders: s.seedScript ? SEED_BURST : BURST_HEADERS,
      premiumHeaders: s.seedScript ? SEED_PREMIUM : PREMIUM_HEADERS,
      chat: s.seedScript,
      engineBase: base,
      engines: s.engines,
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
    m = /^switchyard_endpoint_batch_limit\{endpoint="([^"]*)"\} (\S+)$/.exec(line);
    if (m) (out.batchLimits ??= {})[m[1]!] = m[2]! + (text.includes(`switchyard_endpoint_batch_limit_learned{endpoint="${m[1]}"} 0`) ? '*' : '');
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
    seedScript: argv.includes('--seed-script'),
    engine: engineOption(argv),
    users: argv.includes('--seed-script') ? num('--users', 10, 1) : 0,
    thinkMs: num('--think-ms', 50, 0),
  };
  if (s.engine !== 'sim' && !s.seedScript) throw new Error('fairness: --engine model|parallel needs --seed-script or --sustained');
  const verbose = argv.includes('--verbose');
  const dir = mkdtempSync(join(tmpdir(), 'swy-fairness-'));
  const targets: Target[] = [];
  try {
    for (const arm of armsOption(argv, s)) targets.push(await startTarget(arm, s, dir));
    // warm-up: connections, JIT, first scrapes; with --documented also a small
    // burst (twice the fleet's slots), so each engine queues once and the
    // router has learnt its batch limit before the measured rounds
    for (const t of targets) {
      await phase(t, { ...s, premium: 8, gapMs: 20, burstAtMs: 0, users: 0 }, s.documented || s.seedScript ? 2 * s.engines * s.slots : 0, 'warm');
      await sleep(200);
      // the seed script: two loud phases more, so the batch limit is learnt (two scrapes in a row showing
      // requests waiting behind the same running count) before round 0, as in every later round
      if (s.seedScript) {
        for (let w = 0; w < 2; w++) {
          await phase(t, s, s.burst, `warm${w}`);
          await sleep(300);
        }
      }
    }
    // the premium client must have reached its flow (its band is the point of the bench)
    const premiumFlow = s.seedScript ? 'tenant:premium' : 'tenant:payments';
    for (const t of targets) {
      if (t.mode === 'off') continue;
      const n = (await scrapeFlow(t.url)).dispatched[premiumFlow] ?? 0;
      if (n === 0) throw new Error(`fairness: the ${t.mode} router dispatched nothing for ${premiumFlow} in the warm-up: the premium client is not classified as premium`);
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
        const lb = stats(loud.burst);
        const burstShed = loud.burst.filter((x) => x.status === 429).length;
        const r = {
          quietP95: stats(quiet.premium).p95,
          loudP95: stats(loud.premium).p95,
          burstOk: lb.ok,
          burstShed,
          burstErrors: loud.burst.length - lb.ok - burstShed + loud.premium.filter((x) => x.status !== 200).length,
        };
        t.rounds.push(r);
        if (verbose) {
          const b = lb;
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
      rounds: t.rounds,
      flow: t.flow,
    };
  });
  const json = arg('--json');
  if (json) writeFileSync(json, JSON.stringify({ shape: s, rows }, null, 2));
  return { shape: s, rows };
}

/** Whether a round meets the seed script's floors: premium p95 <= 1.5x alone, >= 90 % of the burst served, no errors. */
export function seedRoundMet(r: FairnessRow['rounds'][number], burst: number): boolean {
  return r.loudP95 / r.quietP95 <= 1.5 && r.burstOk >= 0.9 * burst && r.burstErrors === 0;
}

function seedMarkdown(s: Shape, rows: FairnessRow[]): string {
  let md = `## Fairness with the seed's script (issue 34), engine ${s.engine}\n\n`;
  md +=
    `${s.engines} ${ENGINE_NAMES[s.engine]} engines of ${s.slots} slots, ITL ${s.itlMs} ms, ` +
    `prefill ${s.prefillOverheadMs} ms; the seed's flowControl block (premium minShare 0.30, best-effort, batch; admission probabilistic, ` +
    `maxUtilisation 0.85; no saturation settings; warm-up: a burst of ${2 * s.engines * s.slots}, then two unmeasured loud phases, so the batch limit is learnt before round 0); ${s.users} premium users, each a closed loop ` +
    `(a streamed chat completion of ${s.maxTokens} tokens, then ${s.thinkMs} ms of think time) for ${fmt((s.premium * s.gapMs) / 1000)} s a phase, ${s.burst} best-effort requests at once ${s.burstAtMs} ms into the loud phase; ${s.rounds} rounds, ` +
    `the three routers alternating. Floors per round: premium p95 with the burst ≤ 1.5× alone AND ≥ 90 % of the burst served, 0 errors.\n\n`;
  md += '| router | premium p95 ratio per round | burst served per round (429) | errors | rounds meeting both floors |\n|---|---|---|---|---|\n';
  for (const r of rows) {
    const label =
      r.mode === 'on'
        ? 'on (mode probabilistic, the default)'
        : r.mode === 'noreserve'
          ? 'on, `reserveWindow: 0` (no reserve for the bands above)'
          : r.mode === 'utilisation'
            ? 'on, `mode: utilisation` (the rule before)'
            : 'off (baseline)';
    md +=
      `| ${label} | ${r.roundRatios.map((x) => `${fmt(x, 2)}×`).join(', ')} | ${r.rounds.map((x) => `${x.burstOk}/${s.burst} (${x.burstShed})`).join(', ')} | ` +
      `${r.rounds.reduce((a, x) => a + x.burstErrors, 0)} | **${r.rounds.filter((x) => seedRoundMet(x, s.burst)).length} / ${r.rounds.length}** |\n`;
  }
  const limits = rows.filter((r) => r.flow.batchLimits).map((r) => `${r.mode}: ${Object.entries(r.flow.batchLimits!).map(([e, n]) => `${e} ${n}`).join(', ')}`);
  if (limits.length > 0) md += `\nBatch limits as flow control counted them at the end (\`switchyard_endpoint_batch_limit\`; * = still the probe): ${limits.join('; ')}.\n`;
  return md + '\n';
}

export function fairnessMarkdown(shape: Shape, rows: FairnessRow[]): string {
  const s = shape;
  if (s.seedScript) return seedMarkdown(s, rows);
  let md = s.documented ? '## Fairness with the documented flowControl block\n\n' : '## Fairness (flow control)\n\n';
  const routerCfg = s.documented
    ? `router \`serve --config\` with exactly docs/flow-control.md's auth and flowControl block (the bench's keys for its two digests; probabilistic admission, maxUtilisation 0.85, ` +
      `no saturation settings: the engines' batch limit is learnt; a warm-up burst of ${2 * s.engines * s.slots} makes each engine queue once)`
    : `router \`serve --config\` with saturation.maxConcurrency ${s.slots}, admission mode off, maxUtilisation 0.75`;
  const burstWho = 'API key mapped to tenant internal-tools';
  md +=
    `Fleet: ${s.engines} simulated vLLM engine(s) (\`switchyard sim --fleet ${s.engines}\`), --max-num-seqs ${s.slots} each, ` +
    `ITL ${s.itlMs} ms, prefill ${s.prefillOverheadMs} ms; ${routerCfg}; each router, sim fleet and the load generator in its own process. ` +
    `Premium (API key mapped to tenant payments, declared premium, minShare 0.30): ${s.premium} streaming completions of ${s.maxTokens} tokens, ` +
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
      `(best-effort is let through only while the least-loaded engine is below ${s.documented ? '85' : '75'}% of its slots, and waits in the router's queue otherwise).\n`;
  }
  return md + '\n';
}


/**
 * --arms: a comma list of on, noreserve, off, and with --seed-script also
 * utilisation (default: on,utilisation,off with --seed-script, else on,off;
 * --documented runs the doc's block as written: on and off only).
 */
function armsOption(argv: string[], s: Shape): Arm[] {
  const allowed: Arm[] = s.seedScript ? ['on', 'noreserve', 'utilisation', 'off'] : s.documented ? ['on', 'off'] : ['on', 'noreserve', 'off'];
  const arms = (option(argv, '--arms') ?? (s.seedScript ? 'on,utilisation,off' : 'on,off')).split(',') as Arm[];
  for (const a of arms) if (!allowed.includes(a)) throw new Error(`fairness: --arms takes ${allowed.join(', ')} here; got ${JSON.stringify(a)}`);
  return arms;
}

function engineOption(argv: string[]): EngineKind {
  const e = option(argv, '--engine') ?? 'sim';
  if (e !== 'sim' && e !== 'model' && e !== 'parallel') throw new Error(`fairness: --engine must be sim, model or parallel, got ${JSON.stringify(e)}`);
  return e;
}

// ---- --sustained: 2x the lower bands' capacity for a minute -------------------------------------

interface SustainedArm {
  mode: Arm;
  /** Premium p95 (e2e, ms) alone and during the overload. */
  premiumAloneP95: number;
  premiumLoudP95: number;
  premium: { sent: number; ok: number };
  /** Lower bands (best-effort + batch) during the overload. */
  lower: { sent: number; ok: number; shed: number; errors: number; p95: number };
  perTenant: Record<string, { sent: number; ok: number; shed: number }>;
  /** Largest router queue seen (switchyard_flow_band_queue_length summed, sampled each second), and at the end. */
  maxQueue: number;
  endQueue: number;
  /** Distinct Retry-After values seen on 429s. */
  retryAfter: string[];
  /** Requests the lower bands were offered per second, and the excess 1 - capacity / offered. */
  offeredRate: number;
  excess: number;
  shedFraction: number;
}

export interface SustainedResult {
  engine: EngineKind;
  engines: number;
  slots: number;
  seconds: number;
  maxTokens: number;
  /** Lower-band requests per second the pool completed in the closed-loop calibration (flow control on). */
  capacity: number;
  arms: SustainedArm[];
}

/** --trace: the router's queue per band and in-flight per endpoint, and each engine's running / waiting counts. */
async function traceLine(t: Target): Promise<string> {
  try {
    const text = await (await fetch(`${t.url}/metrics`)).text();
    const bands = [...text.matchAll(/^switchyard_flow_band_queue_length\{[^}]*band="([^"]*)"[^}]*\} (\S+)$/gm)].map((m) => `${m[1]} ${m[2]}`);
    const inflight = [...text.matchAll(/^switchyard_endpoint_in_flight\{endpoint="([^"]*)"\} (\S+)$/gm)].map((m) => `${m[1]} ${m[2]}`);
    const speed = [...text.matchAll(/^switchyard_endpoint_speed_ms_per_ktok\{endpoint="([^"]*)"\} (\S+)$/gm)].map((m) => `${m[1]} ${fmt(Number(m[2]), 1)}`);
    const backlog = [...text.matchAll(/^switchyard_endpoint_prefill_backlog_tokens\{endpoint="([^"]*)"\} (\S+)$/gm)].map((m) => `${m[1]} ${m[2]}`);
    const engines: string[] = [];
    for (let i = 0; i < t.engines; i++) {
      const e = await (await fetch(`http://127.0.0.1:${t.engineBase + i}/metrics`)).text();
      const run = /^vllm:num_requests_running(?:\{[^}]*\})? (\S+)$/m.exec(e)?.[1];
      const wait = /^vllm:num_requests_waiting(?:\{[^}]*\})? (\S+)$/m.exec(e)?.[1];
      engines.push(`${run}/${wait}`);
    }
    return `queued ${bands.join(', ')}; router in flight ${inflight.join(', ')}; engines running/waiting ${engines.join(', ')}; speed ms/ktok ${speed.join(', ')}; prefill backlog ${backlog.join(', ')}`;
  } catch (e) {
    return `(${(e as Error).message})`;
  }
}

async function routerQueue(url: string): Promise<number> {
  try {
    const text = await (await fetch(`${url}/metrics`)).text();
    let n = 0;
    for (const m of text.matchAll(/^switchyard_flow_band_queue_length\{[^}]*\} (\S+)$/gm)) n += Number(m[1]);
    return n;
  } catch {
    return NaN;
  }
}

/** Open loop at `rate` requests/s (by elapsed time, so timer lag does not thin it) for `ms`; every result is pushed to `out`. */
async function openLoop(send: () => Promise<Sample>, rate: number, ms: number, out: Sample[]): Promise<void> {
  const all: Promise<void>[] = [];
  const t0 = performance.now();
  let due = 0;
  let last = 0;
  for (;;) {
    const now = performance.now() - t0;
    if (now >= ms) break;
    due += (rate * (now - last)) / 1000;
    last = now;
    while (due >= 1) {
      due--;
      const at = performance.now();
      all.push(
        send().then((x) => {
          x.at = at;
          out.push(x);
        }),
      );
    }
    await sleep(10);
  }
  await Promise.all(all);
}

/** Closed loop of `clients` for `ms`: completions per second. */
async function closedLoop(send: () => Promise<Sample>, clients: number, ms: number): Promise<number> {
  const until = performance.now() + ms;
  let ok = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: clients }, async () => {
      while (performance.now() < until) if ((await send()).status === 200) ok++;
    }),
  );
  return ok / ((performance.now() - t0) / 1000);
}

export async function measureSustained(argv: string[]): Promise<SustainedResult> {
  const num = (name: string, dflt: number, min: number): number => {
    const v = option(argv, name);
    if (v === undefined) return dflt;
    const n = Number(v);
    if (!Number.isInteger(n) || n < min) throw new Error(`fairness: ${name} must be an integer >= ${min}, got ${JSON.stringify(v)}`);
    return n;
  };
  const engine = engineOption(argv);
  const seconds = num('--seconds', 60, 5);
  const s: Shape = {
    rounds: 1, engines: num('--engines', 2, 1), slots: num('--slots', 4, 1), burst: 0, premium: 0, gapMs: 0, burstAtMs: 0,
    maxTokens: num('--max-tokens', 5, 1), itlMs: 20, prefillOverheadMs: 2, documented: false, seedScript: true, engine, users: 0, thinkMs: 0,
  };
  const verbose = argv.includes('--verbose');
  const dir = mkdtempSync(join(tmpdir(), 'swy-sustained-'));
  const arms: SustainedArm[] = [];
  let capacity = NaN;
  try {
    const modes = (option(argv, '--arms') ?? 'on,off').split(',') as Arm[];
    for (const m of modes) if (m !== 'on' && m !== 'noreserve' && m !== 'off') throw new Error(`fairness: --sustained --arms takes on, noreserve, off; got ${JSON.stringify(m)}`);
    if (modes[0] === 'off') throw new Error('fairness: --sustained --arms: the first arm measures the capacity with flow control on (on or noreserve)');
    for (const mode of modes) {
      const t = await startTarget(mode, s, dir);
      try {
        let n = 0;
        const body = (who: string) =>
          JSON.stringify({ model: 'open-model', messages: [{ role: 'user', content: `${who} ${n++}: summarise the ledger` }], max_tokens: s.maxTokens, stream: true });
        const send = (headers: Record<string, string>, who: string) => () => call(t.burst, headers, body(who), '/v1/chat/completions');
        // warm-up: the engines queue once, so the router learns their batch limit
        await closedLoop(send(SEED_BURST, 'warm'), 3 * s.engines * s.slots, 3000);
        if (mode === modes[0]) capacity = await closedLoop(send(SEED_BURST, 'calibrate'), 3 * s.engines * s.slots, 5000);
        const premiumRate = Math.max(2, 0.1 * capacity);
        const alone: Sample[] = [];
        await openLoop(send(SEED_PREMIUM, 'premium-alone'), premiumRate, 5000, alone);
        await sleep(500);
        const loud: Record<string, Sample[]> = { premium: [], 'best-effort': [], batch: [] };
        let maxQueue = 0;
        let sampling = true;
        const trace = argv.includes('--trace');
        const timeline: string[] = [];
        const loudAt = performance.now();
        const sampler = (async () => {
          while (sampling) {
            const q = await routerQueue(t.url);
            if (q > maxQueue) maxQueue = q;
            if (trace) timeline.push(`${fmt((performance.now() - loudAt) / 1000, 1)} s: ${await traceLine(t)}`);
            await sleep(trace ? 250 : 1000);
          }
        })();
        const ms = seconds * 1000;
        await Promise.all([
          openLoop(send(SEED_PREMIUM, 'premium'), premiumRate, ms, loud.premium!),
          openLoop(send(SEED_BURST, 'best-effort'), 1.3 * capacity, ms, loud['best-effort']!),
          openLoop(send(SEED_BATCH, 'batch'), 0.7 * capacity, ms, loud.batch!),
        ]);
        // the loops send by elapsed time over exactly `ms` (they resolve only when every answer is in)
        const sendMs = ms;
        sampling = false;
        await sampler;
        const endQueue = await routerQueue(t.url);
        if (trace) {
          // premium's latency by the second it was sent in, beside the router's and engines' state
          const bySecond = new Map<number, number[]>();
          for (const x of loud.premium!) {
            if (x.at === undefined) continue;
            const sec = Math.floor((x.at - loudAt) / 1000);
            const xs = bySecond.get(sec);
            if (xs) xs.push(x.e2e);
            else bySecond.set(sec, [x.e2e]);
          }
          const per = [...bySecond.entries()].sort((a, b) => a[0] - b[0]).map(([sec, xs]) => `${sec}s p95 ${fmt(quantile(xs, 0.95))}`);
          console.error(`sustained ${mode} premium e2e by second sent: ${per.join('; ')}`);
          for (const l of timeline) console.error(`sustained ${mode} ${l}`);
        }
        const lower = [...loud['best-effort']!, ...loud.batch!];
        const ok = lower.filter((x) => x.status === 200);
        const shed = lower.filter((x) => x.status === 429).length;
        const offeredRate = lower.length / (sendMs / 1000);
        const excess = 1 - capacity / offeredRate;
        const perTenant: SustainedArm['perTenant'] = {};
        for (const [k, xs] of Object.entries(loud)) perTenant[k] = { sent: xs.length, ok: xs.filter((x) => x.status === 200).length, shed: xs.filter((x) => x.status === 429).length };
        const arm: SustainedArm = {
          mode,
          premiumAloneP95: stats(alone).p95,
          premiumLoudP95: stats(loud.premium!).p95,
          premium: { sent: loud.premium!.length, ok: loud.premium!.filter((x) => x.status === 200).length },
          lower: { sent: lower.length, ok: ok.length, shed, errors: lower.length - ok.length - shed, p95: quantile(ok.map((x) => x.e2e), 0.95) },
          perTenant,
          maxQueue,
          endQueue,
          retryAfter: [],
          offeredRate,
          excess,
          shedFraction: shed / lower.length,
        };
        arms.push(arm);
        if (verbose) console.error(`sustained ${mode}: ${JSON.stringify(arm)}`);
      } finally {
        await stopTarget(t);
      }
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  const res: SustainedResult = { engine, engines: s.engines, slots: s.slots, seconds, maxTokens: s.maxTokens, capacity, arms };
  const json = option(argv, '--json');
  if (json) writeFileSync(json, JSON.stringify(res, null, 2));
  return res;
}

export function sustainedMarkdown(r: SustainedResult): string {
  let md = `## Sustained overload (issue 34), engine ${r.engine}\n\n`;
  md +=
    `${r.engines} ${ENGINE_NAMES[r.engine]} engines of ${r.slots} slots (ITL 20 ms, ${r.maxTokens} tokens a request); ` +
    `the seed's flowControl block (admission probabilistic: target 1 s, interval 10 s by default). Lower-band capacity measured first in the same run ` +
    `(closed loop, flow control on): **${fmt(r.capacity)} req/s**. Then for ${r.seconds} s: premium at 0.1×, best-effort at 1.3×, batch at 0.7× of it ` +
    `(open loop; the lower bands at 2×). Premium alone: the same premium stream for 5 s before. "off" is the same block with \`enabled: false\`.\n\n`;
  md += '| flow control | premium p95 alone / overload (ratio) | premium ok | lower bands offered | served | shed (429) | errors | shed fraction / excess (rel. error) | best-effort / batch shed | lower p95 | router queue max / end |\n';
  md += '|---|---|---|---|---|---|---|---|---|---|---|\n';
  for (const a of r.arms) {
    const rel = (a.shedFraction - a.excess) / a.excess;
    const be = a.perTenant['best-effort']!;
    const ba = a.perTenant.batch!;
    md +=
      `| ${a.mode} | ${fmt(a.premiumAloneP95)} / ${fmt(a.premiumLoudP95)} ms (**${fmt(a.premiumLoudP95 / a.premiumAloneP95, 2)}×**) | ${a.premium.ok}/${a.premium.sent} | ` +
      `${a.lower.sent} (${fmt(a.offeredRate)}/s) | ${a.lower.ok} | ${a.lower.shed} | ${a.lower.errors} | ${fmt(a.shedFraction, 3)} / ${fmt(a.excess, 3)} (${rel >= 0 ? '+' : ''}${fmt(100 * rel)} %) | ` +
      `${be.shed}/${be.sent}, ${ba.shed}/${ba.sent} | ${fmt(a.lower.p95)} ms | ${a.maxQueue} / ${a.endQueue} |\n`;
  }
  const on = r.arms.find((a) => a.mode === 'on');
  if (on) {
    const rel = Math.abs(on.shedFraction - on.excess) / on.excess;
    const ratio = on.premiumLoudP95 / on.premiumAloneP95;
    md +=
      `\nFloors (flow control on): premium p95 ≤ 1.5× alone: ${ratio <= 1.5 ? 'met' : 'not met'} (${fmt(ratio, 2)}×); ` +
      `shed fraction within ±10 % of the excess: ${rel <= 0.1 ? 'met' : 'not met'} (${fmt(100 * rel)} %); queue bounded: max ${on.maxQueue} ` +
      `(${fmt(on.maxQueue / r.capacity)} s of capacity), ${on.endQueue} at the end; errors ${on.lower.errors}.\n`;
  }
  return md + '\n';
}

/** Runs the scenario and returns its markdown section (used by bench/run.ts). */
export async function runFairness(argv: string[]): Promise<string> {
  if (argv.includes('--sustained')) return sustainedMarkdown(await measureSustained(argv));
  const { shape, rows } = await measureFairness(argv);
  return fairnessMarkdown(shape, rows);
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const t0 = performance.now();
  const md = await runFairness(process.argv.slice(2));
  console.log(md);
  console.error(`fairness: ${fmt((performance.now() - t0) / 1000)} s`);
}
