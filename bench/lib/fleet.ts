// The processes most system benchmarks stand up before their routers: a
// fleet of engines of one kind on consecutive ports, and a redis-server for
// active-active replicas. One place for their command lines, so every bench
// that says "the simulator" or "the reference engine model" starts the same
// thing with the same knobs.
import { spawn } from 'node:child_process';
import { BYTES_PER_TOKEN } from '../../src/flow/cost.js';
import { CLI, ROOT, freePort, start, type Proc } from './proc.js';
import { which } from './proxies.js';

/** `sim`: the simulator (`switchyard sim`, serial prefill); `model`: the independent reference engine model (testkit/reference/engine-model.ts). */
export type FleetKind = 'sim' | 'model';

export interface FleetSpec {
  engines: number;
  basePort: number;
  /** Requests an engine runs at once (vLLM --max-num-seqs; the model's --max-running). */
  slots: number;
  itlMs: number;
  /** Fixed cost of a prefill, ms. */
  prefillOverheadMs: number;
  /** Cost per uncached prompt token, µs (the model gets the same per 64-token block). Default: each engine's own. */
  prefillUsPerToken?: number;
  /** KV cache in blocks of `blockSize` tokens (the model gets the same capacity in 64-token blocks). Default: each engine's own. */
  kvCacheBlocks?: number;
  blockSize?: number;
  timeScale?: number;
  /** The simulator's seed (the model has none). */
  seed?: number;
}

/** The reference model's block, in tokens: the same capacity and costs are given to it per block of this size. */
const MODEL_BLOCK_TOKENS = 64;

/** Starts `spec.engines` engines of `kind` on ports basePort, basePort + 1, … (wait for each one's /health before use). */
export function startEngineFleet(name: string, kind: FleetKind, spec: FleetSpec): Proc {
  const args: string[] = ['--fleet', String(spec.engines), '--base-port', String(spec.basePort)];
  const more = (flag: string, v: number | undefined) => {
    if (v !== undefined) args.push(flag, String(v));
  };
  if (kind === 'model') {
    more('--max-running', spec.slots);
    if (spec.kvCacheBlocks !== undefined) more('--cache-blocks', Math.floor((spec.kvCacheBlocks * (spec.blockSize ?? 16)) / MODEL_BLOCK_TOKENS));
    if (spec.prefillUsPerToken !== undefined) {
      more('--block-chars', MODEL_BLOCK_TOKENS * BYTES_PER_TOKEN);
      more('--prefill-us-per-block', spec.prefillUsPerToken * MODEL_BLOCK_TOKENS);
    }
    more('--prefill-ms', spec.prefillOverheadMs);
    more('--itl-ms', spec.itlMs);
    more('--time-scale', spec.timeScale);
    return start(name, process.execPath, [`${ROOT}/dist/testkit/reference/engine-model.js`, ...args]);
  }
  more('--max-num-seqs', spec.slots);
  more('--kv-cache-blocks', spec.kvCacheBlocks);
  more('--block-size', spec.blockSize);
  more('--prefill-us-per-token', spec.prefillUsPerToken);
  more('--prefill-overhead-ms', spec.prefillOverheadMs);
  more('--itl-ms', spec.itlMs);
  more('--time-scale', spec.timeScale);
  more('--seed', spec.seed);
  return start(name, process.execPath, [CLI, 'sim', ...args]);
}

/** A throwaway redis-server on a free loopback port (no persistence), ready (it answers PING) when this resolves. */
export async function startRedisServer(needs: string): Promise<{ url: string; proc: Proc }> {
  const bin = which('redis-server');
  if (!bin) throw new Error(`${needs} needs redis-server (apt-get install redis-server)`);
  const port = await freePort();
  const proc = start('redis', bin, ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no']);
  const cli = bin.replace(/redis-server$/, 'redis-cli');
  for (let i = 0; i < 100; i++) {
    const ok = await new Promise<boolean>((r) => {
      const c = spawn(cli, ['-p', String(port), 'ping'], { stdio: 'ignore' });
      c.on('exit', (code) => r(code === 0));
      c.on('error', () => r(false));
    });
    if (ok) return { url: `redis://127.0.0.1:${port}`, proc };
    await new Promise((r) => setTimeout(r, 100));
  }
  await proc.stop();
  throw new Error(`redis-server on port ${port} did not answer PING within 10 s`);
}

/** `--engine sim|model|sim,model` (default both, in that order), checked. */
export function fleetKinds(value: string | undefined): FleetKind[] {
  const kinds = (value ?? 'sim,model').split(',');
  for (const k of kinds) if (k !== 'sim' && k !== 'model') throw new Error(`--engine must be sim, model or both (got ${k})`);
  return kinds as FleetKind[];
}
