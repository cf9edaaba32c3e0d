// W3C Trace Context (`traceparent`, `tracestate`) and W3C Baggage (`baggage`)
// on the way to the engine: the one place that decides which of a client's
// trace headers an upstream leg carries. Every leg of a request (a retry, a
// prefill leg before a decode leg) appends them with appendTraceHeaders(), so
// the engine's own spans join the client's trace.
//
// Rules (https://www.w3.org/TR/trace-context/ §3, https://www.w3.org/TR/baggage/):
// - a valid `traceparent` is forwarded as is, or, when the router traces the
//   request itself, replaced by one naming the router's leg span as parent;
// - a malformed one (or several `traceparent` lines) is never forwarded: a
//   fresh valid one replaces it (new trace id, not sampled), and `tracestate`
//   is dropped with it (it belongs to the broken trace);
// - `tracestate` and `baggage` pass when they are printable ASCII and at most
//   8192 bytes (baggage's own limit); anything else is dropped, not repaired.
import { randomFillSync } from 'node:crypto';

export const TRACEPARENT = 'traceparent';
export const TRACESTATE = 'tracestate';
export const BAGGAGE = 'baggage';
/** The request headers a leg may carry on to the engine. */
export const TRACE_HEADERS: readonly string[] = [TRACEPARENT, TRACESTATE, BAGGAGE];

/** Longest `tracestate` / `baggage` value forwarded (W3C Baggage: 8192 bytes). */
export const MAX_TRACE_HEADER_BYTES = 8192;

/** The trace context of one request as the client sent it ('' = absent). */
export interface TraceCarrier {
  readonly traceparent?: string;
  readonly tracestate?: string;
  readonly baggage?: string;
}

function isLowerHex(s: string, from: number, to: number): boolean {
  for (let i = from; i < to; i++) {
    const c = s.charCodeAt(i);
    if (!((c >= 0x30 && c <= 0x39) || (c >= 0x61 && c <= 0x66))) return false;
  }
  return true;
}

function allZero(s: string, from: number, to: number): boolean {
  for (let i = from; i < to; i++) if (s.charCodeAt(i) !== 0x30) return false;
  return true;
}

/**
 * True for a `traceparent` a receiver must accept: `vv-<32 hex>-<16 hex>-ff`,
 * lower-case hex, trace id and parent id not all zeros, version not `ff`;
 * version 00 exactly 55 characters, a later version may append `-…` fields.
 */
export function validTraceparent(s: string): boolean {
  if (s.length < 55) return false;
  if (s.charCodeAt(2) !== 0x2d || s.charCodeAt(35) !== 0x2d || s.charCodeAt(52) !== 0x2d) return false;
  if (!isLowerHex(s, 0, 2) || !isLowerHex(s, 3, 35) || !isLowerHex(s, 36, 52) || !isLowerHex(s, 53, 55)) return false;
  if (s.charCodeAt(0) === 0x66 && s.charCodeAt(1) === 0x66) return false; // version ff
  if (allZero(s, 3, 35) || allZero(s, 36, 52)) return false;
  const v00 = s.charCodeAt(0) === 0x30 && s.charCodeAt(1) === 0x30;
  if (v00) return s.length === 55;
  return s.length === 55 || s.charCodeAt(55) === 0x2d;
}

/** The `sampled` flag of a valid traceparent. */
export function sampledFlag(traceparent: string): boolean {
  return (parseInt(traceparent.slice(53, 55), 16) & 1) === 1;
}

const idBytes = Buffer.alloc(24);

/** Random trace id (32 hex) and span id (16 hex), never all zeros. */
export function randomIds(): { traceId: string; spanId: string } {
  for (;;) {
    randomFillSync(idBytes);
    const traceId = idBytes.toString('hex', 0, 16);
    const spanId = idBytes.toString('hex', 16, 24);
    if (!allZero(traceId, 0, 32) && !allZero(spanId, 0, 16)) return { traceId, spanId };
  }
}

/** A `traceparent` for a trace id and parent span id. */
export function formatTraceparent(traceId: string, spanId: string, sampled: boolean): string {
  return `00-${traceId}-${spanId}-${sampled ? '01' : '00'}`;
}

/** A fresh valid traceparent (a new trace), unsampled: what replaces a malformed one. */
export function freshTraceparent(): string {
  const { traceId, spanId } = randomIds();
  return formatTraceparent(traceId, spanId, false);
}

/** Printable ASCII (and HTAB) only, within the size bound: safe to forward byte for byte. */
function forwardable(s: string): boolean {
  if (s.length === 0 || s.length > MAX_TRACE_HEADER_BYTES) return false;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if ((c < 0x20 && c !== 0x09) || c > 0x7e) return false;
  }
  return true;
}

/**
 * Appends the trace headers one upstream leg carries to `out` (a flat
 * name/value list, as UpstreamRequest.headers) and returns `out`.
 * `ownTraceparent`: the router's own span context for this leg (tracing on
 * and the request sampled); it wins over the client's. Nothing is appended
 * (and nothing allocated) for a request without trace headers.
 */
export function appendTraceHeaders(out: string[], carrier: TraceCarrier, ownTraceparent = ''): string[] {
  const tp = carrier.traceparent;
  // tracestate belongs to the client's traceparent: without a valid one it goes too
  const keepState = tp !== undefined && tp !== '' && validTraceparent(tp);
  if (ownTraceparent !== '') out.push(TRACEPARENT, ownTraceparent);
  else if (tp !== undefined && tp !== '') out.push(TRACEPARENT, keepState ? tp : freshTraceparent());
  const ts = carrier.tracestate;
  if (keepState && ts !== undefined && ts !== '' && forwardable(ts)) out.push(TRACESTATE, ts);
  const bg = carrier.baggage;
  if (bg !== undefined && bg !== '' && forwardable(bg)) out.push(BAGGAGE, bg);
  return out;
}

/** True when the request carries any trace header (worth building a leg's trace headers for). */
export function hasTraceHeaders(carrier: TraceCarrier): boolean {
  return carrier.traceparent !== undefined || carrier.tracestate !== undefined || carrier.baggage !== undefined;
}
