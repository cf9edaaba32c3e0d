// The seam between the router (RouterCore: its parts and the answers that
// are not inference) and the HTTP front end that carries its client
// connections (docs/front-end.md). Two front ends implement it:
// front-uws.ts (uWebSockets.js, where its binary loads) and front-native.ts
// (the addon's HTTP/1.1 server, native/front_server.cc). Each one reads a
// request (method, target, the headers the router reads, the body), routes
// it, and writes the answer through the director's ClientPort or the
// host's shared answers below. `server.frontEnd` picks one (chooseFrontEnd).
import type { Logger } from 'pino';
import type { LimitsConfig, RouterConfig, ServerConfig } from '../config/schema.js';
import { SERVER_DEFAULTS } from '../config/schema.js';
import type { Endpoint } from '../endpoints/endpoint.js';
import type { ResponsesService } from '../responses/service.js';
import type { BatchApi } from '../batch/api.js';
import type { Director } from '../director/director.js';
import type { RouterMetrics } from './metrics.js';
import type { InFlightRequest } from './drain.js';
import type { ReadingList } from './reading-list.js';
import { uwsProblem } from '../uws.js';
import type { Caller, Refusal } from '../identity.js';

/** What a front end needs of the router (RouterCore implements it). */
export interface FrontHost {
  readonly config: RouterConfig;
  readonly log: Logger;
  readonly limits: LimitsConfig;
  readonly director: Director;
  readonly metrics: RouterMetrics;
  /** The Responses API (null when disabled). */
  readonly responses: ResponsesService | null;
  /** The Files and Batches API (null without `batch:`). */
  readonly batchApi: BatchApi | null;
  /** close() began: answers close their connection, /readyz answers 503. */
  readonly draining: boolean;
  /** Requests still reading their body (the uWS front end's 408 sweep). */
  readonly reading: ReadingList;
  /** performance.now() at the last sweep. */
  readonly clock: number;
  /** Request headers handed to the director (the gate's, the SLO headers), lower-case. */
  readonly headerNames: readonly string[];
  /** The session header's name (lower-case), or '' when the header is no session source. */
  readonly sessionHeaderName: string;
  /** The same name as bytes (uWS reads a Buffer name in place), or null. */
  readonly sessionHeaderBytes: Buffer | null;
  /** GET /v1/models's body. */
  readonly modelsBody: string;
  /** GET /readyz's answer: status and body. */
  readiness(): [number, string];
  /** The tenant of a request ('' = the anonymous scope, also when refused). */
  tenantOf(get: (name: string) => string): string;
  /** Who a request is, or a Refusal (answer 401 invalid_api_key with its message): src/identity.ts. */
  callerOf(get: (name: string) => string): Caller | Refusal;
  /** GET /v1/models's body for a caller (only its models when it has an allow-list). */
  modelsBodyFor(caller: Caller): string;
  newRequestId(): string;
  headerBlock(ep: Endpoint, contentType: string): Buffer;
  /** An inference request began (paired with requestEnded): in flight until then (a drain's end cuts it), counted for its caller. */
  requestBegan(x: InFlightRequest): void;
  requestEnded(x: InFlightRequest, status: number): void;
  /** The x-ratelimit-* header lines of an answer to `caller` (each ending in CRLF; '' without rate limits: src/limits/). */
  rateHeaders(caller: Caller): string;
  /** logging.access is on: the front end reads the request's tenant for the access log. */
  readonly accessLog: boolean;
}

/** A front end: the client listener and its connections. */
export interface FrontEnd {
  readonly name: 'uws' | 'native';
  /** Listens (port 0: any free port); resolves the port. */
  listen(host: string, port: number): Promise<number>;
  /** Stops taking new connections (the drain at close, the open-file guard); open ones are served on. */
  pauseAccepting(): void;
  /** Takes new connections again after pauseAccepting; false when that failed (retried by the guard). */
  resumeAccepting(): boolean;
  /** Closes the listening socket for good (close()'s drain); open connections are served on. */
  stopListening(): void;
  /** Closes every connection (requests still open are aborted). */
  close(): void;
}

/** The route table both front ends answer 404 / 405 from: path -> the method it takes. */
export function knownPaths(kindPaths: readonly string[]): Record<string, string> {
  const known: Record<string, string> = {
    '/v1/chat/completions': 'POST',
    '/v1/completions': 'POST',
    '/v1/responses': 'POST',
    '/v1/models': 'GET',
    '/healthz': 'GET',
    '/readyz': 'GET',
    '/metrics': 'GET',
  };
  for (const path of kindPaths) known[path] = 'POST';
  return known;
}

/**
 * Which front end serves: the native HTTP/1.1 front end unless `server.frontEnd: uws` (or, absent from the
 * config, SWITCHYARD_FRONT_END=uws) asks for uWebSockets.js. The native one is the default because it is
 * the one that passes the front-end conformance suite (test/frontend/) on every Node release; uWS keeps
 * the known failures docs/uws-framing.md lists and loads only on Node 16/18/20 (docs/front-end.md).
 * uws asked for where its binary does not load: native, with a warning once (the router never fails to
 * start for want of uWS).
 */
export function chooseFrontEnd(server: ServerConfig | undefined, log: Logger): 'uws' | 'native' {
  // absent from the config: SWITCHYARD_FRONT_END (uws | native) may choose, e.g. to run a test suite over the other one
  const env = process.env.SWITCHYARD_FRONT_END;
  const want = (server ?? SERVER_DEFAULTS).frontEnd ?? (env === 'native' || env === 'uws' ? env : undefined);
  if (want !== 'uws') return 'native';
  const problem = uwsProblem();
  if (problem === null) return 'uws';
  // never a failed start for want of a uWS binary: said once, served natively
  log.warn({ reason: problem, asked: want }, 'uWebSockets.js does not load on this Node: serving on the native front end (server.frontEnd: native)');
  return 'native';
}
