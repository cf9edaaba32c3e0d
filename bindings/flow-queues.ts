// Typed surface over the native per-flow queues (native/flow_queues.cc).
//
// One FlowQueues holds one bounded lock-free FIFO ring per flow. The memory is
// process-global: pass `handle` to a worker_thread (postMessage / workerData)
// and call FlowQueues.attach(handle) there; every thread that holds the queues
// keeps them alive until it calls close(), its object is collected, or its
// environment tears down. Any thread may enqueue; one thread (the dispatch
// loop) should dequeue, since peek() assumes a single consumer.
//
// A record is 4 uint32 words: [idLow, idHigh, bytes, time]. ids are integers
// up to 2^53 - 1; payloads stay in JS, keyed by id.
import { native } from './native.js';

/** Words per record in the typed arrays used by the batch calls. */
export const FLOW_RECORD_WORDS = 4;
export const FLOW_QUEUES_MAX_FLOWS = 65536;
export const FLOW_QUEUES_MAX_CAPACITY = 1 << 24;

export interface FlowQueuesOptions {
  /** Number of flows (queues), 1..65536. */
  flows: number;
  /** Records per flow; rounded up to a power of two (>= 2), at most 2^24. */
  capacity: number;
}

export interface FlowRecord {
  id: number;
  bytes: number;
  time: number;
}

function checkInt(name: string, v: unknown, lo: number, hi: number): number {
  if (typeof v !== 'number') throw new TypeError(`${name} must be a number, got ${typeof v}`);
  if (!Number.isInteger(v) || v < lo || v > hi) throw new RangeError(`${name} must be an integer in [${lo}, ${hi}], got ${v}`);
  return v;
}

interface NativeFlowQueues {
  readonly handle: number | undefined;
  readonly flows: number;
  readonly capacity: number | undefined;
  readonly closed: boolean;
  enqueue(flow: number, id: number, bytes: number, time: number): boolean;
  enqueueBatch(flow: number, records: Uint32Array, count: number): number;
  dequeueBatch(flow: number, out: Uint32Array, max: number): number;
  peek(flow: number, out: Uint32Array): boolean;
  size(flow: number): number;
  sizes(out: Uint32Array): number;
  close(): void;
}

const NativeCtor = native.FlowQueues as {
  new (mode: 0, flows: number, capacity: number): NativeFlowQueues;
  new (mode: 1, handle: number): NativeFlowQueues;
  liveRegions(): number;
};

export class FlowQueues {
  readonly #q: NativeFlowQueues;
  readonly #one = new Uint32Array(FLOW_RECORD_WORDS);

  private constructor(q: NativeFlowQueues) {
    this.#q = q;
  }

  /** Creates a new shared set of queues. */
  static create(options: FlowQueuesOptions): FlowQueues {
    if (options === null || typeof options !== 'object') throw new TypeError('FlowQueues.create: options must be an object');
    const flows = checkInt('flows', options.flows, 1, FLOW_QUEUES_MAX_FLOWS);
    const capacity = checkInt('capacity', options.capacity, 1, FLOW_QUEUES_MAX_CAPACITY);
    return new FlowQueues(new NativeCtor(0, flows, capacity));
  }

  /** Attaches this thread to queues created elsewhere in the process. */
  static attach(handle: number): FlowQueues {
    checkInt('handle', handle, 1, 0xffffffff);
    return new FlowQueues(new NativeCtor(1, handle));
  }

  /** Number of FlowQueues regions alive in this process (all threads). */
  static liveRegions(): number {
    return NativeCtor.liveRegions();
  }

  /** Process-wide id to pass to FlowQueues.attach in another thread. */
  get handle(): number {
    const h = this.#q.handle;
    if (h === undefined) throw new Error('FlowQueues is closed');
    return h;
  }

  get flows(): number {
    return this.#q.flows;
  }

  /** Records per flow (the requested capacity rounded up to a power of two). */
  get capacity(): number {
    const c = this.#q.capacity;
    if (c === undefined) throw new Error('FlowQueues is closed');
    return c;
  }

  get closed(): boolean {
    return this.#q.closed;
  }

  /** Pushes one record; false when the flow's ring is full. */
  enqueue(flow: number, id: number, bytes: number, time: number): boolean {
    return this.#q.enqueue(flow, id, bytes, time);
  }

  /** Pushes the first `count` records of `records`; returns how many fit. */
  enqueueBatch(flow: number, records: Uint32Array, count: number = Math.floor(records.length / FLOW_RECORD_WORDS)): number {
    return this.#q.enqueueBatch(flow, records, count);
  }

  /** Pops up to `max` records into `out`; returns how many were popped. */
  dequeueBatch(flow: number, out: Uint32Array, max: number = Math.floor(out.length / FLOW_RECORD_WORDS)): number {
    return this.#q.dequeueBatch(flow, out, max);
  }

  /** Pops one record, or returns undefined when none is ready. Allocates: not for hot loops. */
  dequeue(flow: number): FlowRecord | undefined {
    const out = this.#one;
    if (this.#q.dequeueBatch(flow, out, 1) === 0) return undefined;
    return { id: out[0]! + out[1]! * 0x100000000, bytes: out[2]!, time: out[3]! };
  }

  /** Writes the head record of `flow` into out[0..3] without removing it (consumer thread only). */
  peek(flow: number, out: Uint32Array): boolean {
    return this.#q.peek(flow, out);
  }

  size(flow: number): number {
    return this.#q.size(flow);
  }

  /** Writes every flow's length into out (length >= flows); returns the total. */
  sizes(out: Uint32Array): number {
    return this.#q.sizes(out);
  }

  /** Drops this thread's reference; the memory goes when the last thread lets go. Idempotent. */
  close(): void {
    this.#q.close();
  }
}

/** Reads the id of record `i` of a batch buffer. */
export function flowRecordId(buf: Uint32Array, i: number): number {
  return buf[i * FLOW_RECORD_WORDS]! + buf[i * FLOW_RECORD_WORDS + 1]! * 0x100000000;
}

/** Writes record `i` of a batch buffer. */
export function setFlowRecord(buf: Uint32Array, i: number, id: number, bytes: number, time: number): void {
  const o = i * FLOW_RECORD_WORDS;
  buf[o] = id >>> 0;
  buf[o + 1] = Math.floor(id / 0x100000000);
  buf[o + 2] = bytes;
  buf[o + 3] = time;
}
