// The `server` block of the router config: which HTTP front end serves the
// client listener (docs/front-end.md) and its connection-level limits. Type,
// defaults and zod schema; schema.ts adds it to the Router config.
import { int, oneOf, strict } from './schema-kit.js';

export const FRONT_ENDS = ['uws', 'native'] as const;

export interface ServerConfig {
  /**
   * uws: uWebSockets.js (where its binary loads: Node 16/18/20 on Linux x64); native: the addon's
   * HTTP/1.1 front end (every Node release from 20 on). Absent: uws where it loads, else native.
   */
  frontEnd?: (typeof FRONT_ENDS)[number];
  /** Open client connections at most (0: no limit but the open-file guard); native front end only. */
  maxConnections: number;
  /** A request head must arrive within this from its first byte (408); native front end. */
  headerTimeoutMs: number;
  /** A connection with no request begun is closed after this; native front end (uWS: 10 s, fixed). */
  idleTimeoutMs: number;
  /** Bytes of a request head (431 over it); native front end. */
  maxHeaderBytes: number;
  /** Field lines of a request head (431 over it); native front end. */
  maxHeaderLines: number;
}

export const SERVER_DEFAULTS: ServerConfig = {
  maxConnections: 0,
  headerTimeoutMs: 10_000,
  idleTimeoutMs: 10_000,
  maxHeaderBytes: 64 * 1024,
  maxHeaderLines: 100,
};

export const serverSchema = strict(
  {
    frontEnd: oneOf(FRONT_ENDS).optional().describe('the HTTP front end: native (the default) or uws (uWebSockets.js, where its binary loads; else native with a warning)'),
    maxConnections: int(0, 10_000_000).default(SERVER_DEFAULTS.maxConnections).describe('open client connections at most (0: no limit); native front end'),
    headerTimeoutMs: int(1, 3_600_000).default(SERVER_DEFAULTS.headerTimeoutMs).describe('a request head must arrive within this (408); native front end'),
    idleTimeoutMs: int(1, 86_400_000).default(SERVER_DEFAULTS.idleTimeoutMs).describe('an idle keep-alive connection closes after this; native front end'),
    maxHeaderBytes: int(1024, 1024 * 1024).default(SERVER_DEFAULTS.maxHeaderBytes).describe('bytes of a request head (431 over it); native front end'),
    maxHeaderLines: int(8, 1024).default(SERVER_DEFAULTS.maxHeaderLines).describe('field lines of a request head (431 over it); native front end'),
  },
  'must be a mapping',
).prefault({});
