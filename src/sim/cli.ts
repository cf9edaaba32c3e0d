// `switchyard sim`: run a simulated vLLM/SGLang engine, or a fleet of them.

import { parseArgs, type ParseArgsConfig } from 'node:util';
import { startFleet, type FleetOptions } from './index.js';
import { kvEventsConfigProblem, type KvEventsConfig } from './kv-events.js';
import { ACCELERATOR_NAMES } from '../accelerators.js';
import { FAILURE_KINDS, SIM_DEFAULTS, SimOptionError, resolveSimOptions, type FailureKind } from './options.js';
import { SwitchyardError } from '../errors.js';

const D = SIM_DEFAULTS;
export const SIM_USAGE = `usage: switchyard sim [options]

Runs a simulated vLLM/SGLang engine (OpenAI-compatible HTTP: /v1/completions,
/v1/chat/completions, /v1/models, /health, /metrics). See docs/sim.md.

options (--name value or --name=value):
  --host H                    listen address (default 127.0.0.1)
  --port P                    listen port, 0 = any free port (default 8000)
  --model NAME                served model name; repeat for aliases (default ${D.models[0]})
  --engine vllm|sglang        metrics dialect (default ${D.engine})
  --max-num-seqs N            requests decoded concurrently; the rest wait FIFO (default ${D.maxNumSeqs})
  --kv-cache-blocks N         KV cache capacity in blocks (default ${D.kvCacheBlocks})
  --block-size N              tokens per KV block (default ${D.blockSize})
  --prefill-overhead-ms F     fixed prefill cost per request (default ${D.prefillOverheadMs})
  --prefill-us-per-token F    cost of each uncached prompt token, microseconds (default ${D.prefillUsPerToken})
  --itl-ms F                  inter-token latency with a batch of one (default ${D.itlMs})
  --decode-slowdown F         ITL grows by F per extra running request (default ${D.decodeSlowdown})
  --accelerator NAME          named speed profile: its cost factors become the defaults of the two below
                              (${ACCELERATOR_NAMES.join(', ')})
  --prefill-cost-factor F     multiplies the prefill costs (default: the profile's, else 1)
  --decode-cost-factor F      multiplies the inter-token latency (default: the profile's, else 1)
  --serial-prefill true|false prefills share one compute and stall decodes (default ${D.serialPrefill})
  --time-scale F              multiplies every simulated time; 0 = answer at once (default ${D.timeScale})
  --seed N                    seed of generated text and failure draws (default ${D.seed})
  --revision R                revision label reported in /metrics and /version (default ${D.revision})
  --role both|prefill|decode  what the engine accepts, as vLLM's kv_role / SGLang's disaggregation
                              mode: a vLLM prefill engine refuses do_remote_prefill, a decode engine
                              do_remote_decode; an SGLang prefill engine needs bootstrap_room (default ${D.role})
  --prefill-chunk-tokens N    with serial prefill: prefills run in chunks of N tokens, each slowing every
                              running decode's next token by the chunk's compute (default 0: one token
                              waits for the whole prefill)
  --loading-ms MS             "loading" for MS real ms after start: /health and requests answer 503 (default 0)
  --kv-transfer-ttl-ms MS     a prefill engine holds a transfer for its decode side this long (default 480000)
  --bootstrap-timeout-ms MS   SGLang decode: wait this long for the bootstrap room's prefill (default 30000)
  --failure-rate P            probability in [0,1] that a request fails (default ${D.failureRate})
  --failure-kinds K,K         kinds drawn from: ${FAILURE_KINDS.join(', ')}
                              (default ${D.failureKinds.join(',')})
  --slow-first-byte-ms F      real delay of the slow-first-byte failure (default ${D.slowFirstByteMs})
  --tool-call-rate P          tool_choice "auto": share in [0,1] of requests with tools that call one (default ${D.toolCallRate})
  --max-model-len N           longest prompt + completion in tokens (default ${D.maxModelLen})
  --default-max-tokens N      completion length when a request sets no max_tokens (default ${D.defaultMaxTokens})
  --max-body-bytes N          largest request body (default ${D.maxBodyBytes})
  --lora NAME                 serve a LoRA adapter named NAME on the base model; repeatable
  --max-loras N               distinct adapters in the running batch: the GPU adapter slots (default ${D.maxLoras})
  --lora-modules NAME=PATH    serve adapter NAME from PATH (vLLM's form); repeatable
  --lora-load-ms MS           model ms to bring an adapter into a free GPU slot, and of /v1/load_lora_adapter (default ${D.loraLoadMs})
  --enable-lora               accept runtime adapter loading with no adapter at start (on with --lora)
  --cpu-offload-blocks N      host-memory KV tier in blocks: GPU evictions move there (default ${D.cpuOffloadBlocks})
  --cpu-reload-us-per-block F cost of loading a block back from host memory, microseconds (default ${D.cpuReloadUsPerBlock})
  --kv-events-config JSON     publish KV events like vLLM, e.g. '{"enable_kv_cache_events":true,"publisher":"zmq",
                              "endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","topic":"kv"}';
                              also "layout":"array"|"map", "block_hash_format":"int"|"bytes" (docs/kv-events.md)
  --front-end auto|uws|node   the HTTP server: uWebSockets.js (Node 16/18/20 only) or node:http;
                              auto: uws where its binary loads, else node (default ${D.frontEnd})
  --legacy                    mimic an older vLLM (gpu_cache_usage_perc, flat error bodies)
  --reasoning                 a reasoning model: chat answers carry reasoning_content (the first half of the tokens)
  --fleet N                   start N engines on consecutive ports (default 1)
  --base-port P               first port of the fleet (default: --port)
  -h, --help                  show this message

examples:
  switchyard sim                                        # one vLLM-like engine on 127.0.0.1:8000
  switchyard sim --fleet 4 --base-port 8001 --model llama-3-8b
  switchyard sim --engine sglang --port 30000 --time-scale 0      # answers at once
  switchyard sim --failure-rate 0.05 --failure-kinds 500,reset-mid-stream

Exit codes: 0 after SIGINT/SIGTERM, 1 when it cannot listen, 2 on bad options.`;

type Parsed = FleetOptions & { fleet: number };
type Setter = (o: Parsed, v: string, flag: string) => void;

class FlagError extends SwitchyardError {
  override readonly code = 'SWY_ERR_SIM_FLAG';
}

function number(flag: string, v: string): number {
  const n = Number(v);
  if (v.trim() === '' || !Number.isFinite(n)) throw new FlagError(`${flag} expects a number, got '${v}'`);
  return n;
}
function integer(flag: string, v: string): number {
  const n = number(flag, v);
  if (!Number.isInteger(n)) throw new FlagError(`${flag} expects an integer, got '${v}'`);
  return n;
}
function trueFalse(flag: string, v: string): boolean {
  if (v !== 'true' && v !== 'false') throw new FlagError(`${flag} expects true or false, got '${v}'`);
  return v === 'true';
}
function failureKinds(o: Parsed, v: string, f: string): void {
  const kinds = v.split(',').map((s) => s.trim()).filter((s) => s !== '');
  for (const k of kinds) {
    if (!FAILURE_KINDS.includes(k as FailureKind)) throw new FlagError(`${f}: unknown kind '${k}' (kinds: ${FAILURE_KINDS.join(', ')})`);
  }
  if (kinds.length === 0) throw new FlagError(`${f} expects a comma-separated list of kinds`);
  o.failureKinds = kinds as FailureKind[];
}

/** Each flag (by its parseArgs name): its parseArgs declaration and how its value lands in the options. */
const FLAGS: Record<string, { type: 'string' | 'boolean'; set: Setter }> = {
  host: { type: 'string', set: (o, v) => (o.host = v) },
  port: { type: 'string', set: (o, v, f) => (o.port = integer(f, v)) },
  model: {
    type: 'string',
    set: (o, v) => {
      o.models = o.models === undefined ? [v] : [...o.models, v];
    },
  },
  engine: {
    type: 'string',
    set: (o, v, f) => {
      if (v !== 'vllm' && v !== 'sglang') throw new FlagError(`${f} expects vllm or sglang, got '${v}'`);
      o.engine = v;
    },
  },
  'max-num-seqs': { type: 'string', set: (o, v, f) => (o.maxNumSeqs = integer(f, v)) },
  'kv-cache-blocks': { type: 'string', set: (o, v, f) => (o.kvCacheBlocks = integer(f, v)) },
  'block-size': { type: 'string', set: (o, v, f) => (o.blockSize = integer(f, v)) },
  'prefill-overhead-ms': { type: 'string', set: (o, v, f) => (o.prefillOverheadMs = number(f, v)) },
  'prefill-us-per-token': { type: 'string', set: (o, v, f) => (o.prefillUsPerToken = number(f, v)) },
  'itl-ms': { type: 'string', set: (o, v, f) => (o.itlMs = number(f, v)) },
  accelerator: { type: 'string', set: (o, v) => (o.accelerator = v) },
  'prefill-cost-factor': { type: 'string', set: (o, v, f) => (o.prefillCostFactor = number(f, v)) },
  'decode-cost-factor': { type: 'string', set: (o, v, f) => (o.decodeCostFactor = number(f, v)) },
  'decode-slowdown': { type: 'string', set: (o, v, f) => (o.decodeSlowdown = number(f, v)) },
  'time-scale': { type: 'string', set: (o, v, f) => (o.timeScale = number(f, v)) },
  'serial-prefill': { type: 'string', set: (o, v, f) => (o.serialPrefill = trueFalse(f, v)) },
  'prefill-chunk-tokens': { type: 'string', set: (o, v, f) => (o.prefillChunkTokens = integer(f, v)) },
  seed: { type: 'string', set: (o, v, f) => (o.seed = integer(f, v)) },
  revision: { type: 'string', set: (o, v) => (o.revision = v) },
  'loading-ms': { type: 'string', set: (o, v, f) => (o.loadingMs = number(f, v)) },
  'kv-transfer-ttl-ms': { type: 'string', set: (o, v, f) => (o.kvTransferTtlMs = number(f, v)) },
  'bootstrap-timeout-ms': { type: 'string', set: (o, v, f) => (o.bootstrapTimeoutMs = number(f, v)) },
  role: {
    type: 'string',
    set: (o, v, f) => {
      if (v !== 'both' && v !== 'prefill' && v !== 'decode') throw new FlagError(`${f} expects both, prefill or decode, got '${v}'`);
      o.role = v;
    },
  },
  'failure-rate': { type: 'string', set: (o, v, f) => (o.failureRate = number(f, v)) },
  'failure-kinds': { type: 'string', set: failureKinds },
  'failure-kind': { type: 'string', set: failureKinds },
  'slow-first-byte-ms': { type: 'string', set: (o, v, f) => (o.slowFirstByteMs = number(f, v)) },
  'tool-call-rate': { type: 'string', set: (o, v, f) => (o.toolCallRate = number(f, v)) },
  'max-model-len': { type: 'string', set: (o, v, f) => (o.maxModelLen = integer(f, v)) },
  'default-max-tokens': { type: 'string', set: (o, v, f) => (o.defaultMaxTokens = integer(f, v)) },
  'max-body-bytes': { type: 'string', set: (o, v, f) => (o.maxBodyBytes = integer(f, v)) },
  lora: {
    type: 'string',
    set: (o, v) => {
      o.loras = [...(o.loras ?? []), v];
    },
  },
  'max-loras': { type: 'string', set: (o, v, f) => (o.maxLoras = integer(f, v)) },
  // vLLM's form: name=path (one per flag here; repeatable)
  'lora-modules': {
    type: 'string',
    set: (o, v, f) => {
      const eq = v.indexOf('=');
      if (eq <= 0 || eq === v.length - 1) throw new FlagError(`${f} expects name=path, got '${v}'`);
      const name = v.slice(0, eq);
      o.loras = [...(o.loras ?? []), name];
      o.loraPaths = { ...(o.loraPaths ?? {}), [name]: v.slice(eq + 1) };
    },
  },
  'lora-load-ms': { type: 'string', set: (o, v, f) => (o.loraLoadMs = number(f, v)) },
  'enable-lora': { type: 'boolean', set: (o, v, f) => (o.enableLora = trueFalse(f, v)) },
  'front-end': {
    type: 'string',
    set: (o, v, f) => {
      if (v !== 'auto' && v !== 'uws' && v !== 'node') throw new FlagError(`${f} expects auto, uws or node, got '${v}'`);
      o.frontEnd = v;
    },
  },
  // a switch: `--legacy`; `--legacy=false` also works
  legacy: { type: 'boolean', set: (o, v, f) => (o.legacy = trueFalse(f, v)) },
  reasoning: { type: 'boolean', set: (o, v, f) => (o.reasoning = trueFalse(f, v)) },
  fleet: {
    type: 'string',
    set: (o, v, f) => {
      const n = integer(f, v);
      if (n < 1 || n > 4096) throw new FlagError(`${f} expects an integer in [1, 4096], got '${v}'`);
      o.fleet = n;
    },
  },
  'base-port': { type: 'string', set: (o, v, f) => (o.basePort = integer(f, v)) },
  'cpu-offload-blocks': { type: 'string', set: (o, v, f) => (o.cpuOffloadBlocks = integer(f, v)) },
  'cpu-reload-us-per-block': { type: 'string', set: (o, v, f) => (o.cpuReloadUsPerBlock = number(f, v)) },
  'kv-events-config': {
    type: 'string',
    set: (o, v, f) => {
      let c: unknown;
      try {
        c = JSON.parse(v);
      } catch (err) {
        throw new FlagError(`${f} expects a JSON object, got '${v}' (${(err as Error).message})`);
      }
      const problem = kvEventsConfigProblem(c);
      if (problem !== null) throw new FlagError(`${f}: ${problem}`);
      o.kvEventsConfig = c as KvEventsConfig;
    },
  },
};

const PARSE_OPTIONS = {
  ...Object.fromEntries(Object.entries(FLAGS).map(([name, { type }]) => [name, { type }])),
  help: { type: 'boolean', short: 'h' },
} as const satisfies NonNullable<ParseArgsConfig['options']>;

/** Parses `switchyard sim` flags (node:util parseArgs); throws FlagError with a clear message. Exported for tests. */
export function parseSimArgs(argv: string[]): Parsed | 'help' {
  const o: Parsed = { fleet: 1, port: 8000 };
  // Not strict: the tokens are checked here, in order, so the first problem is
  // reported in our words and `--help` wins only when it comes before it.
  const { tokens } = parseArgs({ args: argv, options: PARSE_OPTIONS, strict: false, allowPositionals: true, tokens: true });
  for (const tok of tokens) {
    if (tok.kind === 'positional') throw new FlagError(`unexpected argument '${tok.value}'`);
    if (tok.kind === 'option-terminator') throw new FlagError(`unknown flag '--'`);
    if (tok.name === 'help') return 'help';
    const spec = FLAGS[tok.name];
    const flag = tok.rawName;
    if (spec === undefined || !flag.startsWith('--')) throw new FlagError(`unknown flag '${flag}'`);
    let value = tok.value;
    if (spec.type === 'boolean') value ??= 'true';
    else if (value === undefined || (!tok.inlineValue && value.startsWith('--') && value.length > 2)) throw new FlagError(`${flag} needs a value`);
    spec.set(o, value, flag);
  }
  if (o.basePort === undefined) o.basePort = o.port;
  const { fleet, basePort, ...rest } = o;
  try {
    resolveSimOptions(rest);
  } catch (err) {
    if (err instanceof SimOptionError) {
      const flag = err.option === 'models' ? '--model' : err.option === 'loras' ? '--lora' : '--' + err.option.replace(/[A-Z]/g, (c) => '-' + c.toLowerCase());
      throw new FlagError(`${flag}: ${err.message.slice(err.message.indexOf(': ') + 2)}`);
    }
    throw err;
  }
  if (!Number.isInteger(basePort) || basePort! < 0 || basePort! + fleet - 1 > 65535) {
    throw new FlagError(`--base-port ${basePort} with --fleet ${fleet} runs past port 65535`);
  }
  return o;
}

export async function runSimCli(argv: string[]): Promise<number> {
  let parsed: ReturnType<typeof parseSimArgs>;
  try {
    parsed = parseSimArgs(argv);
  } catch (err) {
    if (!(err instanceof FlagError)) throw err;
    console.error(`switchyard sim: ${err.message}\nRun 'switchyard sim --help' for the options.`);
    return 2;
  }
  if (parsed === 'help') {
    console.log(SIM_USAGE);
    return 0;
  }
  const { fleet: n, ...opts } = parsed;
  let fleet;
  try {
    fleet = await startFleet(n, opts);
  } catch (err) {
    console.error(`switchyard sim: ${(err as Error).message}`);
    return 1;
  }
  for (const e of fleet.engines) {
    const o = e.options;
    console.log(
      `switchyard sim: ${o.engine} engine serving ${o.models.join(', ')} on ${e.url} ` +
        `(max-num-seqs ${o.maxNumSeqs}, kv-cache-blocks ${o.kvCacheBlocks}, time-scale ${o.timeScale}, http ${e.frontEnd})`,
    );
    if (e.kvEvents !== null) {
      const replay = e.kvEvents.replayEndpoint;
      console.log(`switchyard sim: KV events on ${e.kvEvents.endpoint}${replay !== null ? `, replay on ${replay}` : ''}`);
    }
  }
  return new Promise<number>((resolve) => {
    const stop = (sig: NodeJS.Signals) => {
      process.off('SIGINT', stop);
      process.off('SIGTERM', stop);
      console.log(`switchyard sim: ${sig}, shutting down (requests in flight finish, up to 30 s)`);
      void Promise.all(fleet.engines.map((e) => e.drain(30_000))).then(() => resolve(0));
    };
    process.on('SIGINT', stop);
    process.on('SIGTERM', stop);
  });
}
