// The director's ports: what it needs of a transport (ClientPort, and
// DecisionPortOf for a proxy that dispatches itself), of the router's metrics
// (DirectorMetrics), and what it is built from (DirectorOptions). Types only;
// director.ts re-exports them (DecisionPort = DecisionPortOf<Flight>).
import type { Logger } from 'pino';
import type { AdmissionGate, Rejected } from '../admission.js';
import type { Endpoint } from '../endpoints/endpoint.js';
import type { UpstreamClient } from '../proxy/upstream.js';
import type { Scheduler } from '../scheduler/scheduler.js';
import type { SessionTable } from '../sessions/table.js';
import type { RequestTracer } from '../telemetry/tracing.js';
import type { TokenSource } from '../tokenize/source.js';
import type { Disaggregator } from './pd.js';

/**
 * What the director needs of a transport to answer one client. Calls come in
 * this order: head() (possibly again, before any write), write()*, then end()
 * or fail(); or error() alone; then done() once. Writes after the client left
 * are not made.
 */
export interface ClientPort {
  /** The answer's status, content type and serving endpoint; `contentLength` of the body, -1 when streamed. Written with the first body bytes. */
  head(status: number, contentType: string, endpoint: Endpoint, contentLength: number): void;
  /** A body chunk; copy it to keep it (the upstream client may reuse its memory). When the client is slower than the engine, the transport calls flight.pause() and later flight.resume(). */
  write(chunk: Buffer | string): void;
  /** The last body bytes (maybe empty): the answer is complete. */
  end(chunk: Buffer | string): void;
  /** The engine failed after the head went out: `sseEvent` is an error event to end a stream with; null: cut the connection. */
  fail(sseEvent: string | null): void;
  /** An error answer instead of the engine's: status, OpenAI error body, and for a gate's rejection its reason and Retry-After; `code` a string error code where the API defines one (else the status). */
  error(status: number, message: string, param: string | null, endpoint: Endpoint | undefined, rejection: Rejected | null, code?: string): void;
  /** The request is over, whichever way (after the last write, or when the client left); `status` as counted. */
  done(status: number): void;
}

/**
 * A transport that takes the decision rather than the bytes (the Envoy
 * ext_proc server, src/extproc/): the director parses, admits and picks as for
 * any request, then calls picked() instead of dispatching; the proxy sends the
 * request itself, and the transport reports how it went through
 * flight.served(). head/write/end/fail are never called; error() carries a
 * rejection (no endpoint, shed, bad body), done() the end.
 */
export interface DecisionPortOf<F> extends ClientPort {
  picked(flight: F): void;
}

/** The counters the director keeps (the router's metrics, read at scrape time). */
export interface DirectorMetrics {
  decision: { observe(seconds: number): void };
  ttft: { observe(seconds: number): void }[];
  /** Per endpoint id: time between body chunks of a 200 SSE stream (one chunk is about one token event). Optional. */
  itl?: { observe(seconds: number): void }[];
  rejected: Map<string, number>;
  retries: number;
  promptBlocks: number;
  matchedBlocks: number;
  countRequest(model: string, endpointId: number, status: number): void;
}

export interface DirectorOptions {
  scheduler: Scheduler;
  upstream: UpstreamClient;
  gate: AdmissionGate;
  metrics: DirectorMetrics;
  log: Logger;
  /** Attempts after the first one, on another endpoint, before the first byte reaches the client. */
  maxRetries: number;
  /** Bodies larger than this are parsed in a worker thread, off the event loop (default 256 KiB). */
  parseOffloadBytes?: number;
  /** How a body is read (limits.bodyScan): 'native' scans it in the addon (default), 'javascript' parses it with JSON.parse. */
  bodyScan?: 'native' | 'javascript';
  /** Worker threads for that (default 2). */
  parseWorkers?: number;
  /** Deepest nesting of arrays/objects in a body (default 128). */
  maxJsonDepth?: number;
  /** Session pins and turn records (default: the scheduler's table); its config names the session-key sources. */
  sessions?: SessionTable;
  /** OpenTelemetry tracing (src/telemetry/tracing.ts); null or absent = off. */
  tracer?: RequestTracer | null;
  /** Precise prefix matching: the prompt's tokens, started with admission and awaited before the pick (src/tokenize/source.ts). */
  tokens?: TokenSource | null;
  /** Scan answers for their `completion_tokens` even when the gate does not want usage (the access log's `tokens`). */
  scanUsage?: boolean;
  /** Prefill/decode disaggregation (config.disaggregation); absent: off, and it costs nothing. */
  pd?: Disaggregator | null;
  /** Model rewrites (config modelRewrites; a reload sets new rules on it); absent: none. */
  rewrites?: import('./model-rewrites.js').ModelRewriter;
  /** The router-side hold of adapter requests (config adapterQueue; a reload configures it); absent: the defaults. */
  adapterQueue?: import('../config/models.js').AdapterQueueConfig;
}
