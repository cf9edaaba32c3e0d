// P/D vs aggregated on the simulator, same number of engines, through the
// router: long prompts (~8k tokens), ~200 output tokens, Poisson arrivals at
// several rates, streamed chat. Aggregated: 4 engines of role both. P/D: 3
// prefill + 1 decode engines (--prefill N) behind `disaggregation` (vLLM NIXL mode).
// In the simulator's model prefills run in chunks batched with the running
// decodes (--prefill-chunk-tokens), each chunk slowing every running decode's
// next token, as in engines with chunked prefill; a decode engine that gets
// its KV from a prefill engine does no prefill and stalls nobody.
//
// Reported per rate and fleet: decode ITL p90 and p99 exact (every inter-token
// latency the decode-side engines produced, model time, keepItlSamples; so the
// shared machine's load does not blur it), the p90 the engines'
// vllm:inter_token_latency_seconds histograms give (linear within vLLM's
// coarse buckets), the mean ITL, TTFT p90 (client), e2e p50, the tail (last
// completion after the last arrival), the decode side's running requests,
// and output tokens/s twice: over the whole run (to the last completion, so
// it includes the drain tail) and over the steady window (decode-side output
// tokens from a third of the way into the arrivals to the last one): the
// throughput at that rate. (The client's own ITL is not reported: engines and
// router share this process, so stream chunks arrive coalesced and their gaps
// say more about the event loop than the engines.)
//
// The noise band (--rounds N): each round measures the aggregated fleet twice,
// A before and A' after P/D (A, P/D, A'; every fleet of a round gets the same
// arrivals, seed 42 + round), so the summary shows P/D ÷ aggregated (against
// the mean of A and A') next to A' ÷ A, an A/A ratio: what the same fleet
// measured twice in the same run differs by. A P/D ratio inside the A/A range
// is parity within noise; one below its low end is a real deficit.
//
//   npm run build:ts && node dist/bench/pd-vs-agg.js [--rates 4,8,12] [--seconds 10] [--time-scale 0.5] [--rounds 1]
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { startEngine, type SimEngine } from '../../src/sim/index.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { startRouter } from '../../src/server/router.js';
import { registry } from '../../src/scheduler/plugins/index.js';
import { expGap, median, quantile, rng } from '../lib/stats.js';
import http from 'node:http';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const { values: a } = parseArgs({
  options: {
    rates: { type: 'string', default: '4,8,12' },
    seconds: { type: 'string', default: '10' },
    'time-scale': { type: 'string', default: '0.5' },
    'prompt-tokens': { type: 'string', default: '8000' },
    'output-tokens': { type: 'string', default: '200' },
    prefill: { type: 'string', default: '3' },
    rounds: { type: 'string', default: '1' },
  },
});
const rates = a.rates!.split(',').map(Number);
const seconds = Number(a.seconds);
const scale = Number(a['time-scale']);
const promptTokens = Number(a['prompt-tokens']);
const outTokens = Number(a['output-tokens']);
/** Of the 4 engines, how many prefill in the P/D fleet (the rest decode). */
const nPrefill = Number(a.prefill);
/** Rounds per rate: each is A, P/D, A' (the aggregated fleet twice: the A/A noise band). */
const rounds = Math.max(1, Number(a.rounds));

const SIM = { timeScale: scale, prefillOverheadMs: 2, prefillUsPerToken: 25, prefillChunkTokens: 2048, itlMs: 15, decodeSlowdown: 0.01, maxNumSeqs: 128, kvCacheBlocks: 65536, maxModelLen: 65536, keepItlSamples: true };
const ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0];

/** Failed answers by status and the start of their body (printed after the table). */
const failures = new Map<string, number>();
const agent = new http.Agent({ keepAlive: true, maxSockets: 512 });

interface Sample {
  ok: boolean;
  /** performance.now() at send and at the end of the answer. */
  t0: number;
  t1: number;
  ttftMs: number;
  gaps: number[];
  tokens: number;
}

function stream(url: string, body: string): Promise<Sample> {
  return new Promise((resolve) => {
    const t0 = performance.now();
    let last = 0;
    let ttft = -1;
    const gaps: number[] = [];
    let tokens = 0;
    const req = http.request(url + '/v1/chat/completions', { method: 'POST', agent, headers: { 'content-type': 'application/json' } }, (res) => {
      res.setEncoding('utf8');
      let buf = '';
      res.on('data', (c: string) => {
        const now = performance.now();
        buf += c;
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, i);
          buf = buf.slice(i + 2);
          if (!ev.startsWith('data: {') || !ev.includes('"delta":{"content"')) continue;
          if (ttft < 0) ttft = now - t0;
          else gaps.push(now - last);
          last = now;
          tokens++;
        }
      });
      res.on('end', () => {
        if (res.statusCode !== 200 || tokens === 0) failures.set(`${res.statusCode} ${buf.slice(0, 160)}`, (failures.get(`${res.statusCode} ${buf.slice(0, 160)}`) ?? 0) + 1);
        resolve({ ok: res.statusCode === 200, t0, t1: performance.now(), ttftMs: ttft, gaps, tokens });
      });
      res.on('error', (e) => {
        failures.set(`response error ${e.message}`, (failures.get(`response error ${e.message}`) ?? 0) + 1);
        resolve({ ok: false, t0, t1: performance.now(), ttftMs: ttft, gaps, tokens });
      });
    });
    req.on('error', (e) => {
      failures.set(`request error ${e.message} after ${tokens} tokens`, (failures.get(`request error ${e.message} after ${tokens} tokens`) ?? 0) + 1);
      resolve({ ok: false, t0, t1: performance.now(), ttftMs: -1, gaps, tokens });
    });
    req.end(body);
  });
}

/** p-quantile of the engines' ITL histograms (cumulative bucket counts summed), linear within a bucket. */
async function engineItl(engines: SimEngine[], q: number, before: Map<SimEngine, number[]>): Promise<number> {
  const counts = ITL_BUCKETS.map(() => 0);
  let total = 0;
  for (const e of engines) {
    const now = bucketCounts(await e.metricsText());
    const prev = before.get(e)!;
    now.forEach((c, i) => (counts[i]! += c - prev[i]!));
    total += now.at(-1)! - prev.at(-1)!;
  }
  const target = q * total;
  let lo = 0;
  let prevCount = 0;
  for (let i = 0; i < ITL_BUCKETS.length; i++) {
    if (counts[i]! >= target) {
      const span = counts[i]! - prevCount;
      const f = span > 0 ? (target - prevCount) / span : 0;
      return lo + f * (ITL_BUCKETS[i]! - lo);
    }
    lo = ITL_BUCKETS[i]!;
    prevCount = counts[i]!;
  }
  return Infinity;
}

function bucketCounts(text: string): number[] {
  const out = ITL_BUCKETS.map(() => 0);
  let inf = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith('vllm:inter_token_latency_seconds_bucket')) continue;
    const le = /le="([^"]+)"/.exec(line)![1]!;
    const v = Number(line.slice(line.lastIndexOf(' ') + 1));
    if (le === '+Inf') inf += v;
    else {
      const i = ITL_BUCKETS.indexOf(Number(le));
      if (i >= 0) out[i]! += v;
    }
  }
  return [...out, inf];
}

async function fleet(mode: 'agg' | 'pd') {
  const roles: ('both' | 'prefill' | 'decode')[] = mode === 'agg' ? ['both', 'both', 'both', 'both'] : [0, 1, 2, 3].map((i) => (i < nPrefill ? 'prefill' : 'decode'));
  const engines = await Promise.all(roles.map((role) => startEngine({ ...SIM, role })));
  const cfg = validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [{ name: 'p', models: ['open-model'], endpoints: engines.map((e, i) => ({ name: `${roles[i]}-${i}`, url: e.url, role: roles[i]! })) }],
      logging: { level: 'silent' },
      // engines and router share this process: a health check starved by the load would take
      // endpoints out (the engines never fail here); the breaker still watches real failures
      dataLayer: { healthIntervalMs: 0 },
      ...(mode === 'pd' ? { disaggregation: { thresholdTokens: 256 } } : {}),
    },
    (kind, s) => registry.validate(kind, s.type, s.params),
  );
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  const decoders = engines.filter((_, i) => roles[i] !== 'prefill');
  return { engines, decoders, router, close: async () => (await router.close(1000), await Promise.all(engines.map((e) => e.close()))) };
}

/** Sum and count of the engines' ITL histograms (model seconds) since `before`. */
async function itlMean(engines: SimEngine[], before: Map<SimEngine, [number, number]>): Promise<number> {
  let sum = 0;
  let count = 0;
  for (const e of engines) {
    const [s, c] = itlSumCount(await e.metricsText());
    const [s0, c0] = before.get(e)!;
    sum += s - s0;
    count += c - c0;
  }
  return count > 0 ? sum / count : NaN;
}

function itlSumCount(text: string): [number, number] {
  let sum = 0;
  let count = 0;
  for (const line of text.split('\n')) {
    if (line.startsWith('vllm:inter_token_latency_seconds_sum')) sum += Number(line.slice(line.lastIndexOf(' ') + 1));
    else if (line.startsWith('vllm:inter_token_latency_seconds_count')) count += Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return [sum, count];
}

const genTokens = (es: SimEngine[]): number => es.reduce((x, e) => x + e.stats().generationTokens, 0);

async function run(mode: 'agg' | 'pd', rate: number, seed: number) {
  const f = await fleet(mode);
  const before = new Map<SimEngine, number[]>();
  const beforeSum = new Map<SimEngine, [number, number]>();
  for (const e of f.decoders) before.set(e, bucketCounts(await e.metricsText()));
  for (const e of f.decoders) beforeSum.set(e, itlSumCount(await e.metricsText()));
  const itlFrom = new Map(f.decoders.map((e) => [e, e.itlSamples().length]));
  const rand = rng(seed);
  const filler = 'lorem ipsum dolor sit amet '.repeat(Math.ceil((promptTokens * 4) / 27)).slice(0, promptTokens * 4);
  const pending: Promise<Sample>[] = [];
  const t0 = performance.now();
  const endAt = t0 + seconds * 1000 * scale;
  // steady state: output tokens the decode side produced from a third of the way in to the last arrival
  const steadyFrom = t0 + (seconds / 3) * 1000 * scale;
  let steadyTokens0 = -1;
  let steadyT0 = 0;
  // decode-side occupancy, sampled
  let runSum = 0;
  let runMax = 0;
  let runN = 0;
  const sampler = setInterval(() => {
    const now = performance.now();
    if (steadyTokens0 < 0 && now >= steadyFrom) {
      steadyTokens0 = genTokens(f.decoders);
      steadyT0 = now;
    }
    if (now < steadyFrom || now > endAt) return;
    for (const e of f.decoders) {
      const r = e.stats().running;
      runSum += r;
      runN++;
      if (r > runMax) runMax = r;
    }
  }, 50);
  let n = 0;
  for (let at = t0; at < endAt; at += expGap(rand, rate / scale) * 1000) {
    const wait = at - performance.now();
    if (wait > 1) await new Promise((r) => setTimeout(r, wait));
    const body = JSON.stringify({ model: 'open-model', messages: [{ role: 'user', content: `request ${n++} ${filler}` }], max_tokens: outTokens, min_tokens: outTokens, stream: true });
    pending.push(stream(f.router.url, body));
  }
  const lastArrival = performance.now();
  if (lastArrival < endAt) await new Promise((r) => setTimeout(r, endAt - lastArrival));
  const steadyTokens = genTokens(f.decoders) - steadyTokens0;
  const steadyT1 = performance.now();
  clearInterval(sampler);
  const samples = await Promise.all(pending);
  const wall = (performance.now() - t0) / 1000;
  const ok = samples.filter((s) => s.ok && s.tokens > 0);
  const tokens = ok.reduce((x, s) => x + s.tokens, 0);
  const r = {
    mode,
    rate,
    offered: samples.length,
    completed: ok.length,
    itlP90Engine: (await engineItl(f.decoders, 0.9, before)) * 1000,
    itlMeanEngine: (await itlMean(f.decoders, beforeSum)) * 1000,
    itlP90Exact: quantile(f.decoders.flatMap((e) => e.itlSamples().slice(itlFrom.get(e)!)), 0.9),
    itlP99Exact: quantile(f.decoders.flatMap((e) => e.itlSamples().slice(itlFrom.get(e)!)), 0.99),
    ttftP90: quantile(ok.map((s) => s.ttftMs / scale), 0.9),
    e2eP50: quantile(ok.map((s) => (s.t1 - s.t0) / scale), 0.5),
    tailS: (Math.max(...samples.map((s) => s.t1)) - lastArrival) / 1000 / scale,
    tokPerSec: tokens / (wall / scale),
    steadyTokPerSec: steadyTokens / ((steadyT1 - steadyT0) / 1000 / scale),
    decodeRunning: `${(runSum / Math.max(1, runN)).toFixed(0)}/${runMax}`,
    steadyVsOffered: steadyTokens / Math.max(1, laggedArrivals(samples, steadyT0, steadyT1) * outTokens),
  };
  await f.close();
  return r;
}

type Result = Awaited<ReturnType<typeof run>>;

/**
 * Arrivals whose output falls in the steady window [w0, w1] if the fleet
 * keeps up: those that arrived in the window shifted back by the fleet's
 * median lag from arrival to the middle of its output ((TTFT + e2e) / 2).
 * The steady-window output of a fleet that sustains the rate is about these
 * arrivals' tokens whatever its latency; two fleets with different latencies
 * see differently shifted windows of the same Poisson arrivals, which moves
 * their steady-window tok/s apart by a few percent at 30 s runs.
 */
function laggedArrivals(samples: Sample[], w0: number, w1: number): number {
  const ok = samples.filter((s) => s.ok && s.tokens > 0);
  const lag = median(ok.map((s) => (s.ttftMs + (s.t1 - s.t0)) / 2));
  let n = 0;
  for (const s of samples) if (s.t0 >= w0 - lag && s.t0 < w1 - lag) n++;
  return n;
}

function row(label: string, r: Result, extra: string): string {
  return `| ${r.rate} | ${label} | ${r.completed}/${r.offered} | ${r.itlP90Exact.toFixed(1)} | ${r.itlP99Exact.toFixed(1)} | ${r.itlP90Engine.toFixed(1)} | ${r.itlMeanEngine.toFixed(1)} | ${r.ttftP90.toFixed(0)} | ${(r.e2eP50 / 1000).toFixed(2)} | ${r.tailS.toFixed(2)} | ${r.decodeRunning} | ${r.tokPerSec.toFixed(0)} | ${r.steadyTokPerSec.toFixed(0)} | ${r.steadyVsOffered.toFixed(3)} | ${extra} |`;
}

const range = (xs: number[]): string => `${Math.min(...xs).toFixed(2)}–${Math.max(...xs).toFixed(2)}× (median ${median(xs).toFixed(2)}×)`;

async function main() {
  console.log(`P/D vs aggregated: 4 engines each; prompts ≈${promptTokens} tokens, ${outTokens} output tokens; ${seconds} model-s of Poisson arrivals per point; time-scale ${scale}; ${rounds} round(s) of A, P/D, A' per rate`);
  console.log(
    '| rate (req/s) | fleet | completed/offered | ITL p90 (ms, engines, exact) | ITL p99 (ms, exact) | ITL p90 (ms, engines\' histogram) | ITL mean (ms, engines) | TTFT p90 (ms, client) | e2e p50 (s) | tail after last arrival (s) | decode-side running (mean/max per engine) | output tok/s (whole run) | output tok/s (steady window) | steady output ÷ its lag-aligned offered | ITL p90 (exact) agg ÷ P/D | tok/s P/D ÷ agg (whole run) | tok/s P/D ÷ agg (steady) | tok/s A\' ÷ A (whole run) | tok/s A\' ÷ A (steady) |',
  );
  console.log('|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
  const summary: string[] = [];
  for (const rate of rates) {
    const itl: number[] = [];
    const pdWhole: number[] = [];
    const pdSteady: number[] = [];
    const aaWhole: number[] = [];
    const aaSteady: number[] = [];
    const keepAgg: number[] = [];
    const keepPd: number[] = [];
    for (let k = 0; k < rounds; k++) {
      const seed = 42 + k;
      const a1 = await run('agg', rate, seed);
      const pd = await run('pd', rate, seed);
      const a2 = await run('agg', rate, seed);
      // P/D against the mean of the two aggregated measurements around it (drift cancels)
      const aggWhole = (a1.tokPerSec + a2.tokPerSec) / 2;
      const aggSteady = (a1.steadyTokPerSec + a2.steadyTokPerSec) / 2;
      const aggItl = (a1.itlP90Exact + a2.itlP90Exact) / 2;
      itl.push(aggItl / pd.itlP90Exact);
      pdWhole.push(pd.tokPerSec / aggWhole);
      pdSteady.push(pd.steadyTokPerSec / aggSteady);
      aaWhole.push(a2.tokPerSec / a1.tokPerSec);
      aaSteady.push(a2.steadyTokPerSec / a1.steadyTokPerSec);
      keepAgg.push(a1.steadyVsOffered, a2.steadyVsOffered);
      keepPd.push(pd.steadyVsOffered);
      const tag = rounds > 1 ? ` r${k + 1}` : '';
      console.log(row(`aggregated A (4 both)${tag}`, a1, ' | | | | '));
      console.log(row(`P/D (${nPrefill} prefill + ${4 - nPrefill} decode)${tag}`, pd, `${itl.at(-1)!.toFixed(2)}× | ${pdWhole.at(-1)!.toFixed(2)}× | ${pdSteady.at(-1)!.toFixed(2)}× | | `));
      console.log(row(`aggregated A' (4 both)${tag}`, a2, ` | | | ${aaWhole.at(-1)!.toFixed(2)}× | ${aaSteady.at(-1)!.toFixed(2)}×`));
    }
    summary.push(
      `| ${rate} | ${rounds} | ${range(itl)} | ${range(pdWhole)} | ${range(aaWhole)} | ${range(pdSteady)} | ${range(aaSteady)} | ${range(keepAgg)} | ${range(keepPd)} |`,
    );
  }
  console.log('');
  console.log('| rate (req/s) | rounds | ITL p90 agg ÷ P/D | tok/s P/D ÷ agg (whole run) | tok/s A\' ÷ A (whole run, noise) | tok/s P/D ÷ agg (steady) | tok/s A\' ÷ A (steady, noise) | steady ÷ lag-aligned offered, aggregated | steady ÷ lag-aligned offered, P/D |');
  console.log('|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
  for (const l of summary) console.log(l);
}

main().then(
  () => {
    for (const [k, n] of failures) console.log(`failed ×${n}: ${k}`);
    process.exit(0);
  },
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
