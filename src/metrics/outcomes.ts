// How a request ended, as the metrics count it (switchyard_request_outcomes_total):
// one small integer per request, set by the transport where the end is decided
// (HttpExchange) and counted in RouterCore.requestEnded. Names are the label values.

export const OUTCOME_OK = 0; // answered 2xx/3xx, to the end
export const OUTCOME_CLIENT_ERROR = 1; // 4xx: bad request, unknown model, body too large, the engine's 4xx
export const OUTCOME_REJECTED = 2; // the admission gate refused it (shed, rate-limited): `reason` says why
export const OUTCOME_UPSTREAM_ERROR = 3; // failed before the first byte: the engine's 5xx, connect/reset errors after the retries
export const OUTCOME_MID_STREAM = 4; // the engine failed after the answer's head went out (a killed engine)
export const OUTCOME_TIMEOUT = 5; // 408 (the body did not arrive), an upstream timeout, 504
export const OUTCOME_CANCELLED = 6; // the client went away (499)
export const OUTCOME_UNAVAILABLE = 7; // the router answered 5xx itself: no endpoint for the model, internal error
export const OUTCOME_SHUTDOWN = 8; // cut at the end of a drain's grace (or by a second signal)

export const OUTCOME_NAMES = ['ok', 'client_error', 'rejected', 'upstream_error', 'mid_stream_failure', 'timeout', 'cancelled', 'unavailable', 'shutdown'] as const;

const TIMEOUT_TEXT = /time(?:d)? ?out/i;

/** The outcome of an error answer: the router's or an engine's, before any body byte went out (cold path). */
export function errorOutcome(status: number, message: string, hasEndpoint: boolean, rejected: boolean): number {
  if (rejected) return OUTCOME_REJECTED;
  if (status === 499) return OUTCOME_CANCELLED;
  if (status === 408 || status === 504 || (status >= 500 && TIMEOUT_TEXT.test(message))) return OUTCOME_TIMEOUT;
  if (status >= 500) return hasEndpoint ? OUTCOME_UPSTREAM_ERROR : OUTCOME_UNAVAILABLE;
  if (status >= 400) return OUTCOME_CLIENT_ERROR;
  return OUTCOME_OK;
}

/** The outcome of an answer that ran to its end with `status`. */
export function statusOutcome(status: number): number {
  if (status === 499) return OUTCOME_CANCELLED;
  if (status === 408 || status === 504) return OUTCOME_TIMEOUT;
  if (status >= 500) return OUTCOME_UPSTREAM_ERROR;
  if (status >= 400) return OUTCOME_CLIENT_ERROR;
  return OUTCOME_OK;
}

/** Upstream failure kinds (switchyard_upstream_errors_total{kind}). */
export const UPSTREAM_KINDS = ['http_5xx', 'connect', 'dns', 'timeout', 'reset', 'mid_stream'] as const;

/** The kind of an upstream leg's failure from its message (called on failures only). */
export function upstreamKind(message: string, midStream: boolean): number {
  if (midStream) return 5;
  if (/HTTP 5\d\d/.test(message)) return 0;
  if (/ENOTFOUND|EAI_AGAIN|getaddrinfo|resolve/i.test(message)) return 2;
  if (TIMEOUT_TEXT.test(message)) return 3;
  if (/ECONNREFUSED|connect/i.test(message)) return 1;
  return 4;
}
