// Scenario `mixed-fleet`: predicted-latency scheduling with a TTFT objective on
// a fleet of 2 fast and 2 slow simulated engines (slow = 3× the per-token
// prefill and decode costs: `switchyard sim --accelerator sim-slow`), against
// the router's default scorers (prefix-cache 3, queue 2, kv-cache-utilization
// 2) and round-robin, at several request rates.
//
// Workload: Poisson arrivals of streamed completions with unique prompts (no
// prefix reuse, so every prompt token is prefill work) of mixed length: 70 %
// short (100–700 tokens), 30 % long (2500–4000 tokens); 16 output tokens;
// every request carries `x-slo-ttft-ms` (ignored by the other policies). The
// objective is set so a long prompt can meet it on a fast engine only and
// the fast engines alone cannot carry the higher rates: the slow ones must
// take the short prompts.
//
// Per policy and rate, fresh engines and a fresh router (no learned state or
// queue carries over). Reported: SLO attainment (client-measured TTFT ≤ the
// objective; errors count as misses), TTFT p50/p90, and for predicted-latency
// the router's own prediction error (median absolute percentage error of the
// predicted TTFT, per endpoint, from /metrics: switchyard_latency_ttft_error_ratio).
//
// Engines (`--engine`): `sim` (the simulator, serial prefill) or `parallel`
// (bench/lib/parallel-engine.ts: an independent engine whose prefill runs in
// parallel up to its slots), one process each, the slow ones at 3× the costs.
// By default the router is told nothing of the engines' speeds (one pool, no
// accelerator: it must learn them); `--declare` puts them in two pools with
// accelerators sim-fast / sim-slow. `nginx` is nginx round-robin over the same
// four engines (its default balancing; skipped when nginx is not installed).
// `--one-token`: the hold-out shape: non-streamed answers of one token (TTFT
// = the whole answer).
//
//   node dist/bench/system/mixed-fleet.js [--engine sim|parallel] [--rates 10,20,30,40] [--seconds 12] [--slo-ms 200] [--us-per-token 50]
//        [--margin 0.2] [--policies predicted-latency,default,round-robin,nginx] [--declare] [--one-token]
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Pool } from 'undici';
import { CLI, ROOT, freePort, freePortRange, start, waitReady, option, runMain, type Proc } from '../lib/proc.js';
import { startNginxRoundRobin } from '../lib/proxies.js';
import { expGap, fmt, quantile, rng } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const argv = process.argv.slice(2);
const rates = (option(argv, '--rates') ?? '10,20,30,40').split(',').map(Number);
const seconds = Number(option(argv, '--seconds') ?? '12');
const sloMs = Number(option(argv, '--slo-ms') ?? '200');
const margin = Number(option(argv, '--margin') ?? '0.2');
const usPerToken = Number(option(argv, '--us-per-token') ?? '50');
const engine = option(argv, '--engine') ?? 'sim';
const declare = argv.includes('--declare');
const oneToken = argv.includes('--one-token');
/** `--trace`: per engine, the share of requests and the mean / max running and waiting counts its /metrics reported (sampled every 100 ms), and the router's learned speeds each second (stderr). */
const trace = argv.includes('--trace');
const policies = (option(argv, '--policies') ?? 'predicted-latency,default,round-robin,nginx').split(',');
if (engine !== 'sim' && engine !== 'parallel') throw new Error(`--engine must be sim or parallel, not ${engine}`);

/** Engine costs of the fast (reference) engines; the slow ones take 3× (profile sim-slow). */
const ENGINE = ['--time-scale', '1', '--prefill-overhead-ms', '5', '--prefill-us-per-token', String(usPerToken), '--itl-ms', '5', '--decode-slowdown', '0.01', '--max-num-seqs', '64', '--kv-cache-blocks', '65536'];
const PARALLEL = ['--prefill-ms', '5', '--us-per-token', String(usPerToken), '--itl-ms', '5', '--decode-slowdown', '0.01', '--slots', '64'];
const OUTPUT_TOKENS = oneToken ? 1 : 16;

const POLICY: Record<string, string> = {
  // reference costs of the sim-fast profile, as an operator would state them (250 µs per 4-byte token = 62.5 ms per KB)
  'predicted-latency': `scheduling:\n  scorers:\n    - { type: predicted-latency, params: { ttftMs: ${sloMs}, margin: ${margin}, ttftBaseMs: 5, prefillMsPerKB: ${usPerToken / 4}, itlMs: 5, itlPerRunningMs: 0.05 } }\n`,
  default: '',
  'round-robin': 'scheduling:\n  scorers: []\n  picker: round-robin\n',
};

interface Row {
  policy: string;
  rate: number;
  sent: number;
  errors: number;
  attainment: number;
  p50: number;
  p90: number;
  apes: number[];
  slowShare: number;
}

function prompt(rand: () => number, i: number): string {
  const long = rand() < 0.3;
  const tokens = long ? 2500 + Math.floor(rand() * 1500) : 100 + Math.floor(rand() * 600);
  // 4 bytes per token in the simulator; a unique head so nothing is shared
  const head = `req ${i} ${rand().toString(36).slice(2)} `;
  return head + 'lorem ipsum '.repeat(Math.ceil((tokens * 4 - head.length) / 12)).slice(0, Math.max(0, tokens * 4 - head.length));
}

async function one(pool: Pool, body: string, ttfts: number[], slow: Set<string>, counts: { slow: number; errors: number; by: Map<string, number> }): Promise<void> {
  const t0 = performance.now();
  try {
    const r = await pool.request({ method: 'POST', path: '/v1/completions', headers: { 'content-type': 'application/json', 'x-slo-ttft-ms': String(sloMs) }, body });
    const picked = String(r.headers['x-switchyard-endpoint']);
    if (slow.has(picked)) counts.slow++;
    if (trace) counts.by.set(picked, (counts.by.get(picked) ?? 0) + 1);
    if (r.statusCode !== 200) {
      await r.body.dump();
      counts.errors++;
      ttfts.push(Infinity);
      return;
    }
    let first = 0;
    let last = 0;
    for await (const _ of r.body) {
      last = performance.now();
      if (first === 0) first = last;
    }
    // one-token answers: the whole answer is the first token
    ttfts.push(first === 0 ? Infinity : (oneToken ? last : first) - t0);
  } catch {
    counts.errors++;
    ttfts.push(Infinity);
  }
}

async function run(policy: string, rate: number, dir: string): Promise<Row> {
  const procs: Proc[] = [];
  const fastPort = await freePortRange(2);
  const slowPort = await freePortRange(2);
  try {
    // one process per engine (a fleet process would share one event loop between two engines)
    const ports = [fastPort, fastPort + 1, slowPort, slowPort + 1];
    ports.forEach((p, i) =>
      procs.push(
        engine === 'sim'
          ? start(i < 2 ? `fast${i}` : `slow${i - 2}`, process.execPath, [CLI, 'sim', ...ENGINE, '--port', String(p), '--accelerator', i < 2 ? 'sim-fast' : 'sim-slow'])
          : start(i < 2 ? `fast${i}` : `slow${i - 2}`, process.execPath, [`${ROOT}/dist/bench/lib/parallel-engine.js`, ...PARALLEL, '--fleet', '1', '--base-port', String(p), '--cost-factors', i < 2 ? '1' : '3']),
      ),
    );
    const urls = ports.map((p) => `http://127.0.0.1:${p}`);
    for (const u of urls) await waitReady(`${u}/health`, 60000);
    const port = await freePort();
    let url = `http://127.0.0.1:${port}`;
    if (policy === 'nginx') {
      const ng = startNginxRoundRobin(port, ports);
      if (ng === null) throw new Error('nginx is not installed');
      procs.push(ng);
      await waitReady(`${url}/health`, 20000);
    } else {
      const file = join(dir, `${policy}-${rate}.yaml`);
      const pools = declare
        ? `  - { name: fast, accelerator: sim-fast, models: [open-model], endpoints: [{ name: f0, url: "${urls[0]}" }, { name: f1, url: "${urls[1]}" }] }\n` +
          `  - { name: slow, accelerator: sim-slow, models: [open-model], endpoints: [{ name: s0, url: "${urls[2]}" }, { name: s1, url: "${urls[3]}" }] }\n`
        : `  - { name: fleet, models: [open-model], endpoints: [{ name: f0, url: "${urls[0]}" }, { name: f1, url: "${urls[1]}" }, { name: s0, url: "${urls[2]}" }, { name: s1, url: "${urls[3]}" }] }\n`;
      writeFileSync(file, `apiVersion: switchyard/v1\nkind: Router\nlisten: { host: 127.0.0.1, port: ${port} }\nlogging: { level: warn }\npools:\n` + pools + POLICY[policy]);
      procs.push(start('router', process.execPath, [CLI, 'serve', '--config', file]));
      url = `http://127.0.0.1:${port}`;
      await waitReady(`${url}/readyz`, 60000);
    }
    if (process.env.MIXED_DEBUG) console.error(`router ready`);
    const pool = new Pool(url, { connections: 512, pipelining: 1 });
    const rand = rng(rate * 7919 + 1);
    const ttfts: number[] = [];
    const counts = { slow: 0, errors: 0, by: new Map<string, number>() };
    const gauges = urls.map(() => ({ n: 0, running: 0, waiting: 0, maxRunning: 0, maxWaiting: 0 }));
    let sampling = trace;
    const sampler = (async () => {
      let tick = 0;
      while (sampling) {
        await Promise.all(
          urls.map(async (u, k) => {
            try {
              const text = await (await fetch(`${u}/metrics`)).text();
              const g = gauges[k]!;
              const run = Number(/^vllm:num_requests_running\S* ([0-9.]+)$/m.exec(text)?.[1] ?? NaN);
              const wait = Number(/^vllm:num_requests_waiting\S* ([0-9.]+)$/m.exec(text)?.[1] ?? NaN);
              if (!Number.isFinite(run) || !Number.isFinite(wait)) return;
              g.n++;
              g.running += run;
              g.waiting += wait;
              g.maxRunning = Math.max(g.maxRunning, run);
              g.maxWaiting = Math.max(g.maxWaiting, wait);
            } catch {
              /* an engine busy past the sample: skipped */
            }
          }),
        );
        if (policy !== 'nginx' && ++tick % 10 === 0) {
          try {
            const m = await (await fetch(`${url}/metrics`)).text();
            const sp = [...m.matchAll(/^switchyard_endpoint_speed_ms_per_ktok\{endpoint="([^"]+)"\} ([0-9.e+-]+)$/gm)].map((x) => `${x[1]} ${fmt(Number(x[2]), 0)}`);
            console.error(`  ${policy} ${rate} t=${tick / 10}s speed ms/ktok: ${sp.join(', ')}`);
          } catch {
            /* skipped */
          }
        }
        await new Promise((r) => setTimeout(r, 100));
      }
    })();
    const pending: Promise<void>[] = [];
    const end = performance.now() + seconds * 1000;
    let next = performance.now();
    let i = 0;
    while (next < end) {
      const wait = next - performance.now();
      if (wait > 1) await new Promise((r) => setTimeout(r, wait));
      pending.push(one(pool, JSON.stringify({ model: 'open-model', prompt: prompt(rand, i), max_tokens: OUTPUT_TOKENS, stream: !oneToken }), ttfts, new Set(['s0', 's1']), counts));
      i++;
      next += expGap(rand, rate) * 1000;
    }
    if (process.env.MIXED_DEBUG) console.error(`sent ${i}, waiting`);
    await Promise.all(pending);
    sampling = false;
    await sampler;
    if (trace) {
      const names = ['f0', 'f1', 's0', 's1'];
      console.error(
        `  ${policy} ${rate}: ` +
          names
            .map((nm, k) => {
              const g = gauges[k]!;
              const share = policy === 'nginx' ? '25' : fmt(((counts.by.get(nm) ?? 0) / Math.max(1, i)) * 100, 0);
              return `${nm} ${share} % running ${fmt(g.running / Math.max(1, g.n), 1)} (max ${g.maxRunning}) waiting ${fmt(g.waiting / Math.max(1, g.n), 1)} (max ${g.maxWaiting})`;
            })
            .join('; '),
      );
    }
    if (process.env.MIXED_DEBUG) console.error(`done`);
    const metrics = policy === 'nginx' ? '' : await (await fetch(`${url}/metrics`)).text();
    const apes = [...metrics.matchAll(/^switchyard_latency_ttft_error_ratio\{endpoint="([^"]+)"\} ([0-9.e+-]+)$/gm)].map((m) => Number(m[2]));
    await pool.close();
    const finite = ttfts.filter(Number.isFinite).sort((a, b) => a - b);
    const all = [...ttfts].sort((a, b) => a - b);
    return {
      policy,
      rate,
      sent: i,
      errors: counts.errors,
      attainment: ttfts.filter((x) => x <= sloMs).length / Math.max(1, ttfts.length),
      p50: quantile(all, 0.5),
      p90: quantile(all, 0.9),
      apes,
      slowShare: counts.slow / Math.max(1, i),
    };
    void finite;
  } finally {
    await Promise.all(procs.map((p) => p.stop()));
  }
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'swy-mixed-'));
  console.log(`mixed-fleet (${engine === 'sim' ? 'simulator, serial prefill' : 'parallel-prefill engine'}; speeds ${declare ? 'declared' : 'not declared: learned'}${oneToken ? '; non-streamed one-token answers' : ''}): 2 fast + 2 slow (3×) engines, ${usPerToken} µs per prompt token on a fast one, TTFT objective ${sloMs} ms (predicted-latency margin ${margin}), ${seconds} s per run, rates ${rates.join(', ')} req/s, ${OUTPUT_TOKENS} output tokens, prompts 70 % 100–700 / 30 % 2500–4000 tokens`);
  console.log('| policy | rate (req/s) | sent | errors | SLO attainment | TTFT p50 (ms) | TTFT p90 (ms) | share on slow engines | prediction MdAPE per endpoint |');
  console.log('|---|---:|---:|---:|---:|---:|---:|---:|---|');
  const rows: Row[] = [];
  for (const rate of rates) {
    for (const policy of policies) {
      let r: Row;
      try {
        r = await run(policy, rate, dir);
      } catch (err) {
        // a run that could not start (an overloaded machine) is reported, not fatal to the others
        console.log(`| ${policy} | ${rate} | run failed: ${(err as Error).message} |`);
        continue;
      }
      rows.push(r);
      console.log(
        `| ${r.policy} | ${r.rate} | ${r.sent} | ${r.errors} | ${fmt(r.attainment * 100)} % | ${fmt(r.p50, 0)} | ${fmt(r.p90, 0)} | ${r.policy === 'nginx' ? '50 % (round-robin)' : fmt(r.slowShare * 100, 0) + ' %'} | ${r.apes.length ? r.apes.map((a) => fmt(a * 100) + ' %').join(', ') : '–'} |`,
      );
    }
  }
  // per rate: default against nginx round-robin (floor ≥ 1 everywhere, ≥ 1.3 at the saturating rate), predicted-latency against default (floor ≥ 1)
  console.log('\n| rate (req/s) | default / nginx round-robin | predicted-latency / default |\n|---:|---:|---:|');
  for (const rate of rates) {
    const a = (p: string) => rows.find((r) => r.policy === p && r.rate === rate)?.attainment;
    const d = a('default');
    const n = a('nginx') ?? a('round-robin');
    const pl = a('predicted-latency');
    const ratio = (x?: number, y?: number) => (x === undefined || y === undefined ? '–' : y === 0 ? (x > 0 ? '∞' : '–') : `${fmt(x / y, 2)}×`);
    console.log(`| ${rate} | ${ratio(d, n)} | ${ratio(pl, d)} |`);
  }
  // the floors: at the highest rate where the default scorers reach 80 % attainment
  const def = rows.filter((r) => r.policy === 'default' && r.attainment >= 0.8).sort((a, b) => b.rate - a.rate)[0];
  if (def) {
    const pl = rows.find((r) => r.policy === 'predicted-latency' && r.rate === def.rate);
    if (pl) {
      console.log(
        `\nat ${def.rate} req/s (highest rate where default ≥ 80 %): predicted-latency attainment ${fmt(pl.attainment * 100)} % (floor 95 %), ` +
          `TTFT p90 default / predicted = ${fmt(def.p90 / pl.p90, 2)}× (floor 1.5×), prediction MdAPE max over endpoints ${fmt(Math.max(...pl.apes) * 100)} % (floor ≤ 20 %)`,
      );
    }
  } else console.log('\nthe default scorers reached 80 % attainment at none of these rates');
}

runMain(main);
