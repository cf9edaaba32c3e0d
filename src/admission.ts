// The admission contract: the one seam between the request path (the
// director, src/director/) and whatever decides who goes first (flow control,
// src/flow/). Both import this module and nothing of each other. A gate may
// hold a request (return a promise), reject it (a value carrying its status,
// reason and Retry-After), or let it through. The default gate admits
// everything synchronously. Types only, plus that default: nothing of ours
// is imported at run time (the active-active flow exchange is a type).
import type { Caller, Identity } from './identity.js';
import type { FleetFlows } from './flow/fleet-flows.js';
import type { Registry } from 'prom-client';

/** What an admission gate sees about a request. Valid until release(). */
export interface RequestInfo {
  readonly requestId: string;
  readonly model: string;
  /** '/v1/chat/completions', '/v1/completions', or a passthrough route's path ('/v1/embeddings', '/v1/score', '/tokenize', ...: src/director/kinds.ts). */
  readonly path: string;
  /** The parsed JSON body (do not mutate). */
  readonly body: Readonly<Record<string, unknown>>;
  /** The headers named in the gate's `headerNames`, lower-case names; '' when absent. */
  readonly headers: Readonly<Record<string, string>>;
  /** Size of the request body in bytes. */
  readonly bodyBytes: number;
  /** Prompt bytes used for prefix matching (length only is stable). */
  readonly promptBytes: number;
  /** The conversation this request belongs to ('' when none is known): a Responses chain, `x-session-id`, or the body's `user`/`prompt_cache_key` (docs/responses.md). */
  readonly sessionKey: string;
  /** True when the request continues a conversation whose previous turn ended recently (turn priority: it goes ahead of cold work in its band). */
  readonly continuation: boolean;
  /** Who sent the request (src/identity.ts): its flow (`caller.flow`, '' = classify the headers) and band ceiling (`caller.maxBand`). Absent: classify the headers. */
  readonly caller?: Caller;
}

/** A tiny abort signal (no EventTarget per request): `aborted` flips and `onabort` fires when the client leaves. */
export interface AbortLike {
  readonly aborted: boolean;
  onabort: (() => void) | null;
}

export interface Admitted {
  readonly admitted: true;
  /** Handed back to release(); the gate's own bookkeeping. */
  readonly ticket: unknown;
}

export interface Rejected {
  readonly admitted: false;
  /** HTTP status: 429 (saturated) or 503 (no capacity / no endpoints). */
  readonly status: number;
  readonly message: string;
  /** Goes to the `x-switchyard-dropped-reason` header. */
  readonly reason: string;
  /** When above 0 (429), goes to the `Retry-After` header (whole seconds, rounded up). */
  readonly retryAfterSeconds?: number;
  /** The error body's `type` when it is not the status's default (a rate limit's `requests` or `tokens`, as OpenAI answers). */
  readonly errorType?: string;
}

export type Admission = Admitted | Rejected;

export type ReleaseOutcome = 'ok' | 'failed' | 'aborted';

/**
 * A request that ended, as release() may see it (the director's Flight: the
 * RequestInfo plus what it learnt from the pick and the answer). Valid only
 * during the release() call. A gate that reads the usage fields says so with
 * `wantsUsage`; the director then looks for `"completion_tokens":` in the
 * answer (a non-streamed answer, or a stream that asked for
 * `stream_options.include_usage`).
 */
export interface FinishedRequest extends RequestInfo {
  /** The answer's `usage.completion_tokens` when the director saw it, else -1. */
  readonly completionTokens: number;
  /** The answer's `usage.prompt_tokens` when the director saw it (in the chunk with completion_tokens), else -1. */
  readonly promptTokens: number;
  /** Bytes of the answer relayed to the client. */
  readonly responseBytes: number;
  /** Chunks of the answer relayed to the client (for a streamed answer: at least one token each). */
  readonly responseChunks: number;
  /** Prompt blocks of the last pick, and how many of them the prefix producer matched (0 and 0 without a pick). */
  readonly promptBlocks: number;
  readonly matchedBlocks: number;
}

export interface AdmissionGate {
  /** Request headers the gate needs in RequestInfo.headers (lower-case). */
  readonly headerNames: readonly string[];
  /** The gate's view of who a request belongs to (flow control: `tenant:` flows); absent when the gate knows no tenants. */
  readonly identity?: Identity;
  admit(info: RequestInfo, signal: AbortLike): Admission | Promise<Admission>;
  /**
   * Set to true when release() reads the usage of `request` (FinishedRequest);
   * otherwise the director does not scan answers for it.
   */
  readonly wantsUsage?: boolean;
  /** Called exactly once for every admitted request, when it ends; `request` is the request that ended (when the caller has it). */
  release(ticket: unknown, outcome: ReleaseOutcome, request?: FinishedRequest): void;
  /** The name of the band an admitted request's ticket belongs to ('' when the gate has none): latency plugins apply the band's objectives. */
  bandName?(ticket: unknown): string;
  /** Called after each successful metrics scrape of an endpoint serving `model` (capacity may have changed). */
  onCapacity?(model?: string): void;
  /**
   * Active-active replicas (ha.shareFlows): the gate weighs the other
   * replicas' flows and reports its own (src/flow/fleet-flows.ts); false when
   * it has no flows to share (flow control off).
   */
  attachFleet?(flows: FleetFlows): boolean;
  /** Registers the gate's metric families (read at scrape time) in the router's registry, once, when the router sets up /metrics. */
  registerMetrics?(registry: Registry): void;
  close?(): void | Promise<void>;
}

const ADMIT: Admitted = { admitted: true, ticket: null };

/** Admits every request at once. */
export class PassThroughGate implements AdmissionGate {
  readonly headerNames: readonly string[] = [];
  admit(): Admission {
    return ADMIT;
  }
  release(): void {}
}
