// Scenario `quality`: what prefix- and load-aware routing buys over the
// baselines, on a fleet of simulated engines with limited KV capacity and
// realistic times. For each policy and request rate, a fresh fleet and a fresh
// router are started (so no policy inherits another's warm caches), then one
// workload is replayed with Poisson arrivals over streaming requests.
//
// Workloads:
//   shared-prefix: groups × prompts per group, a long system prompt per group,
//                  a unique question per prompt, a fixed output length;
//   multi-turn:    agent sessions that resend their growing history each turn.
// Reported per run: TTFT p50/p90, end-to-end p50, prefix-cache hit rate from
// the engines' own usage.prompt_tokens_details.cached_tokens, the hit-rate
// bound of a perfect router (every full block already seen by any earlier
// request counts as a hit: an infinite cache; the report states whether the
// workload's distinct blocks fit in the fleet's capacity), and two output
// throughputs:
//   overall:      all output tokens / wall time of the whole run (arrivals,
//                 then the drain of whatever is still queued or running);
//   steady state: streamed tokens received by the client (each SSE token
//                 event timestamped on arrival) inside the window from 25% of
//                 the arrival window to the last arrival, per second of that
//                 window: the fleet's delivered rate once it has filled up and
//                 before the drain, which is what a capacity comparison needs.
// During each run every engine's /metrics is sampled (every 200 ms) for the
// running and waiting requests and KV usage; their means over the same
// steady-state window show how many requests each policy keeps running.
//
// Scenario --routers N (default 1): N router processes with the same config in
// front of the one fleet, each client request sent to the next router in turn
// (active-active replicas behind an L4 balancer). Each approximate router knows
// only its own picks; precise routers all read the same engines' KV events.
// Every policy of a run gets the same N; policy `switchyard-shared` is the defaults
// with the replicas sharing their prefix records and load through a redis-server
// (ha active-active, src/ha/fleet.ts). Scenario --restart-every S: every S
// seconds one engine in turn restarts (POST /sim/restart: its cache is gone,
// its KV-event publisher starts at seq 0); no router is told.
// --routers takes a list (--routers 1,4: every policy with one router and with
// four, in the same invocation, so the ratios come from one run);
// --spread one sends every request to the first router while the others run
// beside it (the same processes, scrapes and sharing: a control that separates
// what four router processes cost a loaded machine from how the decisions are
// split; --spread one,turn runs both); --warmup N sends N short requests
// through every router first (a router just started runs its request path
// unoptimised); --ha 'k: v' adds to switchyard-shared's ha block (e.g.
// --ha 'pickFlushMs: 0'); --trace FILE writes every request (sent at,
// router, endpoint, TTFT, prompt and cached tokens, group) as JSON lines.
// Besides the measured TTFT each run reports the routed TTFT (replayTtft: every
// request replayed on the simulator's serial-prefill model with the endpoint it
// went to and the cached tokens the engine reported; no CPU time of the
// machine enters it), the misses (requests served with less than half their
// prompt cached), and the CPU seconds of the routers and the simulator.
// Every policy of a run gets the same N and the same restarts. After each run every router's
// predicted match (switchyard_prefix_matched_blocks_total / _blocks_total) and
// every engine's vllm:prefix_cache_hits_total / _queries_total are read, so
// predicted and engine-measured hit rates stand side by side.
//
//   node dist/bench/quality.js [--quick] [--kv-cache-blocks N] [--rates 5,10,20] [--workloads shared-prefix,multi-turn]
//                              [--policies round-robin,least-request,switchyard] [--seconds 12] [--routers N[,M]] [--restart-every S]
//                              [--spread turn|one|one,turn] [--warmup N] [--ha 'pickFlushMs: 0'] [--trace out.jsonl]
//                              [--long-seconds 20 --long-from 40] [--json out.json]
import { writeFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Pool } from 'undici';
import { CLI, cpuSeconds, freePort, freePortRange, start, waitReady, option } from '../lib/proc.js';
import { expGap, fmt, mean, quantile, rng } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';
import { startRedisServer } from '../lib/fleet.js';

exitOnHelp(import.meta.url);

export const POLICIES: Record<string, string> = {
  'round-robin': 'scheduling:\n  scorers: []\n  picker: round-robin\n',
  'least-request': 'scheduling:\n  scorers: []\n  picker: least-request\n',
  switchyard: '', // the router's defaults: prefix-cache 3, queue 2, kv-cache-utilization 2, max-score
  // the defaults with the queue counted in requests (before issue 34: no learned speed): the baseline of the equal-pool check
  'switchyard-requests': 'scheduling:\n  scorers:\n    - { type: prefix-cache, weight: 3 }\n    - { type: queue, weight: 2, params: { unit: requests } }\n    - { type: kv-cache-utilization, weight: 2 }\n',
  // the same defaults with prefix.mode precise: engines publish KV events, the router routes on them
  precise: '',
  // precise without its speculative entries (prefix.speculativeMs: 0): the gap between a pick and its events left open
  'precise-nospec': '',
  // precise with host-memory and disk blocks weighted 0 (a diagnostic: affinity to GPU-resident copies only, as the approximate record models)
  'precise-gpu': 'scheduling:\n  tierWeights: { gpu: 1, cpu: 0, disk: 0 }\n',
  // the defaults with the replicas sharing prefix records and load (ha active-active over a redis-server the run starts)
  'switchyard-shared': '',
};

export interface FleetShape {
  engines: number;
  kvCacheBlocks: number;
  blockSize: number; // tokens
  maxNumSeqs: number;
  prefillUsPerToken: number;
  prefillOverheadMs: number;
  itlMs: number;
}

export const FLEET: FleetShape = {
  engines: 8,
  kvCacheBlocks: 1216,
  blockSize: 16,
  maxNumSeqs: 16,
  prefillUsPerToken: 50,
  prefillOverheadMs: 5,
  itlMs: 20,
};

const BYTES_PER_TOKEN = 4; // the simulator's tokenizer (src/sim/tokenizer.ts)

/** One request of a workload: a prompt (completions) or messages (chat). */
interface Turn {
  session: number;
  prompt?: string;
  user?: string;
  maxTokens: number;
}

interface Result {
  ttft: number[];
  e2e: number[];
  promptTokens: number;
  cachedTokens: number;
  outputTokens: number;
  errors: number;
  wallS: number;
  /** Seconds from the start of the run to the last arrival (last request or session sent). */
  arrivalS: number;
  /** Streamed output tokens received per TOKEN_BIN_MS bin since the start of the run. */
  tokenBins: number[];
  t0: number;
  prompts: string[]; // rendered prompts in send order, for the bound
  errorSamples: string[];
  /** --trace: one entry per finished request. */
  trace: TraceEntry[] | null;
}

/** --trace FILE: per request, when it was sent (ms since the start), through which router, where it went, its TTFT, its prompt and cached tokens. */
interface TraceEntry {
  at: number;
  router: number;
  endpoint: string;
  ttft: number;
  prompt: number;
  cached: number;
  /** The request's shared prefix: its group (shared-prefix), its session (multi-turn). */
  tag: string;
}

const TOKEN_BIN_MS = 100;

/** Counts a failed request; the first few distinct causes are kept for the log. */
function noteError(res: Result, what: string): void {
  res.errors++;
  if (res.errorSamples.length < 5 && !res.errorSamples.includes(what)) res.errorSamples.push(what);
}

function countTokens(res: Result, now: number, n: number): void {
  const bin = Math.floor((now - res.t0) / TOKEN_BIN_MS);
  const bins = res.tokenBins;
  while (bins.length <= bin) bins.push(0);
  bins[bin]! += n;
}

/** Output tokens received per second between `fromS` and `toS` seconds after the start (whole bins). */
export function windowRate(bins: readonly number[], fromS: number, toS: number): number {
  const a = Math.ceil((fromS * 1000) / TOKEN_BIN_MS);
  const b = Math.floor((toS * 1000) / TOKEN_BIN_MS);
  if (b <= a) return NaN;
  let t = 0;
  for (let i = a; i < b; i++) t += bins[i] ?? 0;
  return t / (((b - a) * TOKEN_BIN_MS) / 1000);
}

/** One /metrics sample of one engine. */
interface EngineSample {
  t: number; // seconds since the start of the run
  engine: number;
  running: number;
  waiting: number;
  kvUsage: number;
}

function gauge(text: string, name: string): number {
  const i = text.indexOf('\n' + name + '{');
  if (i < 0) return NaN;
  const sp = text.indexOf('} ', i);
  const nl = text.indexOf('\n', sp);
  return Number(text.slice(sp + 2, nl < 0 ? undefined : nl));
}

/** Samples every engine's /metrics every `everyMs` until stopped. */
function sampleEngines(urls: string[], t0: number, everyMs: number): { stop: () => Promise<EngineSample[]> } {
  const out: EngineSample[] = [];
  let live = true;
  const loop = (async () => {
    while (live) {
      const due = performance.now() + everyMs;
      await Promise.all(
        urls.map(async (u, engine) => {
          try {
            const r = await fetch(u + '/metrics');
            const text = '\n' + (await r.text());
            out.push({
              t: (performance.now() - t0) / 1000,
              engine,
              running: gauge(text, 'vllm:num_requests_running'),
              waiting: gauge(text, 'vllm:num_requests_waiting'),
              kvUsage: gauge(text, 'vllm:kv_cache_usage_perc'),
            });
          } catch {
            // a missed sample is only a missed sample
          }
        }),
      );
      const d = due - performance.now();
      if (d > 0 && live) await new Promise((r) => setTimeout(r, d));
    }
  })();
  return {
    stop: async () => {
      live = false;
      await loop;
      return out;
    },
  };
}

export interface EngineLoad {
  /** Mean running requests per engine over the window (mean of the per-engine means). */
  running: number;
  /** Lowest and highest per-engine mean. */
  runningMin: number;
  runningMax: number;
  waiting: number;
  kvUsage: number;
}

export function engineLoad(samples: EngineSample[], engines: number, fromS: number, toS: number): EngineLoad {
  const run = new Float64Array(engines);
  const wait = new Float64Array(engines);
  const kv = new Float64Array(engines);
  const cnt = new Float64Array(engines);
  for (const s of samples) {
    if (s.t < fromS || s.t > toS) continue;
    run[s.engine] += s.running;
    wait[s.engine] += s.waiting;
    kv[s.engine] += s.kvUsage;
    cnt[s.engine]++;
  }
  const per = (a: Float64Array) => Array.from(a, (v, i) => (cnt[i] ? v / cnt[i]! : NaN)).filter(Number.isFinite);
  const r = per(run);
  return {
    running: mean(r),
    runningMin: r.length ? Math.min(...r) : NaN,
    runningMax: r.length ? Math.max(...r) : NaN,
    waiting: mean(per(wait)),
    kvUsage: mean(per(kv)),
  };
}

function text(rand: () => number, bytes: number): string {
  const words = ['alpha', 'bravo', 'cargo', 'delta', 'ember', 'forge', 'gamma', 'harbor', 'ionic', 'jolt', 'kernel', 'lumen'];
  let s = '';
  while (s.length < bytes) s += words[Math.floor(rand() * words.length)] + ' ';
  return s.slice(0, bytes);
}

export interface SharedPrefixShape {
  groups: number;
  systemTokens: number;
  questionTokens: number;
  outputTokens: number;
}

function sharedPrefixTurns(shape: SharedPrefixShape, n: number, seed: number): Turn[] {
  const rand = rng(seed);
  const systems = Array.from({ length: shape.groups }, (_, g) => `[group ${g}] ` + text(rand, shape.systemTokens * BYTES_PER_TOKEN));
  const turns: Turn[] = [];
  for (let i = 0; i < n; i++) {
    const g = Math.floor(rand() * shape.groups);
    turns.push({ session: i, prompt: systems[g] + '\nQ' + i + ': ' + text(rand, shape.questionTokens * BYTES_PER_TOKEN), maxTokens: shape.outputTokens });
  }
  return turns;
}

export interface MultiTurnShape {
  turns: number;
  systemTokens: number;
  userTokens: number;
  outputTokens: number;
}

/** Chat template of the simulator: `<|role|>\ncontent\n` per message, then `<|assistant|>\n`. */
function render(messages: Array<{ role: string; content: string }>): string {
  let s = '';
  for (const m of messages) s += `<|${m.role}|>\n${m.content}\n`;
  return s + '<|assistant|>\n';
}

async function sendStream(pool: Pool, path: string, body: string, res: Result, keepText: boolean, router = 0, tag = ''): Promise<{ text: string } | null> {
  const t0 = performance.now();
  let first = 0;
  let text = '';
  let tail = '';
  let endpoint = '';
  let prompt = 0;
  let cached = 0;
  try {
    const r = await pool.request({ method: 'POST', path, headers: { 'content-type': 'application/json' }, body });
    endpoint = String(r.headers['x-switchyard-endpoint'] ?? '');
    if (r.statusCode !== 200) {
      const b = await r.body.text();
      noteError(res, `HTTP ${r.statusCode}: ${b.slice(0, 200)}`);
      return null;
    }
    for await (const chunk of r.body) {
      const now = performance.now();
      if (!first) first = now;
      tail += (chunk as Buffer).toString('utf8');
      let nl: number;
      let tokens = 0;
      while ((nl = tail.indexOf('\n\n')) >= 0) {
        const ev = tail.slice(0, nl);
        tail = tail.slice(nl + 2);
        if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
        // A completions token event (one token each) is counted without parsing it: the client
        // shares the machine with the fleet and the router.
        if (!keepText && ev.includes('"choices":[{"index":0,"text":"')) {
          tokens++;
          continue;
        }
        const j = JSON.parse(ev.slice(6));
        if (j.error) {
          noteError(res, `stream error: ${JSON.stringify(j.error).slice(0, 200)}`);
          return null;
        }
        const c = j.choices?.[0];
        if (c && (c.text !== undefined || (c.delta?.content !== undefined && c.delta.role === undefined))) tokens++;
        if (c) text += c.delta?.content ?? c.text ?? '';
        if (j.usage) {
          res.promptTokens += j.usage.prompt_tokens;
          res.outputTokens += j.usage.completion_tokens;
          res.cachedTokens += j.usage.prompt_tokens_details?.cached_tokens ?? 0;
          prompt = j.usage.prompt_tokens;
          cached = j.usage.prompt_tokens_details?.cached_tokens ?? 0;
        }
      }
      if (tokens) countTokens(res, now, tokens);
    }
  } catch (e) {
    noteError(res, `client: ${(e as Error).message}`);
    return null;
  }
  const t1 = performance.now();
  res.ttft.push(first - t0);
  res.e2e.push(t1 - t0);
  res.trace?.push({ at: t0 - res.t0, router, endpoint, ttft: first - t0, prompt, cached, tag });
  return { text };
}

export async function runLoad(
  url: string | string[],
  workload: string,
  rate: number,
  n: number,
  seed: number,
  engineUrls: string[] = [],
  restartEveryS = 0,
  spread: 'turn' | 'one' = 'turn',
): Promise<Result & { samples: EngineSample[]; restarts: number }> {
  // several routers: each request goes to the next one in turn (an L4 balancer in front of active-active replicas);
  // spread 'one': all to the first (the others run, scrape and share but route nothing: the same processes and
  // background work as 'turn', so the two differ only in how the routing decisions are split)
  const pools = (Array.isArray(url) ? url : [url]).map((u) => new Pool(u, { connections: 4096, pipelining: 1 }));
  let nextPool = 0;
  let lastPool = 0;
  const pool = () => pools[(lastPool = spread === 'one' ? 0 : nextPool++ % pools.length)]!;
  const t0 = performance.now();
  const res: Result = {
    ttft: [], e2e: [], promptTokens: 0, cachedTokens: 0, outputTokens: 0, errors: 0, wallS: 0, arrivalS: 0, tokenBins: [], t0, prompts: [], errorSamples: [],
    trace: [],
  };
  const sampler = sampleEngines(engineUrls, t0, 200);
  // --restart-every S: every S seconds of the arrival window the next engine in turn restarts (POST /sim/restart:
  // its cache is gone, its KV-event publisher starts again at seq 0), told to no router
  let restarts = 0;
  let arriving = true;
  const restarter = (async () => {
    if (!(restartEveryS > 0) || engineUrls.length === 0) return;
    for (let k = 0; ; k++) {
      await new Promise((r) => setTimeout(r, restartEveryS * 1000));
      if (!arriving) return;
      try {
        const r = await fetch(engineUrls[k % engineUrls.length]! + '/sim/restart', { method: 'POST' });
        await r.text();
        if (r.status === 200) restarts++;
      } catch {
        // counted only when it happened
      }
    }
  })();
  const rand = rng(seed ^ 0x9e3779b9);
  const pending: Promise<unknown>[] = [];
  let at = 0;
  const sleepUntil = async (ms: number) => {
    const d = ms - (performance.now() - t0);
    if (d > 0) await new Promise((r) => setTimeout(r, d));
  };
  if (workload === 'shared-prefix') {
    for (const turn of sharedPrefixTurns(SHARED, n, seed)) {
      at += expGap(rand, rate) * 1000;
      await sleepUntil(at);
      res.prompts.push(turn.prompt!);
      const body = JSON.stringify({ model: 'open-model', prompt: turn.prompt, max_tokens: turn.maxTokens, stream: true, stream_options: { include_usage: true } });
      const p = pool();
      pending.push(sendStream(p, '/v1/completions', body, res, false, lastPool, turn.prompt!.slice(0, turn.prompt!.indexOf(']') + 1)));
    }
  } else {
    // Sessions arrive as a Poisson process of rate / turns, so requests arrive at about `rate`.
    const sessions = Math.max(1, Math.round(n / MULTI.turns));
    const trand = rng(seed);
    for (let s = 0; s < sessions; s++) {
      at += expGap(rand, rate / MULTI.turns) * 1000;
      await sleepUntil(at);
      const messages = [{ role: 'system', content: `[agent ${s}] ` + text(trand, MULTI.systemTokens * BYTES_PER_TOKEN) }];
      const userTexts = Array.from({ length: MULTI.turns }, (_, t) => `turn ${t}: ` + text(trand, MULTI.userTokens * BYTES_PER_TOKEN));
      pending.push(
        (async () => {
          for (let t = 0; t < MULTI.turns; t++) {
            messages.push({ role: 'user', content: userTexts[t]! });
            res.prompts.push(render(messages));
            const body = JSON.stringify({ model: 'open-model', messages, max_tokens: MULTI.outputTokens, stream: true, stream_options: { include_usage: true } });
            const p = pool();
            const r = await sendStream(p, '/v1/chat/completions', body, res, true, lastPool, `agent ${s}`);
            if (!r) return;
            messages.push({ role: 'assistant', content: r.text });
          }
        })(),
      );
    }
  }
  res.arrivalS = at / 1000;
  arriving = false;
  await Promise.all(pending);
  await restarter;
  res.wallS = (performance.now() - t0) / 1000;
  const samples = await sampler.stop();
  await Promise.all(pools.map((p) => p.close()));
  return { ...res, samples, restarts };
}

/** Hit-rate bound of a perfect router with an infinite cache: leading full blocks seen before / prompt tokens. */
export function hitBound(prompts: string[], blockTokens: number): { rate: number; distinctBlocks: number } {
  const seen = new Set<string>();
  const blockBytes = blockTokens * BYTES_PER_TOKEN;
  let hit = 0;
  let total = 0;
  for (const p of prompts) {
    const bytes = Buffer.byteLength(p);
    const tokens = Math.ceil(bytes / BYTES_PER_TOKEN);
    total += tokens;
    const full = Math.floor(tokens / blockTokens);
    let leading = true;
    for (let b = 0; b < full; b++) {
      const key = p.slice(0, (b + 1) * blockBytes); // ASCII workloads: chars = bytes
      if (leading && seen.has(key)) hit += blockTokens;
      else leading = false;
      seen.add(key);
    }
  }
  return { rate: total ? hit / total : 0, distinctBlocks: seen.size };
}

/**
 * TTFT as the routing decisions alone make it: every request replayed, in
 * the order it was sent, on the simulator's prefill model (src/sim/
 * scheduler.ts, serial prefill: a prefill's per-token compute starts when the
 * engine's previous one ends) with its endpoint and the cached tokens the
 * engine reported, from the moment the client sent it. No router, engine or
 * client CPU time enters it (on a loaded 2-core machine those dominate the
 * measured TTFT of four router processes), nor the engine's slot limit (the
 * runs here keep well under max-num-seqs). What it shows: the prefill waits
 * and recomputes that where requests went costs.
 */
export function replayTtft(trace: readonly TraceEntry[], fleet: FleetShape): number[] {
  const sorted = [...trace].sort((a, b) => a.at - b.at);
  const freeAt = new Map<string, number>();
  const out: number[] = [];
  for (const r of sorted) {
    const compute = ((r.prompt - r.cached) * fleet.prefillUsPerToken) / 1000;
    const start = Math.max(r.at, freeAt.get(r.endpoint) ?? 0);
    freeAt.set(r.endpoint, start + compute);
    out.push(start - r.at + fleet.prefillOverheadMs + compute);
  }
  return out;
}

/** The steady-state window starts at this fraction of the arrival window (ramp-up excluded) and ends at the last arrival (drain excluded). */
const STEADY_FROM = 0.25;

let SHARED: SharedPrefixShape = { groups: 16, systemTokens: 2048, questionTokens: 256, outputTokens: 128 };
let MULTI: MultiTurnShape = { turns: 6, systemTokens: 1024, userTokens: 128, outputTokens: 64 };

export interface Row {
  workload: string;
  policy: string;
  rate: number;
  /** Router replicas in front of the fleet. */
  routers: number;
  /** How requests were spread over them: in turn, or all to the first (--spread one). */
  spread: 'turn' | 'one';
  /** Engine restarts during the run (--restart-every). */
  restarts: number;
  requests: number;
  ttftP50: number;
  ttftP90: number;
  /** replayTtft's p50 / p90: the TTFT the routing decisions make on the simulator's prefill model, without the machine's CPU. */
  routedP50: number;
  routedP90: number;
  /** Requests the engines served with less than half their prompt cached (a new prefix, or a prefix recomputed elsewhere). */
  misses: number;
  e2eP50: number;
  /** Output tokens / wall time of the whole run (arrivals + drain). */
  outTokS: number;
  /** Streamed output tokens/s between 25% of the arrival window and the last arrival. */
  steadyTokS: number;
  /** Offered output tokens/s: rate × output tokens per request (shared-prefix; NaN for multi-turn). */
  offeredTokS: number;
  arrivalS: number;
  wallS: number;
  load: EngineLoad;
  hitRate: number;
  /** The routers' predicted match: Σ matched blocks of the picked endpoints / Σ prompt blocks, over every router. */
  predictedMatch: number;
  /** The engines' own counters: Σ vllm:prefix_cache_hits_total / Σ vllm:prefix_cache_queries_total (GPU and host-tier hits). */
  engineHit: number;
  /** Precise mode: candidates raised by speculative entries / scored by the approximate fallback, over every router. */
  specCandidates: number;
  fallbackCandidates: number;
  bound: number;
  errors: number;
}

/** Σ over every series of a counter in a Prometheus text (0 when absent). */
export function counterSum(text: string, name: string): number {
  let t = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith(name)) continue;
    const c = line.charCodeAt(name.length);
    if (c !== 123 /* { */ && c !== 32 /* space */) continue;
    const v = Number(line.slice(line.lastIndexOf(' ') + 1));
    if (Number.isFinite(v)) t += v;
  }
  return t;
}

async function metricsOf(url: string): Promise<string> {
  try {
    const r = await fetch(url + '/metrics');
    return await r.text();
  } catch {
    return '';
  }
}

/** The routers' predicted match ratio (blocks the picked endpoint was believed to hold / prompt blocks), summed over routers. */
async function predictedMatch(urls: string[]): Promise<{ ratio: number; speculative: number; fallback: number; noRoom: number; waitS: number; waited: number }> {
  let blocks = 0, matched = 0, speculative = 0, fallback = 0, noRoom = 0, waitS = 0, waited = 0;
  for (const u of urls) {
    const t = await metricsOf(u);
    // flow control's queue wait (Σ seconds, requests): held at a router before dispatch
    waitS += counterSum(t, 'switchyard_flow_queue_wait_seconds_sum');
    waited += counterSum(t, 'switchyard_flow_queue_wait_seconds_count');
    blocks += counterSum(t, 'switchyard_prefix_blocks_total');
    matched += counterSum(t, 'switchyard_prefix_matched_blocks_total');
    speculative += counterSum(t, 'switchyard_prefix_speculative_candidates_total');
    fallback += counterSum(t, 'switchyard_prefix_fallback_unhealthy_total') + counterSum(t, 'switchyard_prefix_fallback_no_tokens_total');
    noRoom += counterSum(t, 'switchyard_prefix_no_room_candidates_total');
  }
  return { ratio: blocks ? matched / blocks : 0, speculative, fallback, noRoom, waitS, waited };
}

/** The engines' prefix-cache counters, summed over the fleet. */
async function engineHits(urls: string[]): Promise<{ hits: number; queries: number }> {
  let hits = 0, queries = 0;
  for (const u of urls) {
    const t = await metricsOf(u);
    hits += counterSum(t, 'vllm:prefix_cache_hits_total');
    queries += counterSum(t, 'vllm:prefix_cache_queries_total');
  }
  return { hits, queries };
}

function engineUrlsOf(base: number, n: number): string[] {
  return Array.from({ length: n }, (_, i) => `http://127.0.0.1:${base + i}`);
}

/** a - b, key by key (b absent: a). */
function minus<T extends Record<string, number>>(a: T, b: T | undefined): T {
  if (b === undefined) return a;
  const out = { ...a };
  for (const k of Object.keys(a) as Array<keyof T>) out[k] = (a[k] - b[k]) as T[keyof T];
  return out;
}

/**
 * --warmup N: N short streamed requests through every router before the
 * measured run, 8 at a time (a router just started runs its request path
 * unoptimised for its first few hundred requests; with several routers
 * started at once that warm-up is paid several times over at the start of
 * the run). Prompts shorter than one block: nothing reaches a prefix index
 * or an engine's cache; the counters read after the run are taken net of them.
 */
async function warmUp(urls: string[], n: number): Promise<void> {
  await Promise.all(
    urls.map(async (u, k) => {
      const pool = new Pool(u, { connections: 8 });
      let next = 0;
      await Promise.all(
        Array.from({ length: 8 }, async () => {
          while (next < n) {
            const i = next++;
            const body = JSON.stringify({ model: 'open-model', prompt: `w${k}.${i}`, max_tokens: 2, stream: true });
            try {
              const r = await pool.request({ method: 'POST', path: '/v1/completions', headers: { 'content-type': 'application/json' }, body });
              await r.body.text();
            } catch {
              // a failed warm-up request only warms less
            }
          }
        }),
      );
      await pool.close();
    }),
  );
}

export async function runQuality(argv: string[]): Promise<{ rows: Row[]; config: string }> {
  const arg = (name: string) => option(argv, name);
  const quick = argv.includes('--quick');
  if (quick) {
    SHARED = { groups: 16, systemTokens: 1024, questionTokens: 128, outputTokens: 32 };
    MULTI = { turns: 4, systemTokens: 512, userTokens: 64, outputTokens: 32 };
  }
  const rates = (arg('--rates') ?? (quick ? '10,40' : '5,10,20,30,40,60,80')).split(',').map(Number);
  const workloads = (arg('--workloads') ?? 'shared-prefix,multi-turn').split(',');
  const policies = (arg('--policies') ?? 'round-robin,least-request,switchyard').split(',');
  const seconds = Number(arg('--seconds') ?? (quick ? 4 : 12));
  // --routers N[,M...]: N router replicas in front of the fleet, requests spread over them in turn; a list runs
  // every policy with each count in the same invocation (e.g. --routers 1,2,4: ratios against one router, same run)
  const routerCounts = (arg('--routers') ?? '1').split(',').map(Number);
  // --trace FILE: every request (sent at, router, endpoint, TTFT, prompt and cached tokens) as JSON lines, one run a line group
  const traceFile = arg('--trace');
  // --ha 'k: v, ...': more of the ha block for switchyard-shared (e.g. --ha 'deltaFlushMs: 20')
  const haExtra = arg('--ha') ?? '';
  // --warmup N: N short requests through every router before each measured run (0: none, the default)
  const warmup = Number(arg('--warmup') ?? 0);
  if (!(Number.isInteger(warmup) && warmup >= 0)) throw new Error(`--warmup must be a whole number of requests ≥ 0 (got ${arg('--warmup')})`);
  // --spread turn|one: requests to the routers in turn (default), or all to the first one while the others run
  // beside it (a control: the same processes, scrapes and sharing; only the routing is not split); a list runs both
  const spreads = (arg('--spread') ?? 'turn').split(',') as Array<'turn' | 'one'>;
  if (!spreads.every((x) => x === 'turn' || x === 'one')) throw new Error(`--spread must be turn or one, comma-separated (got ${arg('--spread')})`);
  const traces: string[] = [];
  // --restart-every S: an engine restart every S seconds of arrivals, engines in turn (0: none)
  const restartEvery = Number(arg('--restart-every') ?? 0);
  if (!(restartEvery >= 0)) throw new Error(`--restart-every must be a number of seconds ≥ 0 (got ${arg('--restart-every')})`);
  if (!routerCounts.every((r) => Number.isInteger(r) && r >= 1)) throw new Error(`--routers must be positive integers, comma-separated (got ${arg('--routers')})`);
  // Shared-prefix past round-robin's saturation: a longer arrival window, so the steady state dominates
  // the run (the multi-turn runs keep `seconds`: no floor is read from them).
  const longSeconds = Number(arg('--long-seconds') ?? (quick ? seconds : 20));
  const longFrom = Number(arg('--long-from') ?? (quick ? Infinity : 40));
  // --kv-cache-blocks N: the same fleet with another KV capacity per engine (e.g. a KV-bound fleet)
  const kvOverride = arg('--kv-cache-blocks');
  // --cpu-offload-blocks N: a host-memory KV tier per engine (evicted blocks move there, reload at a per-block cost)
  const cpuOffload = Number(arg('--cpu-offload-blocks') ?? 0);
  const fleet = { ...FLEET, kvCacheBlocks: kvOverride !== undefined ? Number(kvOverride) : quick ? 600 : FLEET.kvCacheBlocks };
  if (!Number.isInteger(fleet.kvCacheBlocks) || fleet.kvCacheBlocks < 1) throw new Error(`--kv-cache-blocks must be a positive integer (got ${kvOverride})`);
  const dir = mkdtempSync(join(tmpdir(), 'swy-quality-'));
  const rows: Row[] = [];
  for (const workload of workloads) {
    for (const rate of rates) {
      const long = workload === 'shared-prefix' && rate >= longFrom;
      const n = Math.max(48, Math.round(rate * (long ? longSeconds : seconds)));
      for (const routers of routerCounts) for (const spread of routers > 1 ? spreads : (['turn'] as const)) for (const policy of policies) {
        if (!(policy in POLICIES)) throw new Error(`unknown policy ${policy}`);
        const base = await freePortRange(fleet.engines);
        const precise = policy === 'precise' || policy === 'precise-nospec' || policy === 'precise-gpu';
        const evBase = precise ? await freePortRange(fleet.engines) : 0;
        const rpBase = precise ? await freePortRange(fleet.engines) : 0;
        const sim = start('sim', process.execPath, [
          CLI, 'sim', '--fleet', String(fleet.engines), '--base-port', String(base),
          '--max-num-seqs', String(fleet.maxNumSeqs), '--kv-cache-blocks', String(fleet.kvCacheBlocks),
          '--block-size', String(fleet.blockSize), '--prefill-us-per-token', String(fleet.prefillUsPerToken),
          '--prefill-overhead-ms', String(fleet.prefillOverheadMs), '--itl-ms', String(fleet.itlMs), '--default-max-tokens', '16',
          ...(cpuOffload > 0 ? ['--cpu-offload-blocks', String(cpuOffload)] : []),
          ...(precise
            ? ['--kv-events-config', JSON.stringify({ enable_kv_cache_events: true, publisher: 'zmq', endpoint: `tcp://127.0.0.1:${evBase}`, replay_endpoint: `tcp://127.0.0.1:${rpBase}` })]
            : []),
        ]);
        for (let i = 0; i < fleet.engines; i++) await waitReady(`http://127.0.0.1:${base + i}/health`, 60_000);
        const ports: number[] = [];
        for (let k = 0; k < routers; k++) ports.push(await freePort());
        const endpoints = Array.from(
          { length: fleet.engines },
          (_, i) =>
            `        - { name: e${i}, url: "http://127.0.0.1:${base + i}"` +
            (precise ? `, kvEvents: { endpoint: "tcp://127.0.0.1:${evBase + i}", replayEndpoint: "tcp://127.0.0.1:${rpBase + i}" }` : '') +
            ' }',
        ).join('\n');
        // switchyard-shared: a redis-server for the replicas' shared stream (active-active, src/ha/fleet.ts)
        let redis: ReturnType<typeof start> | null = null;
        let haBlock = '';
        if (policy === 'switchyard-shared') {
          const r = await startRedisServer('switchyard-shared');
          redis = r.proc;
          haBlock = `ha: { redis: "${r.url}"${haExtra ? ', ' + haExtra : ''} }\n`;
        }
        // N replicas with one config but their own port
        const procs = ports.map((port, k) => {
          const cfg = join(dir, `${policy}-${k}.yaml`);
          writeFileSync(
            cfg,
            `apiVersion: switchyard/v1\nkind: Router\nlisten: { host: 127.0.0.1, port: ${port} }\n` +
              `pools:\n  - name: sim\n    engine: vllm\n    models: [open-model]\n` +
              (precise
                ? '    prefix: { mode: precise, blockTokens: ' + fleet.blockSize + ', tokenizer: { type: sim }' + (policy === 'precise-nospec' ? ', speculativeMs: 0' : '') + ' }\n'
                : '') +
              `    endpoints:\n${endpoints}\n` +
              haBlock +
              POLICIES[policy],
          );
          return start(`router${k}`, process.execPath, [CLI, 'serve', '--config', cfg]);
        });
        const routerUrls = ports.map((port) => `http://127.0.0.1:${port}`);
        try {
          for (const u of routerUrls) await waitReady(`${u}/readyz`, 60_000);
          if (warmup > 0) await warmUp(routerUrls, warmup);
          const before = warmup > 0 ? { p: await predictedMatch(routerUrls), e: await engineHits(engineUrlsOf(base, fleet.engines)) } : null;
          const engineUrls = Array.from({ length: fleet.engines }, (_, i) => `http://127.0.0.1:${base + i}`);
          const cpu0 = procs.reduce((a, p) => a + cpuSeconds(p.child.pid), 0);
          const simCpu0 = cpuSeconds(sim.child.pid);
          const r = await runLoad(routerUrls, workload, rate, n, 1234 + rate, engineUrls, restartEvery, spread);
          const routerCpuS = procs.reduce((a, p) => a + cpuSeconds(p.child.pid), 0) - cpu0;
          const simCpuS = cpuSeconds(sim.child.pid) - simCpu0;
          if (traceFile !== undefined) for (const e of r.trace ?? []) traces.push(JSON.stringify({ workload, rate, policy, routers, spread, ...e }));
          const bound = hitBound(r.prompts, fleet.blockSize);
          const routed = replayTtft(r.trace ?? [], fleet);
          const from = STEADY_FROM * r.arrivalS;
          const predicted = minus(await predictedMatch(routerUrls), before?.p);
          const measured = minus(await engineHits(engineUrls), before?.e);
          const row: Row = {
            workload, policy, rate, routers, spread, restarts: r.restarts, requests: r.prompts.length,
            ttftP50: quantile(r.ttft, 0.5), ttftP90: quantile(r.ttft, 0.9), e2eP50: quantile(r.e2e, 0.5),
            routedP50: quantile(routed, 0.5), routedP90: quantile(routed, 0.9),
            misses: (r.trace ?? []).filter((e) => e.cached * 2 < e.prompt).length,
            outTokS: r.outputTokens / r.wallS, steadyTokS: windowRate(r.tokenBins, from, r.arrivalS),
            offeredTokS: workload === 'shared-prefix' ? rate * SHARED.outputTokens : NaN,
            arrivalS: r.arrivalS, wallS: r.wallS, load: engineLoad(r.samples, fleet.engines, from, r.arrivalS),
            hitRate: r.promptTokens ? r.cachedTokens / r.promptTokens : 0,
            predictedMatch: predicted.ratio, engineHit: measured.hits / measured.queries,
            specCandidates: predicted.speculative, fallbackCandidates: predicted.fallback,
            bound: bound.rate, errors: r.errors,
          };
          rows.push(row);
          if (r.errorSamples.length) console.error(`  errors: ${r.errorSamples.join(' | ')}`);
          console.error(
            `${workload} rate=${rate}/s ${policy} routers=${routers}${spread === 'one' ? ' (all to the first)' : ''} restarts=${r.restarts}: ttft p50 ${fmt(row.ttftP50)} ms p90 ${fmt(row.ttftP90)} ms ` +
              `(routed p50 ${fmt(row.routedP50)} ms p90 ${fmt(row.routedP90)} ms, misses ${row.misses}), e2e p50 ${fmt(row.e2eP50)} ms, ` +
              `out tok/s steady ${fmt(row.steadyTokS)} overall ${fmt(row.outTokS)} (arrivals ${fmt(row.arrivalS)} s, wall ${fmt(row.wallS)} s), ` +
              `running/engine ${fmt(row.load.running)} [${fmt(row.load.runningMin)}–${fmt(row.load.runningMax)}] waiting ${fmt(row.load.waiting)} kv ${fmt(row.load.kvUsage * 100)}%, ` +
              `hit ${fmt(row.hitRate * 100)}% (bound ${fmt(row.bound * 100)}%, ${bound.distinctBlocks} distinct blocks vs fleet ${fleet.engines * fleet.kvCacheBlocks}), ` +
              `predicted ${fmt(row.predictedMatch * 100)}% vs engines ${fmt(row.engineHit * 100)}%, spec ${predicted.speculative} fallback ${predicted.fallback} no-room ${predicted.noRoom}, ` +
              `flow-control wait mean ${fmt((predicted.waitS / Math.max(1, predicted.waited)) * 1000)} ms, ` +
              `CPU s routers ${fmt(routerCpuS)} sim ${fmt(simCpuS)}, errors ${r.errors}`,
          );
        } finally {
          await Promise.all(procs.map((p) => p.stop()));
          await sim.stop();
          await redis?.stop();
        }
      }
    }
  }
  const config =
    `fleet: ${fleet.engines} simulated vLLM engines, kv-cache-blocks ${fleet.kvCacheBlocks} × ${fleet.blockSize} tokens, max-num-seqs ${fleet.maxNumSeqs}, ` +
    `prefill ${fleet.prefillOverheadMs} ms + ${fleet.prefillUsPerToken} µs/uncached token (serial, stalls decode), ` +
    `ITL ${fleet.itlMs} ms × (1 + 1% per other running request: the simulator's default decode slowdown); ` +
    `shared-prefix: ${SHARED.groups} groups, ${SHARED.systemTokens}-token system prompt, ${SHARED.questionTokens}-token question, ${SHARED.outputTokens} output tokens; ` +
    `multi-turn: ${MULTI.turns} turns, ${MULTI.systemTokens}-token system prompt, ${MULTI.userTokens}-token user turns, ${MULTI.outputTokens} output tokens; ` +
    `${routerCounts.join(', ')} router replica${routerCounts.some((r) => r > 1) ? 's' : ''} (requests spread over them in turn); ` +
    (restartEvery > 0 ? `an engine restart (cache and KV-event publisher, told to no router) every ${restartEvery} s of arrivals, engines in turn; ` : '') +
    `~${seconds} s of Poisson arrivals per rate${longFrom < Infinity ? ` (shared-prefix: ~${longSeconds} s from ${longFrom} req/s)` : ''} (at least 48 requests); ` +
    `steady-state output tokens/s counted from streamed tokens between ${STEADY_FROM * 100}% of the arrival window and the last arrival`;
  if (traceFile !== undefined) writeFileSync(traceFile, traces.join('\n') + '\n');
  const json = arg('--json');
  if (json) writeFileSync(json, JSON.stringify({ config, rows }, null, 2));
  return { rows, config };
}

export function qualityTable(rows: Row[]): string {
  let md =
    '| workload | rate (req/s) | policy | routers | requests | TTFT p50 (ms) | TTFT p90 (ms) | routed TTFT p50 / p90 (ms) | misses | e2e p50 (ms) | output tok/s, steady state | output tok/s, overall | ' +
    'running / engine (min–max) | waiting / engine | KV usage | hit rate | predicted match | engines\' prefix-cache hits | bound | errors |\n';
  md += '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n';
  for (const r of rows) {
    md +=
      `| ${r.workload} | ${r.rate} | ${r.policy} | ${r.routers}${r.spread === 'one' ? ' (all to 1st)' : ''} | ${r.requests} | ${fmt(r.ttftP50)} | ${fmt(r.ttftP90)} | ${fmt(r.routedP50)} / ${fmt(r.routedP90)} | ${r.misses} | ${fmt(r.e2eP50)} | ${fmt(r.steadyTokS, 0)} | ` +
      `${fmt(r.outTokS, 0)} | ${fmt(r.load.running)} (${fmt(r.load.runningMin)}–${fmt(r.load.runningMax)}) | ${fmt(r.load.waiting)} | ${fmt(r.load.kvUsage * 100, 0)}% | ` +
      `${fmt(r.hitRate * 100)}% | ${fmt(r.predictedMatch * 100)}% | ${fmt(r.engineHit * 100)}% | ${fmt(r.bound * 100)}% | ${r.errors} |\n`;
  }
  return md;
}

export interface Floor {
  ok: boolean;
  name: string;
  value: string;
}

const x = (a: number, b: number) => (Number.isFinite(a / b) ? `${(a / b).toFixed(2)}×` : '—');

/**
 * Issue 6's floors on the shared-prefix workload, Switchyard against
 * round-robin: at the highest rate before round-robin saturates (its
 * steady-state output rate still ≥ 90% of the offered rate) and at every rate
 * past it, TTFT p50 ≥ 5× lower and output tokens/s ≥ 2× higher (the
 * steady-state figure: a capacity comparison; the overall figure is shown
 * beside it); hit rate ≥ 90% of the bound at every rate.
 */
export function qualityFloors(rows: Row[]): { floors: Floor[]; notes: string[] } {
  const sub = rows.filter((r) => r.workload === 'shared-prefix');
  const get = (p: string, rate: number) => sub.find((r) => r.policy === p && r.rate === rate);
  const rates = [...new Set(sub.map((r) => r.rate))].sort((a, b) => a - b).filter((q) => get('round-robin', q) && get('switchyard', q));
  const floors: Floor[] = [];
  const notes: string[] = [];
  if (rates.length === 0) return { floors, notes: ['no shared-prefix run with both round-robin and switchyard: floors not checked'] };
  const unsaturated = rates.filter((q) => get('round-robin', q)!.steadyTokS >= 0.9 * get('round-robin', q)!.offeredTokS);
  const r0 = unsaturated.length ? unsaturated[unsaturated.length - 1]! : rates[0]!;
  notes.push(
    `round-robin keeps up with the offered load (steady-state output ≥ 90% of offered) up to ${unsaturated.length ? `${r0} req/s` : 'none of the rates run'}; ` +
      `the TTFT and throughput floors apply from ${r0} req/s up`,
  );
  for (const q of rates.filter((v) => v >= r0)) {
    const rr = get('round-robin', q)!;
    const sy = get('switchyard', q)!;
    const tag = q === r0 ? ' (highest rate before round-robin saturates)' : '';
    floors.push({
      ok: rr.ttftP50 / sy.ttftP50 >= 5,
      name: `TTFT p50 ≥ 5× lower than round-robin at ${q} req/s${tag}`,
      value: `${fmt(rr.ttftP50)} → ${fmt(sy.ttftP50)} ms = ${x(rr.ttftP50, sy.ttftP50)}`,
    });
    floors.push({
      ok: sy.steadyTokS / rr.steadyTokS >= 2,
      name: `output tokens/s (steady state) ≥ 2× round-robin at ${q} req/s${tag}`,
      value:
        `${fmt(rr.steadyTokS, 0)} → ${fmt(sy.steadyTokS, 0)} = ${x(sy.steadyTokS, rr.steadyTokS)} (offered ${fmt(sy.offeredTokS, 0)}; ` +
        `overall ${fmt(rr.outTokS, 0)} → ${fmt(sy.outTokS, 0)} = ${x(sy.outTokS, rr.outTokS)}; running/engine ${fmt(rr.load.running)} → ${fmt(sy.load.running)})`,
    });
  }
  for (const q of rates) {
    const sy = get('switchyard', q)!;
    floors.push({
      ok: sy.hitRate >= 0.9 * sy.bound,
      name: `hit rate ≥ 90% of the bound at ${q} req/s`,
      value: `${fmt(sy.hitRate * 100)}% of ${fmt(sy.bound * 100)}% = ${fmt((sy.hitRate / sy.bound) * 100)}%`,
    });
  }
  const peak = (p: string) => Math.max(...sub.filter((r) => r.policy === p).map((r) => r.steadyTokS).filter(Number.isFinite));
  notes.push(
    `peak steady-state output tokens/s over the rates run: round-robin ${fmt(peak('round-robin'), 0)}, switchyard ${fmt(peak('switchyard'), 0)} ` +
      `(${x(peak('switchyard'), peak('round-robin'))}); below its saturation a policy delivers the offered load, so a throughput ratio there is ~1 whatever the router`,
  );
  return { floors, notes };
}

export function floorLines(rows: Row[]): string {
  const { floors, notes } = qualityFloors(rows);
  let md = 'Floors (issue 6, shared-prefix, Switchyard vs round-robin):\n\n';
  for (const n of notes) md += `- ${n}\n`;
  for (const f of floors) md += `- ${f.ok ? 'PASS' : 'MISS'} ${f.name}: ${f.value}\n`;
  return md;
}

/**
 * Issue 15's floors (benchmark 3), precise against the approximate mode
 * (`switchyard`) on the shared-prefix workload: steady-state output tokens/s
 * ≥ at every rate, and TTFT p90 ≥ 1.2× lower at the saturating rate (the
 * lowest rate at which the approximate mode delivers < 90% of the offered
 * output; the highest rate run if it never saturates).
 */
export function preciseFloors(rows: Row[]): { floors: Floor[]; notes: string[] } {
  const sub = rows.filter((r) => r.workload === 'shared-prefix');
  const get = (p: string, rate: number) => sub.find((r) => r.policy === p && r.rate === rate);
  const rates = [...new Set(sub.map((r) => r.rate))].sort((a, b) => a - b).filter((q) => get('precise', q) && get('switchyard', q));
  const floors: Floor[] = [];
  const notes: string[] = [];
  if (rates.length === 0) return { floors, notes: ['no shared-prefix run with both precise and switchyard: floors not checked'] };
  const sat = rates.find((q) => get('switchyard', q)!.steadyTokS < 0.9 * get('switchyard', q)!.offeredTokS) ?? rates[rates.length - 1]!;
  notes.push(`the approximate mode first delivers < 90% of the offered output at ${sat} req/s (the saturating rate)`);
  for (const q of rates) {
    const a = get('switchyard', q)!;
    const p = get('precise', q)!;
    floors.push({
      ok: p.steadyTokS >= a.steadyTokS,
      name: `output tokens/s (steady state) precise ≥ approximate at ${q} req/s`,
      value: `${fmt(a.steadyTokS, 0)} → ${fmt(p.steadyTokS, 0)} = ${x(p.steadyTokS, a.steadyTokS)} (overall ${fmt(a.outTokS, 0)} → ${fmt(p.outTokS, 0)} = ${x(p.outTokS, a.outTokS)})`,
    });
  }
  const a = get('switchyard', sat)!;
  const p = get('precise', sat)!;
  floors.push({
    ok: a.ttftP90 / p.ttftP90 >= 1.2,
    name: `TTFT p90 ≥ 1.2× lower than approximate at ${sat} req/s (saturating)`,
    value: `${fmt(a.ttftP90)} → ${fmt(p.ttftP90)} ms = ${x(a.ttftP90, p.ttftP90)}`,
  });
  return { floors, notes };
}

export function preciseFloorLines(rows: Row[]): string {
  const { floors, notes } = preciseFloors(rows);
  let md = 'Floors (issue 15, benchmark 3, shared-prefix, precise vs approximate):\n\n';
  for (const n of notes) md += `- ${n}\n`;
  for (const f of floors) md += `- ${f.ok ? 'PASS' : 'MISS'} ${f.name}: ${f.value}\n`;
  return md;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const argv = process.argv.slice(2);
  const { rows, config } = await runQuality(argv);
  console.log(config + '\n');
  console.log(qualityTable(rows));
  if (rows.some((r) => r.policy === 'round-robin')) console.log(floorLines(rows));
  if (rows.some((r) => r.policy === 'precise')) console.log(preciseFloorLines(rows));
}
