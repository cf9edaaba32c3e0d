// Flow queue throughput: native FlowQueues vs a plain JS array queue, in one run.
//
//   npm run build && npm run bench:queues      (env BENCH_SECONDS=1 per scenario by default)
//
// One "op" below is one record going through the queue: one enqueue plus one
// dequeue. Scenarios:
//   js-array  1 thread   baseline: Array of {id, bytes, time} objects, push + shift, same batch pattern
//   native    1 thread   enqueueBatch(256 records) + dequeueBatch(256) on the same thread
//   native    1 thread   enqueue() + dequeueBatch(1) per record (one boundary call each way)
//   native    1/4 producers (worker_threads) enqueueBatch, main thread dequeueBatch
import { Worker, isMainThread, parentPort, workerData } from 'node:worker_threads';
import { FlowQueues, FLOW_RECORD_WORDS } from '../../bindings/flow-queues.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const SECONDS = Number(process.env.BENCH_SECONDS ?? 1);
const BATCH = 256;
const FLOWS = 4;

interface Result {
  name: string;
  ops: number;
  seconds: number;
}

function fillBatch(buf: Uint32Array, base: number): void {
  for (let k = 0; k < BATCH; k++) {
    const o = k * FLOW_RECORD_WORDS;
    buf[o] = base + k;
    buf[o + 1] = 0;
    buf[o + 2] = 512;
    buf[o + 3] = k;
  }
}

function jsArrayBaseline(): Result {
  interface Rec {
    id: number;
    bytes: number;
    time: number;
  }
  const queues: Rec[][] = Array.from({ length: FLOWS }, () => []);
  let ops = 0;
  let sink = 0;
  const start = process.hrtime.bigint();
  const end = start + BigInt(Math.round(SECONDS * 1e9));
  let now = start;
  let flow = 0;
  while (now < end) {
    for (let rep = 0; rep < 16; rep++) {
      const q = queues[flow]!;
      for (let k = 0; k < BATCH; k++) q.push({ id: ops + k, bytes: 512, time: k });
      for (let k = 0; k < BATCH; k++) sink += q.shift()!.id;
      ops += BATCH;
      flow = (flow + 1) % FLOWS;
    }
    now = process.hrtime.bigint();
  }
  if (sink === -1) console.log('unreachable');
  return { name: 'js-array queue, 1 thread (baseline)', ops, seconds: Number(now - start) / 1e9 };
}

function nativeBatchSingleThread(): Result {
  const q = FlowQueues.create({ flows: FLOWS, capacity: 4096 });
  const inBuf = new Uint32Array(BATCH * FLOW_RECORD_WORDS);
  const outBuf = new Uint32Array(BATCH * FLOW_RECORD_WORDS);
  fillBatch(inBuf, 0);
  let ops = 0;
  let sink = 0;
  const start = process.hrtime.bigint();
  const end = start + BigInt(Math.round(SECONDS * 1e9));
  let now = start;
  let flow = 0;
  while (now < end) {
    for (let rep = 0; rep < 64; rep++) {
      const pushed = q.enqueueBatch(flow, inBuf, BATCH);
      const popped = q.dequeueBatch(flow, outBuf, BATCH);
      if (pushed !== BATCH || popped !== BATCH) throw new Error(`bench: pushed ${pushed}, popped ${popped}`);
      sink += outBuf[0]!;
      ops += BATCH;
      flow = (flow + 1) % FLOWS;
    }
    now = process.hrtime.bigint();
  }
  q.close();
  if (sink === -1) console.log('unreachable');
  return { name: `native batch (${BATCH}), 1 thread`, ops, seconds: Number(now - start) / 1e9 };
}

function nativeSingleCalls(): Result {
  const q = FlowQueues.create({ flows: FLOWS, capacity: 4096 });
  const outBuf = new Uint32Array(FLOW_RECORD_WORDS);
  let ops = 0;
  const start = process.hrtime.bigint();
  const end = start + BigInt(Math.round(SECONDS * 1e9));
  let now = start;
  while (now < end) {
    for (let k = 0; k < 4096; k++) {
      q.enqueue(k & 3, ops, 512, k);
      q.dequeueBatch(k & 3, outBuf, 1);
      ops++;
    }
    now = process.hrtime.bigint();
  }
  q.close();
  return { name: 'native per-record calls, 1 thread', ops, seconds: Number(now - start) / 1e9 };
}

async function nativeProducers(producers: number): Promise<Result> {
  const q = FlowQueues.create({ flows: FLOWS, capacity: 8192 });
  const control = new SharedArrayBuffer(8); // [0] go, [1] stop
  const ctl = new Int32Array(control);
  const workers = Array.from(
    { length: producers },
    (_, p) => new Worker(new URL(import.meta.url), { workerData: { handle: q.handle, flow: p % FLOWS, control } }),
  );
  await Promise.all(workers.map((w) => new Promise((r) => w.once('message', r))));
  const outBuf = new Uint32Array(BATCH * FLOW_RECORD_WORDS);
  let ops = 0;
  Atomics.store(ctl, 0, 1);
  Atomics.notify(ctl, 0);
  const start = process.hrtime.bigint();
  const end = start + BigInt(Math.round(SECONDS * 1e9));
  let now = start;
  while (now < end) {
    for (let rep = 0; rep < 64; rep++) {
      for (let f = 0; f < FLOWS; f++) ops += q.dequeueBatch(f, outBuf, BATCH);
    }
    now = process.hrtime.bigint();
  }
  const seconds = Number(now - start) / 1e9;
  Atomics.store(ctl, 1, 1);
  await Promise.all(workers.map((w) => new Promise((r) => w.once('exit', r))));
  q.close();
  return { name: `native, ${producers} producer thread${producers > 1 ? 's' : ''} + main-thread consumer`, ops, seconds };
}

function producerMain(): void {
  const { handle, flow, control } = workerData as { handle: number; flow: number; control: SharedArrayBuffer };
  const q = FlowQueues.attach(handle);
  const ctl = new Int32Array(control);
  const buf = new Uint32Array(BATCH * FLOW_RECORD_WORDS);
  fillBatch(buf, 0);
  parentPort!.postMessage('ready');
  Atomics.wait(ctl, 0, 0);
  while (Atomics.load(ctl, 1) === 0) {
    // a full ring: sleep 20 µs instead of spinning, so the consumer keeps its core
    if (q.enqueueBatch(flow, buf, BATCH) < BATCH) Atomics.wait(ctl, 1, 0, 0.02);
  }
  q.close();
}

async function main(): Promise<void> {
  const results: Result[] = [];
  results.push(jsArrayBaseline());
  results.push(nativeBatchSingleThread());
  results.push(nativeSingleCalls());
  results.push(await nativeProducers(1));
  results.push(await nativeProducers(4));
  const base = results[0]!.ops / results[0]!.seconds;
  console.log(`flow queues: one op = one record enqueued and dequeued; ${SECONDS}s per scenario; node ${process.version}`);
  console.log('scenario'.padEnd(58) + 'Mops/s'.padStart(9) + '  vs baseline');
  for (const r of results) {
    const rate = r.ops / r.seconds;
    console.log(r.name.padEnd(58) + (rate / 1e6).toFixed(2).padStart(9) + `  ${(rate / base).toFixed(2)}x`);
  }
  const single = results[1]!.ops / results[1]!.seconds;
  const floor = 10e6;
  console.log(`single-thread batch floor ${floor / 1e6} Mops/s: ${single >= floor ? 'met' : 'NOT met'}`);
  if (single < floor) process.exitCode = 1;
}

if (isMainThread) {
  main().catch((err) => {
    console.error(err);
    process.exitCode = 1;
  });
} else {
  producerMain();
}
