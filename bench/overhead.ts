// `npm run bench:overhead`: what the router adds per request, in one run.
// One simulated engine at --time-scale 0 (answers at once) in its own process,
// the router in its own process (`switchyard serve --upstream ...`), and the
// load generator in a third: the same small non-streaming /v1/completions
// request sent directly to the engine (the baseline) and through the router.
//   1. fixed rate 1,000 req/s (open loop, bench/loadgen.ts): p50/p99 and the
//      added latency (router minus direct);
//   2. max throughput at fixed concurrency (wrk, 1 thread; bench/loadgen.ts
//      when wrk is missing).
//   node dist/bench/overhead.js [--seconds 5] [--rate 1000] [--concurrency 64] [--rounds 2] [--json]
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { CLI, freePort, start, waitReady } from './lib/proc.js';
import { hasWrk, runWrk } from './lib/wrk.js';

const argv = process.argv.slice(2);
const arg = (name: string, def: string) => {
  const i = argv.indexOf(name);
  return i >= 0 ? argv[i + 1]! : def;
};
const seconds = Number(arg('--seconds', '5'));
const rate = Number(arg('--rate', '1000'));
const concurrency = Number(arg('--concurrency', '64'));
const rounds = Number(arg('--rounds', '2'));
const BODY = JSON.stringify({ model: 'open-model', prompt: 'Say hello to the benchmark.', max_tokens: 1 });
const LOADGEN = fileURLToPath(new URL('./loadgen.js', import.meta.url));

interface Fig {
  rps: number;
  p50us: number;
  p99us: number;
  errors: number;
}

function loadgen(url: string, extra: string[]): Promise<Fig> {
  return new Promise((resolve, reject) => {
    execFile(process.execPath, [LOADGEN, url, '--duration', String(seconds), '--warmup', '1', '--body', BODY, ...extra], { maxBuffer: 1 << 20 }, (err, out) => {
      if (err) return reject(err);
      const j = JSON.parse(out.trim().split('\n').pop()!);
      resolve({ rps: j.rps, p50us: j.p50us, p99us: j.p99us, errors: j.errors });
    });
  });
}

async function maxThroughput(url: string, useWrk: boolean): Promise<Fig> {
  if (useWrk) {
    const r = await runWrk(`${url}/v1/completions`, BODY, { connections: concurrency, threads: 1, seconds });
    return { rps: r.rps, p50us: r.p50Us, p99us: r.p99Us, errors: r.errors + r.non2xx };
  }
  return loadgen(url, ['--concurrency', String(concurrency)]);
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function main(): Promise<void> {
  const [enginePort, routerPort] = [await freePort(), await freePort()];
  const engineUrl = `http://127.0.0.1:${enginePort}`;
  const routerUrl = `http://127.0.0.1:${routerPort}`;
  const engine = start('engine', process.execPath, [CLI, 'sim', '--port', String(enginePort), '--time-scale', '0']);
  const router = start('router', process.execPath, [CLI, 'serve', '--upstream', engineUrl, '--port', String(routerPort), '--log-level', 'warn']);
  try {
    await waitReady(`${engineUrl}/health`);
    await waitReady(`${routerUrl}/readyz`);
    const useWrk = await hasWrk();
    const rateDirect: Fig[] = [];
    const rateRouter: Fig[] = [];
    const maxDirect: Fig[] = [];
    const maxRouter: Fig[] = [];
    for (let r = 0; r < rounds; r++) {
      // alternate the order so drift (thermal, other processes) hits both sides
      rateDirect.push(await loadgen(engineUrl, ['--rate', String(rate)]));
      rateRouter.push(await loadgen(routerUrl, ['--rate', String(rate)]));
      maxRouter.push(await maxThroughput(routerUrl, useWrk));
      maxDirect.push(await maxThroughput(engineUrl, useWrk));
    }
    const pick = (xs: Fig[]): Fig => ({
      rps: median(xs.map((x) => x.rps)),
      p50us: median(xs.map((x) => x.p50us)),
      p99us: median(xs.map((x) => x.p99us)),
      errors: xs.reduce((a, x) => a + x.errors, 0),
    });
    const rd = pick(rateDirect);
    const rr = pick(rateRouter);
    const md = pick(maxDirect);
    const mr = pick(maxRouter);
    const result = {
      seconds,
      rounds,
      rate,
      concurrency,
      maxTool: useWrk ? 'wrk -t1' : 'loadgen',
      fixedRate: { direct: rd, router: rr, addedP50us: rr.p50us - rd.p50us, addedP99us: rr.p99us - rd.p99us },
      maxThroughput: { direct: md, router: mr, ratio: mr.rps / md.rps },
    };
    if (argv.includes('--json')) {
      console.log(JSON.stringify(result));
      return;
    }
    const f = (n: number) => (Number.isFinite(n) ? Math.round(n).toLocaleString('en-US') : 'n/a');
    console.log(`overhead: ${rounds} round(s) of ${seconds} s each (median shown); engine = switchyard sim --time-scale 0`);
    console.log(`\nfixed rate ${rate} req/s (open loop, bench/loadgen.ts):`);
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
    console.log(`router / direct throughput: ${(result.maxThroughput.ratio * 100).toFixed(1)} % (floor: router ≥ 10,000 req/s)`);
  } finally {
    await router.stop();
    await engine.stop();
  }
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
