// OpenAI's error object, the one module every path writes it with: the
// router's own errors, engines' errors relayed (their bodies mapped into this
// shape), error events in relayed streams (src/proxy/sse-errors.ts) and the
// lines of a batch's error file. The shape, as OpenAI documents it:
//   {"error": {"message": string, "type": string, "param": string|null, "code": string|null}}
// `type` in OpenAI's vocabulary (never an SDK class name), `code` a string or
// null (never the HTTP status). The table of statuses, types and codes is in
// docs/errors.md.

/** OpenAI's `type` for an HTTP status. */
export function errorType(status: number): string {
  if (status === 429) return 'requests';
  if (status === 403) return 'permission_error';
  if (status >= 500) return 'server_error';
  return 'invalid_request_error';
}

/** The `code` an error of `status` carries when its writer names none (null where OpenAI has none either). */
export function defaultCode(status: number, param: string | null): string | null {
  if (status === 404 && param === 'model') return 'model_not_found';
  if (status === 429) return 'rate_limit_exceeded';
  if (status === 401) return 'invalid_api_key';
  return null;
}

/** The error object: `code` a string code where one is known (`previous_response_not_found`); absent: the status's default. */
export interface ErrorObject {
  message: string;
  type: string;
  param: string | null;
  code: string | null;
}

export function errorObject(status: number, message: string, param: string | null = null, code?: string | null, type?: string): ErrorObject {
  return { message, type: type ?? errorType(status), param, code: code ?? defaultCode(status, param) };
}

/** The JSON body of an error answer; `type` when not the status's own (a token rate limit's `tokens`). */
export function errorBody(status: number, message: string, param: string | null = null, code?: string | null, type?: string): string {
  return JSON.stringify({ error: errorObject(status, message, param, code, type) });
}

/** vLLM's and SGLang's words for a prompt longer than the model's context: OpenAI's code for it is context_length_exceeded. */
const CONTEXT_LENGTH = /maximum context length|context length (?:is|of)|longer than the model's context/i;

/** OpenAI's `type` values (docs/errors.md); any other is an engine's own (an SDK class name such as `BadRequestError`). */
const TYPES = new Set(['invalid_request_error', 'authentication_error', 'permission_error', 'not_found_error', 'requests', 'tokens', 'rate_limit_exceeded', 'insufficient_quota', 'server_error']);

/**
 * An engine's error body in OpenAI's shape, or null when it already is (or is
 * not JSON: then it is relayed unchanged). Older vLLM answers with a flat
 * `{"object":"error","message","type","param","code"}`, current vLLM and
 * SGLang with `{"error":{...}}` whose `type` is a class name and `code` the
 * status as an integer; FastAPI with `{"detail": ...}`. The message is kept;
 * an integer code gives the status whose type and code are written.
 */
export function normalizeErrorBody(text: string, status: number): string | null {
  let j: unknown;
  try {
    j = JSON.parse(text);
  } catch {
    return null;
  }
  if (typeof j !== 'object' || j === null || Array.isArray(j)) return null;
  let o = j as Record<string, unknown>;
  const nested = typeof o.error === 'object' && o.error !== null && !Array.isArray(o.error);
  if (nested) o = o.error as Record<string, unknown>;
  const c = o.code;
  if (nested && typeof o.message === 'string' && typeof o.type === 'string' && TYPES.has(o.type) && (c === null || typeof c === 'string') && (o.param === null || typeof o.param === 'string')) return null;
  const st = typeof c === 'number' && Number.isInteger(c) && c >= 400 && c <= 599 ? c : status;
  const message = typeof o.message === 'string' ? o.message : typeof o.detail === 'string' ? o.detail : `upstream error (HTTP ${status})`;
  const type = typeof o.type === 'string' && TYPES.has(o.type) ? o.type : errorType(st);
  const param = typeof o.param === 'string' ? o.param : null;
  const code = typeof c === 'string' && c !== '' ? c : st === 400 && CONTEXT_LENGTH.test(message) ? 'context_length_exceeded' : defaultCode(st, param);
  return JSON.stringify({ error: { message, type, param, code } });
}
