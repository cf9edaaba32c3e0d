// Scenario `prefill-backlog-cost`: does flow control's prefill-backlog term
// (saturation.prefillBacklogTokens) cost throughput, or only change which
// requests are served? One tenant at a time (no fairness effect), or the two
// tenants of bench/cost-fairness.ts together, against two routers that differ
// only in the term: its default (2048) and 0 (off). Each router has its own
// simulated engine (its own process; the engine of cost-fairness: 4 slots,
// 50 µs per prompt token of serial prefill, 10 ms per output token), and the
// two are measured alternately, in the same run, the order swapped each round.
//
// Per window it reports the client's view (answers that ended in the window:
// requests, prompt and output tokens per second) and the engine's (the
// simulator's own counters over the window: prompt tokens admitted, output
// tokens produced, requests finished; its serial prefill compute busy share,
// Δprompt tokens × 50 µs / window: no prefix is ever cached, but the
// simulator counts a prompt at admission, so a window's edges move it by up to
// one prompt's compute, and it can read a little over 100 %;
// and the mean of vllm:num_requests_running sampled every 20 ms).
//
//   node dist/bench/prefill-backlog-cost.js [--scenarios long,short,mix1] [--stream off|on]
//        [--rounds 2] [--seconds 10] [--warmup 3] [--clients 8] [--long 8192] [--short 256] [--max-tokens 16] [--json out.json]
//   scenarios: long, short (that tenant alone), mix1 (both tenants' clients as one tenant: no fairness between
//   them), mix (the two tenants of cost-fairness; with fairness: tokens a 10 s window may serve no long prompt at
//   all: use bench/cost-fairness.ts's 20 s windows for that case)
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Pool } from 'undici';
import { CLI, freePort, freePortRange, simRouterYaml, start, waitReady, type Proc, option } from '../lib/proc.js';
import { fmt } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const US_PER_TOKEN = 50;
/** Output tokens per request (--max-tokens; cost-fairness: 16). */
let MAX_TOKENS = 16;

/** long / short: that tenant alone; mix: both tenants (cost-fairness); mix1: the same clients as one tenant (no fairness between them). */
type Scenario = 'long' | 'short' | 'mix' | 'mix1';

interface Target {
  term: number | undefined;
  sim: Proc;
  simUrl: string;
  router: Proc;
  pool: Pool;
}

interface Window {
  requests: number;
  promptTokens: number;
  outputTokens: number;
}

interface EngineCounts {
  prompt: number;
  generation: number;
  finished: number;
}

export interface Row {
  round: number;
  scenario: Scenario;
  stream: boolean;
  term: string;
  seconds: number;
  client: Window;
  engine: EngineCounts;
  /** Serial prefill compute busy share of the window (0..1). */
  computeBusy: number;
  /** Mean running requests at the engine over the window. */
  meanRunning: number;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function prompt(tokens: number, tag: string): string {
  const head = `${tag}\n`;
  return head + 'lorem ipsum dolor sit amet '.repeat(Math.ceil((tokens * 4 - head.length) / 27)).slice(0, Math.max(0, tokens * 4 - head.length));
}

function routerYaml(port: number, base: number, term: number | undefined): string {
  return `${simRouterYaml(port, base, 1)}flowControl:
  enabled: true
  admission: { mode: "off" }
  saturation: { maxConcurrency: 4${term === undefined ? '' : `, prefillBacklogTokens: ${term}`} }
  fairness: tokens
`;
}

async function startTarget(term: number | undefined, dir: string): Promise<Target> {
  const name = term === undefined ? 'default' : String(term);
  const base = await freePortRange(1);
  const sim = start(`sim-${name}`, process.execPath, [
    CLI, 'sim', '--fleet', '1', '--base-port', String(base), '--max-num-seqs', '4', '--itl-ms', '10',
    '--prefill-overhead-ms', '2', '--prefill-us-per-token', String(US_PER_TOKEN), '--kv-cache-blocks', '65536', '--seed', '3',
  ]);
  try {
    const simUrl = `http://127.0.0.1:${base}`;
    await waitReady(`${simUrl}/health`);
    const port = await freePort();
    const cfg = join(dir, `router-${name}.yaml`);
    writeFileSync(cfg, routerYaml(port, base, term));
    const router = start(`router-${name}`, process.execPath, [CLI, 'serve', '--config', cfg]);
    const url = `http://127.0.0.1:${port}`;
    await waitReady(`${url}/readyz`);
    return { term, sim, simUrl, router, pool: new Pool(url, { connections: 64 }) };
  } catch (e) {
    await sim.stop();
    throw e;
  }
}

async function engineCounts(url: string): Promise<EngineCounts & { running: number }> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const sum = (name: string) => {
    let v = 0;
    for (const m of text.matchAll(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, 'gm'))) v += Number(m[1]);
    return v;
  };
  return {
    prompt: sum('vllm:prompt_tokens_total'),
    generation: sum('vllm:generation_tokens_total'),
    finished: sum('vllm:request_success_total'),
    running: sum('vllm:num_requests_running'),
  };
}

let seq = 0;
const USAGE = /"prompt_tokens":(\d+),(?:"total_tokens":\d+,)?"completion_tokens":(\d+)|"completion_tokens":(\d+),"prompt_tokens":(\d+)/g;

function usageOf(text: string): { prompt: number; completion: number } | null {
  let last: RegExpExecArray | null = null;
  USAGE.lastIndex = 0;
  for (let m = USAGE.exec(text); m !== null; m = USAGE.exec(text)) last = m;
  if (last === null) {
    // the field order is the engine's; fall back to a parse of the last JSON object carrying usage
    const k = text.lastIndexOf('"usage"');
    if (k < 0) return null;
    const p = /"prompt_tokens":(\d+)/.exec(text.slice(k));
    const c = /"completion_tokens":(\d+)/.exec(text.slice(k));
    return p && c ? { prompt: Number(p[1]), completion: Number(c[1]) } : null;
  }
  return last[1] !== undefined ? { prompt: Number(last[1]), completion: Number(last[2]) } : { prompt: Number(last[4]), completion: Number(last[3]) };
}

async function client(t: Target, who: string, tokens: number, stream: boolean, w: Window, from: number, until: number): Promise<void> {
  while (performance.now() < until) {
    const body = JSON.stringify({
      model: 'open-model',
      prompt: prompt(tokens, `${who} ${seq++} ${Math.random()}`),
      max_tokens: MAX_TOKENS,
      ...(stream ? { stream: true, stream_options: { include_usage: true } } : {}),
    });
    try {
      const r = await t.pool.request({ method: 'POST', path: '/v1/completions', headers: { 'content-type': 'application/json', 'x-tenant-id': who }, body });
      const text = await r.body.text();
      const now = performance.now();
      if (r.statusCode !== 200 || now < from || now > until) continue;
      const u = usageOf(text);
      w.requests++;
      w.promptTokens += u?.prompt ?? 0;
      w.outputTokens += u?.completion ?? 0;
    } catch {
      await sleep(10);
    }
  }
}

async function measure(t: Target, scenario: Scenario, stream: boolean, s: { seconds: number; warmup: number; clients: number; long: number; short: number }): Promise<Omit<Row, 'round'>> {
  const w: Window = { requests: 0, promptTokens: 0, outputTokens: 0 };
  const from = performance.now() + s.warmup * 1000;
  const until = from + s.seconds * 1000;
  const clients: Promise<void>[] = [];
  const one = scenario === 'mix1';
  if (scenario !== 'short') for (let i = 0; i < s.clients; i++) clients.push(client(t, one ? 'one' : 'long', s.long, stream, w, from, until));
  if (scenario !== 'long') for (let i = 0; i < s.clients; i++) clients.push(client(t, one ? 'one' : 'short', s.short, stream, w, from, until));
  // the engine's side: counters at the window's edges, running sampled every 20 ms
  const engine = (async () => {
    await sleep(from - performance.now());
    const a = await engineCounts(t.simUrl);
    const t0 = performance.now();
    let samples = 0;
    let running = 0;
    while (performance.now() < until) {
      const c = await engineCounts(t.simUrl);
      running += c.running;
      samples++;
      await sleep(20);
    }
    const b = await engineCounts(t.simUrl);
    const secs = (performance.now() - t0) / 1000;
    return { d: { prompt: b.prompt - a.prompt, generation: b.generation - a.generation, finished: b.finished - a.finished }, secs, meanRunning: samples > 0 ? running / samples : 0 };
  })();
  await Promise.all(clients);
  const e = await engine;
  await sleep(300);
  return {
    scenario,
    stream,
    term: t.term === undefined ? '2048 (default)' : String(t.term),
    seconds: s.seconds,
    client: w,
    engine: e.d,
    computeBusy: (e.d.prompt * US_PER_TOKEN) / 1e6 / e.secs,
    meanRunning: e.meanRunning,
  };
}

export async function measureBacklogCost(argv: string[]): Promise<Row[]> {
  const num = (name: string, dflt: number) => {
    const v = option(argv, name);
    const n = v === undefined ? dflt : Number(v);
    if (!Number.isInteger(n) || n < 1) throw new Error(`prefill-backlog-cost: ${name} must be a positive integer, got ${v}`);
    return n;
  };
  const s = { rounds: num('--rounds', 2), seconds: num('--seconds', 10), warmup: num('--warmup', 3), clients: num('--clients', 8), long: num('--long', 8192), short: num('--short', 256) };
  const scenarios = (option(argv, '--scenarios') ?? 'long,short,mix1').split(',') as Scenario[];
  MAX_TOKENS = num('--max-tokens', 16);
  for (const sc of scenarios) if (sc !== 'long' && sc !== 'short' && sc !== 'mix' && sc !== 'mix1') throw new Error(`prefill-backlog-cost: --scenarios: unknown scenario ${sc}`);
  const st = option(argv, '--stream') ?? 'off';
  if (st !== 'off' && st !== 'on') throw new Error(`prefill-backlog-cost: --stream must be off or on, got ${st}`);
  const stream = st === 'on';
  const dir = mkdtempSync(join(tmpdir(), 'swy-pbc-'));
  const targets: Target[] = [];
  const rows: Row[] = [];
  try {
    targets.push(await startTarget(undefined, dir));
    targets.push(await startTarget(0, dir));
    for (let round = 0; round < s.rounds; round++) {
      for (const sc of scenarios) {
        const order = round % 2 === 0 ? targets : [...targets].reverse();
        for (const t of order) {
          const r = await measure(t, sc, stream, s);
          rows.push({ round, ...r });
          console.error(`round ${round} ${sc} stream=${stream} term=${r.term}: ${r.client.requests} req, engine prompt ${r.engine.prompt}, busy ${fmt(r.computeBusy, 3)}, running ${fmt(r.meanRunning, 2)}`);
        }
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
  const json = option(argv, '--json');
  if (json) writeFileSync(json, JSON.stringify({ shape: { ...s, scenarios, stream, maxTokens: MAX_TOKENS }, rows }, null, 2));
  return rows;
}

export function backlogCostMarkdown(rows: Row[]): string {
  let md = '| round | scenario | stream | term | client req/s | client prompt tok/s | client output tok/s | engine prompt tok/s | engine output tok/s | engine req/s | prefill compute busy | mean running |\n';
  md += '|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n';
  for (const r of rows) {
    const s = r.seconds;
    md += `| ${r.round} | ${r.scenario} | ${r.stream ? 'on' : 'off'} | ${r.term} | ${fmt(r.client.requests / s, 2)} | ${fmt(r.client.promptTokens / s, 0)} | ${fmt(r.client.outputTokens / s, 0)} | ${fmt(r.engine.prompt / s, 0)} | ${fmt(r.engine.generation / s, 0)} | ${fmt(r.engine.finished / s, 2)} | ${fmt(r.computeBusy * 100, 1)} % | ${fmt(r.meanRunning, 2)} |\n`;
  }
  // per scenario: the term's totals over the rounds against the term off
  md += '\n| scenario | stream | client tokens/s, term on / off | ratio | engine prompt tok/s on / off | busy on / off | running on / off |\n|---|---|---|---:|---|---|---|\n';
  const keys = [...new Set(rows.map((r) => r.scenario))];
  for (const sc of keys) {
    const on = rows.filter((r) => r.scenario === sc && r.term !== '0');
    const off = rows.filter((r) => r.scenario === sc && r.term === '0');
    const tot = (rs: Row[], f: (r: Row) => number) => rs.reduce((a, r) => a + f(r), 0) / rs.reduce((a, r) => a + r.seconds, 0);
    const tk = (r: Row) => r.client.promptTokens + r.client.outputTokens;
    const avg = (rs: Row[], f: (r: Row) => number) => rs.reduce((a, r) => a + f(r), 0) / rs.length;
    const a = tot(on, tk);
    const b = tot(off, tk);
    md += `| ${sc} | ${on[0]?.stream ? 'on' : 'off'} | ${fmt(a, 0)} / ${fmt(b, 0)} | **${fmt(a / b, 3)}** | ${fmt(tot(on, (r) => r.engine.prompt), 0)} / ${fmt(tot(off, (r) => r.engine.prompt), 0)} | ${fmt(avg(on, (r) => r.computeBusy) * 100, 1)} % / ${fmt(avg(off, (r) => r.computeBusy) * 100, 1)} % | ${fmt(avg(on, (r) => r.meanRunning), 2)} / ${fmt(avg(off, (r) => r.meanRunning), 2)} |\n`;
  }
  return md;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const t0 = performance.now();
  const rows = await measureBacklogCost(process.argv.slice(2));
  console.log(backlogCostMarkdown(rows));
  console.error(`prefill-backlog-cost: ${fmt((performance.now() - t0) / 1000)} s`);
}
