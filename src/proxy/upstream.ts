// The upstream client seam: send one request to an endpoint and receive its
// status, headers, body chunks, end or error; pause/resume for backpressure;
// abort. The native client (native-client.ts) serves plain http, undici
// (undici-client.ts) https.
import type { Endpoint } from '../endpoints/endpoint.js';
import { SwitchyardError } from '../errors.js';

export interface UpstreamSink {
  /** Status and headers arrived (before any body). `contentLength` is -1 when absent. */
  onUpstreamHeaders(status: number, contentType: string, contentLength: number): void;
  /** A body chunk (valid only during the call unless copied). */
  onUpstreamData(chunk: Buffer): void;
  onUpstreamEnd(): void;
  /** Connect error, reset, timeout or abort. Not called after onUpstreamEnd. */
  onUpstreamError(err: Error): void;
}

export interface UpstreamCall {
  pause(): void;
  resume(): void;
  /** Stops the request; no sink callback follows. Safe to call more than once. */
  abort(): void;
}

export interface UpstreamRequest {
  method: 'GET' | 'POST';
  path: string;
  /** Flat [name, value, name, value, ...] list. */
  headers: string[];
  body: Buffer | null;
}

export interface UpstreamClient {
  send(ep: Endpoint, req: UpstreamRequest, sink: UpstreamSink): UpstreamCall;
  close(): Promise<void>;
  /**
   * Optional: the endpoint left the set (its id is never used again): close
   * its idle connections now and each busy one when its call ends.
   */
  forget?(ep: Endpoint): void;
  /**
   * Optional: true when the client never reads a request's body after send()
   * returns (what the socket did not take at once is its own copy), so the
   * caller may reuse the body's memory once the call has ended or been aborted.
   */
  readonly copiesBody?: boolean;
}

/** A socket-level failure of an upstream call; `code` is the errno-style name (ECONNREFUSED, ETIMEDOUT, EPROTO, ...). */
export class UpstreamSocketError extends SwitchyardError {
  constructor(message: string, code: string) {
    super(message, { code });
  }

  override get swyCode(): string {
    return 'SWY_ERR_UPSTREAM_SOCKET';
  }
}
