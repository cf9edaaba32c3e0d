// Benchmark: failover under load (issue 16, benchmark 1).
//
// HAProxy (the Debian package) in front of a standby pair of `switchyard
// serve` processes sharing one redis-server, four simulated engines behind,
// steady streamed load with shared prompt prefixes (GROUPS system prompts,
// each engine's KV cache holding only part of them). After `--window`
// seconds the active router is SIGKILLed; the load goes on for another
// window. Reported per run:
//   failed      requests that did not complete with 200 and a full stream, and
//               how many requests were in flight at the kill (the floor: only
//               those may fail)
//   takeover    kill → the survivor's /readyz answers 200
//   gap         kill → the first successful completion of a request started
//               after the kill
//   hit rate    cached prompt tokens / prompt tokens (usage.prompt_tokens_details
//               from the engines) of requests in the window before the kill and
//               in the window after it
// Two runs: the warm standby (ha.warmStandby: true, the default) and a cold
// standby (false) as the baseline.
//
// HAProxy checks /readyz on both routers (only the active passes) and lists
// each router a second time as a `backup` server without a check: while no
// router passes (the lease changing hands) requests go to the backups, a
// connection refused by the dead one is retried on the other (`option
// redispatch`, `retry-on conn-failure`), and the standby serves it.
//
//   node dist/bench/failover.js [--warmup 15] [--window 30] [--concurrency 8] [--lease-ttl 3000] [--renew 1000]
import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir, loadavg } from 'node:os';
import { join } from 'node:path';
import { Agent, request } from 'undici';
import { CLI, freePort, option, runMain, start, waitReady, type Proc } from '../lib/proc.js';
import { which } from '../lib/proxies.js';
import { rng } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const GROUPS = 96;
function systemPrompt(g: number): string {
  let s = `You are assistant ${g} of the fleet. `;
  for (let i = 0; s.length < 2400; i++) s += `Policy ${i} of team ${g}: answer precisely, cite, and keep it short. `;
  return s;
}
const PROMPTS = Array.from({ length: GROUPS }, (_, g) => systemPrompt(g));

interface Rec {
  start: number;
  end: number;
  ok: boolean;
  prompt: number;
  cached: number;
  err: string;
}

async function one(url: string, dispatcher: Agent, g: number, q: number): Promise<Rec> {
  const start = performance.now();
  const rec: Rec = { start, end: 0, ok: false, prompt: 0, cached: 0, err: '' };
  try {
    const res = await request(`${url}/v1/chat/completions`, {
      method: 'POST',
      dispatcher,
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'open-model',
        max_tokens: 24,
        stream: true,
        stream_options: { include_usage: true },
        messages: [
          { role: 'system', content: PROMPTS[g] },
          { role: 'user', content: `question ${q}` },
        ],
      }),
    });
    const text = await res.body.text();
    if (res.statusCode !== 200) rec.err = `HTTP ${res.statusCode}`;
    else if (!text.includes('data: [DONE]')) rec.err = 'stream cut';
    else if (text.includes('"error"')) rec.err = 'error event';
    else {
      const m = /"prompt_tokens":(\d+).*?"cached_tokens":(\d+)/.exec(text.slice(text.lastIndexOf('"usage"')));
      if (m) {
        rec.prompt = Number(m[1]);
        rec.cached = Number(m[2]);
      }
      rec.ok = true;
    }
  } catch (e) {
    rec.err = (e as Error).message;
  }
  rec.end = performance.now();
  return rec;
}

function haproxyConf(port: number, routers: number[]): string {
  return `global
  maxconn 4096
defaults
  mode http
  timeout connect 1s
  timeout client 60s
  timeout server 60s
  retries 3
  option redispatch
  retry-on conn-failure empty-response
frontend fe
  bind 127.0.0.1:${port}
  default_backend be
backend be
  # HTTP/1.1: the router's uWS front end does not answer HTTP/1.0 (docs/uws-framing.md)
  option httpchk
  http-check send meth GET uri /readyz ver HTTP/1.1 hdr host localhost
  option allbackups
  default-server inter 200ms fall 1 rise 1
${routers.map((p, i) => `  server r${i} 127.0.0.1:${p} check`).join('\n')}
${routers.map((p, i) => `  server r${i}b 127.0.0.1:${p} backup`).join('\n')}
`;
}

async function startRedis(): Promise<{ url: string; proc: Proc }> {
  const port = await freePort();
  const bin = which('redis-server');
  if (!bin) throw new Error('redis-server not found (apt-get install redis-server)');
  const proc = start('redis', bin, ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no']);
  for (let i = 0; i < 100; i++) {
    const ok = await new Promise<boolean>((r) => {
      const c = spawn(bin.replace('redis-server', 'redis-cli'), ['-p', String(port), 'ping']);
      c.on('exit', (code) => r(code === 0));
      c.on('error', () => r(false));
    });
    if (ok) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  return { url: `redis://127.0.0.1:${port}`, proc };
}

interface RunResult {
  warm: boolean;
  requests: number;
  failed: number;
  inFlightAtKill: number;
  failedNotInFlight: number;
  takeoverMs: number;
  gapMs: number;
  hitBefore: number;
  hitAfter: number;
  /** Hit rate of requests started in the first 5 s after the kill (where a cold index shows). */
  hitFirst5: number;
  errors: string[];
}

async function run(warm: boolean, warmupS: number, windowS: number, conc: number, ttl: number, renew: number): Promise<RunResult> {
  const redis = await startRedis();
  const engines: Proc[] = [];
  const engineUrls: string[] = [];
  for (let i = 0; i < 4; i++) {
    const p = await freePort();
    engines.push(start(`engine${i}`, process.execPath, [CLI, 'sim', '--port', String(p), '--time-scale', '0.02', '--kv-cache-blocks', '1200', '--seed', String(i + 1)]));
    engineUrls.push(`http://127.0.0.1:${p}`);
  }
  for (const u of engineUrls) await waitReady(`${u}/health`);
  const dir = mkdtempSync(join(tmpdir(), 'swy-failover-'));
  const rports = [await freePort(), await freePort()];
  const routers: Proc[] = [];
  for (let i = 0; i < 2; i++) {
    const file = join(dir, `router${i}.yaml`);
    writeFileSync(
      file,
      JSON.stringify({
        apiVersion: 'switchyard/v1',
        kind: 'Router',
        listen: { host: '127.0.0.1', port: rports[i] },
        pools: [{ name: 'p', models: ['open-model'], endpoints: engineUrls.map((url, k) => ({ name: `e${k}`, url })) }],
        logging: { level: 'warn' },
        ha: { redis: redis.url, key: 'bench', leaseTtlMs: ttl, renewIntervalMs: renew, warmStandby: warm },
      }),
    );
    routers.push(start(`router${i}`, process.execPath, [CLI, 'serve', '--config', file], { verbose: process.env.BENCH_VERBOSE === '1' }));
    await waitReady(`http://127.0.0.1:${rports[i]}/healthz`, 90_000); // a loaded machine starts node slowly
  }
  await waitReady(`http://127.0.0.1:${rports[0]}/readyz`, 30_000);
  const hport = await freePort();
  writeFileSync(join(dir, 'haproxy.cfg'), haproxyConf(hport, rports));
  const haproxy = start('haproxy', which('haproxy')!, ['-db', '-f', join(dir, 'haproxy.cfg')]);
  const url = `http://127.0.0.1:${hport}`;
  await waitReady(`${url}/readyz`);

  const dispatcher = new Agent({ connections: conc * 2, keepAliveTimeout: 10_000 });
  const recs: Rec[] = [];
  const rand = rng(42);
  let stop = false;
  let q = 0;
  const t0 = performance.now();
  const loops = Array.from({ length: conc }, async () => {
    while (!stop) {
      const g = Math.floor(rand() * GROUPS);
      recs.push(await one(url, dispatcher, g, q++));
    }
  });
  // warm-up (the engines' caches and the index fill), then the window before the kill
  await new Promise((r) => setTimeout(r, (warmupS + windowS) * 1000));
  const killAt = performance.now();
  routers[0].child.kill('SIGKILL');
  let takeoverAt = 0;
  for (;;) {
    try {
      const r = await request(`http://127.0.0.1:${rports[1]}/readyz`);
      await r.body.arrayBuffer();
      if (r.statusCode === 200) {
        takeoverAt = performance.now();
        break;
      }
    } catch {
      /* retry */
    }
    await new Promise((r) => setTimeout(r, 10));
  }
  await new Promise((r) => setTimeout(r, Math.max(0, windowS * 1000 - (performance.now() - killAt))));
  stop = true;
  await Promise.all(loops);
  void t0;

  const inFlight = recs.filter((r) => r.start < killAt && r.end > killAt).length;
  const failed = recs.filter((r) => !r.ok);
  const failedNotInFlight = failed.filter((r) => !(r.start < killAt && r.end > killAt)).length;
  const firstOk = Math.min(...recs.filter((r) => r.ok && r.start >= killAt).map((r) => r.end));
  const rate = (xs: Rec[]) => {
    const ok = xs.filter((r) => r.ok && r.prompt > 0);
    return ok.reduce((s, r) => s + r.cached, 0) / Math.max(1, ok.reduce((s, r) => s + r.prompt, 0));
  };
  const result: RunResult = {
    warm,
    requests: recs.length,
    failed: failed.length,
    inFlightAtKill: inFlight,
    failedNotInFlight,
    takeoverMs: takeoverAt - killAt,
    gapMs: firstOk - killAt,
    hitBefore: rate(recs.filter((r) => r.end < killAt && r.end >= killAt - windowS * 1000)),
    hitAfter: rate(recs.filter((r) => r.start >= killAt && r.start < killAt + windowS * 1000)),
    hitFirst5: rate(recs.filter((r) => r.start >= killAt && r.start < killAt + 5000)),
    errors: [...new Set(failed.map((r) => r.err))].slice(0, 5),
  };
  await dispatcher.close();
  await haproxy.stop();
  for (const r of routers) await r.stop();
  for (const e of engines) await e.stop();
  await redis.proc.stop();
  return result;
}

async function main(): Promise<void> {
  const argv = process.argv.slice(2);
  const windowS = Number(option(argv, '--window') ?? 30);
  const warmupS = Number(option(argv, '--warmup') ?? 15);
  const conc = Number(option(argv, '--concurrency') ?? 8);
  const ttl = Number(option(argv, '--lease-ttl') ?? 3000);
  const renew = Number(option(argv, '--renew') ?? 1000);
  if (!which('haproxy')) throw new Error('haproxy not found (apt-get install haproxy)');
  const load0 = loadavg()[0];
  const results: RunResult[] = [];
  for (const warm of [true, false]) results.push(await run(warm, warmupS, windowS, conc, ttl, renew));
  console.log(`failover under load: HAProxy → 2 routers (ha, lease ${ttl} ms, renewal ${renew} ms) → 4 sim engines (--time-scale 0.02, 1200 KV blocks each); ${conc} streamed clients, ${GROUPS} prefix groups; ${warmupS} s warm-up, ${windowS} s before the SIGKILL of the active, ${windowS} s after; load average ${load0.toFixed(1)} → ${loadavg()[0].toFixed(1)}`);
  console.log('| standby | requests | failed | in flight at kill | failed not in flight | takeover (kill → /readyz 200) | gap (kill → first success) | hit rate before | hit rate after | after / before | hit rate, first 5 s after |');
  console.log('|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
  for (const r of results) {
    console.log(
      `| ${r.warm ? 'warm' : 'cold (baseline)'} | ${r.requests} | ${r.failed} | ${r.inFlightAtKill} | ${r.failedNotInFlight} | ${r.takeoverMs.toFixed(0)} ms | ${r.gapMs.toFixed(0)} ms | ${(r.hitBefore * 100).toFixed(1)} % | ${(r.hitAfter * 100).toFixed(1)} % | ${((r.hitAfter / r.hitBefore) * 100).toFixed(0)} % | ${(r.hitFirst5 * 100).toFixed(1)} % |`,
    );
  }
  for (const r of results) if (r.errors.length > 0) console.log(`${r.warm ? 'warm' : 'cold'} errors: ${r.errors.join('; ')}`);
}

runMain(main);
