// Options of a simulated engine: the type, the defaults and their validation.

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
  /** Multiplies every simulated time; 0 answers at once (no timers). */
  timeScale?: number;
  seed?: number;
  revision?: string;
  role?: 'both' | 'prefill' | 'decode';
  /** Probability in [0,1] that a request fails with one of failureKinds. */
  failureRate?: number;
  failureKinds?: FailureKind[];
  /** Real (unscaled) delay of the 'slow-first-byte' failure, milliseconds. */
  slowFirstByteMs?: number;
  maxModelLen?: number;
  /** Completion length when the request sets no max_tokens (finish_reason "stop"). */
  defaultMaxTokens?: number;
  /** Largest accepted request body, bytes. */
  maxBodyBytes?: number;
  /** LoRA adapters served on top of the base model (requested by name in `model`). */
  loras?: string[];
  /** Distinct LoRA adapters allowed in the running batch (vLLM's --max-loras). */
  maxLoras?: number;
  /** Mimic an older vLLM: vllm:gpu_cache_usage_perc, no engine label, flat error bodies. */
  legacy?: boolean;
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
  timeScale: 1,
  seed: 0,
  revision: 'r1',
  role: 'both',
  failureRate: 0,
  failureKinds: [...DEFAULT_FAILURE_KINDS],
  slowFirstByteMs: 1000,
  maxModelLen: 32768,
  defaultMaxTokens: 16,
  maxBodyBytes: 32 * 1024 * 1024,
  loras: [],
  maxLoras: 1,
  legacy: false,
}) as ResolvedSimOptions;

/** Thrown for an invalid option; `option` names it. */
export class SimOptionError extends RangeError {
  readonly code = 'SWY_ERR_SIM_OPTION';
  constructor(readonly option: string, message: string) {
    super(`sim option ${option}: ${message}`);
    this.name = 'SimOptionError';
  }
}

function int(name: string, v: unknown, min: number, max = Number.MAX_SAFE_INTEGER): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) {
    throw new SimOptionError(name, `expected an integer in [${min}, ${max}], got ${JSON.stringify(v)}`);
  }
  return v;
}

function num(name: string, v: unknown, min: number, max = Infinity): number {
  if (typeof v !== 'number' || !Number.isFinite(v) || v < min || v > max) {
    throw new SimOptionError(name, `expected a number in [${min}, ${max}], got ${JSON.stringify(v)}`);
  }
  return v;
}

/** Fills defaults and validates; throws SimOptionError with a precise message. */
export function resolveSimOptions(opts: SimOptions = {}): ResolvedSimOptions {
  const o = { ...SIM_DEFAULTS, ...stripUndefined(opts) } as ResolvedSimOptions;
  if (typeof o.host !== 'string' || o.host === '') throw new SimOptionError('host', 'expected a non-empty string');
  int('port', o.port, 0, 65535);
  if (!Array.isArray(o.models) || o.models.length === 0 || o.models.some((m) => typeof m !== 'string' || m === '')) {
    throw new SimOptionError('models', 'expected a non-empty list of non-empty model names');
  }
  if (o.engine !== 'vllm' && o.engine !== 'sglang') throw new SimOptionError('engine', `expected vllm or sglang, got ${JSON.stringify(o.engine)}`);
  int('maxNumSeqs', o.maxNumSeqs, 1);
  int('kvCacheBlocks', o.kvCacheBlocks, 1);
  int('blockSize', o.blockSize, 1, 1 << 16);
  num('prefillOverheadMs', o.prefillOverheadMs, 0);
  num('prefillUsPerToken', o.prefillUsPerToken, 0);
  num('itlMs', o.itlMs, 0);
  num('decodeSlowdown', o.decodeSlowdown, 0);
  if (typeof o.serialPrefill !== 'boolean') throw new SimOptionError('serialPrefill', 'expected a boolean');
  num('timeScale', o.timeScale, 0);
  int('seed', o.seed, 0, 0xffffffff);
  if (typeof o.revision !== 'string') throw new SimOptionError('revision', 'expected a string');
  if (o.role !== 'both' && o.role !== 'prefill' && o.role !== 'decode') {
    throw new SimOptionError('role', `expected both, prefill or decode, got ${JSON.stringify(o.role)}`);
  }
  num('failureRate', o.failureRate, 0, 1);
  if (!Array.isArray(o.failureKinds) || o.failureKinds.length === 0 || o.failureKinds.some((k) => !FAILURE_KINDS.includes(k))) {
    throw new SimOptionError('failureKinds', `expected a non-empty list of ${FAILURE_KINDS.join(', ')}`);
  }
  num('slowFirstByteMs', o.slowFirstByteMs, 0);
  int('maxModelLen', o.maxModelLen, 1);
  int('defaultMaxTokens', o.defaultMaxTokens, 1);
  int('maxBodyBytes', o.maxBodyBytes, 1);
  if (!Array.isArray(o.loras) || o.loras.some((m) => typeof m !== 'string' || m === '' || o.models.includes(m))) {
    throw new SimOptionError('loras', 'expected a list of non-empty adapter names distinct from the model names');
  }
  int('maxLoras', o.maxLoras, 1);
  if (typeof o.legacy !== 'boolean') throw new SimOptionError('legacy', 'expected a boolean');
  o.loras = [...o.loras];
  o.models = [...o.models];
  o.failureKinds = [...o.failureKinds];
  return o;
}

function stripUndefined<T extends object>(o: T): Partial<T> {
  const out: Partial<T> = {};
  for (const k of Object.keys(o) as (keyof T)[]) if (o[k] !== undefined) out[k] = o[k];
  return out;
}
