// The `sessions` block of the router config: how a conversation is
// identified, how long its pin to an endpoint lives, when a pinned
// conversation moves, the turn-priority window, and where pins live (this
// process, or Redis shared by several routers). docs/config.md and
// docs/responses.md ("Sessions", "Turn priority") document each field.
import { got, int, strict, z } from './schema-kit.js';

/** Where a session key may come from, tried in the configured order: the session header, the body's `prompt_cache_key`, the body's `user`. */
export const SESSION_SOURCES = ['header', 'prompt_cache_key', 'user'] as const;
export type SessionSource = (typeof SESSION_SOURCES)[number];

export interface SessionRedisConfig {
  /** redis:// or rediss:// URL. */
  url: string;
  /** Prefix of every key the router writes. */
  keyPrefix: string;
  /** A Redis command that takes longer fails (the request goes on with the local view). */
  timeoutMs: number;
}

export interface SessionsConfig {
  /** Session-key sources in order; [] = only a caller's own key (the Responses chain). */
  sources: SessionSource[];
  /** The request header the `header` source reads (lower case). */
  header: string;
  /** A session's pin and turn record expire this long after its last turn. */
  ttlMs: number;
  /** Sessions tracked at most (least recently used dropped first). */
  maxSessions: number;
  /** A pinned endpoint is saturated (the next turn moves) when this many requests wait there... */
  moveQueueDepth: number;
  /** ...or when it has this many more requests (running and waiting) than the least occupied candidate; 0 = off. */
  moveLoadGap: number;
  /** A request continues an active conversation when its previous turn ended within this window (turn priority); 0 = never. */
  continuationWindowMs: number;
  /** 'memory' (this process) or Redis (shared by several routers). */
  store: 'memory' | SessionRedisConfig;
}

export const SESSION_DEFAULTS = {
  sources: [...SESSION_SOURCES] as SessionSource[],
  header: 'x-session-id',
  ttlMs: 600_000,
  maxSessions: 100_000,
  moveQueueDepth: 4,
  moveLoadGap: 8,
  continuationWindowMs: 10_000,
  keyPrefix: 'switchyard:session:',
  timeoutMs: 250,
};

export function defaultSessions(): SessionsConfig {
  return {
    sources: [...SESSION_DEFAULTS.sources],
    header: SESSION_DEFAULTS.header,
    ttlMs: SESSION_DEFAULTS.ttlMs,
    maxSessions: SESSION_DEFAULTS.maxSessions,
    moveQueueDepth: SESSION_DEFAULTS.moveQueueDepth,
    moveLoadGap: SESSION_DEFAULTS.moveLoadGap,
    continuationWindowMs: SESSION_DEFAULTS.continuationWindowMs,
    store: 'memory',
  };
}

const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9a-z-]+$/;

const redisSchema = strict(
  {
    redis: z
      .string({ error: (i) => (i.input === undefined ? 'is required' : `must be a redis:// or rediss:// URL (got ${got(i.input)})`) })
      .refine((s) => /^rediss?:\/\/[^/\s]/.test(s), { error: (i) => `must be a redis:// or rediss:// URL (got ${got(i.input)})` })
      .describe('redis://[user:password@]host:port[/db]: pins and turn times shared by every router using it'),
    keyPrefix: z.string({ error: 'must be a string' }).default(SESSION_DEFAULTS.keyPrefix),
    timeoutMs: int(1, 60_000).default(SESSION_DEFAULTS.timeoutMs).describe('a Redis command slower than this fails; the request uses the local view'),
  },
  'must be "memory" or a mapping {redis: URL}',
).transform((r): SessionRedisConfig => ({ url: r.redis, keyPrefix: r.keyPrefix, timeoutMs: r.timeoutMs }));

const STORE_ERROR = 'must be "memory" or a mapping {redis: URL}';
// a string checked by value (not a literal): a mapping given instead then reports the mapping's own problems
const memorySchema = z
  .string({ error: STORE_ERROR })
  .refine((s) => s === 'memory', { error: (i) => `${STORE_ERROR} (got ${got(i.input)})` })
  .meta({ enum: ['memory'] }) as unknown as z.ZodLiteral<'memory'>;

export const sessionsSchema = strict(
  {
    sources: z
      .array(
        z.enum(SESSION_SOURCES, { error: (i) => `must be one of: ${SESSION_SOURCES.join(', ')} (got ${got(i.input)})` }),
        { error: 'must be a list' },
      )
      .refine((a) => new Set(a).size === a.length, { error: 'lists a source twice' })
      .default(() => [...SESSION_DEFAULTS.sources])
      .describe('where a session key comes from when the caller gave none, tried in order; [] = none'),
    header: z
      .string({ error: 'must be a header name' })
      .transform((s) => s.toLowerCase())
      .refine((s) => HEADER_NAME.test(s), { error: (i) => `must be a header name (got ${got(i.input)})` })
      .default(SESSION_DEFAULTS.header)
      .describe('the request header of the `header` source'),
    ttlMs: int(1000, 7 * 86_400_000).default(SESSION_DEFAULTS.ttlMs).describe("a session's pin and turn record expire this long after its last turn"),
    maxSessions: int(1, 100_000_000).default(SESSION_DEFAULTS.maxSessions).describe('sessions tracked per router (least recently used dropped first)'),
    moveQueueDepth: int(1, 1_000_000)
      .default(SESSION_DEFAULTS.moveQueueDepth)
      .describe('the pinned endpoint is saturated when this many requests wait there: the next turn moves to a less loaded endpoint'),
    moveLoadGap: int(0, 1_000_000)
      .default(SESSION_DEFAULTS.moveLoadGap)
      .describe('the pinned endpoint is also saturated when it has this many more requests (running and waiting) than the least occupied candidate; 0 = off'),
    continuationWindowMs: int(0, 86_400_000)
      .default(SESSION_DEFAULTS.continuationWindowMs)
      .describe("a request whose session's previous turn ended within this window is a continuation (turn priority); 0 = never"),
    store: z
      .union([memorySchema, redisSchema], { error: STORE_ERROR })
      .default('memory')
      .describe('memory: this router only; {redis: URL}: shared by several routers'),
  },
  'must be a mapping',
).prefault({});
