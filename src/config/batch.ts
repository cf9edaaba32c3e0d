// The `batch` block: the async processor that consumes requests from a Redis
// Stream and runs them on the capacity interactive traffic leaves free
// (docs/batch.md).
import { strict, z } from './schema-kit.js';

export interface BatchQuota {
  /** Requests per window (0 = unlimited). */
  requests: number;
  /** Tokens per window: prompt bytes / 4 + max_tokens at dispatch, corrected to the answer's usage (0 = unlimited). */
  tokens: number;
}

export interface BatchConfig {
  /** redis://host:port[/db] */
  redis: string;
  stream: string;
  group: string;
  /** This router's consumer name in the group (default: hostname-pid). */
  consumer: string;
  /** Where malformed entries go, with the reason. */
  deadLetterStream: string;
  /** Key prefix of the per-request done markers (idempotency) and the quotas' counters (`<keyPrefix>:rl:`, without rateLimits.redis). */
  keyPrefix: string;
  /** How long a done marker is kept, seconds. */
  doneTtlSeconds: number;
  /** Batch requests are dispatched only while the pool's utilisation (occupancy ÷ batch limit) is below this. */
  utilisationCeiling: number;
  /** How often the ceiling is checked while above it, ms (default: the data layer's scrape interval). */
  checkIntervalMs: number;
  /** Batch requests this router runs at once. */
  maxInFlight: number;
  /** An entry delivered to a consumer and not acknowledged for this long is claimed by another (XAUTOCLAIM), ms. */
  reclaimIdleMs: number;
  /** The flow-control band batch requests are admitted in (its name in x-priority); default: the lowest band. */
  band?: string;
  /** The largest file POST /v1/files accepts, bytes (the Batches API). */
  maxFileBytes: number;
  /**
   * A Batches API batch not finished this long after its creation expires:
   * lines not yet dispatched are not run, and go to its error file as
   * `batch_expired` (seconds; default 86,400, OpenAI's "24h" window).
   */
  expireAfterSeconds: number;
  quotas: { windowMs: number; default: BatchQuota; tenants: Record<string, BatchQuota> };
  /** A Files/Batches API Redis command not answered in this long fails (the call answers 503), ms. */
  commandTimeoutMs: number;
  /** The shortest `expires_after.seconds` (files) and `output_expires_after.seconds` (batches) accepted (OpenAI's: 3600). */
  minExpiresAfterSeconds: number;
  /** What one tenant may keep in the Files API: uploaded files and their bytes (batch output files are charged, never refused). */
  fileQuota: { files: number; bytes: number };
  /** An upload without `expires_after` expires this long after its creation (seconds; 0: kept until deleted). OpenAI's: 30 days for purpose batch. */
  fileExpiresAfterSeconds: number;
  /** The largest piece of a file sent to Redis in one command and kept as one list element (bytes; under Redis's proto-max-bulk-len). */
  fileChunkBytes: number;
}

const error = (min: number, max: number) => (i: { input?: unknown }) => `must be a number in [${min}, ${max}] (got ${JSON.stringify(i.input)})`;
const num = (min: number, max: number) => z.number({ error: error(min, max) }).gte(min, { error: error(min, max) }).lte(max, { error: error(min, max) });
const int = (min: number, max: number) => z.int({ error: error(min, max) }).gte(min, { error: error(min, max) }).lte(max, { error: error(min, max) });
const name = () => z.string({ error: 'must be a non-empty string' }).min(1, { error: 'must be a non-empty string' });

const quota = strict({ requests: int(0, 1e12).default(0), tokens: int(0, 1e15).default(0) }, 'must be a mapping {requests, tokens}');

export const batchSchema = strict(
  {
    redis: name()
      .refine((s) => /^rediss?:\/\//.test(s), { error: (i) => `must be a redis:// or rediss:// URL (got ${JSON.stringify(i.input)})` })
      .describe('redis://host:port[/db] of the Redis holding the stream'),
    stream: name().default('switchyard:batch').describe('the request stream'),
    group: name().default('switchyard').describe('the consumer group'),
    consumer: name().optional().describe('this router\'s consumer name; default hostname-pid'),
    deadLetterStream: name().default('switchyard:batch:dead').describe('where malformed entries go, with the reason'),
    keyPrefix: name().default('switchyard:batch').describe('prefix of done markers and quota counters'),
    doneTtlSeconds: int(1, 365 * 86400).default(7 * 86400).describe('how long a request id is remembered as done (idempotency)'),
    utilisationCeiling: num(0.01, 1).default(0.7).describe('dispatch only while the pool utilisation is below this'),
    checkIntervalMs: int(1, 60_000).optional().describe('how often the ceiling is checked while above it; default the scrape interval'),
    maxInFlight: int(1, 65_536).default(16).describe('batch requests this router runs at once'),
    reclaimIdleMs: int(100, 86_400_000).default(60_000).describe('unacknowledged entries idle this long are claimed from their consumer'),
    band: name().optional().describe('flow-control band of batch requests; default the lowest'),
    maxFileBytes: int(1, 512 * 1024 * 1024).default(64 * 1024 * 1024).describe('the largest JSONL file POST /v1/files accepts (bytes)'),
    expireAfterSeconds: int(1, 30 * 86400)
      .default(86400)
      .describe('a Batches API batch not finished this long after creation expires; lines not yet dispatched go to its error file as batch_expired'),
    quotas: strict(
      {
        windowMs: int(1000, 86_400_000).default(60_000),
        default: quota.prefault({}),
        tenants: z.record(z.string().min(1), quota, { error: 'must be a mapping of tenant to {requests, tokens}' }).default({}),
      },
      'must be a mapping {windowMs, default, tenants}',
    )
      .prefault({})
      .describe('per-tenant requests and tokens a window (0 = unlimited), on the rate-limit counters: a burst of the budget refilled evenly over windowMs'),
    minExpiresAfterSeconds: int(1, 2_592_000)
      .default(3600)
      .describe("the shortest expires_after.seconds of an upload, or output_expires_after.seconds of a batch, accepted (OpenAI's 3600; the longest is 30 days)"),
    commandTimeoutMs: int(100, 600_000).default(5000).describe('a Files/Batches API Redis command not answered in this long fails; the call answers 503 store_unavailable'),
    fileQuota: strict(
      { files: int(1, 10_000_000).default(1000), bytes: int(1, 1e15).default(4 * 1024 * 1024 * 1024) },
      'must be a mapping {files, bytes}',
    )
      .prefault({})
      .describe('per tenant: how many files and bytes it may keep uploaded (POST /v1/files beyond it: 429 file_quota_exceeded)'),
    fileExpiresAfterSeconds: int(0, 2_592_000)
      .default(2_592_000)
      .describe("an upload without expires_after expires this long after its creation (seconds; 0 = kept until deleted); OpenAI's files of purpose batch expire after 30 days by default"),
    fileChunkBytes: int(64 * 1024, 256 * 1024 * 1024)
      .default(4 * 1024 * 1024)
      .describe("a file's bytes go to Redis in pieces of at most this many, each one command and one list element (keep it under the Redis proto-max-bulk-len; files of any size fit)"),
  },
  'must be a mapping',
);
