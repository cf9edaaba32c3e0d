// Plugin interfaces of the scheduler. Nothing here knows about HTTP: the
// scheduler picks an endpoint for a request description and is told when the
// request completes.
import type { Endpoint, EndpointSet } from '../endpoints/endpoint.js';
import type { SessionTable } from '../sessions/table.js';
import type { Role } from '../config/schema.js';

/** What the scheduler needs to know about a request. */
export interface SchedRequest {
  /** The requested model (served model name). */
  model: string;
  /** Bytes used for prefix matching: the rendered chat messages or the prompt. Empty/absent = no prefix scoring. */
  prompt?: Uint8Array;
  /** The conversation the request belongs to ('' or absent: none); session-aware plugins pin on it. */
  sessionKey?: string;
  /** The prompt as the engine tokenizes it (token ids as little-endian uint32 bytes): precise prefix matching's input; absent = approximate only. */
  tokens?: Uint8Array;
  /**
   * P/D pairing: only endpoints of this endpoint's pool and revision are
   * candidates (a prefill leg and its decode leg never mix revisions). Null
   * or absent: no constraint.
   */
  pair?: Endpoint | null;
  /**
   * Only endpoints of this role are candidates (P/D: a request an SGLang
   * disaggregation-mode endpoint would refuse goes to a `both` one). Null or
   * absent: no constraint.
   */
  role?: Role | null;
  /** TTFT objective in ms from `x-slo-ttft-ms` (0 or absent: none; latency plugins may apply the band's default). */
  sloTtftMs?: number;
  /** Time-per-output-token objective in ms from `x-slo-tpot-ms` (0 or absent: none). */
  sloTpotMs?: number;
  /** The flow-control band the request was admitted in ('' or absent: unknown). */
  band?: string;
}

/**
 * Per-request latency bookkeeping the scheduler's Decision carries between the
 * pick and the request's end (the director's Flight holds it as plain
 * numbers: no allocation). Written by latency plugins in onDecision, read back
 * in onFirstToken / onStreamEnd / onEnd.
 */
export interface LatencyNote {
  /** Uncached prompt bytes this request added to the endpoint's pending prefill work (0 once prefilled). */
  latPending: number;
  /** Prefill work (KB) queued ahead of this request at dispatch. */
  latWork: number;
  /** This request's own uncached prefill work (KB) at dispatch. */
  latOwn: number;
  /** Requests decoding at the endpoint at the first token (the TPOT feature). */
  latRunning: number;
  latPredTtftMs: number;
  latPredTpotMs: number;
  /** The objectives applied (header or band default; 0 = none). */
  latSloTtftMs: number;
  latSloTpotMs: number;
  /** Index of the band's SLO counters in the plugin (-1: none). */
  latBand: number;
}

/** Prefix blocks of one pick: hashed from the prompt, and of those, held by the picked endpoint. */
export interface PickBlocks {
  promptBlocks: number;
  matchedBlocks: number;
}

/** Per-cycle state shared by the plugins of one pick. Reused between cycles: do not keep references. */
export interface CycleContext {
  request: SchedRequest;
  /** performance.now() at the start of the cycle (an endpoint's freshness and queue estimate take it: ep.fresh(now), ep.queueEstimate(now)). */
  now: number;
  /** Filled by the prefix producer before the scorers run: prompt blocks hashed (0: no prefix to match)... */
  promptBlocks: number;
  /** ...and per candidate (the scorers' `eps` order) the leading blocks that endpoint is believed to hold. */
  prefixMatched: Uint32Array;
  /** Per candidate, those blocks weighted by the KV tier they sit in (GPU > host > disk); absent: unweighted. */
  prefixWeighted?: Float64Array;
  /** Set once the picker chose: the matched blocks of the picked endpoint. */
  matchedBlocks: number;
}

export interface Plugin {
  readonly type: string;
  readonly name: string;
  /** True when the plugin reads the prefix producer's match (ctx.promptBlocks, ctx.prefixMatched): the scheduler then runs it. */
  readonly usesPrefix?: boolean;
  /** Bytes per prefix block this plugin needs (undefined: scheduling.prefixBlockSize). */
  readonly blockSize?: number;
  /** Called once the picker chose `ep` (at candidate index `index`); the request is being dispatched. */
  onPicked?(ctx: CycleContext, ep: Endpoint, index: number): void;
  /**
   * Called when a dispatched request finishes (any outcome). On a failure,
   * `blocks` is the pick's { promptBlocks, matchedBlocks } and `req` the
   * request again when the caller passed it to complete() (cold path only).
   */
  onComplete?(ep: Endpoint, failed: boolean, blocks?: PickBlocks, req?: SchedRequest): void;
  /** Called when an endpoint's KV-cache geometry (from cache_config_info) is learnt or changes. */
  onCapacity?(ep: Endpoint): void;
  /** Called when an endpoint left the set (drained and removed at runtime): drop what the plugin keeps for it. */
  onRemoved?(ep: Endpoint): void;
  /** True when the plugin uses the latency hooks below (the director then times first tokens and streams). */
  readonly usesLatency?: boolean;
  /** After onPicked: the plugin fills the request's latency note (predictions, pending work). */
  onDecision?(ctx: CycleContext, ep: Endpoint, index: number, note: LatencyNote): void;
  /** A streamed answer's first token arrived `ms` after dispatch. */
  onFirstToken?(ep: Endpoint, note: LatencyNote, ms: number): void;
  /** The stream ended: `tokens` tokens after the first took `decodeMs` in all. */
  onStreamEnd?(ep: Endpoint, note: LatencyNote, tokens: number, decodeMs: number): void;
  /** A non-streamed 200 answer of `tokens` output tokens (its usage) took `totalMs` from dispatch (before onEnd). */
  onAnswer?(ep: Endpoint, note: LatencyNote, totalMs: number, tokens: number): void;
  /** The request ended (any outcome; after the hooks above): release what onDecision counted. */
  onEnd?(ep: Endpoint, note: LatencyNote): void;
  /** Registers the plugin's metric families (read at scrape time) in the router's registry. */
  registerMetrics?(registry: import('prom-client').Registry): void;
  close?(): void;
}

/** Returns the endpoints that pass. May return `eps` itself; a returned scratch array is valid until the next cycle. */
export interface Filter extends Plugin {
  filter(ctx: CycleContext, eps: readonly Endpoint[]): readonly Endpoint[];
}

/** Scores each candidate in [0, 1] (higher is better). Entries [0, eps.length) of the returned array are valid until the next cycle. */
export interface Scorer extends Plugin {
  score(ctx: CycleContext, eps: readonly Endpoint[]): Float64Array;
}

/** Chooses one endpoint given the weighted total scores. */
export interface Picker extends Plugin {
  pick(ctx: CycleContext, eps: readonly Endpoint[], scores: Float64Array): number;
}

/** What a plugin factory receives besides its parameters. */
export interface PluginEnv {
  endpoints: EndpointSet;
  /** Bytes per prefix-index block. */
  prefixBlockSize: number;
  /** Random source in [0, 1); tests may seed it. */
  random: () => number;
  /** Session pins and turn records (the `session-affinity` filter); the scheduler makes a default table when none is given. */
  sessions?: SessionTable;
}
