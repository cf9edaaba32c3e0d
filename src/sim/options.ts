// Options of a simulated engine: the type, the defaults and their validation.
import { ALWAYS, z } from '../config/schema-kit.js';
import { kvEventsConfigProblem, type KvEventsConfig } from './kv-events.js';
import { ACCELERATOR_NAMES, acceleratorProfile } from '../accelerators.js';
import { SwitchyardError } from '../errors.js';

export type FailureKind = '500' | '429' | '503' | 'reset-mid-stream' | 'slow-first-byte' | 'error-mid-stream';
export const FAILURE_KINDS: readonly FailureKind[] = ['500', '429', '503', 'reset-mid-stream', 'slow-first-byte', 'error-mid-stream'];
/** Kinds drawn from when failureRate > 0 and no kinds are given. */
export const DEFAULT_FAILURE_KINDS: readonly FailureKind[] = ['500', '429', '503', 'reset-mid-stream', 'slow-first-byte'];

export interface SimOptions {
  host?: string;
  /** 0 = any free port. */
  port?: number;
  /** Served model names; the first one labels the metrics. */
  models?: string[];
  engine?: 'vllm' | 'sglang';
  /** Requests decoded concurrently; the rest wait FIFO. */
  maxNumSeqs?: number;
  /** KV cache capacity in blocks. */
  kvCacheBlocks?: number;
  /** Tokens per KV block. */
  blockSize?: number;
  /** Fixed cost of a prefill, model milliseconds. */
  prefillOverheadMs?: number;
  /** Cost of each prompt token not found in the prefix cache, model microseconds. */
  prefillUsPerToken?: number;
  /** Inter-token latency of a batch of one, model milliseconds. */
  itlMs?: number;
  /** ITL grows by this fraction per additional running request: itl × (1 + f × (running − 1)). */
  decodeSlowdown?: number;
  /** Prefills share one compute resource and stall running decodes (see scheduler.ts); false = independent. */
  serialPrefill?: boolean;
  /** With serialPrefill: a prefill runs in chunks of this many tokens, each slowing every running decode's next token by the chunk's compute (0: the whole prefill delays one token). */
  prefillChunkTokens?: number;
  /** Multiplies every simulated time; 0 answers at once (no timers). */
  timeScale?: number;
  seed?: number;
  revision?: string;
  role?: 'both' | 'prefill' | 'decode';
  /** Real milliseconds after start during which the engine is "loading": /health and requests answer 503. */
  loadingMs?: number;
  /** How long a prefill engine holds a transfer for its decode side, real milliseconds (vLLM frees unread blocks after 480 s). */
  kvTransferTtlMs?: number;
  /** SGLang decode: how long (wall ms) a decode leg waits for its bootstrap room's prefill to finish on the prefill engine. */
  bootstrapTimeoutMs?: number;
  /** Keep every inter-token latency (model ms) for SimEngine.itlSamples() (benchmarks: exact quantiles beyond the histogram's buckets). Off: no cost. */
  keepItlSamples?: boolean;
  /** Probability in [0,1] that a request fails with one of failureKinds. */
  failureRate?: number;
  failureKinds?: FailureKind[];
  /** Real (unscaled) delay of the 'slow-first-byte' failure, milliseconds. */
  slowFirstByteMs?: number;
  /** tool_choice "auto": the share of requests with tools that call one (a seeded hash of the last user message decides which). */
  toolCallRate?: number;
  /** Answer as a reasoning model behind vLLM's --reasoning-parser: the first half of a chat's tokens are reasoning_content. */
  reasoning?: boolean;
  maxModelLen?: number;
  /** Completion length when the request sets no max_tokens (finish_reason "stop"). */
  defaultMaxTokens?: number;
  /** Largest accepted request body, bytes. */
  maxBodyBytes?: number;
  /** LoRA adapters served on top of the base model (requested by name in `model`). */
  loras?: string[];
  /** Distinct LoRA adapters allowed in the running batch (vLLM's --max-loras): the GPU adapter slots. */
  maxLoras?: number;
  /** Paths of adapters (name → path, vLLM's --lora-modules name=path): `root` in /v1/models; adapters in `loras` without one get their name. */
  loraPaths?: Record<string, string>;
  /**
   * Cost of bringing an adapter into a GPU slot it is not in (evicting the
   * least recently used idle one), model milliseconds: it takes the prefill
   * compute like a prefill (every running decode waits). POST
   * /v1/load_lora_adapter answers after this long too (model time).
   */
  loraLoadMs?: number;
  /** Accepts LoRA requests and the runtime load/unload routes even with no adapter at start (vLLM's --enable-lora); on when `loras` is not empty. */
  enableLora?: boolean;
  /** Every POST /v1/load_lora_adapter fails with 500 (an adapter store that is down): tests of a refused load. */
  loraLoadFail?: boolean;
  /** Mimic an older vLLM: vllm:gpu_cache_usage_perc, no engine label, flat error bodies. */
  legacy?: boolean;
  /** Host-memory KV tier in blocks (0: none): GPU evictions move there (kv-offload.ts). */
  cpuOffloadBlocks?: number;
  /** Cost of loading one block back from the host tier, model microseconds. */
  cpuReloadUsPerBlock?: number;
  /** KV-cache events, shaped like vLLM's --kv-events-config (kv-events.ts); null: off. */
  kvEventsConfig?: KvEventsConfig | null;
  /** Named accelerator profile (src/accelerators.ts): its cost factors are the defaults of the two below ('' = none). */
  accelerator?: string;
  /** Multiplies the prefill costs (prefillOverheadMs, prefillUsPerToken): 3 = a machine three times slower at prefill. */
  prefillCostFactor?: number;
  /** Multiplies the decode cost (itlMs). */
  decodeCostFactor?: number;
  /** The HTTP server: uws (uWebSockets.js, Node 16/18/20 only), node (node:http), auto (uws where it loads, else node). */
  frontEnd?: 'auto' | 'uws' | 'node';
}

export type ResolvedSimOptions = Required<SimOptions>;

export const SIM_DEFAULTS: ResolvedSimOptions = Object.freeze({
  host: '127.0.0.1',
  port: 0,
  models: ['open-model'],
  engine: 'vllm',
  maxNumSeqs: 256,
  kvCacheBlocks: 8192,
  blockSize: 16,
  prefillOverheadMs: 5,
  prefillUsPerToken: 50,
  itlMs: 10,
  decodeSlowdown: 0.01,
  serialPrefill: true,
  prefillChunkTokens: 0,
  timeScale: 1,
  seed: 0,
  revision: 'r1',
  role: 'both',
  loadingMs: 0,
  kvTransferTtlMs: 480_000,
  bootstrapTimeoutMs: 30_000,
  keepItlSamples: false,
  failureRate: 0,
  failureKinds: [...DEFAULT_FAILURE_KINDS],
  slowFirstByteMs: 1000,
  toolCallRate: 0.5,
  reasoning: false,
  maxModelLen: 32768,
  defaultMaxTokens: 16,
  maxBodyBytes: 32 * 1024 * 1024,
  loras: [],
  maxLoras: 1,
  loraPaths: {},
  loraLoadMs: 0,
  enableLora: false,
  loraLoadFail: false,
  legacy: false,
  cpuOffloadBlocks: 0,
  cpuReloadUsPerBlock: 100,
  kvEventsConfig: null,
  accelerator: '',
  prefillCostFactor: 1,
  decodeCostFactor: 1,
  frontEnd: 'auto',
}) as ResolvedSimOptions;

/** Thrown for an invalid option; `option` names it. */
export class SimOptionError extends SwitchyardError {
  override readonly code = 'SWY_ERR_SIM_OPTION';
  constructor(readonly option: string, message: string) {
    super(`sim option ${option}: ${message}`);
    this.name = 'SimOptionError';
  }
}

// ---- validation (zod, the schema library of every config surface: see src/config/schema-kit.ts)

function int(min: number, max = Number.MAX_SAFE_INTEGER) {
  const error = (i: { input?: unknown }) => `expected an integer in [${min}, ${max}], got ${JSON.stringify(i.input)}`;
  return z.int({ error }).gte(min, { error }).lte(max, { error });
}

function num(min: number, max = Infinity) {
  const error = (i: { input?: unknown }) => `expected a number in [${min}, ${max}], got ${JSON.stringify(i.input)}`;
  return z.number({ error }).gte(min, { error }).lte(max, { error });
}

const bool = () => z.boolean({ error: 'expected a boolean' });

/**
 * The simulator's options (in the order they are checked: the first problem is
 * the one reported). Loose like before: keys it does not know pass through.
 */
export const simOptionsSchema = z
  .looseObject({
    host: z.string({ error: 'expected a non-empty string' }).min(1, { error: 'expected a non-empty string' }).default(SIM_DEFAULTS.host),
    port: int(0, 65535).default(SIM_DEFAULTS.port),
    models: z
      .array(z.string().min(1), { error: 'expected a non-empty list of non-empty model names' })
      .min(1)
      .default(() => [...SIM_DEFAULTS.models]),
    engine: z.enum(['vllm', 'sglang'], { error: (i) => `expected vllm or sglang, got ${JSON.stringify(i.input)}` }).default(SIM_DEFAULTS.engine),
    maxNumSeqs: int(1).default(SIM_DEFAULTS.maxNumSeqs),
    kvCacheBlocks: int(1).default(SIM_DEFAULTS.kvCacheBlocks),
    blockSize: int(1, 1 << 16).default(SIM_DEFAULTS.blockSize),
    prefillOverheadMs: num(0).default(SIM_DEFAULTS.prefillOverheadMs),
    prefillUsPerToken: num(0).default(SIM_DEFAULTS.prefillUsPerToken),
    itlMs: num(0).default(SIM_DEFAULTS.itlMs),
    decodeSlowdown: num(0).default(SIM_DEFAULTS.decodeSlowdown),
    serialPrefill: bool().default(SIM_DEFAULTS.serialPrefill),
    prefillChunkTokens: int(0).default(SIM_DEFAULTS.prefillChunkTokens),
    timeScale: num(0).default(SIM_DEFAULTS.timeScale),
    seed: int(0, 0xffffffff).default(SIM_DEFAULTS.seed),
    revision: z.string({ error: 'expected a string' }).default(SIM_DEFAULTS.revision),
    role: z.enum(['both', 'prefill', 'decode'], { error: (i) => `expected both, prefill or decode, got ${JSON.stringify(i.input)}` }).default(SIM_DEFAULTS.role),
    loadingMs: num(0).default(SIM_DEFAULTS.loadingMs),
    kvTransferTtlMs: num(0).default(SIM_DEFAULTS.kvTransferTtlMs),
    bootstrapTimeoutMs: num(0).default(SIM_DEFAULTS.bootstrapTimeoutMs),
    keepItlSamples: bool().default(SIM_DEFAULTS.keepItlSamples),
    failureRate: num(0, 1).default(SIM_DEFAULTS.failureRate),
    failureKinds: z
      .array(z.enum(FAILURE_KINDS as [FailureKind, ...FailureKind[]]), { error: `expected a non-empty list of ${FAILURE_KINDS.join(', ')}` })
      .min(1)
      .default(() => [...SIM_DEFAULTS.failureKinds]),
    slowFirstByteMs: num(0).default(SIM_DEFAULTS.slowFirstByteMs),
    toolCallRate: num(0, 1).default(SIM_DEFAULTS.toolCallRate),
    reasoning: bool().default(SIM_DEFAULTS.reasoning),
    maxModelLen: int(1).default(SIM_DEFAULTS.maxModelLen),
    defaultMaxTokens: int(1).default(SIM_DEFAULTS.defaultMaxTokens),
    maxBodyBytes: int(1).default(SIM_DEFAULTS.maxBodyBytes),
    loras: z
      .array(z.string().min(1), { error: 'expected a list of non-empty adapter names distinct from the model names' })
      .default(() => []),
    maxLoras: int(1).default(SIM_DEFAULTS.maxLoras),
    loraPaths: z.record(z.string(), z.string().min(1), { error: 'expected an object of adapter name → non-empty path' }).default(() => ({})),
    loraLoadMs: num(0).default(SIM_DEFAULTS.loraLoadMs),
    enableLora: bool().default(SIM_DEFAULTS.enableLora),
    loraLoadFail: bool().default(SIM_DEFAULTS.loraLoadFail),
    legacy: bool().default(SIM_DEFAULTS.legacy),
    cpuOffloadBlocks: int(0).default(SIM_DEFAULTS.cpuOffloadBlocks),
    cpuReloadUsPerBlock: num(0).default(SIM_DEFAULTS.cpuReloadUsPerBlock),
    kvEventsConfig: z
      .custom<KvEventsConfig | null>((v) => v === null || kvEventsConfigProblem(v) === null, {
        error: (i) => `expected vLLM's kv-events config object: ${kvEventsConfigProblem(i.input) ?? 'invalid'}`,
      })
      .default(null),
    accelerator: z
      .string({ error: 'expected an accelerator profile name' })
      .refine((s) => s === '' || acceleratorProfile(s) !== undefined, {
        error: (i) => `unknown accelerator profile ${JSON.stringify(i.input)} (profiles: ${ACCELERATOR_NAMES.join(', ')})`,
      })
      .default(SIM_DEFAULTS.accelerator),
    frontEnd: z.enum(['auto', 'uws', 'node'], { error: (i) => `expected auto, uws or node, got ${JSON.stringify(i.input)}` }).default(SIM_DEFAULTS.frontEnd),
    prefillCostFactor: num(0.01, 1000).optional(),
    decodeCostFactor: num(0.01, 1000).optional(),
  })
  .superRefine((o, ctx) => {
    if (Array.isArray(o.loras) && Array.isArray(o.models) && o.loras.some((m) => o.models.includes(m))) {
      ctx.addIssue({ code: 'custom', path: ['loras'], message: 'expected a list of non-empty adapter names distinct from the model names', input: o.loras });
    }
  }, ALWAYS);

/** Messages for problems inside a list option, which name the list as a whole. */
const LIST_MESSAGES: Record<string, string> = {
  models: 'expected a non-empty list of non-empty model names',
  failureKinds: `expected a non-empty list of ${FAILURE_KINDS.join(', ')}`,
  loras: 'expected a list of non-empty adapter names distinct from the model names',
};

/** Fills defaults and validates; throws SimOptionError naming the first invalid option. */
export function resolveSimOptions(opts: SimOptions = {}): ResolvedSimOptions {
  const r = simOptionsSchema.safeParse(stripUndefined(opts));
  if (!r.success) {
    const iss = r.error.issues[0]!;
    const option = String(iss.path[0] ?? '(options)');
    throw new SimOptionError(option, LIST_MESSAGES[option] ?? iss.message);
  }
  const o = r.data as SimOptions & Omit<ResolvedSimOptions, 'prefillCostFactor' | 'decodeCostFactor'>;
  if (o.loras.length > 0) o.enableLora = true;
  return withSpeed(o);
}

/** The cost factors: given ones win, then the accelerator profile's, then 1. */
function withSpeed(o: SimOptions & Omit<ResolvedSimOptions, 'prefillCostFactor' | 'decodeCostFactor'>): ResolvedSimOptions {
  const p = o.accelerator === '' ? undefined : acceleratorProfile(o.accelerator);
  return { ...o, prefillCostFactor: o.prefillCostFactor ?? p?.prefillCostFactor ?? 1, decodeCostFactor: o.decodeCostFactor ?? p?.decodeCostFactor ?? 1 };
}

/**
 * The options the batching model runs on: prefill and decode costs scaled by
 * the engine's cost factors (the options themselves keep what was asked for).
 */
export function scaledCosts(o: ResolvedSimOptions): ResolvedSimOptions {
  if (o.prefillCostFactor === 1 && o.decodeCostFactor === 1) return o;
  return {
    ...o,
    prefillOverheadMs: o.prefillOverheadMs * o.prefillCostFactor,
    prefillUsPerToken: o.prefillUsPerToken * o.prefillCostFactor,
    itlMs: o.itlMs * o.decodeCostFactor,
  };
}

function stripUndefined<T extends object>(o: T): Partial<T> {
  const out: Partial<T> = {};
  for (const k of Object.keys(o) as (keyof T)[]) if (o[k] !== undefined) out[k] = o[k];
  return out;
}
