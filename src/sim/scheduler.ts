// The simulated engine's scheduler: the batching and latency model.
//
// - At most maxNumSeqs requests run; the rest wait in FIFO order. The head of
//   the queue is admitted when a slot is free and the KV cache can hold its
//   blocks (strict FIFO: nobody overtakes a head that does not fit yet).
// - On admission the prompt's cached prefix blocks are reused; the prefill
//   takes prefillOverheadMs + uncachedTokens × prefillUsPerToken / 1000 (model
//   milliseconds); the first token is emitted when it ends.
//   TTFT = time waiting + prefill.
// - With serialPrefill (the default) there is one compute resource: a
//   prefill's per-token compute starts when the previous prefill's ends (so
//   concurrent arrivals queue for it, and that wait is part of their TTFT),
//   and it delays the next token of every request already decoding by the
//   same amount (a step that carries prefill work is longer). Cache hits thus
//   save everyone's time, as on a real engine.
// - With prefillChunkTokens (chunked prefill), a prefill runs in chunks, each
//   in one step with the running decodes: every decode's next token is slower
//   by one chunk, and while decodes run each chunk's step also lasts the
//   decode step (itlMs as below), so the prefill takes that much longer too.
// - Each further token takes itlMs × (1 + decodeSlowdown × (running − 1)),
//   evaluated when the token is produced (so the batch size at that moment
//   counts).
// - A request for a LoRA adapter also needs its adapter in one of maxLoras GPU
//   slots (vLLM's --max-loras): an adapter not in a slot is loaded into a free
//   one or over the least recently used idle one, at loraLoadMs of prefill
//   compute; when every slot holds an adapter with running requests, the
//   request waits and later ones for adapters in a slot (or for the base
//   model) go ahead of it (vLLM's scheduler skips such a request rather than
//   blocking its queue).
// - Every model time is multiplied by timeScale to get wall-clock time. With
//   timeScale 0 a request runs to completion synchronously, with no timers.
//
// Tokens are emitted on a virtual clock: when a timer fires, every token whose
// due time has passed is delivered in one batch, so coarse timers never slow
// the simulated rate down.

import { performance } from 'node:perf_hooks';
import { KvCache, type KvBlockMeta, type KvLease } from './kv-cache.js';
import { Histogram } from '../metrics/histogram.js';
import { ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS } from './buckets.js';
import type { ResolvedSimOptions } from './options.js';

export const enum ReqState {
  Waiting = 0,
  Running = 1,
  Done = 2,
  Aborted = 3,
}

/** Receives a request's progress (implemented by the HTTP layer). */
export interface RequestSink {
  /** Tokens [from, to) were produced; from === 0 is the first token. */
  tokens(req: SimRequest, from: number, to: number): void;
  /** All tokens were produced; the request released its resources. */
  finish(req: SimRequest): void;
}

export class SimRequest {
  state = ReqState.Waiting;
  /** Tokens produced so far. */
  out = 0;
  arrival = 0;
  admitted = 0;
  /** Due time of the next token, performance.now() milliseconds. */
  nextAt = 0;
  cachedTokens = 0;
  /** Model ms by which other requests' prefills delayed this request's next token (added to its ITL). */
  stallMs = 0;
  /** Chunked prefill (prefillChunkTokens): model ms of other requests' prefills still to slow this request's coming tokens, one chunk per token. */
  stallDebt = 0;
  /** Model milliseconds of the prefill, waiting time, time to first token, end to end. */
  prefillMs = 0;
  queueMs = 0;
  ttftMs = 0;
  e2eMs = 0;
  timer: NodeJS.Timeout | null = null;
  lease: KvLease | null = null;
  prev: SimRequest | null = null;
  next: SimRequest | null = null;
  /** LoRA adapter name, or null for the base model. */
  lora: string | null = null;
  /** With KV events on: the prompt's token ids and LoRA id for BlockStored (kv-events.ts). */
  meta: KvBlockMeta | null = null;

  constructor(
    readonly hashes: number[],
    readonly nBlocks: number,
    readonly promptTokens: number,
    readonly maxTokens: number,
    readonly privateBlocks: number,
    /** Finish reason once maxTokens are produced: "length" (max_tokens hit) or "stop". */
    readonly finishReason: 'length' | 'stop',
    /** Prefilled elsewhere (P/D decode leg): the prefill costs only its overhead. */
    readonly remotePrefill: boolean,
    readonly sink: RequestSink,
  ) {}
}

export interface SchedulerStats {
  running: number;
  waiting: number;
  kvUsage: number;
  kvUsedBlocks: number;
  kvCachedBlocks: number;
  kvCapacityBlocks: number;
  prefixQueryTokens: number;
  prefixHitTokens: number;
  hostHitTokens: number;
  hostCachedBlocks: number;
  promptTokens: number;
  generationTokens: number;
  finished: number;
  aborted: number;
  evictions: number;
  /** Adapters brought into a GPU slot so far. */
  loraLoads: number;
}

export class Scheduler {
  readonly cache: KvCache;
  readonly ttft = new Histogram(TTFT_BUCKETS);
  readonly itl = new Histogram(ITL_BUCKETS);
  /** Every inter-token latency in model ms (options.keepItlSamples), else null. */
  readonly itlSamples: number[] | null;
  readonly e2e = new Histogram(REQUEST_LATENCY_BUCKETS);
  readonly queueTime = new Histogram(REQUEST_LATENCY_BUCKETS);
  running = 0;
  waiting = 0;
  prefixQueryTokens = 0;
  prefixHitTokens = 0;
  /** Of prefixHitTokens, those loaded back from the host tier. */
  hostHitTokens = 0;
  promptTokensTotal = 0;
  generationTokensTotal = 0;
  finishedLength = 0;
  finishedStop = 0;
  aborted = 0;
  /** Running / waiting requests per LoRA adapter. */
  readonly runningLoras = new Map<string, number>();
  readonly waitingLoras = new Map<string, number>();
  /** Adapters in a GPU slot, least recently used first (insertion order). */
  readonly residentLoras = new Map<string, true>();
  /** Adapters brought into a GPU slot (each costs loraLoadMs). */
  loraLoads = 0;
  #head: SimRequest | null = null;
  #tail: SimRequest | null = null;
  /** Running requests (a second list through the same prev/next links: a request is in one list at a time). */
  #runHead: SimRequest | null = null;
  /** performance.now() when the prefill compute already scheduled ends (serialPrefill). */
  #computeFreeAt = 0;
  readonly #o: ResolvedSimOptions;
  readonly #tick: (req: SimRequest) => void;

  constructor(opts: ResolvedSimOptions) {
    this.#o = opts;
    this.cache = new KvCache(opts.kvCacheBlocks, opts.blockSize, opts.cpuOffloadBlocks);
    this.#tick = (req) => this.#step(req);
    this.itlSamples = opts.keepItlSamples ? [] : null;
  }

  /** Blocks a request needs in total: its prompt and completion tokens, rounded up. */
  blocksNeeded(promptTokens: number, maxTokens: number): number {
    return Math.ceil((promptTokens + maxTokens) / this.#o.blockSize);
  }

  /** Queues a request, or admits it at once when a slot and blocks are free. */
  submit(req: SimRequest): void {
    req.arrival = performance.now();
    if ((this.#head === null || this.#onlyLoraBlocked()) && this.#canAdmit(req)) {
      this.#admit(req);
      return;
    }
    if (req.lora !== null) bump(this.waitingLoras, req.lora, 1);
    req.state = ReqState.Waiting;
    req.prev = this.#tail;
    req.next = null;
    if (this.#tail !== null) this.#tail.next = req;
    else this.#head = req;
    this.#tail = req;
    this.waiting++;
  }

  /** Every queued request waits for an adapter slot (so a newcomer that fits may go ahead of them). */
  #onlyLoraBlocked(): boolean {
    if (this.runningLoras.size < this.#o.maxLoras) return false;
    for (let r = this.#head; r !== null; r = r.next) if (!this.#loraBlocked(r)) return false;
    return true;
  }

  /** Drops a request (client gone): frees its slot and blocks at once. Idempotent. */
  abort(req: SimRequest): void {
    if (req.state === ReqState.Waiting) {
      // A request that was never submitted (its client left during an injected
      // slow-first-byte delay) is Waiting but not queued: unlinking it would
      // reset the queue's head and tail, stranding every queued request, and
      // drive `waiting` negative. Nothing to undo.
      if (req.prev === null && this.#head !== req) return;
      this.#unlink(req);
      req.state = ReqState.Aborted;
      this.aborted++;
      return;
    }
    if (req.state !== ReqState.Running) return;
    req.state = ReqState.Aborted;
    this.aborted++;
    if (req.timer !== null) {
      clearTimeout(req.timer);
      req.timer = null;
    }
    this.#releaseSlot(req);
    this.#drain();
  }

  /** Drops every idle cached block. */
  clearCache(): void {
    this.cache.clear();
  }

  stats(): SchedulerStats {
    const c = this.cache;
    return {
      running: this.running,
      waiting: this.waiting,
      kvUsage: c.usage,
      kvUsedBlocks: c.usedBlocks,
      kvCachedBlocks: c.cachedBlocks,
      kvCapacityBlocks: c.capacity,
      prefixQueryTokens: this.prefixQueryTokens,
      prefixHitTokens: this.prefixHitTokens,
      hostHitTokens: this.hostHitTokens,
      hostCachedBlocks: c.host?.size ?? 0,
      promptTokens: this.promptTokensTotal,
      generationTokens: this.generationTokensTotal,
      finished: this.finishedLength + this.finishedStop,
      aborted: this.aborted,
      evictions: c.evictions,
      loraLoads: this.loraLoads,
    };
  }

  #canAdmit(req: SimRequest): boolean {
    if (this.running >= this.#o.maxNumSeqs) return false;
    if (this.#loraBlocked(req)) return false;
    return this.cache.canAdmit(req.hashes, req.nBlocks, req.privateBlocks);
  }

  /** Every GPU adapter slot holds an adapter with running requests, none of them this request's. */
  #loraBlocked(req: SimRequest): boolean {
    const l = req.lora;
    return l !== null && !this.runningLoras.has(l) && this.runningLoras.size >= this.#o.maxLoras;
  }

  /** Puts the request's adapter in a GPU slot (marked most recently used); returns the model ms it costs (0: it was there). */
  #slotLora(l: string): number {
    const r = this.residentLoras;
    if (r.delete(l)) {
      r.set(l, true);
      return 0;
    }
    if (r.size >= this.#o.maxLoras) {
      // the least recently used adapter with no running request gives up its slot (#loraBlocked says one exists)
      for (const k of r.keys()) {
        if (!this.runningLoras.has(k)) {
          r.delete(k);
          break;
        }
      }
    }
    r.set(l, true);
    this.loraLoads++;
    return this.#o.loraLoadMs;
  }

  /** Forgets an adapter that was unloaded (its slot is free for another). */
  dropLora(l: string): void {
    if (!this.runningLoras.has(l)) this.residentLoras.delete(l);
  }

  #unlink(req: SimRequest): void {
    if (req.lora !== null) bump(this.waitingLoras, req.lora, -1);
    if (req.prev !== null) req.prev.next = req.next;
    else this.#head = req.next;
    if (req.next !== null) req.next.prev = req.prev;
    else this.#tail = req.prev;
    req.prev = req.next = null;
    this.waiting--;
  }

  #admit(req: SimRequest): void {
    const o = this.#o;
    const now = performance.now();
    req.state = ReqState.Running;
    req.admitted = now;
    this.running++;
    req.prev = null;
    req.next = this.#runHead;
    if (this.#runHead !== null) this.#runHead.prev = req;
    this.#runHead = req;
    const loadMs = req.lora !== null ? this.#slotLora(req.lora) : 0;
    if (req.lora !== null) bump(this.runningLoras, req.lora, 1);
    // The engine always computes the prompt's last token, so a full hit is capped one token short.
    const maxHitBlocks = Math.floor((req.promptTokens - 1) / o.blockSize);
    const lease = this.cache.acquire(req.hashes, req.nBlocks, req.privateBlocks, maxHitBlocks, req.meta);
    req.lease = lease;
    req.cachedTokens = lease.cachedTokens;
    this.prefixQueryTokens += req.promptTokens;
    this.prefixHitTokens += lease.cachedTokens;
    this.hostHitTokens += lease.hostBlocks * o.blockSize;
    this.promptTokensTotal += req.promptTokens;
    const uncached = req.remotePrefill ? 0 : req.promptTokens - lease.cachedTokens;
    // blocks loaded back from host memory cost their transfer, not their recompute
    req.prefillMs = o.prefillOverheadMs + loadMs + (uncached * o.prefillUsPerToken + lease.hostBlocks * o.cpuReloadUsPerBlock) / 1000;
    req.queueMs = o.timeScale > 0 ? (now - req.arrival) / o.timeScale : 0;
    req.ttftMs = req.queueMs + req.prefillMs;
    req.e2eMs = req.ttftMs;
    if (o.timeScale === 0) {
      this.#runSync(req);
      return;
    }
    const scale = o.timeScale;
    let start = now;
    if (o.serialPrefill) {
      // One compute resource: prefills run one after another, and each one's
      // compute delays the next token of every request already decoding.
      // an adapter load takes the compute too (the step that loads it stalls the batch)
      let computeMs = (uncached * o.prefillUsPerToken) / 1000 + loadMs;
      if (this.#computeFreeAt > start) start = this.#computeFreeAt;
      if (computeMs > 0) {
        const chunked = o.prefillChunkTokens > 0;
        let decoding = 0;
        for (let r = req.next; r !== null; r = r.next) {
          if (r.out === 0) continue;
          decoding++;
          if (chunked) {
            r.stallDebt += computeMs; // spread over its next tokens (stallChunk)
            continue;
          }
          r.nextAt += computeMs * scale;
          r.stallMs += computeMs;
        }
        // Chunked: each chunk runs in one step with the running decodes' tokens, and
        // that step lasts the chunk's compute plus the decode step: the decodes see
        // it as a slower token (stallChunk), and the prefill is as much longer.
        if (chunked && decoding > 0) computeMs += Math.ceil(uncached / o.prefillChunkTokens) * this.#itlMs();
      }
      this.#computeFreeAt = start + computeMs * scale;
      req.prefillMs += computeMs - (uncached * o.prefillUsPerToken) / 1000 - loadMs;
      req.ttftMs = req.queueMs + req.prefillMs + (start - now) / scale;
      req.e2eMs = req.ttftMs;
    }
    req.nextAt = start + req.prefillMs * scale;
    req.timer = setTimeout(this.#tick, req.nextAt - now, req);
  }

  /**
   * Chunked prefill: a prefill runs in chunks of prefillChunkTokens batched
   * with the running decodes (vLLM's chunked prefill, SGLang's
   * chunked_prefill_size), so each decode step during it is slower by one
   * chunk's compute rather than one token waiting for the whole prefill.
   */
  #stallChunk(req: SimRequest): number {
    const o = this.#o;
    const chunkMs = (o.prefillChunkTokens * o.prefillUsPerToken) / 1000;
    const extra = req.stallDebt < chunkMs ? req.stallDebt : chunkMs;
    req.stallDebt -= extra;
    return extra;
  }

  #itlMs(): number {
    const o = this.#o;
    return o.itlMs * (1 + o.decodeSlowdown * (this.running - 1));
  }

  #runSync(req: SimRequest): void {
    this.ttft.observe(req.ttftMs / 1000);
    const n = req.maxTokens;
    for (let i = 1; i < n; i++) {
      const itl = this.#itlMs();
      this.itl.observe(itl / 1000);
      this.itlSamples?.push(itl);
      req.e2eMs += itl;
    }
    req.out = n;
    this.generationTokensTotal += n;
    req.sink.tokens(req, 0, n);
    if (req.state !== ReqState.Running) return; // aborted by the sink
    this.#finish(req);
  }

  #step(req: SimRequest): void {
    req.timer = null;
    if (req.state !== ReqState.Running) return;
    const o = this.#o;
    const now = performance.now();
    const from = req.out;
    if (from === 0) {
      if (req.nextAt > now + 0.5) {
        req.timer = setTimeout(this.#tick, req.nextAt - now, req);
        return;
      }
      this.ttft.observe(req.ttftMs / 1000);
      req.out = 1;
      req.nextAt += this.#itlMs() * o.timeScale;
    }
    while (req.out < req.maxTokens && req.nextAt <= now + 0.5) {
      const itl = this.#itlMs() + (req.stallDebt > 0 ? this.#stallChunk(req) : 0);
      req.out++;
      const observed = itl + req.stallMs;
      req.stallMs = 0;
      this.itl.observe(observed / 1000);
      this.itlSamples?.push(observed);
      req.e2eMs += observed;
      req.nextAt += itl * o.timeScale;
    }
    if (req.out === from) {
      req.timer = setTimeout(this.#tick, Math.max(0, req.nextAt - now), req);
      return;
    }
    this.generationTokensTotal += req.out - from;
    req.sink.tokens(req, from, req.out);
    if (req.state !== ReqState.Running) return; // aborted by the sink
    if (req.out >= req.maxTokens) {
      this.#finish(req);
      return;
    }
    req.timer = setTimeout(this.#tick, Math.max(0, req.nextAt - now), req);
  }

  #finish(req: SimRequest): void {
    req.state = ReqState.Done;
    if (req.finishReason === 'length') this.finishedLength++;
    else this.finishedStop++;
    this.e2e.observe(req.e2eMs / 1000);
    this.queueTime.observe(req.queueMs / 1000);
    this.#releaseSlot(req);
    req.sink.finish(req);
    this.#drain();
  }

  #releaseSlot(req: SimRequest): void {
    this.running--;
    if (req.prev !== null) req.prev.next = req.next;
    else this.#runHead = req.next;
    if (req.next !== null) req.next.prev = req.prev;
    req.prev = req.next = null;
    if (req.lora !== null) bump(this.runningLoras, req.lora, -1);
    if (req.lease !== null) {
      this.cache.release(req.lease);
      req.lease = null;
    }
  }

  #drain(): void {
    let r = this.#head;
    while (r !== null) {
      // a request whose adapter finds no slot is passed over; any other that does not fit stops the queue (FIFO)
      if (this.#loraBlocked(r)) {
        r = r.next;
        continue;
      }
      if (!this.#canAdmit(r)) return;
      const next = r.next;
      this.#unlink(r);
      this.#admit(r);
      r = next !== null && next.state === ReqState.Waiting ? next : this.#head;
    }
  }
}

function bump(m: Map<string, number>, key: string, d: number): void {
  const v = (m.get(key) ?? 0) + d;
  if (v <= 0) m.delete(key);
  else m.set(key, v);
}
