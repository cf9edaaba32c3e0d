// Scenario `cost-fairness`: two backlogged tenants in one band, one sending
// 8k-token prompts, one 256-token prompts. Does each get the same share of
// the engines' work (prompt + output tokens), or the same number of requests?
//
// Two simulated fleets (their own processes), a router in front of each with
// the same flowControl block except `fairness`: `tokens` on one, `requests`
// on the other. Each tenant runs `--clients` closed-loop clients (more than
// the pool's slots, so both always have requests queued). Every prompt starts
// with a unique line, so no prefix is cached and every prompt token is
// computed. Served tokens per tenant are summed from the answers' `usage`
// over the measured window (after a warm-up), the routers alternating.
//
//   node dist/bench/cost-fairness.js [--rounds 2] [--seconds 8] [--warmup 4] [--clients 8] [--long 8192] [--short 256]
//                                    [--quantum N (fairness.newFlowQuantum on both routers; default: the default, 16)]
//                                    [--prefill-backlog N (saturation.prefillBacklogTokens on both routers; default: the default, 2048)] [--json out.json]
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Pool } from 'undici';
import { CLI, freePort, freePortRange, simRouterYaml, start, waitReady, type Proc, option } from '../lib/proc.js';
import { fmt } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

type Mode = 'tokens' | 'requests';

interface Shape {
  rounds: number;
  seconds: number;
  clients: number;
  long: number;
  short: number;
  maxTokens: number;
  warmup: number;
}

interface Served {
  requests: number;
  tokens: number;
}

interface Target {
  mode: Mode;
  sim: Proc;
  router: Proc;
  pool: Pool;
  served: { long: Served; short: Served };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A prompt of about `tokens` simulated tokens (4 bytes each), unique from its first line. */
function prompt(tokens: number, tag: string): string {
  const head = `${tag}\n`;
  return head + 'lorem ipsum dolor sit amet '.repeat(Math.ceil((tokens * 4 - head.length) / 27)).slice(0, Math.max(0, tokens * 4 - head.length));
}

/** fairness.newFlowQuantum for both routers (--quantum), undefined: the default. */
let quantum: number | undefined;
/** saturation.prefillBacklogTokens for both routers (--prefill-backlog), undefined: the default. */
let backlog: number | undefined;

function routerYaml(port: number, base: number, mode: Mode): string {
  return `${simRouterYaml(port, base, 1)}flowControl:
  enabled: true
  admission: { mode: "off" }
  saturation: { maxConcurrency: 4${backlog === undefined ? '' : `, prefillBacklogTokens: ${backlog}`} }
  fairness: ${quantum === undefined ? mode : `{ mode: ${mode}, newFlowQuantum: ${quantum} }`}
`;
}

async function startTarget(mode: Mode, dir: string): Promise<Target> {
  const base = await freePortRange(1);
  const sim = start(`sim-${mode}`, process.execPath, [
    CLI, 'sim', '--fleet', '1', '--base-port', String(base), '--max-num-seqs', '4', '--itl-ms', '10',
    '--prefill-overhead-ms', '2', '--prefill-us-per-token', '50', '--kv-cache-blocks', '65536', '--seed', '3',
  ]);
  try {
    await waitReady(`http://127.0.0.1:${base}/health`);
    const port = await freePort();
    const cfg = join(dir, `router-${mode}.yaml`);
    writeFileSync(cfg, routerYaml(port, base, mode));
    const router = start(`router-${mode}`, process.execPath, [CLI, 'serve', '--config', cfg]);
    const url = `http://127.0.0.1:${port}`;
    await waitReady(`${url}/readyz`);
    return { mode, sim, router, pool: new Pool(url, { connections: 64 }), served: { long: { requests: 0, tokens: 0 }, short: { requests: 0, tokens: 0 } } };
  } catch (e) {
    await sim.stop();
    throw e;
  }
}

let seq = 0;

/** One tenant's closed-loop client until `until` (performance.now ms); answers that end inside [from, until] count. */
async function client(t: Target, who: 'long' | 'short', tokens: number, s: Shape, from: number, until: number): Promise<void> {
  while (performance.now() < until) {
    const body = JSON.stringify({ model: 'open-model', prompt: prompt(tokens, `${who} ${seq++} ${Math.random()}`), max_tokens: s.maxTokens });
    try {
      const r = await t.pool.request({
        method: 'POST',
        path: '/v1/completions',
        headers: { 'content-type': 'application/json', 'x-tenant-id': who },
        body,
      });
      const text = await r.body.text();
      const now = performance.now();
      if (r.statusCode !== 200 || now < from || now > until) continue;
      const u = (JSON.parse(text) as { usage?: { prompt_tokens?: number; completion_tokens?: number } }).usage;
      t.served[who].requests++;
      t.served[who].tokens += (u?.prompt_tokens ?? 0) + (u?.completion_tokens ?? 0);
    } catch {
      await sleep(10);
    }
  }
}

export interface CostRow {
  mode: Mode;
  long: Served;
  short: Served;
  /** Served tokens, long tenant / short tenant. */
  tokenRatio: number;
  /** Served requests, long / short. */
  requestRatio: number;
}

export async function measureCost(argv: string[]): Promise<{ shape: Shape; rows: CostRow[] }> {
  const num = (name: string, dflt: number) => {
    const v = option(argv, name);
    const n = v === undefined ? dflt : Number(v);
    if (!Number.isInteger(n) || n < 1) throw new Error(`cost-fairness: ${name} must be a positive integer, got ${v}`);
    return n;
  };
  const s: Shape = { rounds: num('--rounds', 2), seconds: num('--seconds', 8), clients: num('--clients', 8), long: num('--long', 8192), short: num('--short', 256), maxTokens: 16, warmup: num('--warmup', 4) };
  const q = option(argv, '--quantum');
  quantum = q === undefined ? undefined : Number(q);
  if (quantum !== undefined && !(quantum >= 0)) throw new Error(`cost-fairness: --quantum must be a number >= 0, got ${q}`);
  const pb = option(argv, '--prefill-backlog');
  backlog = pb === undefined ? undefined : Number(pb);
  if (backlog !== undefined && !(Number.isInteger(backlog) && backlog >= 0)) throw new Error(`cost-fairness: --prefill-backlog must be an integer >= 0, got ${pb}`);
  const dir = mkdtempSync(join(tmpdir(), 'swy-cost-'));
  const targets: Target[] = [];
  try {
    targets.push(await startTarget('tokens', dir));
    targets.push(await startTarget('requests', dir));
    for (let round = 0; round < s.rounds; round++) {
      for (const t of targets) {
        // warm-up (queues fill, virtual times settle past the start, where both flows begin level), then the measured window
        const from = performance.now() + s.warmup * 1000;
        const until = from + s.seconds * 1000;
        await Promise.all([
          ...Array.from({ length: s.clients }, () => client(t, 'long', s.long, s, from, until)),
          ...Array.from({ length: s.clients }, () => client(t, 'short', s.short, s, from, until)),
        ]);
        await sleep(300);
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
  const rows = targets.map((t): CostRow => ({
    mode: t.mode,
    long: t.served.long,
    short: t.served.short,
    tokenRatio: t.served.long.tokens / t.served.short.tokens,
    requestRatio: t.served.long.requests / t.served.short.requests,
  }));
  const json = option(argv, '--json');
  if (json) writeFileSync(json, JSON.stringify({ shape: s, rows }, null, 2));
  return { shape: s, rows };
}

export function costMarkdown(s: Shape, rows: CostRow[]): string {
  let md = '## Cost fairness: tokens vs requests\n\n';
  md +=
    `One simulated engine per router (\`switchyard sim --max-num-seqs 4 --prefill-us-per-token 50 --itl-ms 10\`), a router in front of each ` +
    `with \`flowControl: { enabled: true, admission: { mode: off }, saturation: { maxConcurrency: 4 } }\` and \`fairness: tokens\` on one, ` +
    `\`fairness: requests\` on the other; each in its own process. Two tenants in band standard, ${s.clients} closed-loop clients each ` +
    `(always backlogged): \`long\` sends ${s.long}-token prompts, \`short\` ${s.short}-token prompts, every prompt unique (no prefix cache hit), ` +
    `max_tokens ${s.maxTokens}. Served prompt + output tokens from the answers' usage over ${s.rounds} × ${s.seconds} s windows (each after ${s.warmup} s of the same load, not counted), the routers alternating.\n\n`;
  if (quantum !== undefined) md += `Both routers with \`fairness.newFlowQuantum: ${quantum}\`.\n\n`;
  md += '| fairness | long: requests / tokens | short: requests / tokens | tokens long : short | requests long : short |\n|---|---|---|---|---|\n';
  for (const r of rows) {
    md += `| ${r.mode} | ${r.long.requests} / ${r.long.tokens} | ${r.short.requests} / ${r.short.tokens} | **${fmt(r.tokenRatio, 2)} : 1** | ${fmt(r.requestRatio, 3)} : 1 |\n`;
  }
  const tk = rows.find((r) => r.mode === 'tokens');
  if (tk) {
    const worst = Math.max(tk.tokenRatio, 1 / tk.tokenRatio);
    md += `\nFloor: served tokens within 1.25:1 with \`fairness: tokens\`: ${fmt(worst, 2)}:1, **${worst <= 1.25 ? 'met' : 'not met'}**.\n`;
  }
  return md + '\n';
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const t0 = performance.now();
  const { shape, rows } = await measureCost(process.argv.slice(2));
  console.log(costMarkdown(shape, rows));
  console.error(`cost-fairness: ${fmt((performance.now() - t0) / 1000)} s`);
}
