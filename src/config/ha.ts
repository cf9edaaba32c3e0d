// The `ha` block of the router config: active-active replicas sharing their
// routing state through Redis (the default), or a hot-standby pair over a
// lease (`mode: standby`; docs/operations.md "High availability"). Types,
// defaults and the zod schema; schema.ts adds it to the Router config.
import { got, int, nonEmpty, strict, z } from './schema-kit.js';

export const ON_REDIS_DOWN = ['serve-alone', 'refuse'] as const;
export const HA_MODES = ['active-active', 'standby'] as const;

export interface HaConfig {
  /**
   * active-active: every replica serves and shares its prefix records and
   * load through Redis (src/ha/fleet.ts); standby: one active router holds a
   * lease, the other waits (src/ha/standby.ts). Default: active-active, or
   * standby with `kubernetes` (the Lease is the pair's).
   */
  mode: (typeof HA_MODES)[number];
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
  /**
   * Active-active: after a pick, this replica's message (its records and its
   * load) goes out within this long instead of at the next deltaFlushMs; at
   * most one such message per pickFlushMs. 0 (or ≥ deltaFlushMs): off.
   */
  pickFlushMs: number;
  /** Approximate cap on the delta stream's length (XADD MAXLEN ~). */
  streamMaxLen: number;
  /** The active publishes its routing-state deltas and the standby follows them (false: a cold standby). */
  warmStandby: boolean;
  /** Active-active: a replica whose reports stopped this long ago is gone (its in-flight share expires). */
  peerTtlMs: number;
  /** Active-active: this replica's id on the shared stream; default: hostname plus a random suffix. */
  replicaId?: string;
  /**
   * Active-active with flow control: the replicas share their flows' queued
   * and in-flight counts, so a tenant's share and the higher bands' priority
   * hold fleet-wide (src/flow/fleet-flows.ts). False: each replica orders
   * its own arrivals alone.
   */
  shareFlows: boolean;
  /** Active-active with shareFlows: the longest a replica leaves free capacity to another replica's requests before it dispatches its own anyway. */
  flowHoldMs: number;
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

export const HA_DEFAULTS = { key: 'switchyard:ha', leaseTtlMs: 3000, renewIntervalMs: 1000, onRedisDown: 'serve-alone' as const, deltaFlushMs: 100, pickFlushMs: 5, streamMaxLen: 1000, warmStandby: true, peerTtlMs: 2000, shareFlows: true, flowHoldMs: 60 };

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
    mode: z
      .enum(HA_MODES, { error: (i) => `must be one of: ${HA_MODES.join(', ')} (got ${got(i.input)})` })
      .optional()
      .describe('active-active (default): every replica serves and shares routing state through Redis; standby: a lease picks one active router (default with kubernetes)'),
    redis: redisUrl.optional().describe('the Redis the replicas share: redis://host:port[/db] (active-active: the shared stream; standby: the lease unless kubernetes, the warm standby\'s delta stream)'),
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
    pickFlushMs: int(0, 60_000)
      .default(HA_DEFAULTS.pickFlushMs)
      .describe('active-active: after a pick the replica shares its records and load within this long (at most one message per pickFlushMs); 0: only every deltaFlushMs'),
    streamMaxLen: int(10, 10_000_000).default(HA_DEFAULTS.streamMaxLen).describe('approximate cap on the delta stream (XADD MAXLEN ~)'),
    warmStandby: z
      .boolean({ error: (i) => `must be true or false (got ${got(i.input)})` })
      .default(HA_DEFAULTS.warmStandby)
      .describe('the active publishes routing-state deltas and the standby follows them (false: a cold standby)'),
    peerTtlMs: int(100, 600_000).default(HA_DEFAULTS.peerTtlMs).describe('active-active: a replica silent this long is gone and its in-flight share expires'),
    replicaId: nonEmpty().optional().describe("active-active: this replica's id on the shared stream; default: hostname plus a random suffix"),
    shareFlows: z
      .boolean({ error: (i) => `must be true or false (got ${got(i.input)})` })
      .default(HA_DEFAULTS.shareFlows)
      .describe("active-active with flow control: share the flows' queued and in-flight counts, so tenant shares and band priority hold across the replicas (false: each replica orders its own arrivals)"),
    flowHoldMs: int(1, 10_000)
      .default(HA_DEFAULTS.flowHoldMs)
      .describe("active-active with shareFlows: the longest a replica leaves free capacity to another replica's requests (a higher band, or a flow under its fleet share) before dispatching its own anyway"),
  },
  'must be a mapping (at least `redis: redis://host:port` or `kubernetes: {name}`)',
).superRefine((v, ctx) => {
  const mode = v.mode ?? (v.kubernetes !== undefined ? 'standby' : 'active-active');
  if (mode === 'active-active') {
    if (v.redis === undefined) ctx.addIssue({ code: 'custom', path: ['redis'], message: 'is required: active-active replicas share their routing state through it (or mode: standby with kubernetes: {name})', input: undefined });
    if (v.kubernetes !== undefined) ctx.addIssue({ code: 'custom', path: ['kubernetes'], message: 'is the standby pair\'s lease: active-active replicas need no lease (set mode: standby, or remove kubernetes)', input: v.kubernetes });
    if (typeof v.peerTtlMs === 'number' && typeof v.deltaFlushMs === 'number' && v.peerTtlMs < 3 * v.deltaFlushMs) {
      ctx.addIssue({ code: 'custom', path: ['peerTtlMs'], message: `must be at least 3 × deltaFlushMs (${3 * v.deltaFlushMs}): a live replica reports every deltaFlushMs, and two late reports must not expire it`, input: v.peerTtlMs });
    }
  } else if (v.redis === undefined && v.kubernetes === undefined) ctx.addIssue({ code: 'custom', path: ['redis'], message: 'is required (or kubernetes: {name} for a Kubernetes Lease)', input: undefined });
  if (typeof v.leaseTtlMs === 'number' && typeof v.renewIntervalMs === 'number' && v.renewIntervalMs * 2 > v.leaseTtlMs) {
    ctx.addIssue({ code: 'custom', path: ['renewIntervalMs'], message: `must be at most half of leaseTtlMs (${v.leaseTtlMs}): one missed renewal must not lose the lease`, input: v.renewIntervalMs });
  }
}).transform((v): HaConfig => ({ ...v, mode: v.mode ?? (v.kubernetes !== undefined ? 'standby' : 'active-active') }));

// the ext_proc block moved to extproc.ts (re-exported here for older imports)
export { EXT_PROC_DEFAULTS, extProcSchema, type ExtProcConfig } from './extproc.js';
