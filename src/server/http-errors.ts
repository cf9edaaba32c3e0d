// OpenAI-style error bodies: {"error":{"message","type","param","code"}},
// with the HTTP status as `code`.

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

export const STATUS_LINES: Record<number, string> = {
  200: '200 OK',
  201: '201 Created',
  204: '204 No Content',
  400: '400 Bad Request',
  401: '401 Unauthorized',
  403: '403 Forbidden',
  404: '404 Not Found',
  405: '405 Method Not Allowed',
  408: '408 Request Timeout',
  413: '413 Payload Too Large',
  422: '422 Unprocessable Entity',
  429: '429 Too Many Requests',
  500: '500 Internal Server Error',
  502: '502 Bad Gateway',
  503: '503 Service Unavailable',
  504: '504 Gateway Timeout',
};

export function statusLine(status: number): string {
  return STATUS_LINES[status] ?? `${status} Status`;
}

export function errorBody(status: number, message: string, param: string | null = null): string {
  return JSON.stringify({ error: { message, type: TYPES[status] ?? 'Error', param, code: status } });
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
