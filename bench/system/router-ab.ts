// `node dist/bench/router-ab.js --base <dir>`: the router's CPU per proxied
// request and throughput, this build against another build of Switchyard (a
// checkout or copy with bin/, dist/ and build/Release/ built), in one run.
// One simulated engine at --time-scale 0; one router process per build, same
// config; wrk (1 thread) at several connection counts in interleaved rounds
// (order flipped every round) so the VM's drift hits both alike. CPU per
// request = utime + stime from /proc/<pid>/stat over each wrk run divided by
// the requests completed; user time is also reported on its own.
// `--base .` with `--extra '<yaml lines>'` compares one build under two configs
// instead (the lines are appended to the second router's config only);
// `--extra-all '<yaml lines>'` appends lines to both routers' configs (e.g. a
// flowControl block, to compare the admission path of two builds);
// `--extra-base '<yaml lines>'` to the first (base) router's only (e.g. local
// rate-limit counters against the second's Redis-shared ones).
// `--auth-keys N` writes N random API keys (SHA-256 digests in a keys file)
// and gives the second router `auth: { keysFile }` (docs/security.md): every
// request to both routers carries `Authorization: Bearer <one of the keys>`,
// so the second authenticates it (a non-2xx would be counted as an error);
// with `--auth-both` both do (two builds compared on the auth path).
// The GC column: the router's own nodejs_gc_duration_seconds (all kinds,
// read from its /metrics before and after each wrk run, outside the CPU
// window) per request: a router process can run in a mode where most of
// each scavenge survives (bench/RESULTS.md, 2026-12-04), and this column
// says which runs that was.
// `--otlp-sink` starts an OTLP/HTTP trace sink in this process (answers 200,
// counts the bytes) and replaces {OTLP} in --extra with its URL, so a tracing
// config exports to a live collector.
//   node dist/bench/router-ab.js --base /tmp/swy-base [--seconds 3] [--rounds 5] [--connections 16,64,256] [--client native] [--extra 'yaml'] [--extra-all 'yaml'] [--extra-base 'yaml'] [--auth-keys 1000 [--auth-both]] [--otlp-sink]
import { mkdtempSync, writeFileSync } from 'node:fs';
import { createHash, randomBytes } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CLI, ROOT, cpuSeconds, freePort, start, waitReady, type Proc, runMain, option } from '../lib/proc.js';
import { hasWrk, runWrk } from '../lib/wrk.js';
import { median } from '../lib/stats.js';
import { progress } from '../../src/progress.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const argv = process.argv.slice(2);
const arg = (name: string, def: string) => option(argv, name) ?? def;
const base = arg('--base', '');
const seconds = Number(arg('--seconds', '3'));
const rounds = Number(arg('--rounds', '5'));
const connections = arg('--connections', '16,64,256').split(',').map(Number);
const client = arg('--client', 'native');
let extra = arg('--extra', '');
let extraAll = arg('--extra-all', '');
const extraBase = arg('--extra-base', '');
const otlpSink = argv.includes('--otlp-sink');
const authKeys = Number(arg('--auth-keys', '0'));
const authBoth = argv.includes('--auth-both');
const BODY = JSON.stringify({ model: 'open-model', prompt: 'Say hello to the benchmark.', max_tokens: 1 });


interface Run {
  rps: number;
  cpuUs: number;
  userUs: number;
  p50us: number;
  p99us: number;
  errors: number;
  gcUs: number;
}

/** Seconds the router has spent in GC (nodejs_gc_duration_seconds_sum over its kinds). */
async function gcSeconds(url: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  let s = 0;
  for (const m of text.matchAll(/^nodejs_gc_duration_seconds_sum\{[^}]*\} ([0-9.e+-]+)$/gm)) s += Number(m[1]);
  return s;
}

async function main(): Promise<void> {
  if (base === '') throw new Error('--base <dir of another Switchyard build> is required');
  if (!(await hasWrk())) throw new Error('wrk is required (apt-get install wrk)');
  const enginePort = await freePort();
  const engineUrl = `http://127.0.0.1:${enginePort}`;
  const engine = start('engine', process.execPath, [CLI, 'sim', '--port', String(enginePort), '--time-scale', '0']);
  const dir = mkdtempSync(join(tmpdir(), 'swy-ab-'));
  let sink: Server | null = null;
  let sinkBytes = 0;
  let sinkRequests = 0;
  if (otlpSink) {
    sink = createServer((req, res) => {
      req.on('data', (c: Buffer) => (sinkBytes += c.length));
      req.on('end', () => {
        sinkRequests++;
        res.writeHead(200, { 'content-type': 'application/x-protobuf' }).end();
      });
    });
    await new Promise<void>((r) => sink!.listen(0, '127.0.0.1', r));
    extra = extra.replaceAll('{OTLP}', `http://127.0.0.1:${(sink.address() as { port: number }).port}/v1/traces`);
  }
  let headers: Record<string, string> = {};
  if (authKeys > 0) {
    const keys = Array.from({ length: authKeys }, () => `sk-${randomBytes(24).toString('hex')}`);
    const file = join(dir, 'keys.txt');
    writeFileSync(file, keys.map((k, i) => `${createHash('sha256').update(k).digest('hex')} tenant-${i}\n`).join(''));
    // --auth-both: both routers authenticate (an A/B of two builds on the auth path)
    if (authBoth) extraAll = [extraAll, `auth: { keysFile: "${file}" }`].filter((x) => x !== '').join('\n');
    else extra = [extra, `auth: { keysFile: "${file}" }`].filter((x) => x !== '').join('\n');
    headers = { authorization: `Bearer ${keys[keys.length >> 1]}` };
  }
  const builds = [
    { name: 'base', cli: join(base, 'bin', 'switchyard.js'), extra: [extraAll, extraBase].filter((x) => x !== '').join('\n') },
    { name: 'this', cli: CLI, extra: [extraAll, extra].filter((x) => x !== '').join('\n') },
  ];
  const routers: { name: string; url: string; proc: Proc }[] = [];
  try {
    await waitReady(`${engineUrl}/health`);
    for (const b of builds) {
      const port = await freePort();
      const file = join(dir, `${b.name}.yaml`);
      writeFileSync(
        file,
        `apiVersion: switchyard/v1\nkind: Router\nlisten: { host: 127.0.0.1, port: ${port} }\nproxy: { client: ${client} }\n` +
          `logging: { level: warn }\npools:\n  - { name: default, models: [open-model], endpoints: [{ name: e0, url: "${engineUrl}" }] }\n` +
          (b.extra ? `${b.extra}\n` : ''),
      );
      routers.push({ name: b.name, url: `http://127.0.0.1:${port}`, proc: start(`router-${b.name}`, process.execPath, [b.cli, 'serve', '--config', file]) });
    }
    for (const r of routers) await waitReady(`${r.url}/readyz`);
    for (const r of routers) await runWrk(`${r.url}/v1/completions`, BODY, { connections: 64, threads: 1, seconds: 1, headers }); // warm-up
    const runs = new Map<string, Run[]>();
    const bar = progress('router A/B', rounds * connections.length * routers.length);
    for (let round = 0; round < rounds; round++) {
      for (const c of connections) {
        for (const r of round % 2 === 0 ? routers : [...routers].reverse()) {
          bar.tick(`round ${round + 1}, ${c} connections, ${r.name}`);
          const pid = r.proc.child.pid;
          const g0 = await gcSeconds(r.url);
          const c0 = cpuSeconds(pid);
          const u0 = cpuSeconds(pid, true);
          const w = await runWrk(`${r.url}/v1/completions`, BODY, { connections: c, threads: 1, seconds, headers });
          const n = w.rps * seconds;
          const cpu1 = cpuSeconds(pid);
          const user1 = cpuSeconds(pid, true);
          const g1 = await gcSeconds(r.url);
          const key = `${r.name}@${c}`;
          if (!runs.has(key)) runs.set(key, []);
          runs.get(key)!.push({
            rps: w.rps,
            cpuUs: ((cpu1 - c0) / n) * 1e6,
            userUs: ((user1 - u0) / n) * 1e6,
            p50us: w.p50Us,
            p99us: w.p99Us,
            errors: w.errors + w.non2xx,
            gcUs: ((g1 - g0) / n) * 1e6,
          });
        }
      }
    }
    bar.done();
    const f = (n: number) => Math.round(n).toLocaleString('en-US');
    console.log(`router A/B: base = ${base}, this = ${ROOT}${extra ? ` with ${JSON.stringify(extra)}` : ''}${authKeys > 0 ? ` (${authKeys} keys; every request to both carries one)` : ''}${extraAll ? `; both with ${JSON.stringify(extraAll)}` : ''}${extraBase ? `; base with ${JSON.stringify(extraBase)}` : ''}; proxy.client ${client}; ${rounds} interleaved round(s) of ${seconds} s (medians); wrk -t1; engine = switchyard sim --time-scale 0`);
    console.log('| connections | build | req/s | router CPU µs/req | of which user µs/req | GC µs/req | p50 µs | p99 µs | errors | CPU/req vs base | user/req vs base | req/s vs base |');
    console.log('|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
    for (const c of connections) {
      const med = (name: string) => {
        const xs = runs.get(`${name}@${c}`)!;
        return {
          rps: median(xs.map((x) => x.rps)),
          cpuUs: median(xs.map((x) => x.cpuUs)),
          userUs: median(xs.map((x) => x.userUs)),
          gcUs: median(xs.map((x) => x.gcUs)),
          p50us: median(xs.map((x) => x.p50us)),
          p99us: median(xs.map((x) => x.p99us)),
          errors: xs.reduce((a, x) => a + x.errors, 0),
        };
      };
      const b = med('base');
      for (const name of ['base', 'this']) {
        const x = med(name);
        const pct = (a: number, z: number) => `${((a / z) * 100).toFixed(0)} %`;
        console.log(
          `| ${c} | ${name} | ${f(x.rps)} | ${x.cpuUs.toFixed(1)} | ${x.userUs.toFixed(1)} | ${x.gcUs.toFixed(2)} | ${f(x.p50us)} | ${f(x.p99us)} | ${x.errors} | ${pct(x.cpuUs, b.cpuUs)} | ${pct(x.userUs, b.userUs)} | ${pct(x.rps, b.rps)} |`,
        );
      }
    }
    if (sink !== null) console.log(`OTLP sink: ${sinkRequests} export request(s), ${sinkBytes} bytes`);
  } finally {
    sink?.close();
    for (const r of routers) await r.proc.stop();
    await engine.stop();
  }
}

runMain(main);
