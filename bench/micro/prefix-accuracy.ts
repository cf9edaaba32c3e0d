// Prefix accuracy benchmark (`node dist/bench/micro/prefix-accuracy.js`): how well the
// router's predicted cache hit (the picked endpoint's matched blocks × block
// tokens, capped like the engine caps it) matches the hit the engine measures
// (usage.prompt_tokens_details.cached_tokens), per request, for precise mode
// (event-fed) and approximate mode (the router's own record) on the same
// workload and a fresh fleet each. The fleet is KV-bound: small GPU caches
// that evict, and a host-memory tier, so the approximate guess drifts.
//
// Workload: FAMILIES shared system prompts (SYSTEM_TOKENS each) + a unique
// question; requests sent one at a time (each waits for the previous answer
// and for the event feed to settle), picked by the scheduler with the
// default scorers, sent straight to the picked engine.
//
// Reported: Σ|predicted − measured| / Σ measured (the relative error), the
// share of requests predicted exactly, and the hit rates.
import { MatchResult } from '../../bindings/index.js';
import { API_VERSION, validateConfig } from '../../src/config/schema.js';
import { EndpointSet } from '../../src/endpoints/endpoint.js';
import { buildPrecise } from '../../src/server/precise.js';
import { Scheduler } from '../../src/scheduler/scheduler.js';
import { startFleet } from '../../src/sim/index.js';
import { SimTokenizer } from '../../src/tokenize/tokenizer.js';
import { rng } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const args = new Set(process.argv.slice(2));
const QUICK = args.has('--quick');
const ENGINES = 4;
const FAMILIES = 24;
const SYSTEM_TOKENS = 512; // 32 blocks
const REQUESTS = QUICK ? 300 : 1200;
const KV_BLOCKS = 160; // per engine: ~4 families resident on the GPU
const CPU_BLOCKS = 160;
const BLOCK = 16;
const RESET_EVERY = 100;
void MatchResult;

function word(r: () => number): string {
  return Math.floor(r() * 1e9).toString(36).padEnd(6, 'q');
}

async function run(mode: 'precise' | 'approximate'): Promise<{ err: number; exact: number; predicted: number; measured: number; prompt: number }> {
  const fleet = await startFleet(ENGINES, {
    timeScale: 0,
    kvCacheBlocks: KV_BLOCKS,
    cpuOffloadBlocks: CPU_BLOCKS,
    maxModelLen: 4096,
    kvEventsConfig: { enable_kv_cache_events: true, publisher: 'zmq', endpoint: 'tcp://127.0.0.1:*', replay_endpoint: 'tcp://127.0.0.1:*' },
  });
  const cfg = validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [
        {
          name: 'p',
          models: ['open-model'],
          prefix: { mode, blockTokens: BLOCK },
          endpoints: fleet.engines.map((e, i) => ({
            name: `e${i}`,
            url: e.url,
            // what an engine's cache_config_info tells the approximate index: its GPU blocks (its host tier and the
            // blocks its running requests hold privately are invisible to the router)
            capacity: { gpuBlocks: KV_BLOCKS, cpuBlocks: 0, diskBlocks: 0 },
            kvEvents: { endpoint: e.kvEvents!.endpoint, replayEndpoint: e.kvEvents!.replayEndpoint! },
          })),
        },
      ],
    },
    undefined,
  );
  const set = new EndpointSet(cfg.pools, cfg.dataLayer);
  const precise = buildPrecise(cfg, set);
  const sched = new Scheduler(set, cfg.scheduling, { precise: precise?.feed, random: rng(7) });
  if (precise) {
    while (!precise.feed.streams.every((s) => s.stream.healthy)) await new Promise((r) => setTimeout(r, 5));
    await new Promise((r) => setTimeout(r, 200));
  }
  const r = rng(42);
  const systems = Array.from({ length: FAMILIES }, (_, f) => {
    const rr = rng(1000 + f);
    let s = `family ${f}: `;
    while (s.length < SYSTEM_TOKENS * 4) s += word(rr) + ' ';
    return s.slice(0, SYSTEM_TOKENS * 4);
  });
  const tok = new SimTokenizer();
  let predicted = 0, measured = 0, absErr = 0, exact = 0, promptTok = 0;
  for (let i = 0; i < REQUESTS; i++) {
    // now and then an engine drops its cache (a restart, an operator's reset): the router is not told
    if (i > 0 && i % RESET_EVERY === 0) fleet.engines[(i / RESET_EVERY) % ENGINES]!.clearCache();
    // a skewed popularity: a few hot families, a long tail that keeps evicting
    const f = Math.min(FAMILIES - 1, Math.floor(-Math.log(1 - r()) * 5));
    const prompt = systems[f] + `question ${i}: ` + word(r) + ' ' + word(r);
    const tokens = tok.tokenize({ model: 'open-model', prompt })!;
    const d = sched.pick({ model: 'open-model', prompt: Buffer.from(prompt), tokens })!;
    const res = await fetch(d.endpoint.url + '/v1/completions', { method: 'POST', body: JSON.stringify({ model: 'open-model', prompt, max_tokens: 4 }) });
    const j = (await res.json()) as { usage: { prompt_tokens: number; prompt_tokens_details: { cached_tokens: number } } };
    sched.complete(d, 'ok');
    const pt = j.usage.prompt_tokens;
    const cap = Math.floor((pt - 1) / BLOCK);
    // approximate blocks are 64 bytes = 16 simulator tokens, the same unit
    const pred = Math.min(d.matchedBlocks, cap) * BLOCK;
    const meas = j.usage.prompt_tokens_details.cached_tokens;
    predicted += pred;
    measured += meas;
    absErr += Math.abs(pred - meas);
    promptTok += pt;
    if (pred === meas) exact++;
    // let the events of this request reach the index before the next pick
    if (precise) {
      const want = fleet.engines.reduce((a, e) => a + e.kvEvents!.batches, 0);
      const end = Date.now() + 200;
      while (precise.feed.streams.reduce((a, s) => a + s.stream.counters.batches, 0) < want && Date.now() < end) await new Promise((r) => setImmediate(r));
      await new Promise((r) => setImmediate(r));
      await new Promise((r) => setImmediate(r));
    }
  }
  await precise?.close();
  await sched.close();
  await fleet.close();
  return { err: absErr / Math.max(1, measured), exact: exact / REQUESTS, predicted, measured, prompt: promptTok };
}

async function main(): Promise<void> {
  const rows: string[] = [];
  for (const mode of ['precise', 'approximate'] as const) {
    const x = await run(mode);
    const line = `| ${mode} | ${(x.err * 100).toFixed(1)} % | ${(x.exact * 100).toFixed(1)} % | ${((x.predicted / x.prompt) * 100).toFixed(1)} % | ${((x.measured / x.prompt) * 100).toFixed(1)} % |`;
    rows.push(line);
    console.log(line);
  }
  console.log(
    [
      '',
      'Command: `npm run build && node dist/bench/micro/prefix-accuracy.js`' + (QUICK ? ' --quick' : ''),
      '',
      `${ENGINES} simulated engines (${KV_BLOCKS} GPU blocks + ${CPU_BLOCKS} host blocks each, KV events on), ${FAMILIES} system prompts of ${SYSTEM_TOKENS} tokens with skewed popularity, ${REQUESTS} completions one at a time, picked by the default scorers; every ${RESET_EVERY} requests one engine drops its cache (the router is not told; its events say so). The approximate index is given each engine's GPU capacity (what cache_config_info reports), not its host tier.`,
      '',
      '| mode | Σ\\|predicted − measured\\| / Σ measured | requests predicted exactly | predicted hit rate | measured hit rate |',
      '|---|---|---|---|---|',
      ...rows,
    ].join('\n'),
  );
}

void main();
