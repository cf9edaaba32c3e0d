// `npm run bench:overhead`: what the router adds per request, in one run.
// One simulated engine at --time-scale 0 (answers at once) in its own process,
// the router in its own process (`switchyard serve --upstream ...`), and the
// load generator in a third: the same small non-streaming /v1/completions
// request sent directly to the engine (the baseline) and through the router.
//   0. one request at a time (closed loop, concurrency 1): added latency with
//      no queueing anywhere;
//   1. fixed rate 1,000 req/s (open loop, bench/loadgen.ts): p50/p99 and the
//      added latency (router minus direct);
//   2. max throughput at fixed concurrency (wrk, 1 thread; bench/loadgen.ts
//      when wrk is missing), plus the CPU each process spent per request;
//      router processes using undici (proxy.client: undici) as their
//      upstream client, and the native client with the engine named
//      `localhost` (looked up by the router; the "h1" rows, named after the
//      TypeScript client that served names until it was retired), are
//      measured too, against the default (auto = the native addon client for
//      http:// endpoints, here addressed by IP).
// With --pin (needs taskset), the router runs alone on cpu 0 and everything
// else (engine, load generator, this script) on cpu 1. On a machine shared
// with other jobs pinning concentrates their load too, so it is off by default.
//   node dist/bench/overhead.js [--seconds 5] [--rate 1000] [--concurrency 64] [--rounds 2] [--windows 4] [--pin] [--json]
import { execFile, execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { CLI, cpuSeconds, freePort, start, waitReady, runMain, option } from '../lib/proc.js';
import { hasWrk, runWrk } from '../lib/wrk.js';
import { median } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const argv = process.argv.slice(2);
const arg = (name: string, def: string) => option(argv, name) ?? def;
const seconds = Number(arg('--seconds', '5'));
const rate = Number(arg('--rate', '1000'));
const concurrency = Number(arg('--concurrency', '64'));
const rounds = Number(arg('--rounds', '2'));
const windows = Number(arg('--windows', '4'));
const BODY = JSON.stringify({ model: 'open-model', prompt: 'Say hello to the benchmark.', max_tokens: 1 });
const LOADGEN = fileURLToPath(new URL('../lib/loadgen.js', import.meta.url));

interface Fig {
  rps: number;
  /** CPU µs per request of the router and of the engine during the run (max-throughput runs). */
  routerCpuUs?: number;
  engineCpuUs?: number;
  p50us: number;
  p99us: number;
  errors: number;
}

function loadgen(urls: string[], extra: string[], duration = seconds, warmup = 1): Promise<Fig[]> {
  return new Promise((resolve, reject) => {
    execFile(process.execPath, [LOADGEN, ...urls, '--duration', String(duration), '--warmup', String(warmup), '--body', BODY, ...extra], { maxBuffer: 1 << 20 }, (err, out) => {
      if (err) return reject(err);
      const j = JSON.parse(out.trim().split('\n').pop()!);
      resolve(j.targets.map((x: Fig) => ({ rps: x.rps, p50us: x.p50us, p99us: x.p99us, errors: x.errors })));
    });
  });
}

async function maxThroughput(url: string, useWrk: boolean): Promise<Fig> {
  if (useWrk) {
    const r = await runWrk(`${url}/v1/completions`, BODY, { connections: concurrency, threads: 1, seconds });
    return { rps: r.rps, p50us: r.p50Us, p99us: r.p99Us, errors: r.errors + r.non2xx };
  }
  return (await loadgen([url], ['--concurrency', String(concurrency)]))[0];
}



function canPin(): boolean {
  if (!argv.includes('--pin')) return false;
  try {
    execFileSync('taskset', ['-p', '-c', '1', String(process.pid)], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

async function main(): Promise<void> {
  const pinned = canPin(); // children inherit cpu 1
  const [enginePort, routerPort, undiciPort, h1Port] = [await freePort(), await freePort(), await freePort(), await freePort()];
  const engineUrl = `http://127.0.0.1:${enginePort}`;
  const routerUrl = `http://127.0.0.1:${routerPort}`;
  const engine = start('engine', process.execPath, [CLI, 'sim', '--port', String(enginePort), '--time-scale', '0']);
  const routerArgs = [CLI, 'serve', '--upstream', engineUrl, '--port', String(routerPort), '--log-level', 'warn'];
  const router = pinned
    ? start('router', 'taskset', ['-c', '0', process.execPath, ...routerArgs])
    : start('router', process.execPath, routerArgs);
  const cfgFile = join(mkdtempSync(join(tmpdir(), 'swy-overhead-')), 'undici.yaml');
  writeFileSync(
    cfgFile,
    `apiVersion: switchyard/v1\nkind: Router\nlisten: { host: 127.0.0.1, port: ${undiciPort} }\nproxy: { client: undici }\n` +
      `logging: { level: warn }\npools:\n  - { name: default, models: [open-model], endpoints: [{ name: e0, url: "${engineUrl}" }] }\n`,
  );
  const undiciUrl = `http://127.0.0.1:${undiciPort}`;
  const routerU = pinned
    ? start('router-undici', 'taskset', ['-c', '0', process.execPath, CLI, 'serve', '--config', cfgFile])
    : start('router-undici', process.execPath, [CLI, 'serve', '--config', cfgFile]);
  const h1Cfg = cfgFile.replace(/undici\.yaml$/, 'h1.yaml');
  writeFileSync(h1Cfg, readFileSync(cfgFile, 'utf8').replace('client: undici', 'client: native').replace('//127.0.0.1:', '//localhost:').replace(`port: ${undiciPort}`, `port: ${h1Port}`));
  const h1Url = `http://127.0.0.1:${h1Port}`;
  const routerH = pinned
    ? start('router-h1', 'taskset', ['-c', '0', process.execPath, CLI, 'serve', '--config', h1Cfg])
    : start('router-h1', process.execPath, [CLI, 'serve', '--config', h1Cfg]);
  try {
    await waitReady(`${engineUrl}/health`);
    await waitReady(`${routerUrl}/readyz`);
    await waitReady(`${undiciUrl}/readyz`);
    await waitReady(`${h1Url}/readyz`);
    const useWrk = await hasWrk();
    const seqDirect: Fig[] = [];
    const seqRouter: Fig[] = [];
    const rateDirect: Fig[] = [];
    const rateRouter: Fig[] = [];
    const maxDirect: Fig[] = [];
    const maxRouter: Fig[] = [];
    const maxUndici: Fig[] = [];
    const maxH1: Fig[] = [];
    for (let r = 0; r < rounds; r++) {
      // alternate the order so drift (thermal, other processes) hits both sides
      seqDirect.push((await loadgen([engineUrl], ['--concurrency', '1']))[0]);
      seqRouter.push((await loadgen([routerUrl], ['--concurrency', '1']))[0]);
      // fixed rate: alternating short windows (direct, router, direct, ...), so
      // slow drift in the machine's load hits both sides alike while the two
      // never compete with each other for the engine or the CPUs
      for (let w = 0; w < windows; w++) {
        rateDirect.push((await loadgen([engineUrl], ['--rate', String(rate)], seconds / windows, 0.25))[0]);
        rateRouter.push((await loadgen([routerUrl], ['--rate', String(rate)], seconds / windows, 0.25))[0]);
      }
      const measured = async (url: string, via = router): Promise<Fig> => {
        const r0 = cpuSeconds(via.child.pid);
        const e0 = cpuSeconds(engine.child.pid);
        const f = await maxThroughput(url, useWrk);
        const n = f.rps * seconds;
        f.routerCpuUs = ((cpuSeconds(via.child.pid) - r0) / n) * 1e6;
        f.engineCpuUs = ((cpuSeconds(engine.child.pid) - e0) / n) * 1e6;
        return f;
      };
      maxRouter.push(await measured(routerUrl));
      maxDirect.push(await measured(engineUrl));
      maxUndici.push(await measured(undiciUrl, routerU));
      maxH1.push(await measured(h1Url, routerH));
    }
    const pick = (xs: Fig[]): Fig => ({
      rps: median(xs.map((x) => x.rps)),
      routerCpuUs: median(xs.map((x) => x.routerCpuUs ?? NaN)),
      engineCpuUs: median(xs.map((x) => x.engineCpuUs ?? NaN)),
      p50us: median(xs.map((x) => x.p50us)),
      p99us: median(xs.map((x) => x.p99us)),
      errors: xs.reduce((a, x) => a + x.errors, 0),
    });
    const sd = pick(seqDirect);
    const sr = pick(seqRouter);
    const rd = pick(rateDirect);
    const rr = pick(rateRouter);
    const md = pick(maxDirect);
    const mr = pick(maxRouter);
    const mu = pick(maxUndici);
    const mh = pick(maxH1);
    const result = {
      seconds,
      rounds,
      rate,
      concurrency,
      maxTool: useWrk ? 'wrk -t1' : 'loadgen',
      pinned,
      sequential: { direct: sd, router: sr, addedP50us: sr.p50us - sd.p50us, addedP99us: sr.p99us - sd.p99us },
      fixedRate: { direct: rd, router: rr, addedP50us: rr.p50us - rd.p50us, addedP99us: rr.p99us - rd.p99us },
      maxThroughput: { direct: md, router: mr, routerUndici: mu, routerH1: mh, ratio: mr.rps / md.rps },
    };
    if (argv.includes('--json')) {
      console.log(JSON.stringify(result));
      return;
    }
    const f = (n: number) => (Number.isFinite(n) ? Math.round(n).toLocaleString('en-US') : 'n/a');
    console.log(`overhead: ${rounds} round(s) of ${seconds} s each (median shown); engine = switchyard sim --time-scale 0`);
    console.log(pinned ? 'pinned: router on cpu 0; engine, load generator on cpu 1' : 'not pinned (pass --pin to pin)');
    console.log('\none request at a time (closed loop, concurrency 1):');
    console.log('| target | req/s | p50 µs | p99 µs | errors |');
    console.log('|---|---:|---:|---:|---:|');
    console.log(`| direct | ${f(sd.rps)} | ${f(sd.p50us)} | ${f(sd.p99us)} | ${sd.errors} |`);
    console.log(`| router | ${f(sr.rps)} | ${f(sr.p50us)} | ${f(sr.p99us)} | ${sr.errors} |`);
    console.log(`added latency: p50 ${f(result.sequential.addedP50us)} µs, p99 ${f(result.sequential.addedP99us)} µs`);
    console.log(`\nfixed rate ${rate} req/s, open loop (bench/loadgen.ts), ${windows} alternating windows of ${seconds / windows} s per round (median over windows):`);
    console.log('| target | achieved req/s | p50 µs | p99 µs | errors |');
    console.log('|---|---:|---:|---:|---:|');
    console.log(`| direct | ${f(rd.rps)} | ${f(rd.p50us)} | ${f(rd.p99us)} | ${rd.errors} |`);
    console.log(`| router | ${f(rr.rps)} | ${f(rr.p50us)} | ${f(rr.p99us)} | ${rr.errors} |`);
    console.log(`added latency: p50 ${f(result.fixedRate.addedP50us)} µs, p99 ${f(result.fixedRate.addedP99us)} µs (floors: ≤ 100, ≤ 500)`);
    console.log(`\nmax throughput, ${concurrency} connections (${result.maxTool}):`);
    console.log('| target | req/s | p50 µs | p99 µs | errors |');
    console.log('|---|---:|---:|---:|---:|');
    console.log(`| direct | ${f(md.rps)} | ${f(md.p50us)} | ${f(md.p99us)} | ${md.errors} |`);
    console.log(`| router | ${f(mr.rps)} | ${f(mr.p50us)} | ${f(mr.p99us)} | ${mr.errors} |`);
    console.log(`| router, undici client | ${f(mu.rps)} | ${f(mu.p50us)} | ${f(mu.p99us)} | ${mu.errors} |`);
    console.log(`| router, engine named localhost | ${f(mh.rps)} | ${f(mh.p50us)} | ${f(mh.p99us)} | ${mh.errors} |`);
    console.log(`router / direct throughput: ${(result.maxThroughput.ratio * 100).toFixed(1)} % (floor: router ≥ 10,000 req/s)`);
    console.log(
      `CPU per request (wall-clock-independent, from /proc): engine ${f(md.engineCpuUs!)} µs direct; through the router: ` +
        `router ${f(mr.routerCpuUs!)} µs + engine ${f(mr.engineCpuUs!)} µs ` +
        `(one router core would carry about ${f(1e6 / mr.routerCpuUs!)} req/s)`,
    );
    console.log(
      `router with the undici client: ${f(mu.routerCpuUs!)} µs per request (default client / undici: ${((mr.routerCpuUs! / mu.routerCpuUs!) * 100).toFixed(0)} %)`,
    );
    console.log(
      `router with the engine named localhost: ${f(mh.routerCpuUs!)} µs per request (by IP / by name: ${((mr.routerCpuUs! / mh.routerCpuUs!) * 100).toFixed(0)} %)`,
    );
  } finally {
    await routerH.stop();
    await routerU.stop();
    await router.stop();
    await engine.stop();
  }
}

runMain(main);
