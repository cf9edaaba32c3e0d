// Prefill/decode disaggregation: the director's collaborator for the prefill
// leg. The flight picks its decode endpoint as for any request; then, only
// when the config has a `disaggregation` block and the decode endpoint's pool
// has prefill endpoints, the decider looks at the prompt's uncached tokens on
// that decode endpoint and either lets the flight go on alone (direct) or runs
// a prefill leg on a prefill endpoint of the same pool and revision (picked by
// the prefill profile):
//
//   nixl (vLLM NIXL connector, sequential): prefill with do_remote_decode,
//     stream false, max_tokens 1 → its kv_transfer_params → decode with them.
//   sglang (bootstrap): bootstrap_host/port/room added to the body, sent to
//     prefill and decode at once; decode's answer is the client's.
//
// Failure rules: a prefill 4xx goes to the client; any other prefill failure
// or a timeout, or a prefill answer without usable kv_transfer_params, sends
// the request to decode alone (it prefills itself), counted as a fallback.
// A decode failure before the first byte is retried by the flight on another
// decode endpoint of the same revision (SchedRequest.pair).
//
// SGLang: a server in prefill or decode disaggregation mode refuses every
// request without a bootstrap room (HTTP 400 "Disaggregated request received
// without bootstrap room id", SGLang's scheduler), and sgl-router's PD mode
// never sends decode alone: each attempt selects a new (prefill, decode) pair
// and a new room. So in SGLang mode a decode-role endpoint is never sent a
// request alone: "direct" goes to a `both` endpoint of its revision when one
// is ready, else the request is disaggregated anyway (counted as forced); a
// failed pair (prefill 5xx, error, timeout; decode-transfer) becomes a new
// pair (fresh room, another prefill endpoint when there is one, the same
// decode endpoint) within the retry budget, or goes to a `both` endpoint; with
// neither, the client gets a 502/503 before any byte.
//
// Wire facts: vLLM's disagg proxy examples and llm-d's P/D sidecar (prefill
// request: kv_transfer_params {do_remote_decode: true, do_remote_prefill:
// false, remote_* null}, stream false, max_tokens 1, stream_options and
// min_tokens dropped); SGLang's mini load balancer (bootstrap_host,
// bootstrap_port, bootstrap_room as a random 63-bit integer).
import { performance } from 'node:perf_hooks';
import { randomBytes } from 'node:crypto';
import type { DisaggregationConfig } from '../config/schema.js';
import type { Endpoint, EndpointSet } from '../endpoints/endpoint.js';
import { Histogram } from '../metrics/histogram.js';
import { HistogramMetric, type Registry } from '../metrics/prom.js';
import type { UpstreamCall, UpstreamClient, UpstreamSink } from '../proxy/upstream.js';
import type { Decision, Scheduler } from '../scheduler/scheduler.js';
import type { SchedRequest } from '../scheduler/types.js';
import { Counter } from 'prom-client';

/** Bytes of prompt text per token, the conversion the prefix index uses everywhere (docs/config.md). */
export const BYTES_PER_TOKEN = 4;
/** Largest prefill answer read (a one-token completion with its transfer parameters is far smaller). */
const MAX_PREFILL_BODY = 1024 * 1024;

/**
 * Prompt tokens the decode endpoint would still have to compute: the prompt
 * less the leading blocks the prefix producer matched on it. Without prefix
 * matching (no prefix scorer), the whole prompt. The one place the decider
 * counts: a tier-weighted count (a block on CPU or disk is cached but not free)
 * replaces this function.
 */
export function uncachedTokens(promptBytes: number, promptBlocks: number, matchedBlocks: number, blockSize: number): number {
  if (promptBlocks === 0 || blockSize <= 0) return promptBytes / BYTES_PER_TOKEN;
  const cached = matchedBlocks * blockSize;
  return cached >= promptBytes ? 0 : (promptBytes - cached) / BYTES_PER_TOKEN;
}

/** The body with `fields` (JSON members, comma-separated) added at the end of its top-level object: later members win, as in JSON.parse and Python's json. */
export function withFields(raw: Buffer, fields: string): Buffer {
  let end = raw.length - 1;
  while (end >= 0 && (raw[end] === 0x20 || raw[end] === 0x0a || raw[end] === 0x0d || raw[end] === 0x09)) end--;
  // the director parsed the body as a JSON object: it ends with '}'
  let before = end - 1;
  while (before >= 0 && (raw[before] === 0x20 || raw[before] === 0x0a || raw[before] === 0x0d || raw[before] === 0x09)) before--;
  const sep = before >= 0 && raw[before] === 0x7b /* { */ ? '' : ',';
  return Buffer.concat([raw.subarray(0, end), Buffer.from(sep + fields + '}')]);
}

const NIXL_PREFILL_FIELDS =
  '"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null},' +
  '"stream":false,"max_tokens":1,"stream_options":null,"min_tokens":0';

/** Why a disaggregated request went to decode alone. */
export const FALLBACK_REASONS = ['prefill-5xx', 'prefill-error', 'prefill-timeout', 'kv-missing', 'kv-malformed', 'decode-transfer'] as const;
export type FallbackReason = (typeof FALLBACK_REASONS)[number];
/** Why an SGLang pair failed (and a new pair was formed): the SGLang subset of the fallback reasons. */
export const NEW_PAIR_REASONS = ['prefill-5xx', 'prefill-error', 'prefill-timeout', 'decode-transfer'] as const;

function bump(m: Map<FallbackReason, number>, reason: FallbackReason): void {
  m.set(reason, (m.get(reason) ?? 0) + 1);
}

export class PdMetrics {
  disaggregated = 0;
  direct = 0;
  /** Direct because the decode endpoint's revision had no ready prefill endpoint. */
  noPrefill = 0;
  readonly fallback = new Map<FallbackReason, number>();
  /** SGLang: failed pairs retried as a new pair (fresh room), by reason. */
  readonly newPair = new Map<FallbackReason, number>();
  /** SGLang: below the threshold, disaggregated anyway (a decode-role endpoint refuses a request alone; no `both` endpoint ready). */
  forced = 0;
  /** SGLang: direct requests sent to a `both` endpoint instead of the decode-role endpoint first picked. */
  directToBoth = 0;
  /** A prefill 4xx returned to the client. */
  prefillRejected = 0;
  kvMissing = 0;
  kvMalformed = 0;
  readonly prefillLeg = new Histogram([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]);

  get fallbacks(): number {
    let n = 0;
    for (const v of this.fallback.values()) n += v;
    return n;
  }

  register(registry: Registry): void {
    const m = this;
    const r = [registry];
    new Counter({
      name: 'switchyard_pd_decisions_total',
      help: 'P/D decisions for requests to pools with prefill endpoints: disaggregated (prefill leg ran and decode got its KV), direct (decode alone by the decider, or no ready prefill endpoint in the revision), fallback (prefill failed: decode alone).',
      labelNames: ['decision'],
      registers: r,
      collect() {
        this.reset();
        this.inc({ decision: 'disaggregated' }, m.disaggregated);
        this.inc({ decision: 'direct' }, m.direct);
        this.inc({ decision: 'fallback' }, m.fallbacks);
      },
    });
    new Counter({
      name: 'switchyard_pd_fallbacks_total',
      help: 'Disaggregated requests sent to decode alone, by reason.',
      labelNames: ['reason'],
      registers: r,
      collect() {
        this.reset();
        for (const reason of FALLBACK_REASONS) this.inc({ reason }, m.fallback.get(reason) ?? 0);
      },
    });
    new Counter({
      name: 'switchyard_pd_new_pairs_total',
      help: 'SGLang: failed prefill/decode pairs retried as a new pair (fresh bootstrap room, another prefill endpoint when there is one), by reason.',
      labelNames: ['reason'],
      registers: r,
      collect() {
        this.reset();
        for (const reason of NEW_PAIR_REASONS) this.inc({ reason }, m.newPair.get(reason) ?? 0);
      },
    });
    new Counter({
      name: 'switchyard_pd_forced_total',
      help: 'SGLang: requests below thresholdTokens disaggregated anyway: their decode endpoint (disaggregation mode) refuses a request without a bootstrap room and their revision had no ready both endpoint.',
      registers: r,
      collect() {
        this.reset();
        this.inc(m.forced);
      },
    });
    new Counter({
      name: 'switchyard_pd_direct_to_both_total',
      help: 'SGLang: direct requests (below thresholdTokens, or no ready prefill endpoint) sent to a both endpoint of the revision instead of the decode endpoint first picked.',
      registers: r,
      collect() {
        this.reset();
        this.inc(m.directToBoth);
      },
    });
    new Counter({
      name: 'switchyard_pd_kv_transfer_params_total',
      help: 'Prefill answers (HTTP 200) whose kv_transfer_params were missing or malformed.',
      labelNames: ['problem'],
      registers: r,
      collect() {
        this.reset();
        this.inc({ problem: 'missing' }, m.kvMissing);
        this.inc({ problem: 'malformed' }, m.kvMalformed);
      },
    });
    new Counter({
      name: 'switchyard_pd_direct_no_prefill_total',
      help: 'Requests the decider would have disaggregated, sent direct because their revision had no ready prefill endpoint.',
      registers: r,
      collect() {
        this.reset();
        this.inc(m.noPrefill);
      },
    });
    new Counter({
      name: 'switchyard_pd_prefill_rejected_total',
      help: 'Prefill legs answered with a 4xx, returned to the client.',
      registers: r,
      collect() {
        this.reset();
        this.inc(m.prefillRejected);
      },
    });
    new HistogramMetric({
      name: 'switchyard_pd_prefill_leg_seconds',
      help: 'Duration of prefill legs (dispatch to the end of the answer). The decode leg is switchyard_upstream_ttft_seconds of its endpoint.',
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
      registers: r,
      series: (emit) => emit({}, m.prefillLeg),
    });
  }
}

/** What the disaggregator needs of a flight (the director's Flight implements it). */
export interface PdFlight {
  readonly endpoint: Endpoint;
  /** The upstream path of both legs. */
  readonly path: string;
  readonly promptBytes: number;
  readonly promptBlocks: number;
  readonly matchedBlocks: number;
  readonly aborted: boolean;
  /** The body as the client sent it. */
  readonly rawBody: Buffer;
  prefillEndpoint: Endpoint | null;
  /** The headers every leg carries (x-request-id, authorization, and whatever else the decode leg gets). */
  legHeaders(endpoint: Endpoint): string[];
  /** Sends the decode leg with `body`; `retryBody` is what a retry on another decode endpoint sends. */
  sendDecode(body: Buffer, retryBody: Buffer): void;
  /** The prefill leg answered 4xx: the client gets that status and message. */
  prefillRejected(status: number, message: string): void;
  /** The prefill leg belongs to the flight until it ends: aborted with it. */
  setLeg(leg: PrefillLeg | null): void;
  /** SGLang mode: the decode leg has not sent a byte to the client yet. */
  readonly started: boolean;
  /** SGLang mode: prefill endpoints whose pair failed for this request (a new pair prefers another). */
  readonly triedPrefill: readonly Endpoint[] | null;
  /** SGLang mode: the pair failed (`prefill` its prefill endpoint): a new pair, a `both` endpoint, or a clean error. */
  pairFailed(reason: FallbackReason, prefill: Endpoint | null): void;
  /**
   * SGLang mode: re-pick a `both` endpoint of the picked endpoint's pool and
   * revision for `sreq` (the first pick released); false (nothing changed)
   * when none is ready.
   */
  toBoth(sreq: SchedRequest): boolean;
  /** SGLang mode: the revision of the picked decode endpoint has no ready prefill endpoint and no ready both endpoint: the flight picks elsewhere or answers 503. */
  noPairInRevision(): void;
  /** SGLang mode: nothing can serve the request: the client gets `status` and `message` (the decode pick released, no breaker failure). */
  unservable(status: number, message: string): void;
}

export class Disaggregator {
  readonly cfg: DisaggregationConfig;
  readonly prefill: Scheduler;
  readonly upstream: UpstreamClient;
  readonly metrics = new PdMetrics();
  /** Bytes per block of the decode scheduler's prefix index (0: no prefix matching). */
  readonly blockSize: number;
  readonly #set: EndpointSet;
  /** Pools with prefill endpoints (recomputed when the endpoints change). */
  #pdPools = new Set<string>();
  /** Endpoints whose pool and revision have an active both endpoint (recomputed when the endpoints change). */
  #withBoth = new Set<Endpoint>();
  readonly #req: SchedRequest = { model: '', prompt: undefined, pair: null };
  /** The decode scheduler's prefix producer: its tier-weighted cached count for the endpoint just picked. */
  readonly #decodePrefix: { pickedCachedTokens(): number } | null;

  /**
   * The prompt tokens the chosen decode endpoint would compute itself: the
   * prompt less its tier-weighted cached tokens (a block in host memory or on
   * disk counts as cached but not free: docs/prefix-index.md, tier weights);
   * without tiers from the pick, the matched block count (uncachedTokens).
   */
  uncached(f: PdFlight, sreq: SchedRequest): number {
    const cached = this.#decodePrefix !== null ? this.#decodePrefix.pickedCachedTokens() : -1;
    if (cached < 0) return uncachedTokens(f.promptBytes, f.promptBlocks, f.matchedBlocks, this.blockSize);
    const promptTokens = sreq.tokens !== undefined ? sreq.tokens.length / 4 : f.promptBytes / BYTES_PER_TOKEN;
    return cached >= promptTokens ? 0 : promptTokens - cached;
  }

  constructor(
    cfg: DisaggregationConfig,
    set: EndpointSet,
    prefill: Scheduler,
    upstream: UpstreamClient,
    decodeBlockSize: number,
    decodePrefix: { pickedCachedTokens(): number } | null = null,
  ) {
    this.cfg = cfg;
    this.#decodePrefix = decodePrefix;
    this.prefill = prefill;
    this.upstream = upstream;
    this.blockSize = decodeBlockSize;
    this.#set = set;
    this.#scan();
    set.onChange(() => this.#scan());
  }

  #scan(): void {
    const s = new Set<string>();
    const both = new Set<string>();
    for (const ep of this.#set.all) {
      if (ep.state !== 'active') continue;
      if (ep.role === 'prefill') s.add(ep.pool);
      else if (ep.role === 'both') both.add(ep.pool + '\0' + ep.revision);
    }
    const withBoth = new Set<Endpoint>();
    for (const ep of this.#set.all) if (both.has(ep.pool + '\0' + ep.revision)) withBoth.add(ep);
    this.#pdPools = s;
    this.#withBoth = withBoth;
  }

  #mode(ep: Endpoint): 'nixl' | 'sglang' {
    return this.cfg.mode === 'auto' ? (ep.engine === 'sglang' ? 'sglang' : 'nixl') : this.cfg.mode;
  }

  /**
   * An endpoint that refuses a request without a bootstrap room: an SGLang
   * prefill or decode server in a pool with prefill endpoints (SGLang's
   * scheduler aborts such a request with 400). Every request it gets is one
   * leg of a pair.
   */
  needsRoom(ep: Endpoint): boolean {
    return ep.role !== 'both' && this.#pdPools.has(ep.pool) && this.#mode(ep) === 'sglang';
  }

  /** The pool and revision of `ep` have an active `both` endpoint (the scheduler's filters may still refuse it). */
  hasBoth(ep: Endpoint): boolean {
    return this.#withBoth.has(ep);
  }

  countFallback(reason: FallbackReason): void {
    bump(this.metrics.fallback, reason);
  }

  countNewPair(reason: FallbackReason): void {
    bump(this.metrics.newPair, reason);
  }

  /** SGLang: the decode leg of a pair answered (status below 500): the request was served disaggregated. */
  paired(): void {
    this.metrics.disaggregated++;
  }

  /**
   * Called by the flight right after its first decode pick, while `sreq`
   * still holds the prompt. True when it took the dispatch over (a prefill
   * leg runs; the flight's sendDecode follows); false: the flight sends as usual.
   */
  begin(f: PdFlight, sreq: SchedRequest): boolean {
    const ep = f.endpoint;
    if (!this.#pdPools.has(ep.pool)) return false;
    const m = this.metrics;
    if (ep.role === 'both' && this.#mode(ep) === 'sglang') {
      // an SGLang server outside disaggregation mode cannot take a prefill server's KV: it prefills itself
      m.direct++;
      return false;
    }
    const room = this.needsRoom(ep);
    let forced = false;
    if (this.uncached(f, sreq) < this.cfg.thresholdTokens) {
      if (!room) {
        m.direct++;
        return false;
      }
      // an SGLang decode server would refuse it alone: a both endpoint of its revision, else a pair anyway
      if (f.toBoth(sreq)) {
        m.direct++;
        m.directToBoth++;
        return false;
      }
      forced = true;
    }
    let d = this.#pickPrefill(sreq, ep, f.triedPrefill);
    // a retry whose failed pairs used every prefill endpoint: one of them again (a fresh room)
    if (d === null && f.triedPrefill !== null) d = this.#pickPrefill(sreq, ep, null);
    if (d === null) {
      if (room) {
        if (f.toBoth(sreq)) {
          m.direct++;
          m.noPrefill++;
          m.directToBoth++;
          return false;
        }
        f.noPairInRevision();
        return true;
      }
      m.direct++;
      m.noPrefill++;
      return false;
    }
    if (forced) m.forced++;
    this.#start(f, d, this.#mode(ep));
    return true;
  }

  /**
   * SGLang: a new pair after a failed one (the flight counted the attempt):
   * a prefill endpoint of the decode endpoint's revision other than those that
   * failed, with a fresh room; else a `both` endpoint of the revision alone;
   * else the same prefill endpoint again (a fresh room); else a clean 502.
   */
  repair(f: PdFlight, sreq: SchedRequest, why: string): void {
    let d = this.#pickPrefill(sreq, f.endpoint, f.triedPrefill);
    if (d === null && f.toBoth(sreq)) {
      f.sendDecode(f.rawBody, f.rawBody);
      return;
    }
    // no other prefill endpoint and no both endpoint: the same prefill endpoint again (a new room)
    if (d === null && f.triedPrefill !== null) d = this.#pickPrefill(sreq, f.endpoint, null);
    if (d !== null) {
      this.#start(f, d, 'sglang');
      return;
    }
    f.unservable(502, `no prefill endpoint left to pair with decode endpoint ${f.endpoint.name} for model \`${sreq.model}\` after: ${why}`);
  }

  /** A prefill endpoint of `decode`'s pool and revision, not in `exclude`; null when none is ready. */
  #pickPrefill(sreq: SchedRequest, decode: Endpoint, exclude: readonly Endpoint[] | null): Decision | null {
    const req = this.#req;
    req.model = sreq.model;
    req.prompt = sreq.prompt;
    req.pair = decode;
    try {
      return this.prefill.pick(req, exclude);
    } finally {
      req.prompt = undefined;
      req.pair = null;
    }
  }

  #start(f: PdFlight, d: Decision, mode: 'nixl' | 'sglang'): void {
    const leg = new PrefillLeg(this, f, d, mode);
    f.prefillEndpoint = d.endpoint;
    f.setLeg(leg);
    if (mode === 'nixl') {
      leg.send(withFields(f.rawBody, NIXL_PREFILL_FIELDS));
    } else {
      const u = new URL(d.endpoint.url);
      const room = randomBytes(8).readBigUInt64BE() >> 1n; // a non-negative 63-bit integer
      const port = d.endpoint.bootstrapPort ?? this.cfg.bootstrapPort;
      const fields = `"bootstrap_host":${JSON.stringify(u.hostname.replace(/^\[|\]$/g, ''))},"bootstrap_port":${port},"bootstrap_room":${room}`;
      const body = withFields(f.rawBody, fields);
      leg.send(body);
      // both legs at once; a retry cannot join this room: it forms a new pair (or goes alone to a both endpoint).
      // A prefill leg that failed synchronously (a closed connection pool) already re-paired the flight.
      if (!f.aborted && !leg.over) f.sendDecode(body, f.rawBody);
    }
  }
}

/** One prefill leg: an upstream sink that buffers the (small) answer, with a timeout. */
export class PrefillLeg implements UpstreamSink {
  readonly #pd: Disaggregator;
  readonly #f: PdFlight;
  readonly #d: Decision;
  readonly mode: 'nixl' | 'sglang';
  #call: UpstreamCall | null = null;
  #timer: NodeJS.Timeout | undefined;
  #status = 0;
  #chunks: Buffer[] = [];
  #bytes = 0;
  #t0 = 0;
  #over = false;

  constructor(pd: Disaggregator, f: PdFlight, d: Decision, mode: 'nixl' | 'sglang') {
    this.#pd = pd;
    this.#f = f;
    this.#d = d;
    this.mode = mode;
  }

  get endpoint(): Endpoint {
    return this.#d.endpoint;
  }

  /** The leg ended (answered, failed, timed out or aborted). */
  get over(): boolean {
    return this.#over;
  }

  send(body: Buffer): void {
    this.#t0 = performance.now();
    this.#timer = setTimeout(() => this.#timeout(), this.#pd.cfg.prefillTimeoutMs);
    this.#timer.unref();
    const call = this.#pd.upstream.send(this.#d.endpoint, { method: 'POST', path: this.#f.path, headers: this.#f.legHeaders(this.#d.endpoint), body }, this);
    if (!this.#over) this.#call = call;
  }

  /** The flight ended first (client gone, or its answer is over in SGLang mode): stop the leg, release its endpoint. */
  abort(): void {
    if (this.#over) return;
    this.#end();
    this.#call?.abort();
    this.#call = null;
    this.#pd.prefill.complete(this.#d, 'aborted');
  }

  onUpstreamHeaders(status: number): void {
    if (this.#over) return;
    this.#status = status;
  }

  onUpstreamData(chunk: Buffer): void {
    if (this.#over) return;
    this.#bytes += chunk.length;
    if (this.#bytes <= MAX_PREFILL_BODY) this.#chunks.push(Buffer.from(chunk));
  }

  onUpstreamEnd(): void {
    if (this.#over) return;
    this.#end();
    const status = this.#status;
    this.#pd.prefill.complete(this.#d, status >= 500 ? 'failed' : 'ok');
    this.#pd.metrics.prefillLeg.observe((performance.now() - this.#t0) / 1000);
    const f = this.#f;
    if (f.aborted) return;
    const text = this.#bytes <= MAX_PREFILL_BODY ? Buffer.concat(this.#chunks).toString('utf8') : '';
    this.#chunks = [];
    if (status >= 400 && status < 500) {
      if (this.mode === 'sglang' && f.started) return; // decode already answers: too late to matter
      this.#pd.metrics.prefillRejected++;
      f.prefillRejected(status, errorMessage(text, status));
      return;
    }
    if (status >= 500 || status < 200 || status >= 300) return this.#fallback('prefill-5xx');
    if (this.mode === 'sglang') return; // decode has its KV (or fails and is retried alone)
    let kv: unknown;
    try {
      kv = (JSON.parse(text) as Record<string, unknown>).kv_transfer_params;
    } catch {
      kv = undefined;
      this.#pd.metrics.kvMalformed++;
      return this.#fallback('kv-malformed');
    }
    if (kv === undefined || kv === null) {
      this.#pd.metrics.kvMissing++;
      return this.#fallback('kv-missing');
    }
    if (!validKvParams(kv)) {
      this.#pd.metrics.kvMalformed++;
      return this.#fallback('kv-malformed');
    }
    this.#pd.metrics.disaggregated++;
    const body = withFields(f.rawBody, `"kv_transfer_params":${JSON.stringify(kv)}`);
    f.sendDecode(body, body);
  }

  onUpstreamError(): void {
    if (this.#over) return;
    this.#end();
    this.#pd.prefill.complete(this.#d, 'failed');
    if (!this.#f.aborted) this.#fallback('prefill-error');
  }

  #timeout(): void {
    if (this.#over) return;
    this.#end();
    this.#call?.abort();
    this.#call = null;
    this.#pd.prefill.complete(this.#d, 'failed');
    if (!this.#f.aborted) this.#fallback('prefill-timeout');
  }

  #end(): void {
    this.#over = true;
    clearTimeout(this.#timer);
    this.#f.setLeg(null);
  }

  #fallback(reason: FallbackReason): void {
    const f = this.#f;
    f.prefillEndpoint = null;
    if (this.mode === 'nixl') {
      this.#pd.countFallback(reason);
      f.sendDecode(f.rawBody, f.rawBody);
    } else if (!f.started) f.pairFailed(reason, this.#d.endpoint);
  }
}

/** vLLM's NIXL parameters for the decode side: an object saying do_remote_prefill with the remote engine and blocks. */
function validKvParams(kv: unknown): boolean {
  if (typeof kv !== 'object' || kv === null || Array.isArray(kv)) return false;
  const k = kv as Record<string, unknown>;
  return k.do_remote_prefill === true && typeof k.remote_engine_id === 'string' && Array.isArray(k.remote_block_ids);
}

/** The message of an OpenAI-shaped error body (current or flat), else a generic one. */
function errorMessage(text: string, status: number): string {
  try {
    const o = JSON.parse(text) as Record<string, unknown>;
    const e = (typeof o.error === 'object' && o.error !== null ? o.error : o) as Record<string, unknown>;
    if (typeof e.message === 'string') return e.message;
  } catch {
    // not JSON
  }
  return `the prefill endpoint answered HTTP ${status}`;
}
