// Builds precise prefix matching for a router from its config: the event-fed
// index and its KV-event feed (one stream per endpoint of a `prefix.mode:
// precise` pool with `kvEvents`), the token source the director awaits before
// the pick, and their Prometheus families. Nothing is built (and nothing
// costs) when no pool is precise.
import { Counter, Gauge } from 'prom-client';
import { PAYLOAD_TOTALS as T, PrefixIndex } from '../../bindings/index.js';
import type { RouterConfig } from '../config/schema.js';
import { DEFAULT_TIER_WEIGHTS_CONFIG } from '../config/prefix-mode.js';
import { MAX_ENDPOINT_IDS, type EndpointSet } from '../endpoints/endpoint.js';
import { KvEventFeed, LAG_BUCKETS, type KvFeedEndpoint } from '../kv-events/feed.js';
import { HistogramMetric, scrapeCounter, type Registry } from '../metrics/prom.js';
import type { PrefixProducer, TierWeights } from '../scheduler/prefix-producer.js';
import { TokenSource, type ModelTokenizer } from '../tokenize/source.js';
import { EngineTokenizer, SimTokenizer, type Tokenizer } from '../tokenize/tokenizer.js';
import { HfTokenizer } from '../tokenize/hf-tokenizer.js';

export interface Precise {
  feed: KvEventFeed;
  tokens: TokenSource;
  close(): Promise<void>;
  registerMetrics(registry: Registry, producer: () => PrefixProducer | null): void;
}

export function tierWeightsOf(cfg: RouterConfig): TierWeights {
  const w = cfg.scheduling.tierWeights ?? DEFAULT_TIER_WEIGHTS_CONFIG;
  return [w.gpu, w.cpu, w.disk];
}

export function buildPrecise(cfg: RouterConfig, set: EndpointSet): Precise | null {
  const pools = cfg.pools.map((p, i) => ({ p, i })).filter(({ p }) => p.prefix?.mode === 'precise');
  if (pools.length === 0) return null;
  // validateConfig (src/config/prefix-mode.ts preciseRules) made every precise pool's blockTokens and speculativeMs equal
  const blockTokens = pools[0]!.p.prefix!.blockTokens;
  const speculativeMs = pools[0]!.p.prefix!.speculativeMs;
  const index = new PrefixIndex({ blockSize: blockTokens * 4, maxEndpoints: MAX_ENDPOINT_IDS, defaultCapacity: [0xffffffff, 0xffffffff, 0xffffffff] });
  const feed = new KvEventFeed(index, { blockTokens });
  feed.speculativeMs = speculativeMs;
  const byModel = new Map<string, ModelTokenizer>();
  const hf = new Map<string, Tokenizer>();
  for (const { p } of pools) {
    const t = p.prefix!.tokenizer;
    let tok: Tokenizer;
    if (t.type === 'sim') tok = new SimTokenizer();
    else if (t.type === 'engine') {
      const eps = p.endpoints.map((e) => set.byName(e.name)!);
      tok = new EngineTokenizer(() => {
        const now = performance.now();
        const ep = eps.find((e) => e.routable(now)) ?? eps[0];
        return ep ? ep.url : null;
      });
    } else {
      const dir = t.path!;
      tok = hf.get(dir) ?? new HfTokenizer(dir);
      hf.set(dir, tok);
    }
    for (const m of p.models) byModel.set(m, { tokenizer: tok, timeoutMs: t.timeoutMs, cacheEntries: t.cacheEntries });
  }
  for (const fe of kvFeedEndpoints(cfg, set)) feed.add(fe);
  const tokens = new TokenSource(byModel);
  return {
    feed,
    tokens,
    async close() {
      feed.close();
      await tokens.close();
    },
    registerMetrics(registry, producer) {
      registerPreciseMetrics(registry, feed, tokens, producer, set);
    },
  };
}

/**
 * One subscription per publisher address of the precise pools' endpoints. Endpoints that share an address
 * with different `kvEvents.dataParallelRank`s are that publisher's ranks: each rank's batches go to its own
 * endpoint (a separate holder in the index); batches without a rank go to rank 0's endpoint (or the first).
 */
export function kvFeedEndpoints(cfg: RouterConfig, set: EndpointSet): KvFeedEndpoint[] {
  const byAddr = new Map<string, KvFeedEndpoint & { ranks: Record<number, number> }>();
  cfg.pools.forEach((p, i) => {
    if (p.prefix?.mode !== 'precise') return;
    p.endpoints.forEach((ec, j) => {
      if (!ec.kvEvents) return;
      const ep = set.byName(ec.name)!;
      const rank = ec.kvEvents.dataParallelRank;
      const have = byAddr.get(ec.kvEvents.endpoint);
      if (!have) {
        byAddr.set(ec.kvEvents.endpoint, {
          id: ep.id,
          name: ep.name,
          endpoint: ec.kvEvents.endpoint,
          replayEndpoint: ec.kvEvents.replayEndpoint ?? null,
          topic: ec.kvEvents.topic,
          model: p.models[0]!,
          ranks: rank !== undefined ? { [rank]: ep.id } : {},
          maxMessageBytes: ec.kvEvents.maxMessageBytes,
          maxQueuedBytes: ec.kvEvents.maxQueuedBytes,
          where: `pools[${i}].endpoints[${j}].kvEvents.endpoint`,
        });
        return;
      }
      // one subscription for the publisher's ranks: the tightest bounds any of them asked for
      have.maxMessageBytes = minOf(have.maxMessageBytes, ec.kvEvents.maxMessageBytes);
      have.maxQueuedBytes = minOf(have.maxQueuedBytes, ec.kvEvents.maxQueuedBytes);
      // validateConfig (preciseRules) refused a shared publisher without distinct ranks
      if (rank === undefined || have.ranks[rank] !== undefined) return;
      have.ranks[rank] = ep.id;
      if (rank === 0) {
        have.id = ep.id;
        have.name = ep.name;
      }
    });
  });
  return [...byAddr.values()];
}

function minOf(a: number | undefined, b: number | undefined): number | undefined {
  return a === undefined ? b : b === undefined ? a : Math.min(a, b);
}

function registerPreciseMetrics(registry: Registry, feed: KvEventFeed, tokens: TokenSource, producer: () => PrefixProducer | null, set: EndpointSet): void {
  const r = [registry];
  const streams = () => feed.streams;
  new Gauge({
    name: 'switchyard_kv_events_stream_healthy',
    help: 'Whether an endpoint\'s KV-event stream is trusted (1) or the endpoint is scored by the approximate mode (0).',
    labelNames: ['endpoint', 'problem'],
    registers: r,
    collect() {
      this.reset();
      for (const { name, stream } of streams()) this.set({ endpoint: name, problem: stream.problem ?? '' }, stream.healthy ? 1 : 0);
    },
  });
  const perStream: [string, string, keyof import('../kv-events/subscriber.js').KvStreamCounters][] = [
    ['switchyard_kv_events_batches_total', 'Event batches received.', 'batches'],
    ['switchyard_kv_events_gaps_total', 'Sequence gaps detected.', 'gaps'],
    ['switchyard_kv_events_replays_total', 'Replay requests sent for a gap.', 'replays'],
    ['switchyard_kv_events_replay_failures_total', 'Replays that failed or timed out (the endpoint was cleared).', 'replayFailures'],
    ['switchyard_kv_events_duplicates_total', 'Batches with a repeated or out-of-order sequence number (dropped).', 'duplicates'],
    ['switchyard_kv_events_restarts_total', 'Publishers that restarted at sequence 0 (the endpoint was cleared).', 'restarts'],
    ['switchyard_kv_events_dropped_total', 'Batches dropped because the queue was full (oldest first).', 'dropped'],
    ['switchyard_kv_events_dropped_bytes_bound_total', 'Of the dropped batches: dropped because the queue was over its maxQueuedBytes.', 'droppedBytes'],
    ['switchyard_kv_events_disconnects_total', 'Times the publisher connection went away (a frame over maxMessageBytes is one; the endpoint was cleared).', 'disconnects'],
    ['switchyard_kv_events_resubscribes_total', 'New subscriber sockets opened after a disconnect (libzmq does not reconnect one it dropped for an oversize frame).', 'resubscribes'],
    ['switchyard_kv_events_replay_overflows_total', 'Replays whose answer was over the queue bounds (not applied; the endpoint was cleared).', 'replayOverflows'],
    ['switchyard_kv_events_callback_errors_total', 'Exceptions caught in a receive, disconnect or replay callback (the stream went on; the endpoint was cleared).', 'callbackErrors'],
    ['switchyard_kv_events_decode_errors_total', 'Batches that were not valid msgpack event batches.', 'decodeErrors'],
    ['switchyard_kv_events_clears_total', "Times an endpoint's precise entries were cleared (gap, restart, flood, decode error).", 'clears'],
  ];
  for (const [name, help, key] of perStream) {
    new Counter({
      name,
      help,
      labelNames: ['endpoint'],
      registers: r,
      collect() {
        this.reset();
        for (const { name: ep, stream } of streams()) this.inc({ endpoint: ep }, stream.counters[key]);
      },
    });
  }
  const global: [string, string, () => number][] = [
    ['switchyard_kv_events_blocks_stored_total', 'Blocks applied from BlockStored events.', () => feed.totals[0]!],
    ['switchyard_kv_events_blocks_removed_total', 'Blocks applied from BlockRemoved events.', () => feed.totals[1]!],
    ['switchyard_kv_events_orphan_blocks_total', 'Stored blocks whose parent the endpoint did not hold (skipped).', () => feed.totals[2]!],
    ['switchyard_kv_events_unknown_removals_total', 'Removed blocks that were never stored (ignored).', () => feed.totals[3]!],
    ['switchyard_kv_events_unknown_events_total', 'Events of an unknown type (skipped).', () => feed.unknownEvents],
    ['switchyard_kv_events_bad_events_total', 'Events with a missing or mistyped field or a hash of the wrong width (skipped).', () => feed.badEvents],
    ['switchyard_kv_events_block_size_mismatch_total', "BlockStored events whose block_size is not the pool's prefix.blockTokens (skipped).", () => feed.blockSizeMismatch],
    ['switchyard_kv_events_dropped_rank_total', 'Batches from a data-parallel rank with no holder (dropped).', () => feed.droppedRanks],
    ['switchyard_kv_events_bad_hashes_total', 'Events skipped for a block hash that is not a 64-bit integer or at least 8 digest bytes (also in bad_events).', () => feed.badHashes],
    ['switchyard_kv_events_applied_total', 'Events applied to the precise index (stored, removed, cleared).', () => feed.totals[T.events]!],
    ['switchyard_kv_events_drain_errors_total', 'Drains that threw (their batches were lost; those endpoints were cleared).', () => feed.drainErrors + feed.resetHookErrors],
    ['switchyard_kv_events_map_forgotten_total', 'Engine block hashes forgotten over the per-endpoint limit (their blocks left the index).', () => feed.totals[T.forgotten]!],
    ['switchyard_prefix_precise_candidates_total', 'Candidates scored from the precise (event-fed) index.', () => producer()?.preciseCounters.precise ?? 0],
    ['switchyard_prefix_fallback_unhealthy_total', 'Candidates scored by the approximate mode because their event stream was unhealthy.', () => producer()?.preciseCounters.fallbackUnhealthy ?? 0],
    ['switchyard_prefix_speculative_candidates_total', 'Candidates whose precise match was raised by speculative entries (blocks picked for them that their engine had not yet confirmed).', () => producer()?.preciseCounters.speculative ?? 0],
    ['switchyard_prefix_no_room_candidates_total', 'Candidates whose host-memory and disk blocks were weighted 0: no GPU room to admit the prompt while another candidate had room.', () => producer()?.preciseCounters.noRoom ?? 0],
    ['switchyard_prefix_fallback_no_tokens_total', 'Candidates scored by the approximate mode because the request had no tokens.', () => producer()?.preciseCounters.fallbackNoTokens ?? 0],
    ['switchyard_tokenize_cache_hits_total', 'Prompts whose tokens came from the cache.', () => tokens.counters.cacheHits],
    ['switchyard_tokenize_timeouts_total', 'Tokenizations that timed out (approximate scoring for that request).', () => tokens.counters.timeouts],
    ['switchyard_tokenize_failures_total', 'Tokenizations that failed (approximate scoring for that request).', () => tokens.counters.failures],
  ];
  for (const [name, help, get] of global) scrapeCounter(r, name, help, get);
  new Gauge({
    name: 'switchyard_kv_events_map_entries',
    help: 'Engine block hashes remembered per endpoint (bounded by the event map limit).',
    labelNames: ['endpoint'],
    registers: r,
    collect() {
      this.reset();
      for (const id of feed.holders) this.set({ endpoint: set.byId(id)?.name ?? String(id) }, feed.index.mappedBlocks(id));
    },
  });
  new HistogramMetric({
    name: 'switchyard_kv_events_lag_seconds',
    help: 'From a KV-event batch arriving to its blocks being in the index.',
    buckets: LAG_BUCKETS,
    registers: r,
    series: (emit) => emit({}, feed.lag),
  });
}
