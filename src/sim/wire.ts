// The simulator's HTTP wire constants: status lines, content types, the OpenAI/vLLM error body, the echoed request id.

export const STATUS: Record<number, string> = {
  200: '200 OK',
  400: '400 Bad Request',
  404: '404 Not Found',
  405: '405 Method Not Allowed',
  413: '413 Payload Too Large',
  429: '429 Too Many Requests',
  500: '500 Internal Server Error',
  503: '503 Service Unavailable',
};
const ERROR_TYPE: Record<number, string> = {
  400: 'BadRequestError',
  404: 'NotFoundError',
  405: 'MethodNotAllowed',
  413: 'BadRequestError',
  429: 'RateLimitError',
  500: 'InternalServerError',
  503: 'ServiceUnavailableError',
};

/** The OpenAI/vLLM error body. */
export function errorBody(status: number, message: string, param: string | null = null, legacy = false): string {
  const fields = `"message":${JSON.stringify(message)},"type":"${ERROR_TYPE[status] ?? 'Error'}","param":${
    param === null ? 'null' : JSON.stringify(param)
  },"code":${status}`;
  // Older vLLM releases answered a flat object.
  return legacy ? `{"object":"error",${fields}}` : `{"error":{${fields}}}`;
}

export const JSON_TYPE = 'application/json';
export const SSE_TYPE = 'text/event-stream; charset=utf-8';
export const DONE = 'data: [DONE]\n\n';

/**
 * The x-request-id value to echo. uWS hands header values over as latin1
 * strings (one char per byte) but writes strings as UTF-8, so an id with bytes
 * >= 0x80 would come back re-encoded (the client could not match it): echo
 * such an id as its original bytes. ASCII ids (the norm) pass as they are.
 */
export function echoId(rid: string): string | Buffer {
  for (let i = 0; i < rid.length; i++) if (rid.charCodeAt(i) > 0x7f) return Buffer.from(rid, 'latin1');
  return rid;
}
