// The `responses` block of the router config: the Responses API's store and
// bounds (docs/responses.md). Lives in config/ so the router config validates
// it with the rest; config/ imports nothing of ours but schema-kit.
import { got, int, strict, z } from './schema-kit.js';

export const RESPONSE_STORES = ['memory', 'sqlite', 'redis'] as const;
export type ResponseStoreType = (typeof RESPONSE_STORES)[number];

export interface ResponsesConfig {
  /** Serve /v1/responses (default true). */
  enabled: boolean;
  store: {
    type: ResponseStoreType;
    /** sqlite: the database file (created if missing). */
    path?: string;
    /** redis: redis://[user:pass@]host:port[/db] or rediss://. */
    url?: string;
    /** redis: prefix of every key the store writes. */
    keyPrefix: string;
    /** redis: a command not answered within this many ms fails (the turn gets 503). */
    commandTimeoutMs: number;
  };
  /** A stored response expires this long after it was created. */
  ttlSeconds: number;
  /** memory, sqlite: most responses kept (least recently used / oldest evicted first). */
  maxResponses: number;
  /** memory, sqlite: most bytes of stored conversations kept. */
  maxBytes: number;
  /** The rebuilt conversation (stored turns + this input + instructions) sent to the engine may not exceed this: 413. */
  maxInputBytes: number;
}

export const RESPONSES_DEFAULTS = {
  enabled: true,
  store: { type: 'memory' as ResponseStoreType, keyPrefix: 'switchyard:resp:', commandTimeoutMs: 2000 },
  ttlSeconds: 86_400,
  maxResponses: 100_000,
  maxBytes: 512 * 1024 * 1024,
  maxInputBytes: 8 * 1024 * 1024,
};

const str = () =>
  z.string({ error: (i) => (i.input === undefined ? 'is required' : 'must be a non-empty string') }).min(1, { error: 'must be a non-empty string' });

const storeSchema = strict(
  {
    type: z
      .enum(RESPONSE_STORES, { error: (i) => `must be one of: ${RESPONSE_STORES.join(', ')} (got ${got(i.input)})` })
      .default(RESPONSES_DEFAULTS.store.type)
      .describe('memory: in-process, bounded (the default); sqlite: a durable file (better-sqlite3); redis: shared by router replicas'),
    path: str().optional().describe('sqlite: the database file'),
    url: str()
      .refine((s) => /^rediss?:\/\//.test(s), { error: (i) => `must be a redis:// or rediss:// URL (got ${got(i.input)})` })
      .optional()
      .describe('redis: the server URL'),
    keyPrefix: z.string({ error: 'must be a string' }).default(RESPONSES_DEFAULTS.store.keyPrefix).describe('redis: prefix of every key'),
    commandTimeoutMs: int(1, 600_000).default(RESPONSES_DEFAULTS.store.commandTimeoutMs).describe('redis: a command unanswered this long fails (503)'),
  },
  'must be a mapping',
)
  .superRefine((v, ctx) => {
    if (v.type === 'sqlite' && v.path === undefined) ctx.addIssue({ code: 'custom', path: ['path'], message: 'is required with type: sqlite', input: undefined });
    if (v.type === 'redis' && v.url === undefined) ctx.addIssue({ code: 'custom', path: ['url'], message: 'is required with type: redis', input: undefined });
  })
  .prefault({});

export const responsesSchema = strict(
  {
    enabled: z.boolean({ error: 'must be true or false' }).default(RESPONSES_DEFAULTS.enabled),
    store: storeSchema,
    ttlSeconds: int(1, 10 * 365 * 86_400).default(RESPONSES_DEFAULTS.ttlSeconds).describe('a stored response expires this long after its creation'),
    maxResponses: int(1).default(RESPONSES_DEFAULTS.maxResponses).describe('memory and sqlite stores: most responses kept'),
    maxBytes: int(1024).default(RESPONSES_DEFAULTS.maxBytes).describe('memory and sqlite stores: most bytes of stored conversations'),
    maxInputBytes: int(1, 2 ** 31 - 1)
      .default(RESPONSES_DEFAULTS.maxInputBytes)
      .describe('largest rebuilt conversation a turn may send to an engine (413 beyond)'),
  },
  'must be a mapping',
).prefault({});
