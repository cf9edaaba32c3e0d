// Failure injection: which requests fail, and how (options.failureRate / failureKinds, setFailures at run time).

import { resolveSimOptions, type FailureKind, type ResolvedSimOptions } from './options.js';
import { BadRequest } from './request.js';
import { mix32, rng } from './text.js';

/** One engine's failure draws: seeded per engine (`salt` separates the engines of a fleet). */
export class FailureInjector {
  rate: number;
  kinds: FailureKind[];
  readonly #rand: () => number;

  constructor(opts: ResolvedSimOptions, salt: number) {
    this.#rand = rng(mix32(opts.seed ^ 0x5eed) ^ mix32(salt + 1));
    this.rate = opts.failureRate;
    this.kinds = [...opts.failureKinds];
  }

  /** Changes the rate and kinds, validated as the options are. */
  set(opts: ResolvedSimOptions, rate: number, kinds?: FailureKind[]): void {
    const r = resolveSimOptions({ ...opts, failureRate: rate, failureKinds: kinds ?? this.kinds, port: 0 });
    this.rate = r.failureRate;
    this.kinds = r.failureKinds;
  }

  /**
   * Draws for one request: null (no failure), or the kind that happens during
   * its generation. The status kinds (500, 429, 503) throw their answer here.
   */
  draw(): FailureKind | null {
    if (this.rate <= 0 || this.#rand() >= this.rate) return null;
    const kind = this.kinds[Math.floor(this.#rand() * this.kinds.length)]!;
    switch (kind) {
      case '500':
        throw new BadRequest(500, 'simulated engine failure (injected)', null);
      case '429':
        throw new BadRequest(429, 'simulated rate limit (injected)', null);
      case '503':
        throw new BadRequest(503, 'simulated overload: service unavailable (injected)', null);
      default:
        return kind;
    }
  }
}

/** The token at which a mid-generation failure strikes: half way. */
export function failAtToken(outTokens: number): number {
  return Math.max(1, Math.floor(outTokens / 2));
}

/** Whether a failure kind cuts the generation (at failAtToken). */
export function cutsGeneration(kind: FailureKind | null): boolean {
  return kind === 'reset-mid-stream' || kind === 'error-mid-stream';
}
