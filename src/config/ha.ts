// The `ha` and `extProc` blocks of the router config: a hot-standby pair over
// a Redis lease (docs/operations.md "High availability") and the Envoy
// ext_proc listener (docs/operations.md "Envoy ext_proc"). Types, defaults and
// their zod schemas; schema.ts adds them to the Router config.
import { strict, z } from './schema-kit.js';

export const ON_REDIS_DOWN = ['serve-alone', 'refuse'] as const;

export interface HaConfig {
  /** redis://host:port[/db] of the Redis both routers of the pair share (the lease, unless `kubernetes`; the warm standby's delta stream). */
  redis?: string;
  /** The lease as a Kubernetes coordination.k8s.io/v1 Lease instead of in Redis. */
  kubernetes?: HaKubernetesConfig;
  /** Prefix of every Redis key the pair uses (lease, fencing counter, delta stream). */
  key: string;
  /** How long an acquired or renewed lease lasts without renewal. */
  leaseTtlMs: number;
  /** How often the active renews (and the standby tries to acquire). */
  renewIntervalMs: number;
  /** Redis unreachable at start: serve alone (active, and say so) or refuse to start. */
  onRedisDown: (typeof ON_REDIS_DOWN)[number];
  /** How often the active publishes its batched routing-state deltas. */
  deltaFlushMs: number;
  /** Approximate cap on the delta stream's length (XADD MAXLEN ~). */
  streamMaxLen: number;
  /** The active publishes its routing-state deltas and the standby follows them (false: a cold standby). */
  warmStandby: boolean;
}

export interface HaKubernetesConfig {
  /** The Lease object's name (created when absent). */
  name: string;
  /** Its namespace; default: the router's own (in-cluster), else the kubeconfig context's. */
  namespace?: string;
  /** A kubeconfig file; absent: the in-cluster service account. */
  kubeconfig?: string;
  /** holderIdentity of this router; default: its hostname (the pod name) plus a random suffix. */
  identity?: string;
}

export interface ExtProcConfig {
  host: string;
  /** gRPC port for envoy.service.ext_proc.v3.ExternalProcessor and grpc.health.v1.Health (0: one the OS picks). */
  port: number;
  /** The dynamic-metadata namespace of the picked endpoint (Gateway API Inference Extension: envoy.lb). */
  metadataNamespace: string;
  /** Other candidates of the pick sent after it (`ip:port,ip:port,...`), best first, for the proxy's retries; 0: the pick alone. */
  fallbacks: number;
  /** A stream whose response has not completed this long after its decision: the decision is released (in-flight slot, as a client abort) and the stream ended, ms. */
  decisionTimeoutMs?: number;
  /** A stream with no message for this long is ended (and its decision released), ms. */
  idleTimeoutMs?: number;
  /** Streams open at once; more are refused with RESOURCE_EXHAUSTED. */
  maxStreams?: number;
  /** Request bytes buffered awaiting a decision over all streams; a body beyond it answers 503. */
  maxBufferedBytes?: number;
}

export const HA_DEFAULTS = { key: 'switchyard:ha', leaseTtlMs: 3000, renewIntervalMs: 1000, onRedisDown: 'serve-alone' as const, deltaFlushMs: 100, streamMaxLen: 1000, warmStandby: true };
export const EXT_PROC_DEFAULTS = { host: '127.0.0.1', port: 9002, metadataNamespace: 'envoy.lb', fallbacks: 0, decisionTimeoutMs: 600_000, idleTimeoutMs: 300_000, maxStreams: 10_000, maxBufferedBytes: 512 * 1024 * 1024 };

const got = (v: unknown) => JSON.stringify(v);
function int(min: number, max: number) {
  const error = (i: { input?: unknown }) => `must be an integer in [${min}, ${max}] (got ${got(i.input)})`;
  return z.int({ error }).gte(min, { error }).lte(max, { error });
}
const nonEmpty = () =>
  z.string({ error: (i) => (i.input === undefined ? 'is required' : 'must be a non-empty string') }).min(1, { error: 'must be a non-empty string' });

const redisUrl = nonEmpty().refine(
  (s) => {
    try {
      const u = new URL(s);
      return (u.protocol === 'redis:' || u.protocol === 'rediss:') && u.hostname !== '';
    } catch {
      return false;
    }
  },
  { error: (i) => `must be a redis:// or rediss:// URL, e.g. redis://10.0.0.9:6379 (got ${got(i.input)})` },
);

export const haSchema = strict(
  {
    redis: redisUrl.optional().describe('the Redis the standby pair shares: redis://host:port[/db] (lease unless kubernetes; the warm standby\'s delta stream)'),
    kubernetes: strict(
      {
        name: nonEmpty()
          .refine((s) => /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/.test(s), { error: (i) => `must be a Kubernetes object name (got ${got(i.input)})` })
          .describe('name of the coordination.k8s.io/v1 Lease (created when absent)'),
        namespace: nonEmpty()
          .refine((s) => /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/.test(s), { error: (i) => `must be a Kubernetes namespace name (got ${got(i.input)})` })
          .optional()
          .describe("the Lease's namespace; default: the router's own"),
        kubeconfig: nonEmpty().optional().describe('kubeconfig file; absent: the in-cluster service account'),
        identity: nonEmpty().optional().describe('holderIdentity of this router; default: hostname plus a random suffix'),
      },
      'must be a mapping {name, namespace, kubeconfig, identity}',
    )
      .optional()
      .describe('the lease as a Kubernetes Lease instead of in Redis (docs/operations.md)'),
    key: nonEmpty().default(HA_DEFAULTS.key).describe('prefix of the Redis keys of this pair'),
    leaseTtlMs: int(200, 600_000).default(HA_DEFAULTS.leaseTtlMs).describe('lease lifetime without renewal'),
    renewIntervalMs: int(50, 300_000).default(HA_DEFAULTS.renewIntervalMs).describe('lease renewal (active) and acquisition attempts (standby)'),
    onRedisDown: z
      .enum(ON_REDIS_DOWN, { error: (i) => `must be one of: ${ON_REDIS_DOWN.join(', ')} (got ${got(i.input)})` })
      .default(HA_DEFAULTS.onRedisDown)
      .describe('Redis unreachable at start: serve alone as active, or refuse to start'),
    deltaFlushMs: int(10, 60_000).default(HA_DEFAULTS.deltaFlushMs).describe('how often the active publishes routing-state deltas'),
    streamMaxLen: int(10, 10_000_000).default(HA_DEFAULTS.streamMaxLen).describe('approximate cap on the delta stream (XADD MAXLEN ~)'),
    warmStandby: z
      .boolean({ error: (i) => `must be true or false (got ${got(i.input)})` })
      .default(HA_DEFAULTS.warmStandby)
      .describe('the active publishes routing-state deltas and the standby follows them (false: a cold standby)'),
  },
  'must be a mapping (at least `redis: redis://host:port` or `kubernetes: {name}`)',
).superRefine((v, ctx) => {
  if (v.redis === undefined && v.kubernetes === undefined) ctx.addIssue({ code: 'custom', path: ['redis'], message: 'is required (or kubernetes: {name} for a Kubernetes Lease)', input: undefined });
  if (typeof v.leaseTtlMs === 'number' && typeof v.renewIntervalMs === 'number' && v.renewIntervalMs * 2 > v.leaseTtlMs) {
    ctx.addIssue({ code: 'custom', path: ['renewIntervalMs'], message: `must be at most half of leaseTtlMs (${v.leaseTtlMs}): one missed renewal must not lose the lease`, input: v.renewIntervalMs });
  }
});

export const extProcSchema = strict(
  {
    host: nonEmpty().default(EXT_PROC_DEFAULTS.host),
    port: int(0, 65535).default(EXT_PROC_DEFAULTS.port).describe('gRPC listen port (0: one the OS picks)'),
    metadataNamespace: nonEmpty().default(EXT_PROC_DEFAULTS.metadataNamespace).describe('dynamic-metadata namespace of the picked endpoint'),
    fallbacks: int(0, 7).default(EXT_PROC_DEFAULTS.fallbacks).describe('other candidates sent after the pick for the proxy to retry on (0: the pick alone)'),
    decisionTimeoutMs: int(50, 86_400_000).default(EXT_PROC_DEFAULTS.decisionTimeoutMs).describe("a decision whose response has not completed this long after it is released and its stream ended (ms)"),
    idleTimeoutMs: int(50, 86_400_000).default(EXT_PROC_DEFAULTS.idleTimeoutMs).describe('a stream with no message this long is ended, its decision released (ms)'),
    maxStreams: int(1, 1_000_000).default(EXT_PROC_DEFAULTS.maxStreams).describe('ext_proc streams open at once; more are refused (RESOURCE_EXHAUSTED)'),
    maxBufferedBytes: int(1024, 64 * 1024 * 1024 * 1024).default(EXT_PROC_DEFAULTS.maxBufferedBytes).describe('request body bytes buffered awaiting a decision over all streams; beyond it 503'),
  },
  'must be a mapping',
);
