// OpenAI-style error bodies: {"error":{"message","type","param","code"}},
// with the HTTP status as `code`, and the rewrite of older engines' flat
// error shape into it. Shared by every transport and the relay.

const TYPES: Record<number, string> = {
  400: 'BadRequestError',
  404: 'NotFoundError',
  405: 'MethodNotAllowedError',
  408: 'RequestTimeoutError',
  413: 'RequestTooLargeError',
  429: 'RateLimitError',
  500: 'InternalServerError',
  502: 'BadGatewayError',
  503: 'ServiceUnavailableError',
};

/** `code`: a string code where the API defines one (`previous_response_not_found`); else the status. */
export function errorBody(status: number, message: string, param: string | null = null, code?: string): string {
  return JSON.stringify({ error: { message, type: TYPES[status] ?? 'Error', param, code: code ?? status } });
}

/**
 * An engine's error body in the current OpenAI shape. Older vLLM answers with
 * a flat `{"object":"error","message","type","param","code"}`; that shape (or
 * any JSON without an `error` object) is rewritten, the current one kept as it
 * is. Returns null when `text` is not JSON (then it is relayed unchanged).
 */
export function normalizeErrorBody(text: string, status: number): string | null {
  let j: unknown;
  try {
    j = JSON.parse(text);
  } catch {
    return null;
  }
  if (typeof j !== 'object' || j === null || Array.isArray(j)) return null;
  const o = j as Record<string, unknown>;
  if (typeof o.error === 'object' && o.error !== null) return null;
  const message = typeof o.message === 'string' ? o.message : typeof o.detail === 'string' ? o.detail : `upstream error (HTTP ${status})`;
  const type = typeof o.type === 'string' ? o.type : TYPES[status] ?? 'Error';
  const param = typeof o.param === 'string' ? o.param : null;
  const code = typeof o.code === 'number' || typeof o.code === 'string' ? o.code : status;
  return JSON.stringify({ error: { message, type, param, code } });
}
