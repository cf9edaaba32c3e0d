// HTTP status lines for uWS's writeStatus; the OpenAI error bodies live in
// src/proxy/error-shape.ts (every transport writes the same shape).
import { errorBody } from '../proxy/error-shape.js';
export { errorBody, normalizeErrorBody } from '../proxy/error-shape.js';

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


/**
 * Answers 401 invalid_api_key on the uWS transport for a request that
 * authentication refused (src/identity.ts), before its body is read (uWS
 * reads and drops a body no handler takes). A body declared over the limit is
 * not worth reading: answered after uWS is done with this read, then closed.
 */
export function answerUnauthorized(
  host: { readonly draining: boolean; readonly limits: { readonly maxBodyBytes: number }; readonly metrics: { countRequest(model: string, endpoint: number, status: number): void } },
  res: import('../uws.js').HttpResponse,
  message: string,
  declaredLength = '',
): void {
  host.metrics.countRequest('', -1, 401);
  const close = declaredLength !== '' && Number(declaredLength) > host.limits.maxBodyBytes;
  const write = (): void =>
    void res.cork(() => {
      res.writeStatus(statusLine(401)).writeHeader('content-type', 'application/json').end(errorBody(401, message), close || host.draining);
    });
  if (!close) return write();
  let gone = false;
  res.onAborted(() => {
    gone = true;
  });
  setImmediate(() => {
    if (!gone) write();
  });
}
