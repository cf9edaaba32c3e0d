// Benchmark: the cost of active-active sharing (issue 32, benchmark 4).
//
// Two `switchyard serve` replicas in front of four simulated engines
// (--time-scale 0: the engines answer at once, so the router's own CPU
// dominates), the same closed-loop load (--concurrency clients, requests
// spread over the two replicas in turn, 64 shared system prompts) with
// sharing off (no `ha`) and on (`ha: { redis }`, active-active), in
// alternating rounds. Reported per mode: router CPU per request
// (process_cpu_seconds_total of both replicas, Δ over the round ÷ requests),
// the throughput, and Redis commands per request and per second (INFO
// commandstats, Δ over the round; sharing's commands do not grow with the
// request rate, so per request is per-rate).
//
//   flock /tmp/switchyard-bench.lock node dist/bench/system/sharing-cost.js [--requests 4000] [--concurrency 16] [--rounds 2] [--pick-flush-ms 5]
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir, loadavg } from 'node:os';
import { join } from 'node:path';
import { Agent, request } from 'undici';
import { CLI, freePort, freePortRange, option, runMain, start, waitReady, type Proc } from '../lib/proc.js';
import { which } from '../lib/proxies.js';
import { median } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const GROUPS = 64;
const PROMPTS = Array.from({ length: GROUPS }, (_, g) => {
  let s = `You are assistant ${g}. `;
  for (let i = 0; s.length < 2000; i++) s += `Rule ${i} of team ${g}: be brief. `;
  return s;
});

async function cpuSeconds(url: string): Promise<number> {
  const r = await request(`${url}/metrics`);
  const text = await r.body.text();
  const m = /^process_cpu_seconds_total (\S+)$/m.exec(text);
  return m ? Number(m[1]) : NaN;
}

function redisCalls(cli: string, port: number): number {
  const out = spawnSync(cli, ['-p', String(port), 'INFO', 'commandstats'], { encoding: 'utf8' }).stdout;
  let n = 0;
  for (const m of out.matchAll(/^cmdstat_(\w+):calls=(\d+)/gm)) if (m[1] !== 'info') n += Number(m[2]);
  return n;
}

interface Round {
  mode: 'off' | 'on';
  requests: number;
  seconds: number;
  cpuUsPerRequest: number;
  redisPerRequest: number;
  redisPerSecond: number;
  failed: number;
}

// --pick-flush-ms N: ha.pickFlushMs of the sharing replicas (default: the router's default)
const PICK_FLUSH_MS = option(process.argv.slice(2), '--pick-flush-ms') !== undefined ? Number(option(process.argv.slice(2), '--pick-flush-ms')) : undefined;

async function round(mode: 'off' | 'on', engines: string[], redisPort: number, cli: string, total: number, conc: number, dir: string): Promise<Round> {
  const ports = [await freePort(), await freePort()];
  const procs: Proc[] = ports.map((port, k) => {
    const file = join(dir, `${mode}-${k}.json`);
    writeFileSync(
      file,
      JSON.stringify({
        apiVersion: 'switchyard/v1',
        kind: 'Router',
        listen: { host: '127.0.0.1', port },
        pools: [{ name: 'p', models: ['open-model'], endpoints: engines.map((url, i) => ({ name: `e${i}`, url })) }],
        logging: { level: 'warn' },
        ...(mode === 'on' ? { ha: { redis: `redis://127.0.0.1:${redisPort}`, key: `cost-${Date.now()}`, ...(PICK_FLUSH_MS !== undefined ? { pickFlushMs: PICK_FLUSH_MS } : {}) } } : {}),
      }),
    );
    return start(`router-${mode}-${k}`, process.execPath, [CLI, 'serve', '--config', file]);
  });
  const urls = ports.map((p) => `http://127.0.0.1:${p}`);
  for (const u of urls) await waitReady(`${u}/readyz`, 60_000);
  const agent = new Agent({ connections: conc, keepAliveTimeout: 10_000 });
  const one = async (i: number): Promise<boolean> => {
    try {
      const res = await request(`${urls[i % 2]}/v1/chat/completions`, {
        method: 'POST',
        dispatcher: agent,
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'open-model', max_tokens: 8, messages: [{ role: 'system', content: PROMPTS[i % GROUPS] }, { role: 'user', content: `q${i}` }] }),
      });
      await res.body.arrayBuffer();
      return res.statusCode === 200;
    } catch {
      return false;
    }
  };
  // warm-up (JIT, connections), not counted
  let next = 0;
  const run = async (n: number) => {
    let failed = 0;
    const end = next + n;
    await Promise.all(
      Array.from({ length: conc }, async () => {
        while (next < end) if (!(await one(next++))) failed++;
      }),
    );
    return failed;
  };
  await run(500);
  const cpu0 = (await Promise.all(urls.map(cpuSeconds))).reduce((a, b) => a + b, 0);
  const r0 = redisCalls(cli, redisPort);
  const t0 = performance.now();
  const failed = await run(total);
  const seconds = (performance.now() - t0) / 1000;
  const r1 = redisCalls(cli, redisPort);
  const cpu1 = (await Promise.all(urls.map(cpuSeconds))).reduce((a, b) => a + b, 0);
  await agent.close();
  for (const p of procs) await p.stop();
  return { mode, requests: total, seconds, cpuUsPerRequest: ((cpu1 - cpu0) * 1e6) / total, redisPerRequest: (r1 - r0) / total, redisPerSecond: (r1 - r0) / seconds, failed };
}

async function main(): Promise<void> {
  const argv = process.argv.slice(2);
  const total = Number(option(argv, '--requests') ?? 4000);
  const conc = Number(option(argv, '--concurrency') ?? 16);
  const rounds = Number(option(argv, '--rounds') ?? 2);
  const bin = which('redis-server');
  if (!bin) throw new Error('redis-server not found (apt-get install redis-server)');
  const cli = bin.replace('redis-server', 'redis-cli');
  const redisPort = await freePort();
  const redis = start('redis', bin, ['--port', String(redisPort), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no']);
  await new Promise((r) => setTimeout(r, 300));
  const base = await freePortRange(4);
  const sim = start('sim', process.execPath, [CLI, 'sim', '--fleet', '4', '--base-port', String(base), '--time-scale', '0']);
  const engines = Array.from({ length: 4 }, (_, i) => `http://127.0.0.1:${base + i}`);
  for (const u of engines) await waitReady(`${u}/health`, 60_000);
  const dir = mkdtempSync(join(tmpdir(), 'swy-share-cost-'));
  const load0 = loadavg()[0];
  const results: Round[] = [];
  try {
    for (let k = 0; k < rounds; k++) for (const mode of k % 2 === 0 ? (['off', 'on'] as const) : (['on', 'off'] as const)) results.push(await round(mode, engines, redisPort, cli, total, conc, dir));
  } finally {
    await sim.stop();
    await redis.stop();
  }
  if (PICK_FLUSH_MS !== undefined) console.log(`ha.pickFlushMs of the sharing replicas: ${PICK_FLUSH_MS}`);
  console.log(`sharing cost: 2 replicas → 4 sim engines (--time-scale 0), ${conc} closed-loop clients, ${total} requests per round after 500 of warm-up, ${rounds} rounds per mode (alternating); load average ${load0.toFixed(1)} → ${loadavg()[0].toFixed(1)}`);
  console.log('| round | sharing | req/s | router CPU µs / request (both replicas) | Redis commands / request | Redis commands / s | failed |');
  console.log('|---:|---|---:|---:|---:|---:|---:|');
  results.forEach((r, i) => console.log(`| ${i + 1} | ${r.mode} | ${(r.requests / r.seconds).toFixed(0)} | ${r.cpuUsPerRequest.toFixed(0)} | ${r.redisPerRequest.toFixed(4)} | ${r.redisPerSecond.toFixed(1)} | ${r.failed} |`));
  const med = (m: 'off' | 'on') => median(results.filter((r) => r.mode === m).map((r) => r.cpuUsPerRequest));
  console.log(`median router CPU per request: on ${med('on').toFixed(0)} µs, off ${med('off').toFixed(0)} µs: on / off ${(med('on') / med('off')).toFixed(3)}×`);
}

runMain(main);
