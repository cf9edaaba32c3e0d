// Throughput of the engine simulator at --time-scale 0 against baselines in
// the same run, each server in its own process (pinned to one core with
// taskset when available), the load generator in another process.
//
//   npm run bench:sim                      # all scenarios, 5 s each
//   node dist/bench/sim-bench.js --duration 10 --connections 64 --rounds 3 [--only sim,uws-fixed,fidelity] [--no-wrk] [--no-fidelity]
//
// Servers:
//   sim          switchyard sim (one engine, time-scale 0), small non-streaming completions
//   sim-stream   the same with stream: true (16 SSE chunks + [DONE] per request)
//   uws-fixed    a uWebSockets.js server that reads the body and answers a fixed
//                body of the same size as the sim's answer (the ceiling: HTTP only)
//   node-fixed   the same on node:http (what a plain Node server does)
// Load: wrk (1 thread) when installed, else a closed-loop undici generator.
// Then `fidelity`: at time-scale 1, client-measured TTFT and end-to-end times
// against the latency model's values.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { cpuSeconds } from '../lib/proc.js';
import { median } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const SELF = fileURLToPath(import.meta.url);
const BODY = JSON.stringify({ model: 'open-model', prompt: 'Say hello to the benchmark, briefly.', max_tokens: 8 });
const STREAM_BODY = JSON.stringify({ model: 'open-model', prompt: 'Say hello to the benchmark, briefly.', max_tokens: 16, stream: true });

/** The engine of the fidelity scenario: real time (time-scale 1). */
const TIMED = { timeScale: 1, prefillOverheadMs: 5, prefillUsPerToken: 50, itlMs: 20, decodeSlowdown: 0.01, maxNumSeqs: 8 };

const { values } = parseArgs({
  options: {
    serve: { type: 'string' },
    load: { type: 'string' },
    port: { type: 'string', default: '0' },
    duration: { type: 'string', default: '5' },
    connections: { type: 'string', default: '64' },
    rounds: { type: 'string', default: '3' },
    body: { type: 'string', default: BODY },
    'fixed-body': { type: 'string', default: '' },
    only: { type: 'string' },
    'no-wrk': { type: 'boolean', default: false },
    'no-fidelity': { type: 'boolean', default: false },
  },
});

// ---------------------------------------------------------------- servers

async function serve(kind: string, port: number, fixedBody: string): Promise<void> {
  let actual = 0;
  if (kind === 'sim') {
    const { startEngine } = await import('../../src/sim/index.js');
    const e = await startEngine({ port, timeScale: 0 });
    actual = e.port;
  } else if (kind === 'sim-timed') {
    const { startEngine } = await import('../../src/sim/index.js');
    const e = await startEngine({ port, ...TIMED });
    actual = e.port;
  } else if (kind === 'uws-fixed') {
    const { uws } = await import('../../src/uws.js');
    const app = uws.App();
    app.post('/*', (res) => {
      res.onAborted(() => {});
      res.onData((_chunk, last) => {
        if (last) res.cork(() => res.writeHeader('Content-Type', 'application/json').end(fixedBody));
      });
    });
    actual = await new Promise<number>((resolve, reject) =>
      app.listen('127.0.0.1', port, (s) => (s ? resolve(uws.us_socket_local_port(s as never)) : reject(new Error('listen failed')))),
    );
  } else if (kind === 'node-fixed') {
    const srv = http.createServer({ keepAliveTimeout: 60_000 }, (req, res) => {
      req.on('data', () => {});
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(fixedBody) });
        res.end(fixedBody);
      });
    });
    actual = await new Promise<number>((resolve) => srv.listen(port, '127.0.0.1', () => resolve((srv.address() as { port: number }).port)));
  } else throw new Error(`unknown server ${kind}`);
  process.stdout.write(`LISTENING ${actual}\n`);
}

// ---------------------------------------------------------------- JS load generator (fallback)

async function load(url: string, seconds: number, connections: number, body: string): Promise<void> {
  const { Pool } = await import('undici');
  const pool = new Pool(url, { connections, pipelining: 1, keepAliveTimeout: 60_000 });
  const payload = Buffer.from(body);
  const headers = ['content-type', 'application/json'];
  let ok = 0;
  let bad = 0;
  let running = true;
  const loop = async () => {
    while (running) {
      try {
        const r = await pool.request({ path: '/v1/completions', method: 'POST', headers, body: payload });
        await r.body.dump();
        if (r.statusCode === 200) ok++;
        else bad++;
      } catch {
        bad++;
      }
    }
  };
  // 1 s warm-up, then measure.
  const workers = Array.from({ length: connections }, loop);
  await new Promise((r) => setTimeout(r, 1000));
  const ok0 = ok;
  const t0 = performance.now();
  await new Promise((r) => setTimeout(r, seconds * 1000));
  const rps = ((ok - ok0) * 1000) / (performance.now() - t0);
  running = false;
  await Promise.all(workers);
  await pool.close();
  process.stdout.write(JSON.stringify({ rps, errors: bad, requests: ok }) + '\n');
}

// ---------------------------------------------------------------- runner

// Probed by main() only (the server and load child processes skip them).
let hasTaskset = false;
let hasWrk = false;

function pinned(cpu: number, cmd: string, args: string[]): [string, string[]] {
  return hasTaskset ? ['taskset', ['-c', String(cpu), cmd, ...args]] : [cmd, args];
}

async function startServer(kind: string, fixedBody: string): Promise<{ child: ChildProcess; port: number }> {
  const [cmd, args] = pinned(0, process.execPath, [SELF, '--serve', kind, '--fixed-body', fixedBody]);
  const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'inherit'] });
  const port = await new Promise<number>((resolve, reject) => {
    let out = '';
    child.stdout!.on('data', (c: Buffer) => {
      out += c.toString();
      const m = /LISTENING (\d+)/.exec(out);
      if (m) resolve(Number(m[1]));
    });
    child.on('exit', (code) => reject(new Error(`${kind} server exited with ${code}`)));
  });
  return { child, port };
}

function stop(child: ChildProcess): Promise<void> {
  return new Promise((resolve) => {
    if (child.exitCode !== null) return resolve();
    child.once('exit', () => resolve());
    child.kill('SIGTERM');
  });
}

interface LoadResult {
  rps: number;
  p50: string;
  p99: string;
  errors: number;
  /** Requests completed in the measured run. */
  requests: number;
  /** CPU seconds the server process used during the measured run (NaN without /proc). */
  cpu: number;
}


function runWrk(pid: number, port: number, body: string, seconds: number, connections: number): LoadResult {
  const script = join(tmpdir(), `sim-bench-${process.pid}.lua`);
  writeFileSync(script, `wrk.method = "POST"\nwrk.body = ${JSON.stringify(body)}\nwrk.headers["Content-Type"] = "application/json"\n`);
  const url = `http://127.0.0.1:${port}/v1/completions`;
  // Warm-up, then the measured run.
  const [wc, wa] = pinned(1, 'wrk', ['-t1', `-c${connections}`, '-d1s', '-s', script, url]);
  spawnSync(wc, wa);
  const [c, a] = pinned(1, 'wrk', ['-t1', `-c${connections}`, `-d${seconds}s`, '--latency', '-s', script, url]);
  const cpu0 = cpuSeconds(pid);
  const r = spawnSync(c, a, { encoding: 'utf8' });
  const cpu = cpuSeconds(pid) - cpu0;
  const out = r.stdout;
  const requests = Number(/(\d+) requests in/.exec(out)?.[1] ?? NaN);
  const rps = Number(/Requests\/sec:\s+([\d.]+)/.exec(out)?.[1] ?? NaN);
  const p50 = /\s50%\s+(\S+)/.exec(out)?.[1] ?? '?';
  const p99 = /\s99%\s+(\S+)/.exec(out)?.[1] ?? '?';
  const non2xx = Number(/Non-2xx or 3xx responses:\s+(\d+)/.exec(out)?.[1] ?? 0);
  const sockErr = /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/.exec(out);
  const errors = non2xx + (sockErr ? sockErr.slice(1).reduce((s, x) => s + Number(x), 0) : 0);
  if (!Number.isFinite(rps)) throw new Error(`wrk output not understood:\n${out}\n${r.stderr}`);
  return { rps, p50, p99, errors, requests, cpu };
}

async function runJs(pid: number, port: number, body: string, seconds: number, connections: number): Promise<LoadResult> {
  const [cmd, args] = pinned(1, process.execPath, [SELF, '--load', `http://127.0.0.1:${port}`, '--duration', String(seconds), '--connections', String(connections), '--body', body]);
  const cpu0 = cpuSeconds(pid);
  const r = spawnSync(cmd, args, { encoding: 'utf8' });
  const cpu = cpuSeconds(pid) - cpu0; // includes the 1 s warm-up
  const j = JSON.parse(r.stdout.trim().split('\n').at(-1)!);
  return { rps: j.rps, p50: '-', p99: '-', errors: j.errors, requests: j.requests, cpu };
}

async function sampleResponse(port: number, body: string): Promise<string> {
  const res = await fetch(`http://127.0.0.1:${port}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
  return res.text();
}

/** Time to first body byte and to the end of one streaming request, from a fresh connection. */
function timedRequest(port: number, body: string): Promise<{ ttft: number; e2e: number }> {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    let ttft = -1;
    const req = http.request({ host: '127.0.0.1', port, path: '/v1/completions', method: 'POST', headers: { 'content-type': 'application/json' } }, (res) => {
      res.on('data', () => {
        if (ttft < 0) ttft = performance.now() - t0;
      });
      res.on('end', () => resolve({ ttft, e2e: performance.now() - t0 }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

/**
 * Fidelity: at time-scale 1, how close do the wall times a client sees come to
 * the latency model (docs/sim.md)? Sequential requests, so no queueing.
 */
async function fidelity(): Promise<void> {
  const { child, port } = await startServer('sim-timed', '');
  try {
    const tokens = 2000;
    const out = 16;
    const cached = Math.floor((tokens - 1) / 16) * 16;
    const modelTtftCold = TIMED.prefillOverheadMs + (tokens * TIMED.prefillUsPerToken) / 1000;
    const modelTtftWarm = TIMED.prefillOverheadMs + ((tokens - cached) * TIMED.prefillUsPerToken) / 1000;
    const decode = (out - 1) * TIMED.itlMs;
    const rows: [string, number, number[]][] = [];
    const cold: { ttft: number; e2e: number }[] = [];
    const warm: { ttft: number; e2e: number }[] = [];
    for (let i = 0; i < 10; i++) {
      const prompt = String(i).repeat(4 * tokens); // a fresh 2,000-token prompt each time
      cold.push(await timedRequest(port, JSON.stringify({ prompt, max_tokens: out, stream: true })));
      warm.push(await timedRequest(port, JSON.stringify({ prompt, max_tokens: out, stream: true })));
    }
    rows.push(['TTFT, 2,000 uncached tokens', modelTtftCold, cold.map((r) => r.ttft)]);
    rows.push([`TTFT, ${cached} of 2,000 cached`, modelTtftWarm, warm.map((r) => r.ttft)]);
    rows.push(['E2E, uncached, 16 tokens', modelTtftCold + decode, cold.map((r) => r.e2e)]);
    rows.push(['E2E, cached, 16 tokens', modelTtftWarm + decode, warm.map((r) => r.e2e)]);
    console.log(`# fidelity at time-scale 1 (${JSON.stringify(TIMED)}), 10 sequential requests each, client in this process`);
    for (const [name, model, xs] of rows) {
      const sorted = [...xs].sort((a, b) => a - b);
      const med = sorted[Math.floor(sorted.length / 2)]!;
      console.log(`fidelity ${name.padEnd(28)} model ${model.toFixed(1).padStart(7)} ms  measured median ${med.toFixed(1).padStart(7)} ms  max ${sorted.at(-1)!.toFixed(1).padStart(7)} ms  (+${(med - model).toFixed(1)} ms)`);
    }
  } finally {
    await stop(child);
  }
}

async function main(): Promise<void> {
  hasTaskset = spawnSync('taskset', ['-c', '0', 'true']).status === 0;
  hasWrk = !values['no-wrk'] && spawnSync('wrk', ['--version']).error === undefined;
  const seconds = Number(values.duration);
  const connections = Number(values.connections);
  // The fixed baselines answer a body as large as the sim's own answer.
  const probe = await startServer('sim', '');
  const simAnswer = await sampleResponse(probe.port, BODY);
  await stop(probe.child);
  const scenarios: { name: string; server: string; body: string }[] = [
    { name: 'uws-fixed', server: 'uws-fixed', body: BODY },
    { name: 'node-fixed', server: 'node-fixed', body: BODY },
    { name: 'sim', server: 'sim', body: BODY },
    { name: 'sim-stream', server: 'sim', body: STREAM_BODY },
  ].filter((s) => values.only === undefined || values.only.split(',').includes(s.name));
  console.log(
    `# sim-bench: ${seconds} s per scenario, ${connections} connections, load by ${hasWrk ? 'wrk -t1' : 'undici (JS)'}` +
      `${hasTaskset ? ', server on cpu 0, load on cpu 1' : ''}; answer ${Buffer.byteLength(simAnswer)} bytes`,
  );
  // Rounds interleave the scenarios so that load from other processes on the
  // machine hits all of them alike; the median round counts.
  const rounds = Number(values.rounds);
  const all: Record<string, number[]> = {};
  const perCpu: Record<string, number[]> = {};
  for (let round = 1; round <= rounds; round++) {
    for (const s of scenarios) {
      const { child, port } = await startServer(s.server, simAnswer);
      try {
        const r = hasWrk ? runWrk(child.pid!, port, s.body, seconds, connections) : await runJs(child.pid!, port, s.body, seconds, connections);
        (all[s.name] ??= []).push(r.rps);
        const pc = r.requests / r.cpu;
        (perCpu[s.name] ??= []).push(pc);
        console.log(
          `round ${round} ${s.name.padEnd(11)} ${r.rps.toFixed(0).padStart(8)} req/s  p50 ${r.p50.padStart(8)}  p99 ${r.p99.padStart(8)}  ` +
            `errors ${r.errors}  server cpu ${r.cpu.toFixed(2)} s → ${pc.toFixed(0)} req per cpu-second`,
        );
      } finally {
        await stop(child);
      }
    }
  }
  const results: Record<string, number> = {};
  const cpuResults: Record<string, number> = {};
  for (const [name, xs] of Object.entries(all)) {
    results[name] = median(xs);
    cpuResults[name] = median(perCpu[name]!);
    console.log(
      `median ${name.padEnd(11)} ${results[name]!.toFixed(0).padStart(8)} req/s (rounds: ${xs.map((x) => x.toFixed(0)).join(', ')}); ` +
        `${cpuResults[name]!.toFixed(0)} req per server cpu-second`,
    );
  }
  if (results.sim !== undefined) {
    for (const base of ['uws-fixed', 'node-fixed']) {
      if (results[base] !== undefined) {
        console.log(
          `sim / ${base}: throughput ${(results.sim / results[base]!).toFixed(2)}, per server cpu-second ${(cpuResults.sim! / cpuResults[base]!).toFixed(2)}`,
        );
      }
    }
    // One core's worth: requests per CPU-second of the (single-threaded) sim process.
    const oneCore = cpuResults.sim!;
    console.log(
      `sim on one core: ${oneCore.toFixed(0)} req per cpu-second, wall ${results.sim.toFixed(0)} req/s: ` +
        `${Math.min(oneCore, Infinity) >= 20000 ? 'meets' : 'MISSES'} the 20,000 req/s floor`,
    );
  }
  if (!values['no-fidelity'] && (values.only === undefined || values.only.split(',').includes('fidelity'))) await fidelity();
}

if (values.serve !== undefined) {
  await serve(values.serve, Number(values.port), values['fixed-body']!);
  process.on('SIGTERM', () => process.exit(0));
} else if (values.load !== undefined) {
  await load(values.load, Number(values.duration), Number(values.connections), values.body!);
} else {
  await main();
}
