// Scenario `tenant-isolation` (#29): does a tenant at its rate limit slow
// another tenant?
//
// One fleet of simulated engines (`--engines`, 4; --max-num-seqs 32, 10 ms a
// token) behind a router with `auth` keys for two tenants. The quiet tenant
// `b` sends non-streamed completions of 16 tokens as a Poisson process at
// `--quiet-rate` (30/s); the noisy tenant `a` sends completions of 64 tokens
// at `--noisy-rate` (300/s, open loop: it does not slow down when refused).
// Arms, each on a fresh fleet and router (in this process), the same arrival
// times for b in every arm:
//
//   alone      no rateLimits; only b sends (the baseline);
//   limited    rateLimits.tenants.a.requestsPerMinute = --noisy-limit (120: a burst of
//              120, then 2/s); a floods at --noisy-rate, nearly all of its requests are
//              answered 429 by the router, the rest run on the engines beside b's;
//   unlimited  no rateLimits; a floods and every request of it reaches the engines
//              (what the limit protects b from).
//
// b starts `--warmup` seconds (2) after a, so that in `limited` a has spent
// its burst and is at its limit through all of b's requests (the burst itself
// is allowed traffic and runs on the engines: with --warmup 0 it is measured too).
// Reported per arm: b's latency p50/p99 (from the scheduled send time), b's
// errors, a's requests sent / served / refused (429). The figure: b's p50 and
// p99 in `limited` over `alone` (1.0 = no slow-down).
//
//   flock /tmp/switchyard-bench.lock node dist/bench/system/tenant-isolation.js [--seconds 5] [--warmup 2] [--quiet-rate 30] [--noisy-rate 300] [--noisy-limit 120] [--engines 4] [--arms alone,limited,unlimited]
import { createHash } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { Pool } from 'undici';
import { startFleet } from '../../src/sim/index.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { registry } from '../../src/scheduler/plugins/index.js';
import { startRouter } from '../../src/server/router.js';
import { option, runMain } from '../lib/proc.js';
import { expGap, fmt, quantile, rng } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const argv = process.argv.slice(2);
const SECONDS = Number(option(argv, '--seconds') ?? '5');
const QUIET_RATE = Number(option(argv, '--quiet-rate') ?? '30');
const NOISY_RATE = Number(option(argv, '--noisy-rate') ?? '300');
/** Tenant a's requests a minute in `limited` (GCRA: a burst of this many, then this many a minute). */
const NOISY_LIMIT = Number(option(argv, '--noisy-limit') ?? '120');
const ENGINES = Number(option(argv, '--engines') ?? '4');
const WARMUP = Number(option(argv, '--warmup') ?? '2');
type ArmName = 'alone' | 'limited' | 'unlimited';
const ARMS = (option(argv, '--arms') ?? 'alone,limited,unlimited').split(',') as ArmName[];
for (const a of ARMS) if (!['alone', 'limited', 'unlimited'].includes(a)) throw new Error(`--arms: unknown arm "${a}" (alone, limited, unlimited)`);

const KEY_A = 'sk-isolation-noisy-tenant-a';
const KEY_B = 'sk-isolation-quiet-tenant-b';
const sha = (k: string) => createHash('sha256').update(k).digest('hex');

/** Send times (ms from the start) of a Poisson process at `rate` over SECONDS, from `seed`. */
function arrivals(rate: number, seed: number, from: number, to: number): number[] {
  const r = rng(seed);
  const out: number[] = [];
  for (let t = from + expGap(r, rate) * 1000; t < to; t += expGap(r, rate) * 1000) out.push(t);
  return out;
}

interface ArmResult {
  arm: ArmName;
  bSent: number;
  bP50: number;
  bP99: number;
  bErrors: number;
  aSent: number;
  aServed: number;
  aRefused: number;
}

async function arm(name: ArmName, quiet: number[], noisy: number[]): Promise<ArmResult> {
  const fleet = await startFleet(ENGINES, { timeScale: 1, itlMs: 10, prefillOverheadMs: 2, prefillUsPerToken: 20, maxNumSeqs: 32 });
  const cfg = validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [{ name: 'p', models: ['open-model'], endpoints: fleet.urls.map((url, i) => ({ name: `e${i}`, url })) }],
      logging: { level: 'silent' },
      auth: { keys: [{ digest: sha(KEY_A), tenant: 'a' }, { digest: sha(KEY_B), tenant: 'b' }] },
      ...(name === 'limited' ? { rateLimits: { tenants: { a: { requestsPerMinute: NOISY_LIMIT } } } } : {}),
    },
    (kind, s) => registry.validate(kind, s.type, s.params),
  );
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  const pool = new Pool(router.url, { connections: 1024, pipelining: 1 });
  const bLat: number[] = [];
  let bErrors = 0;
  let aServed = 0;
  let aRefused = 0;
  const t0 = performance.now() + 100;
  const one = async (at: number, key: string, tokens: number, i: number): Promise<number> => {
    const wait = t0 + at - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    try {
      const res = await pool.request({
        path: '/v1/completions',
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
        body: JSON.stringify({ model: 'open-model', prompt: `request ${i}: ${Math.random().toString(36)} write a short note`, max_tokens: tokens }),
      });
      await res.body.dump();
      return res.statusCode;
    } catch {
      return 0;
    }
  };
  await Promise.all([
    ...quiet.map(async (at, i) => {
      const s = await one(at, KEY_B, 16, i);
      if (s === 200) bLat.push(performance.now() - (t0 + at));
      else bErrors++;
    }),
    ...(name === 'alone'
      ? []
      : noisy.map(async (at, i) => {
          const s = await one(at, KEY_A, 64, i);
          if (s === 200) aServed++;
          else if (s === 429) aRefused++;
        })),
  ]);
  await pool.close();
  await router.close(200);
  await fleet.close();
  return { arm: name, bSent: quiet.length, bP50: quantile(bLat, 0.5), bP99: quantile(bLat, 0.99), bErrors, aSent: name === 'alone' ? 0 : noisy.length, aServed, aRefused };
}

runMain(async () => {
  const quiet = arrivals(QUIET_RATE, 29, WARMUP * 1000, (WARMUP + SECONDS) * 1000);
  const noisy = arrivals(NOISY_RATE, 30, 0, (WARMUP + SECONDS) * 1000);
  const runs: ArmResult[] = [];
  for (const a of ARMS) runs.push(await arm(a, quiet, noisy));
  console.log(`${ENGINES} engines (32 seqs, 10 ms/token); b: ${QUIET_RATE}/s × 16 tokens; a: ${NOISY_RATE}/s × 64 tokens, limit ${NOISY_LIMIT}/min in 'limited'; b over ${SECONDS} s from ${WARMUP} s after a's start`);
  console.log('| arm | b requests | b p50 ms | b p99 ms | b errors | a sent | a served | a refused (429) |');
  console.log('|---|---:|---:|---:|---:|---:|---:|---:|');
  for (const r of runs) console.log(`| ${r.arm} | ${r.bSent} | ${fmt(r.bP50)} | ${fmt(r.bP99)} | ${r.bErrors} | ${r.aSent} | ${r.aServed} | ${r.aRefused} |`);
  const by = (n: ArmName) => runs.find((r) => r.arm === n);
  const [alone, limited, unlimited] = [by('alone'), by('limited'), by('unlimited')];
  if (alone && limited) console.log(`b with a at its limit / b alone: p50 ${fmt(limited.bP50 / alone.bP50, 2)}×, p99 ${fmt(limited.bP99 / alone.bP99, 2)}×`);
  if (alone && unlimited) console.log(`b with a unlimited / b alone: p50 ${fmt(unlimited.bP50 / alone.bP50, 2)}×, p99 ${fmt(unlimited.bP99 / alone.bP99, 2)}×`);
});
