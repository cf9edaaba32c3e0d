// Benchmark: failover under load (issue 16, benchmark 1; issue 32, benchmark 3).
//
// HAProxy (the Debian package) in front of `--routers` `switchyard serve`
// processes sharing one redis-server, four simulated engines behind, steady
// streamed load with shared prompt prefixes (GROUPS system prompts, each
// engine's KV cache holding only part of them). The routers are active-active
// replicas (ha.mode active-active, the default) or a standby pair (mode
// standby), in the same run. After `--window` seconds one router is
// SIGKILLed (active-active: router 0; standby: the active); the load goes on
// for another window. With `--rolling`, a further run per mode restarts every
// router in turn instead (SIGTERM: /readyz 503 for shutdown.drainDelayMs, then
// its requests drain; start it again on its port; wait until it is Ready, or
// for a standby until it is up; next). Reported per run:
//   failed      requests that did not complete with 200 and a full stream, and
//               how many requests were in flight at the kill (the floor: only
//               those may fail) and of those how many on the killed router
//               (HAProxy names the server in x-served-by)
//   takeover    kill → the survivor's /readyz answers 200 (active-active: it
//               never stopped being Ready)
//   gap         kill → the first successful completion of a request started
//               after the kill
//   hit rate    cached prompt tokens / prompt tokens (usage.prompt_tokens_details
//               from the engines) of requests in the window before the kill and
//               in the window after it
// Runs: `--modes` (default active-active,standby: the warm standby, ha.warmStandby
// true, is the baseline), and with `--cold` the cold standby too.
//
// HAProxy checks /readyz on both routers (only the active passes) and lists
// each router a second time as a `backup` server without a check: while no
// router passes (the lease changing hands) requests go to the backups, a
// connection refused by the dead one is retried on the other (`option
// redispatch`, `retry-on conn-failure`), and the standby serves it.
//
//   node dist/bench/system/failover.js [--warmup 15] [--window 30] [--concurrency 8] [--routers 2]
//       [--modes active-active,standby] [--cold] [--rolling] [--lease-ttl 3000] [--renew 1000] [--drain-delay 1000]
//       [--plain-haproxy]   (issue 32's setup: retries 2, option redispatch, no backup servers, no retry-on)
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir, loadavg } from 'node:os';
import { join } from 'node:path';
import { Agent, request } from 'undici';
import { CLI, freePort, option, runMain, start, waitReady, type Proc } from '../lib/proc.js';
import { which } from '../lib/proxies.js';
import { startRedisServer } from '../lib/fleet.js';
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
  /** HAProxy's server name for the router that answered (x-served-by), '' when no headers came. */
  server: string;
}

async function one(url: string, dispatcher: Agent, g: number, q: number): Promise<Rec> {
  const start = performance.now();
  const rec: Rec = { start, end: 0, ok: false, prompt: 0, cached: 0, err: '', server: '' };
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
    const by = res.headers['x-served-by'];
    rec.server = typeof by === 'string' ? by : '';
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

/**
 * `plain`: the issue-32 setup a new user writes (check /readyz, `retries 2`, `option redispatch`, no
 * backup servers, no retry-on); else the one docs/operations.md recommends.
 */
function haproxyConf(port: number, routers: number[], plain: boolean): string {
  const servers = (suffix: string, flag: string) => routers.map((p, i) => `  server r${i}${suffix} 127.0.0.1:${p} ${flag}`).join('\n') + '\n';
  return `global
  maxconn 4096
defaults
  mode http
  timeout connect 1s
  timeout client 60s
  timeout server 60s
  retries ${plain ? 2 : 3}
  option redispatch
${plain ? '' : '  retry-on conn-failure empty-response\n'}frontend fe
  bind 127.0.0.1:${port}
  default_backend be
backend be
${plain ? '' : '  # HTTP/1.1: the router\'s uWS front end does not answer HTTP/1.0 (docs/uws-framing.md)\n'}  option httpchk
  http-check send meth GET uri /readyz ver HTTP/1.1 hdr host localhost
${plain ? '' : '  option allbackups\n'}  http-response set-header x-served-by %s
  default-server inter 200ms fall 1 rise 1
${servers('', 'check')}${plain ? '' : servers('b', 'backup')}`;
}


type Mode = 'active-active' | 'standby' | 'cold';

interface RunResult {
  mode: Mode;
  scenario: 'kill' | 'rolling';
  /** Requests in flight at the kill on the router killed (by x-served-by). */
  inFlightOnKilled: number;
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
  /** The failed requests' ends, ms after the event: first and last. */
  failFirstMs: number;
  failLastMs: number;
}

interface RunOptions {
  warmupS: number;
  windowS: number;
  conc: number;
  ttl: number;
  renew: number;
  routers: number;
  drainDelayMs: number;
  plainHaproxy: boolean;
}

async function run(mode: Mode, scenario: 'kill' | 'rolling', o: RunOptions): Promise<RunResult> {
  const { warmupS, windowS, conc, ttl, renew } = o;
  const redis = await startRedisServer('failover');
  const engines: Proc[] = [];
  const engineUrls: string[] = [];
  for (let i = 0; i < 4; i++) {
    const p = await freePort();
    engines.push(start(`engine${i}`, process.execPath, [CLI, 'sim', '--port', String(p), '--time-scale', '0.02', '--kv-cache-blocks', '1200', '--seed', String(i + 1)]));
    engineUrls.push(`http://127.0.0.1:${p}`);
  }
  for (const u of engineUrls) await waitReady(`${u}/health`);
  const dir = mkdtempSync(join(tmpdir(), 'swy-failover-'));
  const rports: number[] = [];
  for (let i = 0; i < o.routers; i++) rports.push(await freePort());
  const routers: Proc[] = [];
  const files: string[] = [];
  const ha =
    mode === 'active-active'
      ? { redis: redis.url, key: 'bench', deltaFlushMs: 100 }
      : { mode: 'standby', redis: redis.url, key: 'bench', leaseTtlMs: ttl, renewIntervalMs: renew, warmStandby: mode === 'standby' };
  const startRouterProc = (i: number) => start(`router${i}`, process.execPath, [CLI, 'serve', '--config', files[i]], { verbose: process.env.BENCH_VERBOSE === '1' });
  for (let i = 0; i < o.routers; i++) {
    const file = join(dir, `router${i}.yaml`);
    files.push(file);
    writeFileSync(
      file,
      JSON.stringify({
        apiVersion: 'switchyard/v1',
        kind: 'Router',
        listen: { host: '127.0.0.1', port: rports[i] },
        pools: [{ name: 'p', models: ['open-model'], endpoints: engineUrls.map((url, k) => ({ name: `e${k}`, url })) }],
        logging: { level: 'warn' },
        // a drain HAProxy notices (its check every 200 ms) before the listener closes
        shutdown: { drainDelayMs: o.drainDelayMs, graceMs: 30_000 },
        ha,
      }),
    );
    routers.push(startRouterProc(i));
    await waitReady(`http://127.0.0.1:${rports[i]}/healthz`, 90_000); // a loaded machine starts node slowly
  }
  await waitReady(`http://127.0.0.1:${rports[0]}/readyz`, 30_000);
  const hport = await freePort();
  writeFileSync(join(dir, 'haproxy.cfg'), haproxyConf(hport, rports, o.plainHaproxy));
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
  const readyz = async (port: number): Promise<number> => {
    try {
      const r = await request(`http://127.0.0.1:${port}/readyz`);
      await r.body.arrayBuffer();
      return r.statusCode;
    } catch {
      return 0;
    }
  };
  const waitFor = async (cond: () => Promise<boolean>, ms = 90_000) => {
    const until = performance.now() + ms;
    while (performance.now() < until) {
      if (await cond()) return;
      await new Promise((r) => setTimeout(r, 10));
    }
    throw new Error('timed out');
  };
  // warm-up (the engines' caches and the index fill), then the window before the kill
  await new Promise((r) => setTimeout(r, (warmupS + windowS) * 1000));
  // the router to kill: the standby pair's active (the one Ready), else the first
  let victim = 0;
  if (mode !== 'active-active') for (let i = 0; i < rports.length; i++) if ((await readyz(rports[i])) === 200) victim = i;
  const killAt = performance.now();
  let takeoverAt = 0;
  if (scenario === 'kill') {
    routers[victim].child.kill('SIGKILL');
    const others = rports.filter((_, i) => i !== victim);
    await waitFor(async () => {
      for (const p of others) if ((await readyz(p)) === 200) return true;
      return false;
    });
    takeoverAt = performance.now();
  } else {
    // every router in turn: SIGTERM (drain), start again, wait until it is back, next
    for (let i = 0; i < routers.length; i++) {
      const old = routers[i];
      const exited = new Promise<void>((r) => (old.child.exitCode !== null ? r() : old.child.once('exit', () => r())));
      old.child.kill('SIGTERM');
      await exited;
      routers[i] = startRouterProc(i);
      await waitReady(`http://127.0.0.1:${rports[i]}/healthz`, 90_000);
      if (mode === 'active-active') await waitFor(async () => (await readyz(rports[i])) === 200);
      // a standby pair: the restarted one is the standby; the next SIGTERM hands the lease over to it
      else await waitFor(async () => (await Promise.all(rports.map(readyz))).some((c) => c === 200));
    }
    takeoverAt = performance.now();
  }
  await new Promise((r) => setTimeout(r, Math.max(0, windowS * 1000 - (performance.now() - killAt))));
  stop = true;
  await Promise.all(loops);
  void t0;

  const inFlight = recs.filter((r) => r.start < killAt && r.end > killAt).length;
  const inFlightOnKilled = recs.filter((r) => r.start < killAt && r.end > killAt && (r.server === `r${victim}` || r.server === `r${victim}b`)).length;
  const failed = recs.filter((r) => !r.ok);
  const failedNotInFlight = failed.filter((r) => !(r.start < killAt && r.end > killAt)).length;
  const firstOk = Math.min(...recs.filter((r) => r.ok && r.start >= killAt).map((r) => r.end));
  const rate = (xs: Rec[]) => {
    const ok = xs.filter((r) => r.ok && r.prompt > 0);
    return ok.reduce((s, r) => s + r.cached, 0) / Math.max(1, ok.reduce((s, r) => s + r.prompt, 0));
  };
  const result: RunResult = {
    mode,
    scenario,
    inFlightOnKilled,
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
    failFirstMs: failed.length > 0 ? Math.min(...failed.map((r) => r.end - killAt)) : 0,
    failLastMs: failed.length > 0 ? Math.max(...failed.map((r) => r.end - killAt)) : 0,
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
  const routers = Number(option(argv, '--routers') ?? 2);
  const drainDelayMs = Number(option(argv, '--drain-delay') ?? 1000);
  const modes = (option(argv, '--modes') ?? 'active-active,standby').split(',') as Mode[];
  if (argv.includes('--cold')) modes.push('cold');
  for (const m of modes) if (!['active-active', 'standby', 'cold'].includes(m)) throw new Error(`--modes: unknown mode ${m}`);
  const scenarios: ('kill' | 'rolling')[] = argv.includes('--rolling') ? ['kill', 'rolling'] : ['kill'];
  if (!which('haproxy')) throw new Error('haproxy not found (apt-get install haproxy)');
  const load0 = loadavg()[0];
  const plainHaproxy = argv.includes('--plain-haproxy');
  const o: RunOptions = { warmupS, windowS, conc, ttl, renew, routers, drainDelayMs, plainHaproxy };
  const results: RunResult[] = [];
  for (const scenario of scenarios) for (const mode of modes) results.push(await run(mode, scenario, o));
  console.log(
    `failover under load: HAProxy (${plainHaproxy ? 'the plain setup: check /readyz every 200 ms, retries 2, redispatch, no backups, no retry-on' : 'check /readyz every 200 ms, retries 3, redispatch, retry-on conn-failure empty-response, the routers again as unchecked backups'}) → ${routers} routers (active-active: ha.redis; standby: lease ${ttl} ms, renewal ${renew} ms; shutdown.drainDelayMs ${drainDelayMs}) → 4 sim engines (--time-scale 0.02, 1200 KV blocks each); ${conc} streamed clients, ${GROUPS} prefix groups; ${warmupS} s warm-up, ${windowS} s before the event, ${windowS} s after; load average ${load0.toFixed(1)} → ${loadavg()[0].toFixed(1)}`,
  );
  console.log('| mode | event | requests | failed | in flight at the event (on the killed router) | failed not in flight | takeover (event → a router Ready; rolling: → all back) | gap (event → first success) | hit rate before | hit rate after | after / before | hit rate, first 5 s after |');
  console.log('|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
  const label = (m: Mode) => (m === 'standby' ? 'standby, warm' : m === 'cold' ? 'standby, cold' : m);
  for (const r of results) {
    console.log(
      `| ${label(r.mode)} | ${r.scenario === 'kill' ? 'SIGKILL one' : 'rolling restart'} | ${r.requests} | ${r.failed} | ${r.inFlightAtKill} (${r.inFlightOnKilled}) | ${r.failedNotInFlight} | ${r.takeoverMs.toFixed(0)} ms | ${r.gapMs.toFixed(0)} ms | ${(r.hitBefore * 100).toFixed(1)} % | ${(r.hitAfter * 100).toFixed(1)} % | ${((r.hitAfter / r.hitBefore) * 100).toFixed(0)} % | ${(r.hitFirst5 * 100).toFixed(1)} % |`,
    );
  }
  for (const r of results) if (r.errors.length > 0) console.log(`${label(r.mode)} ${r.scenario} errors (failed requests ended ${r.failFirstMs.toFixed(0)} to ${r.failLastMs.toFixed(0)} ms after the event): ${r.errors.join('; ')}`);
}

runMain(main);
