// Scenario `herding` (issue 32, benchmark 2): do active-active replicas that
// share their load and prefix records pile a burst onto one engine less than
// replicas that each know only their own picks?
//
// Four router processes with the same default config in front of one fleet,
// in two modes in the same run: `off` (no ha: each replica sees only its own
// in-flight requests and the engines' scrapes) and `on` (ha active-active over
// a redis-server the run starts: prefix records and load shared,
// src/ha/fleet.ts). Each mode gets a fresh fleet and fresh routers, then
// `--bursts` bursts: `--burst` chat requests that share one long system prompt
// (new for every burst) with a distinct user question each, sent over
// `--spread-ms` (evenly spaced), to the four routers in turn, as an agent
// framework's fan-out behind an L4 balancer. The next burst starts when the
// previous one has finished and a `--gap-ms` pause has passed.
//
// Per burst: the largest number of its requests that went to one engine (the
// x-switchyard-endpoint header), and the largest engine queue seen (running +
// waiting from every engine's /metrics, sampled every 20 ms, beyond what the
// engine ran before the burst). Reported per mode: the mean over bursts of
// both, the burst's TTFT p90, and the ratios off / on from the same run.
// One router alone (`--single`, on by default) is shown beside them as the
// reference: what one scheduler that sees every pick does with the same bursts.
//
// --engine sim|model|sim,model: the simulator (`switchyard sim`), the
// independent reference engine model (testkit/reference/engine-model.ts), or
// both in turn.
//
//   flock /tmp/switchyard-bench.lock node dist/bench/system/herding.js
//        [--engine sim,model] [--bursts 6] [--burst 32] [--spread-ms 100] [--gap-ms 300]
//        [--routers 4] [--engines 8] [--max-tokens 24] [--no-single] [--json out.json]
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Pool } from 'undici';
import { CLI, freePort, freePortRange, intOption, option, start, stopAll, waitReady } from '../lib/proc.js';
import { fmt, quantile, rng } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';
import { fleetKinds, startEngineFleet, startRedisServer, type FleetKind } from '../lib/fleet.js';

exitOnHelp(import.meta.url);

const BYTES_PER_TOKEN = 4;

interface Fleet {
  engines: number;
  kvCacheBlocks: number;
  blockSize: number;
  maxNumSeqs: number;
  prefillUsPerToken: number;
  prefillOverheadMs: number;
  itlMs: number;
}

interface BurstResult {
  /** Most requests of the burst on one engine. */
  maxOnOne: number;
  /** Engines the burst used. */
  enginesUsed: number;
  /** Largest running + waiting seen on one engine during the burst, beyond its count before it. */
  peakQueue: number;
  ttft: number[];
  errors: number;
}

interface ModeRow {
  engine: string;
  mode: string;
  routers: number;
  bursts: number;
  maxOnOne: number;
  enginesUsed: number;
  peakQueue: number;
  ttftP90: number;
  errors: number;
}

function words(rand: () => number, bytes: number): string {
  const w = ['alpha', 'bravo', 'cargo', 'delta', 'ember', 'forge', 'gamma', 'harbor', 'ionic', 'jolt', 'kernel', 'lumen'];
  let s = '';
  while (s.length < bytes) s += w[Math.floor(rand() * w.length)] + ' ';
  return s.slice(0, bytes);
}

function gauge(text: string, name: string): number {
  const i = text.indexOf('\n' + name + '{');
  if (i < 0) return 0;
  const sp = text.indexOf('} ', i);
  const nl = text.indexOf('\n', sp);
  const v = Number(text.slice(sp + 2, nl < 0 ? undefined : nl));
  return Number.isFinite(v) ? v : 0;
}

async function occupancy(url: string): Promise<number> {
  try {
    const r = await fetch(url + '/metrics');
    const t = '\n' + (await r.text());
    return gauge(t, 'vllm:num_requests_running') + gauge(t, 'vllm:num_requests_waiting');
  } catch {
    return 0;
  }
}

async function send(pool: Pool, body: string, out: BurstResult, where: Map<string, number>): Promise<void> {
  const t0 = performance.now();
  try {
    const r = await pool.request({ method: 'POST', path: '/v1/chat/completions', headers: { 'content-type': 'application/json' }, body });
    const ep = String(r.headers['x-switchyard-endpoint'] ?? '?');
    let first = 0;
    for await (const _ of r.body) if (first === 0) first = performance.now();
    if (r.statusCode !== 200) {
      out.errors++;
      return;
    }
    where.set(ep, (where.get(ep) ?? 0) + 1);
    out.ttft.push(first - t0);
  } catch {
    out.errors++;
  }
}

async function runBurst(pools: Pool[], engineUrls: string[], size: number, spreadMs: number, maxTokens: number, prefix: string, rand: () => number): Promise<BurstResult> {
  const out: BurstResult = { maxOnOne: 0, enginesUsed: 0, peakQueue: 0, ttft: [], errors: 0 };
  const where = new Map<string, number>();
  const before = await Promise.all(engineUrls.map(occupancy));
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      const now = await Promise.all(engineUrls.map(occupancy));
      for (let i = 0; i < now.length; i++) out.peakQueue = Math.max(out.peakQueue, now[i]! - before[i]!);
      await new Promise((r) => setTimeout(r, 20));
    }
  })();
  const t0 = performance.now();
  const pending: Promise<void>[] = [];
  for (let k = 0; k < size; k++) {
    const due = t0 + (size > 1 ? (k * spreadMs) / (size - 1) : 0);
    const d = due - performance.now();
    if (d > 0) await new Promise((r) => setTimeout(r, d));
    const body = JSON.stringify({
      model: 'open-model',
      max_tokens: maxTokens,
      stream: true,
      messages: [
        { role: 'system', content: prefix },
        { role: 'user', content: `task ${k}: ` + words(rand, 64 * BYTES_PER_TOKEN) },
      ],
    });
    pending.push(send(pools[k % pools.length]!, body, out, where));
  }
  await Promise.all(pending);
  sampling = false;
  await sampler;
  for (const n of where.values()) out.maxOnOne = Math.max(out.maxOnOne, n);
  out.enginesUsed = where.size;
  return out;
}

function startEngines(kind: FleetKind, fleet: Fleet, base: number): ReturnType<typeof start> {
  return startEngineFleet(kind === 'model' ? 'engine-model' : 'sim', kind, {
    engines: fleet.engines, basePort: base, slots: fleet.maxNumSeqs, kvCacheBlocks: fleet.kvCacheBlocks, blockSize: fleet.blockSize,
    prefillUsPerToken: fleet.prefillUsPerToken, prefillOverheadMs: fleet.prefillOverheadMs, itlMs: fleet.itlMs,
  });
}

async function runMode(kind: FleetKind, mode: 'off' | 'on' | 'single', routers: number, fleet: Fleet, opts: { bursts: number; burst: number; spreadMs: number; gapMs: number; maxTokens: number; seed: number }, dir: string): Promise<ModeRow> {
  const base = await freePortRange(fleet.engines);
  const engines = startEngines(kind, fleet, base);
  const engineUrls = Array.from({ length: fleet.engines }, (_, i) => `http://127.0.0.1:${base + i}`);
  let redis: ReturnType<typeof start> | null = null;
  const procs: ReturnType<typeof start>[] = [];
  try {
    for (const u of engineUrls) await waitReady(`${u}/health`, 60_000);
    let ha = '';
    if (mode === 'on') {
      const r = await startRedisServer('herding');
      redis = r.proc;
      ha = `ha: { redis: "${r.url}" }\n`;
    }
    const n = mode === 'single' ? 1 : routers;
    const ports: number[] = [];
    for (let k = 0; k < n; k++) ports.push(await freePort());
    const endpoints = engineUrls.map((u, i) => `      - { name: e${i}, url: "${u}" }`).join('\n');
    for (let k = 0; k < n; k++) {
      const cfg = join(dir, `${kind}-${mode}-${k}.yaml`);
      writeFileSync(
        cfg,
        `apiVersion: switchyard/v1\nkind: Router\nlisten: { host: 127.0.0.1, port: ${ports[k]} }\nlogging: { level: warn }\n` +
          `dataLayer: { healthTimeoutMs: 10000 }\n` +
          `pools:\n  - name: p\n    engine: vllm\n    models: [open-model]\n    endpoints:\n${endpoints}\n` +
          ha,
      );
      procs.push(start(`router-${mode}-${k}`, process.execPath, [CLI, 'serve', '--config', cfg]));
    }
    for (const p of ports) await waitReady(`http://127.0.0.1:${p}/readyz`, 60_000);
    const pools = ports.map((p) => new Pool(`http://127.0.0.1:${p}`, { connections: 256 }));
    // warm-up: a few short requests through every router (their request path optimised before the bursts)
    await Promise.all(
      pools.map(async (pool, k) => {
        for (let i = 0; i < 40; i++) {
          const body = JSON.stringify({ model: 'open-model', max_tokens: 1, messages: [{ role: 'user', content: `w${k}.${i}` }] });
          const r = await pool.request({ method: 'POST', path: '/v1/chat/completions', headers: { 'content-type': 'application/json' }, body });
          await r.body.text();
        }
      }),
    );
    await new Promise((r) => setTimeout(r, 300));
    const rand = rng(opts.seed);
    const results: BurstResult[] = [];
    for (let b = 0; b < opts.bursts; b++) {
      // the same prompts in every mode (same seed), new to the fleet in each burst
      const prefix = `[burst ${b}] ` + words(rand, 2048 * BYTES_PER_TOKEN);
      results.push(await runBurst(pools, engineUrls, opts.burst, opts.spreadMs, opts.maxTokens, prefix, rand));
      await new Promise((r) => setTimeout(r, opts.gapMs));
    }
    await Promise.all(pools.map((p) => p.close()));
    const mean = (f: (r: BurstResult) => number) => results.reduce((a, r) => a + f(r), 0) / results.length;
    const row: ModeRow = {
      engine: kind,
      mode,
      routers: n,
      bursts: results.length,
      maxOnOne: mean((r) => r.maxOnOne),
      enginesUsed: mean((r) => r.enginesUsed),
      peakQueue: mean((r) => r.peakQueue),
      ttftP90: quantile(results.flatMap((r) => r.ttft), 0.9),
      errors: results.reduce((a, r) => a + r.errors, 0),
    };
    console.error(
      `${kind} ${mode} (${n} router${n > 1 ? 's' : ''}): per burst of ${opts.burst}: most on one engine ${fmt(row.maxOnOne)} ` +
        `[${results.map((r) => r.maxOnOne).join(' ')}], engines used ${fmt(row.enginesUsed)}, largest engine queue ${fmt(row.peakQueue)} ` +
        `[${results.map((r) => r.peakQueue).join(' ')}], TTFT p90 ${fmt(row.ttftP90)} ms, errors ${row.errors}`,
    );
    return row;
  } finally {
    // the routers first (they drain to the engines and say goodbye on Redis), then what they used
    await stopAll(...procs);
    await stopAll(engines, redis);
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const argv = process.argv.slice(2);
  const arg = (name: string) => option(argv, name);
  const kinds = fleetKinds(arg('--engine'));
  const int = (name: string, dflt: number, min: number) => intOption(argv, name, dflt, min);
  const opts = {
    bursts: int('--bursts', 6, 1),
    burst: int('--burst', 32, 1),
    spreadMs: int('--spread-ms', 100, 0),
    gapMs: int('--gap-ms', 300, 0),
    maxTokens: int('--max-tokens', 24, 1),
    seed: 4242,
  };
  const routers = int('--routers', 4, 2);
  const fleet: Fleet = { engines: int('--engines', 8, 2), kvCacheBlocks: 1216, blockSize: 16, maxNumSeqs: 16, prefillUsPerToken: 50, prefillOverheadMs: 5, itlMs: 20 };
  const modes: Array<'single' | 'off' | 'on'> = argv.includes('--no-single') ? ['off', 'on'] : ['single', 'off', 'on'];
  const dir = mkdtempSync(join(tmpdir(), 'swy-herding-'));
  const rows: ModeRow[] = [];
  for (const kind of kinds) for (const mode of modes) rows.push(await runMode(kind, mode, routers, fleet, opts, dir));
  console.log(
    `fleet: ${fleet.engines} engines (max ${fleet.maxNumSeqs} running each), prefill ${fleet.prefillOverheadMs} ms + ${fleet.prefillUsPerToken} µs/uncached token, ITL ${fleet.itlMs} ms; ` +
      `${opts.bursts} bursts of ${opts.burst} chat requests (a new 2048-token system prompt per burst, a 64-token question each, ${opts.maxTokens} output tokens) ` +
      `spread over ${opts.spreadMs} ms and over ${routers} routers in turn; default scheduling; ${opts.gapMs} ms between bursts\n`,
  );
  console.log('| engine | mode | routers | most of a burst on one engine | engines used | largest engine queue (running + waiting) | TTFT p90 (ms) | errors |');
  console.log('|---|---|---|---:|---:|---:|---:|---:|');
  for (const r of rows) console.log(`| ${r.engine} | ${r.mode} | ${r.routers} | ${fmt(r.maxOnOne)} | ${fmt(r.enginesUsed)} | ${fmt(r.peakQueue)} | ${fmt(r.ttftP90)} | ${r.errors} |`);
  console.log('');
  for (const kind of kinds) {
    const off = rows.find((r) => r.engine === kind && r.mode === 'off');
    const on = rows.find((r) => r.engine === kind && r.mode === 'on');
    const one = rows.find((r) => r.engine === kind && r.mode === 'single');
    if (!off || !on) continue;
    console.log(
      `- ${kind}: largest engine queue without sharing / with = ${fmt(off.peakQueue / on.peakQueue, 2)}× ` +
        `(most of a burst on one engine ${fmt(off.maxOnOne / on.maxOnOne, 2)}×; TTFT p90 ${fmt(off.ttftP90 / on.ttftP90, 2)}×)` +
        (one ? `; with sharing / one router: queue ${fmt(on.peakQueue / one.peakQueue, 2)}×, TTFT p90 ${fmt(on.ttftP90 / one.ttftP90, 2)}×` : ''),
    );
  }
  const json = arg('--json');
  if (json) writeFileSync(json, JSON.stringify({ fleet, opts, rows }, null, 2));
}
