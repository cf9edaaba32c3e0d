// KV-event ingest benchmark (`npm run bench:kv-ingest`).
//
// 1. Throughput on one core: realistic vLLM batches (BlockStored events of 8
//    blocks × 16 tokens with a parent, BlockRemoved of 8, in both layouts,
//    written by the simulator's encoder) handed as raw payloads to the precise
//    index, one native call per drain of 64 batches that decodes the msgpack
//    and applies the events (PrefixIndex.applyPayloads, what the feed does):
//    blocks/s including decode. Baselines in the same run: msgpackr decode alone
//    (the ceiling of any msgpackr-based ingest), the TS reference path (msgpackr
//    + flatten + one applyEvents call per drain: the feed's path until ABI 6),
//    and one native record()/remove() call per event.
// 2. Lag while serving: a real ZMQ PUB sends 100 k blocks/s to a KvEventFeed
//    in this process while the loop also runs a precise match every 200 µs
//    (the request path's native call); the feed's event-to-index lag histogram
//    gives p50/p99.
// 3. Lag while a router serves traffic: `switchyard serve` (its own process) in
//    precise mode in front of two simulated engines, endpoint e0 fed by a ZMQ
//    PUB in this process at 100 k blocks/s, while bench/loadgen.js sends
//    completions at a fixed rate through the router; the router's
//    switchyard_kv_events_lag_seconds histogram is scraped per round: p99 of
//    the quietest round and of all samples.
//
//   npm run build && node dist/bench/micro/kv-ingest.js [--quick] [--only router-lag] (prints the RESULTS.md rows)
import { performance } from 'node:perf_hooks';
import { loadavg, tmpdir } from 'node:os';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { CLI, ROOT, freePort, freePortRange, start, waitReady } from '../lib/proc.js';
import { Unpackr } from 'msgpackr';
import { Publisher } from 'zeromq';
import { MatchResult, PAYLOAD_TOTALS_LENGTH, PrefixIndex } from '../../bindings/index.js';
import { EventBatchEncoder, type DecodeCounts } from '../../src/kv-events/decode.js';
import { KvEventFeed } from '../../src/kv-events/feed.js';
import { KvEventPublisher, KV_EVENTS_DEFAULTS } from '../../src/sim/kv-events.js';
import type { Histogram } from '../../src/metrics/histogram.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const args = new Set(process.argv.slice(2));
const QUICK = args.has('--quick');
const ONLY = process.argv.includes('--only') ? process.argv[process.argv.indexOf('--only') + 1] : null;
const BLOCK_TOKENS = 16;
const PER_EVENT = 8;
const EVENTS_PER_BATCH = 16; // 8 stored + 8 removed → 128 blocks per batch
const BATCHES = QUICK ? 2000 : 8000;
const DRAIN = 64;

/** Captures what the simulator's publisher encodes, without sockets. */
function makeBatches(layout: 'array' | 'map'): Buffer[] {
  const pub = new KvEventPublisher({ ...KV_EVENTS_DEFAULTS, enable_kv_cache_events: true, publisher: 'zmq', layout });
  const out: Buffer[] = [];
  // flush() would send: intercept by reading the batch the ring keeps
  let h = 1;
  const tokens = new Uint32Array(PER_EVENT * BLOCK_TOKENS);
  for (let b = 0; b < BATCHES; b++) {
    for (let e = 0; e < EVENTS_PER_BATCH / 2; e++) {
      const hashes: number[] = [];
      for (let i = 0; i < PER_EVENT; i++) hashes.push(h + i);
      for (let i = 0; i < tokens.length; i++) tokens[i] = (h * 31 + i) >>> 0;
      pub.stored(hashes, h > 1 ? h - 1 : null, tokens, null, null, 'GPU');
      // remove the blocks stored 64 events ago: the index stays at a steady size
      const old = h - 64 * PER_EVENT;
      if (old > 0) pub.removed(Array.from({ length: PER_EVENT }, (_, i) => old + i), 'GPU');
      else pub.removed([1e15 + h], 'GPU');
      h += PER_EVENT;
    }
    pub.flush();
  }
  // the replay buffer holds every batch (buffer_steps ≥ BATCHES)
  for (const r of pub.buffered()) out.push(r);
  pub.close();
  return out;
}

/** The upper bound of the bucket holding quantile q (ms). */
function quantileMs(h: Histogram, q: number): number {
  const want = q * h.count;
  for (let i = 0; i < h.bounds.length; i++) if (h.cumulative(i) >= want) return h.bounds[i]! * 1000;
  return Infinity;
}

const counts: DecodeCounts = { unknownEvents: 0, badEvents: 0, blockSizeMismatch: 0 };

/** What the feed does: payloads copied into one buffer per drain, one applyPayloads call (decode + apply in C++). */
function ingestNative(batches: Buffer[]): number {
  const index = new PrefixIndex({ blockSize: BLOCK_TOKENS * 4, maxEndpoints: 4, defaultCapacity: [1 << 24, 0, 0] });
  const totals = new Float64Array(PAYLOAD_TOTALS_LENGTH);
  const items = new Uint32Array(8 * DRAIN);
  const status = new Uint8Array(DRAIN);
  const ranks = Int32Array.of(0);
  let data = new Uint8Array(1 << 20);
  const t0 = performance.now();
  for (let i = 0; i < batches.length; i += DRAIN) {
    const end = Math.min(batches.length, i + DRAIN);
    let at = 0;
    for (let j = i; j < end; j++) {
      const b = batches[j]!;
      if (at + b.length > data.length) {
        const next = new Uint8Array(Math.max(at + b.length, data.length * 2));
        next.set(data);
        data = next;
      }
      data.set(b, at);
      const o = (j - i) * 8;
      items[o] = 1;
      items[o + 1] = at;
      at += b.length;
      items[o + 2] = at;
      items[o + 3] = 0;
      items[o + 4] = 0;
      items[o + 5] = 1;
      items[o + 6] = 1;
      items[o + 7] = 2;
    }
    index.applyPayloads(data, items, end - i, ranks, status, totals);
  }
  const ms = performance.now() - t0;
  if (totals[11]! > 0 || totals[0]! === 0) throw new Error('native ingest: malformed batches or nothing stored');
  return (totals[0]! + totals[1]! + totals[3]!) / (ms / 1000);
}

function ingestBatched(batches: Buffer[]): number {
  const index = new PrefixIndex({ blockSize: BLOCK_TOKENS * 4, maxEndpoints: 4, defaultCapacity: [1 << 24, 0, 0] });
  const enc = new EventBatchEncoder(BLOCK_TOKENS);
  const totals = new Float64Array(4);
  const seed = [1, 2] as const;
  const t0 = performance.now();
  let blocks = 0;
  for (let i = 0; i < batches.length; i += DRAIN) {
    const end = Math.min(batches.length, i + DRAIN);
    for (let j = i; j < end; j++) enc.add(batches[j]!, () => 0, () => seed, counts);
    blocks += enc.blocks;
    index.applyEvents(enc.ops, enc.nOps, enc.words, enc.tokens, totals);
    enc.reset();
  }
  const ms = performance.now() - t0;
  if (totals[2]! > 0 && totals[0]! === 0) throw new Error('nothing stored');
  return blocks / (ms / 1000);
}

const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: 'auto' } as unknown as ConstructorParameters<typeof Unpackr>[0]);

function decodeOnly(batches: Buffer[]): number {
  const t0 = performance.now();
  let blocks = 0;
  for (const b of batches) {
    const v = unpackr.unpack(b) as unknown[];
    blocks += (v[1] as unknown[]).length * PER_EVENT;
  }
  const ms = performance.now() - t0;
  return blocks / (ms / 1000);
}

/** The same events with one native call per event (record / remove), keys hashed per event in JS-driven calls. */
function ingestPerEvent(batches: Buffer[]): number {
  const index = new PrefixIndex({ blockSize: BLOCK_TOKENS * 4, maxEndpoints: 4, defaultCapacity: [1 << 24, 0, 0] });
  const keys = new BigUint64Array(PER_EVENT);
  const tok = new Uint32Array(PER_EVENT * BLOCK_TOKENS);
  const map = new Map<number, bigint>();
  const t0 = performance.now();
  let blocks = 0;
  for (const b of batches) {
    const v = unpackr.unpack(b) as unknown[];
    for (const e of v[1] as unknown[][]) {
      const arr = Array.isArray(e) ? e : [(e as Record<string, unknown>).type, (e as Record<string, unknown>).block_hashes, (e as Record<string, unknown>).parent_block_hash, (e as Record<string, unknown>).token_ids];
      const hashes = arr[1] as number[];
      if (arr[0] === 'BlockStored') {
        const ids = arr[3] as number[];
        for (let i = 0; i < ids.length; i++) tok[i] = ids[i]!;
        const parent = arr[2] === null || arr[2] === undefined ? 1n : (map.get(arr[2] as number) ?? 1n);
        index.hashPrompt(new Uint8Array(tok.buffer), parent, keys);
        for (let i = 0; i < hashes.length; i++) map.set(hashes[i]!, keys[i]!);
        index.record(0, keys, hashes.length);
      } else {
        let n = 0;
        for (const h of hashes) {
          const k = map.get(h);
          if (k !== undefined) {
            keys[n++] = k;
            map.delete(h);
          }
        }
        index.remove(0, keys, n);
      }
      blocks += hashes.length;
    }
  }
  const ms = performance.now() - t0;
  return blocks / (ms / 1000);
}

async function lagWhileServing(): Promise<{ p50: number; p99: number; blocksPerSec: number; matchP50us: number }> {
  const pub = new Publisher({ linger: 0, sendHighWaterMark: 1_000_000 });
  await pub.bind('tcp://127.0.0.1:*');
  const index = new PrefixIndex({ blockSize: BLOCK_TOKENS * 4, maxEndpoints: 4, defaultCapacity: [1 << 24, 0, 0] });
  const feed = new KvEventFeed(index, { blockTokens: BLOCK_TOKENS, maxQueuedBatches: 100000 });
  const stream = feed.add({ id: 0, name: 'e0', endpoint: pub.lastEndpoint!, model: 'm' });
  while (!stream.healthy) await new Promise((r) => setTimeout(r, 5));
  await new Promise((r) => setTimeout(r, 200));
  const batches = makeBatches('array');
  const blocksPerBatch = EVENTS_PER_BATCH * PER_EVENT;
  const rate = 100_000; // blocks/s
  const seconds = QUICK ? 2 : 5;
  const total = Math.min(batches.length, Math.floor((rate * seconds) / blocksPerBatch));
  const prompt = Buffer.alloc(BLOCK_TOKENS * 4 * 64, 7);
  const seed = PrefixIndex.seedFor('m');
  const res = new MatchResult();
  const cands = Int32Array.of(0, 1, 2, 3);
  const matchTimes: number[] = [];
  let serving = true;
  const serve = () => {
    if (!serving) return;
    const t0 = performance.now();
    index.matchPrompt(prompt, seed, cands, res);
    matchTimes.push(performance.now() - t0);
    setTimeout(serve, 0.2);
  };
  serve();
  const t0 = performance.now();
  for (let i = 0; i < total; i++) {
    const due = t0 + ((i * blocksPerBatch) / rate) * 1000;
    const wait = due - performance.now();
    if (wait > 1) await new Promise((r) => setTimeout(r, wait));
    await pub.send([Buffer.from('kv'), seq8(i), batches[i]!]);
  }
  const sentMs = performance.now() - t0;
  while (stream.counters.batches < total) await new Promise((r) => setTimeout(r, 5));
  await new Promise((r) => setTimeout(r, 50));
  serving = false;
  feed.close();
  pub.close();
  matchTimes.sort((a, b) => a - b);
  return {
    p50: quantileMs(feed.lag, 0.5),
    p99: quantileMs(feed.lag, 0.99),
    blocksPerSec: (total * blocksPerBatch) / (sentMs / 1000),
    matchP50us: (matchTimes[matchTimes.length >> 1] ?? 0) * 1000,
  };
}

/** Cumulative bucket counts of switchyard_kv_events_lag_seconds from a router's /metrics (le → count). */
async function scrapeLag(url: string): Promise<Map<string, number>> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out = new Map<string, number>();
  for (const m of text.matchAll(/^switchyard_kv_events_lag_seconds_bucket\{[^}]*le="([^"]+)"[^}]*\} (\S+)$/gm)) out.set(m[1]!, Number(m[2]));
  return out;
}

/** The bucket upper bound (ms) holding quantile q of a delta of cumulative buckets. */
function quantileOfBuckets(after: Map<string, number>, before: Map<string, number>, q: number): { ms: number; count: number } {
  const les = [...after.keys()].filter((k) => k !== '+Inf').sort((a, b) => Number(a) - Number(b));
  const count = (after.get('+Inf') ?? 0) - (before.get('+Inf') ?? 0);
  for (const le of les) {
    if ((after.get(le) ?? 0) - (before.get(le) ?? 0) >= q * count) return { ms: Number(le) * 1000, count };
  }
  return { ms: Infinity, count };
}

interface RouterLag {
  rounds: { p50: number; p99: number; batches: number }[];
  all: { p50: number; p99: number; batches: number };
  rps: number;
  p99us: number;
  errors: number;
}

async function lagWhileRouterServes(rounds: number, roundSeconds: number, reqRate: number): Promise<RouterLag> {
  const base = await freePortRange(2);
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'swy-kv-ingest-'));
  const pub = new Publisher({ linger: 0, sendHighWaterMark: 1_000_000 });
  await pub.bind('tcp://127.0.0.1:*');
  const sim = start('sim', process.execPath, [CLI, 'sim', '--fleet', '2', '--base-port', String(base), '--itl-ms', '1']);
  let router: ReturnType<typeof start> | null = null;
  try {
    for (let i = 0; i < 2; i++) await waitReady(`http://127.0.0.1:${base + i}/health`);
    const cfg = join(dir, 'router.yaml');
    writeFileSync(
      cfg,
      `apiVersion: switchyard/v1
kind: Router
listen: { host: 127.0.0.1, port: ${port} }
logging: { level: warn }
pools:
  - name: sim
    engine: vllm
    models: [open-model]
    prefix: { mode: precise, blockTokens: ${BLOCK_TOKENS}, tokenizer: { type: sim } }
    endpoints:
      - { name: e0, url: "http://127.0.0.1:${base}", kvEvents: { endpoint: "${pub.lastEndpoint}" } }
      - { name: e1, url: "http://127.0.0.1:${base + 1}" }
`,
    );
    router = start('router', process.execPath, [CLI, 'serve', '--config', cfg]);
    const url = `http://127.0.0.1:${port}`;
    await waitReady(`${url}/readyz`);
    const batches = makeBatches('array');
    const blocksPerBatch = EVENTS_PER_BATCH * PER_EVENT;
    const rate = 100_000;
    // the subscriber connects after the router starts: send until it applies something
    let seq = 0;
    const send = async (i: number) => pub.send([Buffer.from('kv'), seq8(i), batches[i % batches.length]!]);
    const t0Wait = Date.now();
    while ((await scrapeLag(url)).get('+Inf') === undefined || (await scrapeLag(url)).get('+Inf') === 0) {
      if (Date.now() - t0Wait > 10000) throw new Error('the router never applied a KV-event batch');
      await send(seq++);
      await new Promise((r) => setTimeout(r, 50));
    }
    // load through the router for the whole measurement (a 200-token prompt with a shared head)
    const prompt = 'You are a helpful assistant. '.repeat(20) + 'Summarise the KV-event benchmark.';
    const total = rounds * roundSeconds + 2;
    const gen = spawn(process.execPath, [join(ROOT, 'dist/bench/lib/loadgen.js'), url, '--rate', String(reqRate), '--duration', String(total), '--warmup', '0', '--body', JSON.stringify({ model: 'open-model', prompt, max_tokens: 4 })], { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    gen.stdout!.on('data', (b: Buffer) => (out += b.toString()));
    const genDone = new Promise<void>((r) => gen.once('exit', () => r()));
    await new Promise((r) => setTimeout(r, 1000));
    const first = await scrapeLag(url);
    let before = first;
    const res: RouterLag['rounds'] = [];
    for (let k = 0; k < rounds; k++) {
      const t0 = performance.now();
      const n = Math.floor((rate * roundSeconds) / blocksPerBatch);
      for (let i = 0; i < n; i++) {
        const due = t0 + ((i * blocksPerBatch) / rate) * 1000;
        const wait = due - performance.now();
        if (wait > 1) await new Promise((r) => setTimeout(r, wait));
        await send(seq++);
      }
      await new Promise((r) => setTimeout(r, 100));
      const after = await scrapeLag(url);
      const p50 = quantileOfBuckets(after, before, 0.5);
      const p99 = quantileOfBuckets(after, before, 0.99);
      res.push({ p50: p50.ms, p99: p99.ms, batches: p99.count });
      before = after;
    }
    await genDone;
    const lg = JSON.parse(out.trim().split('\n').pop()!) as { targets: { rps: number; p99us: number; errors: number }[] };
    const p50 = quantileOfBuckets(before, first, 0.5);
    const p99 = quantileOfBuckets(before, first, 0.99);
    return { rounds: res, all: { p50: p50.ms, p99: p99.ms, batches: p99.count }, rps: lg.targets[0]!.rps, p99us: lg.targets[0]!.p99us, errors: lg.targets[0]!.errors };
  } finally {
    await router?.stop();
    await sim.stop();
    pub.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

function seq8(n: number): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt(n));
  return b;
}

async function main(): Promise<void> {
  const lines: string[] = [];
  const load0 = loadavg()[0]!.toFixed(2);
  if (ONLY === null || ONLY === 'throughput') {
    for (const layout of ['array', 'map'] as const) {
      const batches = makeBatches(layout);
      if (batches.length !== BATCHES) throw new Error(`expected ${BATCHES} batches, got ${batches.length}`);
      const rounds = QUICK ? 3 : 5;
      const r = { native: [] as number[], batched: [] as number[], decode: [] as number[], perEvent: [] as number[] };
      for (let i = 0; i < rounds; i++) {
        r.native.push(ingestNative(batches));
        r.decode.push(decodeOnly(batches));
        r.batched.push(ingestBatched(batches));
        r.perEvent.push(ingestPerEvent(batches));
      }
      const med = (a: number[]) => a.sort((x, y) => x - y)[a.length >> 1]!;
      const n = med(r.native), b = med(r.batched), d = med(r.decode), p = med(r.perEvent);
      lines.push(
        `| ${layout} | ${(n / 1e6).toFixed(2)} M | ${(b / 1e6).toFixed(2)} M | ${(d / 1e6).toFixed(2)} M | ${(p / 1e6).toFixed(2)} M | ${(n / b).toFixed(2)} | ${(n / d).toFixed(2)} | ${(n / p).toFixed(2)} |`,
      );
      console.log(`${layout}: native ${(n / 1e6).toFixed(2)} M blocks/s, msgpackr path ${(b / 1e6).toFixed(2)} M, decode-only ${(d / 1e6).toFixed(2)} M, per-event calls ${(p / 1e6).toFixed(2)} M (native rounds: ${r.native.map((x) => (x / 1e6).toFixed(2)).join(' ')})`);
    }
  }
  const text: string[] = ['Command: `npm run build && node dist/bench/micro/kv-ingest.js` (`npm run bench:kv-ingest`).', ''];
  if (lines.length > 0) {
    text.push(
      `Batches of ${EVENTS_PER_BATCH} events (BlockStored of ${PER_EVENT} blocks × ${BLOCK_TOKENS} tokens with a parent, and BlockRemoved of ${PER_EVENT}), ${BATCHES} batches, written by the simulator's encoder; one native call per ${DRAIN} batches. Median of rounds (2 cores shared with other work: absolute numbers are noisy, the ratios in one row are what counts).`,
      '',
      '| layout | native ingest (raw payloads → applyPayloads: decode + apply in C++), blocks/s | msgpackr path (decode + flatten + applyEvents) | msgpackr decode alone | one native call per event | native / msgpackr path | native / decode alone | native / per-event calls |',
      '|---|---|---|---|---|---|---|---|',
      ...lines,
      '',
    );
  }
  if (ONLY === null || ONLY === 'lag') {
    const lag = await lagWhileServing();
    console.log(`lag at ${(lag.blocksPerSec / 1e3).toFixed(0)} k blocks/s: p50 ${lag.p50.toFixed(2)} ms, p99 ${lag.p99.toFixed(2)} ms; match p50 ${lag.matchP50us.toFixed(1)} µs`);
    text.push(`In-process lag: a real ZMQ PUB → SUB in this process at ${(lag.blocksPerSec / 1e3).toFixed(0)} k blocks/s while a precise match runs every 0.2 ms on the same loop: event-to-index lag p50 ${lag.p50.toFixed(2)} ms, p99 ${lag.p99.toFixed(2)} ms (histogram bucket upper bounds); match p50 ${lag.matchP50us.toFixed(1)} µs.`, '');
  }
  if (ONLY === null || ONLY === 'router-lag') {
    const rounds = QUICK ? 2 : 4;
    const rl = await lagWhileRouterServes(rounds, QUICK ? 3 : 5, 200);
    const rows = rl.rounds.map((r, i) => `| ${i + 1} | ${r.batches} | ${r.p50.toFixed(2)} ms | ${r.p99.toFixed(2)} ms |`);
    const quiet = rl.rounds.reduce((a, b) => (b.p99 < a.p99 ? b : a));
    console.log(`router lag: quiet round p99 ${quiet.p99.toFixed(2)} ms, all samples p99 ${rl.all.p99.toFixed(2)} ms (p50 ${rl.all.p50.toFixed(2)} ms) over ${rl.all.batches} batches; traffic ${rl.rps.toFixed(0)} req/s, p99 ${(rl.p99us / 1000).toFixed(1)} ms, ${rl.errors} errors`);
    text.push(
      `Router serving traffic: \`switchyard serve\` in precise mode (its own process) in front of two simulated engines; e0's KV events come from a ZMQ PUB in the bench process at 100 k blocks/s (${(100_000 / (EVENTS_PER_BATCH * PER_EVENT)).toFixed(0)} batches/s of ${EVENTS_PER_BATCH * PER_EVENT} blocks) while bench/loadgen.js sends ${rl.rps.toFixed(0)} completions/s (200-token prompts, sim tokenizer, precise scoring) through the router (request p99 ${(rl.p99us / 1000).toFixed(1)} ms, ${rl.errors} errors). Lag = the router's \`switchyard_kv_events_lag_seconds\` (batch received by the subscriber → its blocks in the index), scraped per round; quantiles are bucket upper bounds.`,
      '',
      '| round | batches | lag p50 | lag p99 |',
      '|---|---|---|---|',
      ...rows,
      `| all samples | ${rl.all.batches} | ${rl.all.p50.toFixed(2)} ms | ${rl.all.p99.toFixed(2)} ms |`,
      '',
      `Quietest round p99 ${quiet.p99.toFixed(2)} ms; all samples p99 ${rl.all.p99.toFixed(2)} ms.`,
      '',
    );
  }
  const load1 = loadavg()[0]!.toFixed(2);
  text.push(`Load average ${load0} → ${load1}.`);
  console.log('\n' + text.join('\n'));
}

void main();
