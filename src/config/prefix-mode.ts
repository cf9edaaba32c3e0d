// Precise prefix matching's config: a pool's `prefix` block (approximate or
// precise, engine block size, tokenizer), an endpoint's `kvEvents` block (where
// its engine publishes KV events) and `scheduling.tierWeights`. The router
// config (schema.ts) embeds these schemas; docs/config.md documents each field
// and docs/kv-events.md the feed.
import { got, int, isMapping, strict, z } from './schema-kit.js';

export const PREFIX_MODES = ['approximate', 'precise'] as const;
export type PrefixMode = (typeof PREFIX_MODES)[number];
export const TOKENIZER_TYPES = ['sim', 'engine', 'huggingface'] as const;
export type TokenizerType = (typeof TOKENIZER_TYPES)[number];

export interface TokenizerConfig {
  /** sim: the simulator's tokenizer (in process); engine: the engine's POST /tokenize; huggingface: tokenizer.json in `path`. */
  type: TokenizerType;
  /** Directory with tokenizer.json (and tokenizer_config.json with the chat template) for `huggingface`. */
  path?: string;
  /** A tokenization slower than this falls back to approximate scoring for that request, ms. */
  timeoutMs: number;
  /** Prompts whose tokens are cached (keyed by the prompt's chained block hashes). */
  cacheEntries: number;
}

export interface PoolPrefixConfig {
  mode: PrefixMode;
  /** Tokens per engine KV block (vLLM --block-size); the engine's events must use the same. */
  blockTokens: number;
  tokenizer: TokenizerConfig;
  /**
   * How long a pick's blocks count as held by the picked endpoint before its engine's events confirm them,
   * ms (0 = off): the gap between routing a prompt and the engine's BlockStored event (queue + prefill +
   * publish) during which followers of the same prefix would otherwise be spread.
   */
  speculativeMs: number;
}

export interface KvEventsEndpointConfig {
  /** The engine's ZMQ PUB address, e.g. tcp://10.0.0.5:5557. */
  endpoint: string;
  /** Its replay ROUTER address; absent: a gap clears the endpoint's entries. */
  replayEndpoint?: string;
  /** Topic prefix to subscribe to; "" = all. */
  topic: string;
  /** The data-parallel rank whose blocks this endpoint holds; absent: rank 0 and batches without a rank. */
  dataParallelRank?: number;
  /** The largest KV-event frame accepted, bytes (default 64 MiB; ZMQ_MAXMSGSIZE). */
  maxMessageBytes?: number;
  /** Payload bytes held for the decoder before the oldest batches are dropped (default 64 MiB). */
  maxQueuedBytes?: number;
}

export interface TierWeightsConfig {
  gpu: number;
  cpu: number;
  disk: number;
}

export const DEFAULT_POOL_PREFIX: PoolPrefixConfig = {
  mode: 'approximate',
  blockTokens: 16,
  tokenizer: { type: 'sim', timeoutMs: 50, cacheEntries: 4096 },
  speculativeMs: 2000,
};

/** Defaults from the simulator's costs: see DEFAULT_TIER_WEIGHTS in src/scheduler/prefix-producer.ts. */
export const DEFAULT_TIER_WEIGHTS_CONFIG: TierWeightsConfig = { gpu: 1, cpu: 0.875, disk: 0.5 };

const weight = () => {
  const error = (i: { input?: unknown }) => `must be a number in [0, 1] (got ${got(i.input)})`;
  return z.number({ error }).gte(0, { error }).lte(1, { error });
};
const ZMQ_ADDR = /^(tcp:\/\/[^\s]+:\d+|ipc:\/\/\S+)$/;
const zmqAddress = () =>
  z
    .string({ error: 'must be a ZMQ address such as tcp://10.0.0.5:5557' })
    .regex(ZMQ_ADDR, { error: (i) => `must be a ZMQ address such as tcp://10.0.0.5:5557 (got ${got(i.input)})` });
function oneOf<const T extends readonly [string, ...string[]]>(allowed: T) {
  return z.enum(allowed, { error: (i) => `must be one of: ${allowed.join(', ')} (got ${got(i.input)})` });
}

const tokenizerSchema = strict(
  {
    type: oneOf(TOKENIZER_TYPES).default(DEFAULT_POOL_PREFIX.tokenizer.type),
    path: z.string({ error: 'must be a directory path' }).min(1, { error: 'must be a directory path' }).optional(),
    timeoutMs: int(1, 60_000).default(DEFAULT_POOL_PREFIX.tokenizer.timeoutMs),
    cacheEntries: int(0, 1 << 20).default(DEFAULT_POOL_PREFIX.tokenizer.cacheEntries),
  },
  'must be a mapping {type, path, timeoutMs, cacheEntries}',
)
  .superRefine((t, ctx) => {
    if (t.type === 'huggingface' && !t.path) ctx.addIssue({ code: 'custom', path: ['path'], message: 'is required for a huggingface tokenizer (a directory with tokenizer.json)' });
  })
  .prefault({});

export const poolPrefixSchema = strict(
  {
    mode: oneOf(PREFIX_MODES).default(DEFAULT_POOL_PREFIX.mode).describe('precise: score from the engines\' KV events (endpoints need kvEvents); approximate: the router\'s own record'),
    blockTokens: int(1, 4096).default(DEFAULT_POOL_PREFIX.blockTokens).describe('tokens per engine KV block (vLLM --block-size)'),
    tokenizer: tokenizerSchema,
    speculativeMs: int(0, 60_000)
      .default(DEFAULT_POOL_PREFIX.speculativeMs)
      .describe("precise mode: how long a pick's blocks count as held by the picked endpoint until its engine's KV events confirm them, ms (0 = off)"),
  },
  'must be a mapping {mode, blockTokens, tokenizer, speculativeMs}',
).prefault({});

export const kvEventsEndpointSchema = strict(
  {
    endpoint: zmqAddress().describe("the engine's KV-event PUB address (vLLM --kv-events-config endpoint)"),
    replayEndpoint: zmqAddress().optional().describe('its replay ROUTER address (replay_endpoint)'),
    topic: z.string({ error: 'must be a string' }).default(''),
    dataParallelRank: int(0, 1023)
      .optional()
      .describe("the data-parallel rank whose blocks this endpoint holds (batches carry data_parallel_rank); endpoints sharing one publisher address with different ranks share one subscription"),
    maxMessageBytes: int(1024, 1 << 30)
      .default(64 << 20)
      .describe('the largest KV-event frame accepted (ZMQ_MAXMSGSIZE): a publisher that sends a bigger one is disconnected and the endpoint cleared'),
    maxQueuedBytes: int(1024, 1 << 30)
      .default(64 << 20)
      .describe('payload bytes of received batches held for the decoder before the oldest are dropped (the endpoint cleared, the stream unhealthy until drained)'),
  },
  'must be a mapping {endpoint, replayEndpoint, topic, dataParallelRank, maxMessageBytes, maxQueuedBytes}',
);

export const tierWeightsSchema = strict(
  {
    gpu: weight().default(DEFAULT_TIER_WEIGHTS_CONFIG.gpu),
    cpu: weight().default(DEFAULT_TIER_WEIGHTS_CONFIG.cpu),
    disk: weight().default(DEFAULT_TIER_WEIGHTS_CONFIG.disk),
  },
  'must be a mapping {gpu, cpu, disk}',
)
  .prefault({})
  .describe('what a matched prefix block is worth by the KV tier it sits in');

type AddIssue = (path: PropertyKey[], message: string) => void;

/**
 * Rules across the precise pools (they share one event-fed index and one
 * KV-event subscription per publisher address): one `blockTokens` and one
 * `speculativeMs` for all of them, and endpoints that share a publisher
 * address are that publisher's data-parallel ranks, each rank held once.
 * `nameOf` gives an endpoint's name as the router will call it. Runs on whatever parsed (raw values are guarded), so its problems are
 * reported with the rest of the config's.
 */
export function preciseRules(pools: unknown[], add: AddIssue, nameOf: (endpoint: unknown) => string): void {
  let first: { blockTokens: unknown; speculativeMs: unknown } | undefined;
  const byAddr = new Map<string, { name: string; ranked: boolean; ranks: Map<number, string> }>();
  pools.forEach((pool, i) => {
    if (!isMapping(pool) || !isMapping(pool.prefix) || pool.prefix.mode !== 'precise') return;
    const blockTokens = pool.prefix.blockTokens ?? DEFAULT_POOL_PREFIX.blockTokens;
    const speculativeMs = pool.prefix.speculativeMs ?? DEFAULT_POOL_PREFIX.speculativeMs;
    if (first === undefined) first = { blockTokens, speculativeMs };
    else {
      if (blockTokens !== first.blockTokens) add(['pools', i, 'prefix', 'blockTokens'], `must equal the other precise pools' (${String(first.blockTokens)}): they share one index`);
      if (speculativeMs !== first.speculativeMs) add(['pools', i, 'prefix', 'speculativeMs'], `must equal the other precise pools' (${String(first.speculativeMs)}): they share one index`);
    }
    if (!Array.isArray(pool.endpoints)) return;
    pool.endpoints.forEach((e, j) => {
      if (!isMapping(e) || !isMapping(e.kvEvents) || typeof e.kvEvents.endpoint !== 'string') return;
      const addr = e.kvEvents.endpoint;
      const rank = typeof e.kvEvents.dataParallelRank === 'number' ? e.kvEvents.dataParallelRank : undefined;
      const name = nameOf(e) || `pools[${i}].endpoints[${j}]`;
      const have = byAddr.get(addr);
      if (!have) {
        byAddr.set(addr, { name, ranked: rank !== undefined, ranks: rank !== undefined ? new Map([[rank, name]]) : new Map() });
        return;
      }
      const path = ['pools', i, 'endpoints', j, 'kvEvents'];
      if (rank === undefined || !have.ranked) {
        add([...path, 'endpoint'], `${addr} is also ${have.name}'s publisher: endpoints sharing a publisher need distinct dataParallelRank values`);
        return;
      }
      const holder = have.ranks.get(rank);
      if (holder !== undefined) add([...path, 'dataParallelRank'], `rank ${rank} of ${addr} is already ${holder}'s`);
      else have.ranks.set(rank, name);
    });
  });
}
