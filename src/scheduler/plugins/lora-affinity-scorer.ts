// Scorer `lora-affinity`: for a request naming a LoRA adapter, prefers the
// endpoints that have it active (its requests running or waiting there, from
// vllm:lora_requests_info and the router's own in-flight requests, or sent
// there among the last max_lora adapters: likely still in a GPU slot) and
// room for one more request; then those with a free adapter slot (max_lora
// less the adapters running or waiting); then an active one that is full;
// ("room": fewer than maxPending of the router's requests there still wait for
// their first byte, and the batch is not full); then, in a pool that loads
// adapters on demand, an engine that lacks it
// (a load costs a round trip and the engine's load time). Requests for a base
// model score 1 everywhere (the scorer is neutral to them). As llm-d's
// lora-affinity scorer, after its reading of the same metric.
import type { Endpoint } from '../../endpoints/endpoint.js';
import { intParam, numberParam, pluginParams, type PluginFactory } from '../registry.js';
import type { CycleContext, PluginEnv, Scorer } from '../types.js';
import { ensure } from './score-util.js';

export interface LoraAffinityParams {
  /** The adapter active there and room for a request (occupancy below the batch limit). */
  active: number;
  /** A free adapter slot. */
  freeSlot: number;
  /** The adapter active there, but the engine is full. */
  activeFull: number;
  /** Every slot taken by other adapters' requests: it waits for one. */
  noSlot: number;
  /** The engine lacks the adapter and its pool loads on demand (with a free slot; half that without). */
  loadable: number;
  /** "Room": fewer than this many of the router's requests there still wait for their first byte (and occupancy below the batch limit). */
  maxPending: number;
}

export class LoraAffinityScorer implements Scorer {
  readonly type = 'lora-affinity';
  readonly name: string;
  readonly #p: LoraAffinityParams;
  readonly #env: PluginEnv;
  #out = new Float64Array(16);

  constructor(params: LoraAffinityParams, env: PluginEnv, name = 'lora-affinity') {
    this.#p = params;
    this.#env = env;
    this.name = name;
  }

  score(ctx: CycleContext, eps: readonly Endpoint[]): Float64Array {
    const n = eps.length;
    const out = (this.#out = ensure(this.#out, n));
    const m = ctx.request.model;
    if (n === 0 || eps[0].models.includes(m) || this.#env.endpoints.baseOf(m) === undefined) {
      for (let i = 0; i < n; i++) out[i] = 1;
      return out;
    }
    const p = this.#p;
    for (let i = 0; i < n; i++) {
      const ep = eps[i];
      const st = ep.adapterState(m);
      if (!ep.adapters.has(m)) out[i] = st === 0 ? p.loadable / 2 : p.loadable;
      else if (st === 2) out[i] = ep.prefillRequests < p.maxPending && ep.occupancy(ctx.now) < ep.batchLimit ? p.active : p.activeFull;
      else out[i] = st === 1 ? p.freeSlot : p.noSlot;
    }
    return out;
  }
}

const unit = () => numberParam(0, 1);

export const loraAffinityScorer: PluginFactory<'scorer'> = {
  kind: 'scorer',
  type: 'lora-affinity',
  params: pluginParams({
    active: unit().default(1),
    freeSlot: unit().default(0.6),
    activeFull: unit().default(0.5),
    noSlot: unit().default(0),
    loadable: unit().default(0.3),
    maxPending: intParam(1, 1_000_000).default(4),
  }),
  create: (params, env) => new LoraAffinityScorer(params as unknown as LoraAffinityParams, env),
};
