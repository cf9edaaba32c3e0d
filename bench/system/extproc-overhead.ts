// Benchmark: the Envoy ext_proc decision against the same decision over the
// HTTP path (issue 16, benchmark 2).
//
// One router process (`switchyard serve`, proxy.client native, extProc on),
// two simulated engines at --time-scale 0, the load generator in this process.
//   http    POST /v1/chat/completions through the router: parse, admit, pick,
//           relay the engine's answer, complete.
//   extproc a grpc-js client plays Envoy: request headers + body (BUFFERED
//           mode) → the decision (header + envoy.lb metadata), then the
//           response headers with the served endpoint → completion. The data
//           plane's own request to the engine is not sent (it is Envoy's
//           work, not the router's).
//   direct  POST straight to an engine (latency baseline: http − direct is
//           what the router adds on the HTTP path).
// Router CPU per request = utime + stime of the router process over a phase /
// requests. Latency: http and direct per request; extproc from sending the
// headers to receiving the decision (what the data plane waits for).
// Interleaved rounds; medians of the per-round CPU figures, latencies pooled.
//
//   node dist/bench/extproc-overhead.js [--requests 3000] [--concurrency 8] [--rounds 3]
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Pool } from 'undici';
import { CLI, cpuSeconds, freePort, option, runMain, start, waitReady } from '../lib/proc.js';
import { median, quantile } from '../lib/stats.js';
import { decide, extProcClient, respond } from '../../testkit/envoy-client.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const GROUPS = 16;
function body(g: number, q: number): string {
  let sys = `You are assistant ${g}. `;
  for (let i = 0; sys.length < 1000; i++) sys += `Rule ${i} for ${g}: be brief. `;
  return JSON.stringify({ model: 'open-model', max_tokens: 1, messages: [{ role: 'system', content: sys }, { role: 'user', content: `question ${q}` }] });
}

async function runPhase(n: number, conc: number, one: (i: number) => Promise<number>): Promise<number[]> {
  const lat: number[] = [];
  let next = 0;
  await Promise.all(
    Array.from({ length: conc }, async () => {
      while (next < n) {
        const i = next++;
        lat.push(await one(i));
      }
    }),
  );
  return lat;
}

async function main(): Promise<void> {
  const argv = process.argv.slice(2);
  const N = Number(option(argv, '--requests') ?? 3000);
  const C = Number(option(argv, '--concurrency') ?? 8);
  const R = Number(option(argv, '--rounds') ?? 3);
  const e1 = await freePort();
  const e2 = await freePort();
  const engines = [start('engine1', process.execPath, [CLI, 'sim', '--port', String(e1), '--time-scale', '0']), start('engine2', process.execPath, [CLI, 'sim', '--port', String(e2), '--time-scale', '0'])];
  await waitReady(`http://127.0.0.1:${e1}/health`);
  await waitReady(`http://127.0.0.1:${e2}/health`);
  const port = await freePort();
  const grpcPort = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'swy-extproc-bench-'));
  const file = join(dir, 'router.yaml');
  writeFileSync(
    file,
    JSON.stringify({
      apiVersion: 'switchyard/v1',
      kind: 'Router',
      listen: { host: '127.0.0.1', port },
      pools: [{ name: 'p', models: ['open-model'], endpoints: [{ name: 'e1', url: `http://127.0.0.1:${e1}` }, { name: 'e2', url: `http://127.0.0.1:${e2}` }] }],
      proxy: { client: 'native' },
      logging: { level: 'warn' },
      extProc: { host: '127.0.0.1', port: grpcPort },
    }),
  );
  const router = start('router', process.execPath, [CLI, 'serve', '--config', file]);
  await waitReady(`http://127.0.0.1:${port}/readyz`);
  const pid = router.child.pid;
  const pool = new Pool(`http://127.0.0.1:${port}`, { connections: C, pipelining: 1 });
  const direct = new Pool(`http://127.0.0.1:${e1}`, { connections: C, pipelining: 1 });
  const grpc = extProcClient(`127.0.0.1:${grpcPort}`);
  const bodies = Array.from({ length: 256 }, (_, i) => body(i % GROUPS, i));

  const httpOne = (p: Pool) => async (i: number) => {
    const t0 = performance.now();
    const r = await p.request({ method: 'POST', path: '/v1/chat/completions', headers: { 'content-type': 'application/json' }, body: bodies[i % bodies.length] });
    await r.body.arrayBuffer();
    if (r.statusCode !== 200) throw new Error(`HTTP ${r.statusCode}`);
    return performance.now() - t0;
  };
  const grpcOne = async (i: number) => {
    const t0 = performance.now();
    const d = await decide(grpc, bodies[i % bodies.length]);
    const t1 = performance.now();
    if (!d.picked) throw new Error(`ImmediateResponse ${d.status}: ${d.body}`);
    await respond(d.stream, 200, d.endpoint);
    return t1 - t0;
  };

  const modes = { http: httpOne(pool), extproc: grpcOne, direct: httpOne(direct) } as const;
  const cpu: Record<string, number[]> = { http: [], extproc: [], direct: [] };
  const lat: Record<string, number[]> = { http: [], extproc: [], direct: [] };
  // warm-up: JIT, connections, the prefix index
  for (const m of ['http', 'extproc', 'direct'] as const) await runPhase(Math.min(500, N), C, modes[m]);
  const loadStart = (await import('node:os')).loadavg()[0];
  for (let r = 0; r < R; r++) {
    const order = r % 2 === 0 ? (['http', 'extproc', 'direct'] as const) : (['extproc', 'http', 'direct'] as const);
    for (const m of order) {
      const c0 = cpuSeconds(pid);
      const l = await runPhase(N, C, modes[m]);
      const c1 = cpuSeconds(pid);
      cpu[m].push(((c1 - c0) / N) * 1e6);
      lat[m].push(...l);
    }
  }
  const loadEnd = (await import('node:os')).loadavg()[0];
  const row = (m: string) => {
    const xs = Float64Array.from(lat[m]).sort();
    return { cpu: median(cpu[m]), p50: quantile(xs, 0.5), p99: quantile(xs, 0.99), rounds: cpu[m].map((x) => x.toFixed(0)).join(' / ') };
  };
  const h = row('http');
  const g = row('extproc');
  const d = row('direct');
  console.log(`ext_proc vs HTTP decision: ${R} interleaved rounds x ${N} requests, concurrency ${C}; 2 engines (sim --time-scale 0); load average ${loadStart.toFixed(1)} → ${loadEnd.toFixed(1)}`);
  console.log('| path | router CPU µs/req (median; per round) | p50 ms | p99 ms |');
  console.log('|---|---|---:|---:|');
  console.log(`| HTTP (full proxied request) | ${h.cpu.toFixed(0)} (${h.rounds}) | ${h.p50.toFixed(2)} | ${h.p99.toFixed(2)} |`);
  console.log(`| ext_proc decision + completion | ${g.cpu.toFixed(0)} (${g.rounds}) | ${g.p50.toFixed(2)} | ${g.p99.toFixed(2)} |`);
  console.log(`| engine direct (no router) | — | ${d.p50.toFixed(2)} | ${d.p99.toFixed(2)} |`);
  console.log(`ratios: router CPU ext_proc/HTTP = ${((g.cpu / h.cpu) * 100).toFixed(0)} %; latency the router adds on HTTP (p50 http − direct) = ${(h.p50 - d.p50).toFixed(2)} ms vs ext_proc decision p50 ${g.p50.toFixed(2)} ms`);
  grpc.close();
  await pool.close();
  await direct.close();
  await router.stop();
  await Promise.all(engines.map((e) => e.stop()));
}

runMain(main);
