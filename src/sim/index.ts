// Programmatic API of the engine simulator: start and stop engines and fleets.

import { startSaltedEngine, type SimEngine } from './engine.js';
import { resolveSimOptions, type SimOptions } from './options.js';

export { startEngine, errorBody, type SimEngine, type SimEngineStats } from './engine.js';
export {
  resolveSimOptions,
  SimOptionError,
  SIM_DEFAULTS,
  FAILURE_KINDS,
  type FailureKind,
  type SimOptions,
  type ResolvedSimOptions,
} from './options.js';
export { countTokens, renderChat, utf8ByteLength, messageText, BYTES_PER_TOKEN, type ChatMessage } from './tokenizer.js';

export interface SimFleet {
  readonly engines: SimEngine[];
  /** The engines' base URLs, in order. */
  readonly urls: string[];
  close(): Promise<void>;
}

export interface FleetOptions extends SimOptions {
  /** First port; engine i listens on basePort + i. 0 or absent = free ports. */
  basePort?: number;
}

/**
 * Starts `n` engines with the same options in this process. Their failure
 * draws differ (salted with the engine's index); the generated text is the
 * same on all of them (a function of the seed and the prompt, like greedy
 * decoding on identical replicas). If one fails to start, the started ones
 * are closed.
 */
export async function startFleet(n: number, opts: FleetOptions = {}): Promise<SimFleet> {
  if (!Number.isInteger(n) || n < 1 || n > 4096) throw new RangeError(`startFleet: n must be an integer in [1, 4096], got ${n}`);
  const { basePort = 0, ...rest } = opts;
  if (!Number.isInteger(basePort) || basePort < 0 || basePort + n - 1 > 65535) {
    throw new RangeError(`startFleet: basePort must be 0 or a port with basePort + n - 1 <= 65535, got ${basePort}`);
  }
  const base = resolveSimOptions(rest);
  const engines: SimEngine[] = [];
  try {
    for (let i = 0; i < n; i++) {
      engines.push(await startSaltedEngine({ ...base, port: basePort === 0 ? 0 : basePort + i }, i));
    }
  } catch (err) {
    await Promise.all(engines.map((e) => e.close()));
    throw err;
  }
  return {
    engines,
    urls: engines.map((e) => e.url),
    close: async () => {
      await Promise.all(engines.map((e) => e.close()));
    },
  };
}
