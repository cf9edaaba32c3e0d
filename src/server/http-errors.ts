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
