// Loads a LoRA adapter on an engine that lacks it (vLLM's runtime API: POST
// /v1/load_lora_adapter {lora_name, lora_path}; the engine needs
// VLLM_ALLOW_RUNTIME_LORA_UPDATING=True), for pools with adapterLoading on.
// Off the request path's fast lane: only a request routed to an endpoint
// without its adapter waits for it, and concurrent requests for the same
// adapter and endpoint share one load.
import { performance } from 'node:perf_hooks';
import { request } from 'undici';
import type { Endpoint, EndpointSet } from './endpoint.js';

/** Largest answer body read from a load (vLLM answers a line of text). */
const MAX_ANSWER = 64 * 1024;

export class AdapterLoader {
  readonly #set: EndpointSet;
  /** Loads under way, by endpoint id and adapter. */
  readonly #pending = new Map<string, Promise<string>>();

  constructor(set: EndpointSet) {
    this.#set = set;
  }

  /**
   * Loads `adapter` on `ep`; resolves '' once the engine has it, or the reason
   * it does not (a refusal's status and message, a timeout, a connection error).
   */
  load(ep: Endpoint, adapter: string): Promise<string> {
    if (ep.adapters.has(adapter)) return Promise.resolve('');
    const key = `${ep.id}\0${adapter}`;
    let p = this.#pending.get(key);
    if (p === undefined) {
      p = this.#load(ep, adapter).finally(() => this.#pending.delete(key));
      this.#pending.set(key, p);
    }
    return p;
  }

  async #load(ep: Endpoint, adapter: string): Promise<string> {
    const pool = this.#set.pool(ep.pool);
    const timeoutMs = pool?.adapterLoading?.timeoutMs ?? 30_000;
    const headers: Record<string, string> = { 'content-type': 'application/json' };
    if (ep.upstreamAuthorization !== '') headers.authorization = ep.upstreamAuthorization;
    let why = '';
    try {
      const res = await request(`${ep.url}/v1/load_lora_adapter`, {
        method: 'POST',
        headers,
        body: JSON.stringify({ lora_name: adapter, lora_path: this.#set.adapterPath(adapter) }),
        signal: AbortSignal.timeout(timeoutMs),
      });
      let text = '';
      for await (const chunk of res.body as AsyncIterable<Buffer>) {
        if (text.length < MAX_ANSWER) text += chunk.toString('utf8');
      }
      // 400 "already been loaded": it has it (another router, or a load this one did not see answer)
      if (res.statusCode === 200 || (res.statusCode === 400 && text.includes('already been loaded'))) {
        if (!ep.removed) this.#set.adapterLoaded(ep, adapter);
      } else why = `${ep.name} answered HTTP ${res.statusCode} to loading adapter "${adapter}": ${text.slice(0, 200)}`;
    } catch (err) {
      why = `loading adapter "${adapter}" on ${ep.name} failed: ${(err as Error)?.name === 'TimeoutError' ? `no answer within ${timeoutMs} ms` : ((err as Error)?.message ?? String(err))}`;
    }
    this.#set.adapterStats.loaded(adapter, why === '');
    if (why !== '') ep.loadRefused.set(adapter, performance.now() + (pool?.adapterLoading?.retryAfterMs ?? 30_000));
    return why;
  }
}
