// HTTP status lines for uWS's writeStatus; the OpenAI error bodies live in
// src/proxy/error-shape.ts (every transport writes the same shape).
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

