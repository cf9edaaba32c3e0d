// The admission contract: the one seam between the request path (the
// director, src/director/) and whatever decides who goes first (flow control,
// src/flow/). Both import this module and nothing of each other. A gate may
// hold a request (return a promise), reject it (a value carrying its status,
// reason and Retry-After), or let it through. The default gate admits
// everything synchronously. Types only, plus that default: nothing of ours
// is imported.
import type { Registry } from 'prom-client';

/** What an admission gate sees about a request. Valid until release(). */
export interface RequestInfo {
  readonly requestId: string;
  readonly model: string;
  /** '/v1/chat/completions' or '/v1/completions'. */
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
}

export type Admission = Admitted | Rejected;

export type ReleaseOutcome = 'ok' | 'failed' | 'aborted';

export interface AdmissionGate {
  /** Request headers the gate needs in RequestInfo.headers (lower-case). */
  readonly headerNames: readonly string[];
  admit(info: RequestInfo, signal: AbortLike): Admission | Promise<Admission>;
  /** Called exactly once for every admitted request, when it ends. */
  release(ticket: unknown, outcome: ReleaseOutcome): void;
  /** The name of the band an admitted request's ticket belongs to ('' when the gate has none): latency plugins apply the band's objectives. */
  bandName?(ticket: unknown): string;
  /** Called after each successful metrics scrape of an endpoint serving `model` (capacity may have changed). */
  onCapacity?(model?: string): void;
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
