// Native FlowQueues against the plain-array reference model, plus argument
// validation and lifetime (close / attach / liveRegions).
import t from 'tap';
import fc from 'fast-check';
import { FlowQueues, FLOW_RECORD_WORDS, flowRecordId, setFlowRecord } from '../../bindings/flow-queues.js';
import { FlowQueuesModel, type ModelRecord } from '../../testkit/reference/flow-queues-model.js';

const recordArb = fc.record({
  id: fc.oneof(fc.integer({ min: 0, max: 0xffffffff }), fc.maxSafeNat()),
  bytes: fc.integer({ min: 0, max: 0xffffffff }),
  time: fc.integer({ min: 0, max: 0xffffffff }),
});

type Op =
  | { kind: 'enqueue'; flow: number; rec: ModelRecord }
  | { kind: 'enqueueBatch'; flow: number; recs: ModelRecord[] }
  | { kind: 'dequeueBatch'; flow: number; max: number }
  | { kind: 'peek'; flow: number }
  | { kind: 'sizes' };

function opArb(flows: number): fc.Arbitrary<Op> {
  const flow = fc.integer({ min: 0, max: flows - 1 });
  return fc.oneof(
    { weight: 4, arbitrary: fc.record({ kind: fc.constant('enqueue' as const), flow, rec: recordArb }) },
    { weight: 2, arbitrary: fc.record({ kind: fc.constant('enqueueBatch' as const), flow, recs: fc.array(recordArb, { maxLength: 12 }) }) },
    { weight: 3, arbitrary: fc.record({ kind: fc.constant('dequeueBatch' as const), flow, max: fc.integer({ min: 0, max: 10 }) }) },
    { weight: 1, arbitrary: fc.record({ kind: fc.constant('peek' as const), flow }) },
    { weight: 1, arbitrary: fc.record({ kind: fc.constant('sizes' as const) }) },
  );
}

function readRecords(buf: Uint32Array, n: number): ModelRecord[] {
  const out: ModelRecord[] = [];
  for (let i = 0; i < n; i++) out.push({ id: flowRecordId(buf, i), bytes: buf[i * 4 + 2]!, time: buf[i * 4 + 3]! });
  return out;
}

function sameRecords(a: ModelRecord[], b: ModelRecord[]): boolean {
  return a.length === b.length && a.every((r, i) => r.id === b[i]!.id && r.bytes === b[i]!.bytes && r.time === b[i]!.time);
}

t.test('native queues match the reference model on random op sequences', (t) => {
  fc.assert(
    fc.property(
      fc.integer({ min: 1, max: 4 }).chain((flows) =>
        fc.tuple(fc.constant(flows), fc.integer({ min: 1, max: 9 }), fc.array(opArb(flows), { maxLength: 120, size: 'max' })),
      ),
      ([flows, capacity, ops]) => {
        const q = FlowQueues.create({ flows, capacity });
        const m = new FlowQueuesModel(flows, capacity);
        try {
          if (q.capacity !== m.capacity) return false;
          const buf = new Uint32Array(16 * FLOW_RECORD_WORDS);
          const sizes = new Uint32Array(flows);
          for (const op of ops) {
            switch (op.kind) {
              case 'enqueue': {
                const { id, bytes, time } = op.rec;
                if (q.enqueue(op.flow, id, bytes, time) !== m.enqueue(op.flow, op.rec)) return false;
                break;
              }
              case 'enqueueBatch': {
                op.recs.forEach((r, i) => setFlowRecord(buf, i, r.id, r.bytes, r.time));
                if (q.enqueueBatch(op.flow, buf, op.recs.length) !== m.enqueueBatch(op.flow, op.recs)) return false;
                break;
              }
              case 'dequeueBatch': {
                const n = q.dequeueBatch(op.flow, buf, op.max);
                const want = m.dequeueBatch(op.flow, op.max);
                if (n !== want.length || !sameRecords(readRecords(buf, n), want)) return false;
                break;
              }
              case 'peek': {
                const got = q.peek(op.flow, buf);
                const want = m.peek(op.flow);
                if (got !== (want !== undefined)) return false;
                if (want && !sameRecords(readRecords(buf, 1), [want])) return false;
                break;
              }
              case 'sizes': {
                let total = 0;
                for (let f = 0; f < flows; f++) total += m.size(f);
                if (q.sizes(sizes) !== total) return false;
                for (let f = 0; f < flows; f++) if (sizes[f] !== m.size(f) || q.size(f) !== m.size(f)) return false;
                break;
              }
            }
          }
          return true;
        } finally {
          q.close();
        }
      },
    ),
    { numRuns: 300 },
  );
  t.pass('300 random sequences agree with the model');
  t.end();
});

t.test('wraps around many laps in FIFO order', (t) => {
  const q = FlowQueues.create({ flows: 1, capacity: 4 });
  const buf = new Uint32Array(4 * FLOW_RECORD_WORDS);
  let next = 0;
  let expect = 0;
  let ok = true;
  for (let lap = 0; lap < 10000; lap++) {
    const k = 1 + (lap % 4);
    for (let i = 0; i < k; i++) setFlowRecord(buf, i, next + i, i, lap);
    if (q.enqueueBatch(0, buf, k) !== k) ok = false;
    next += k;
    const n = q.dequeueBatch(0, buf, 4);
    for (let i = 0; i < n; i++) if (flowRecordId(buf, i) !== expect++) ok = false;
  }
  t.ok(ok, 'ids come out in order across laps');
  t.equal(expect, next);
  q.close();
  t.end();
});

t.test('validates arguments with TypeError/RangeError', (t) => {
  t.throws(() => FlowQueues.create({ flows: 0, capacity: 4 }), RangeError);
  t.throws(() => FlowQueues.create({ flows: 1.5, capacity: 4 }), RangeError);
  t.throws(() => FlowQueues.create({ flows: 1, capacity: 2 ** 25 }), RangeError);
  t.throws(() => FlowQueues.create({ flows: 65536, capacity: 1 << 24 }), RangeError, 'region memory cap');
  t.throws(() => FlowQueues.create({ flows: '2', capacity: 4 } as unknown as { flows: number; capacity: number }), TypeError);
  t.throws(() => FlowQueues.create(null as unknown as { flows: number; capacity: number }), TypeError);
  const q = FlowQueues.create({ flows: 2, capacity: 4 });
  t.throws(() => q.enqueue(2, 1, 1, 1), RangeError);
  t.throws(() => q.enqueue(-1, 1, 1, 1), RangeError);
  t.throws(() => q.enqueue(NaN, 1, 1, 1), RangeError);
  t.throws(() => q.enqueue('0' as unknown as number, 1, 1, 1), TypeError);
  t.throws(() => q.enqueue(0, 2 ** 53, 1, 1), RangeError);
  t.throws(() => q.enqueue(0, 1, 2 ** 32, 1), RangeError);
  t.throws(() => q.enqueue(0, 1, 1, -1), RangeError);
  t.throws(() => q.enqueue(0, 1, 1, 0.5), RangeError);
  t.throws(() => (q.enqueue as (...a: unknown[]) => boolean)(0, 1), TypeError);
  t.throws(() => q.enqueueBatch(0, new Uint32Array(7), 2), RangeError);
  t.throws(() => q.enqueueBatch(0, new Int32Array(8) as unknown as Uint32Array, 2), TypeError);
  t.throws(() => q.dequeueBatch(0, new Uint32Array(4), 2), RangeError);
  t.throws(() => q.dequeueBatch(0, [] as unknown as Uint32Array, 0), TypeError);
  t.throws(() => q.peek(0, new Uint32Array(3)), RangeError);
  t.throws(() => q.sizes(new Uint32Array(1)), RangeError);
  t.equal(q.size(0), 0, 'nothing was enqueued by failed calls');
  t.throws(() => FlowQueues.attach(0), RangeError);
  t.throws(() => FlowQueues.attach(0xfffffff0), RangeError, 'unknown handle');
  q.close();
  t.end();
});

t.test('close, attach and liveRegions', (t) => {
  const before = FlowQueues.liveRegions();
  const a = FlowQueues.create({ flows: 2, capacity: 8 });
  t.equal(FlowQueues.liveRegions(), before + 1);
  a.enqueue(1, 42, 100, 7);
  const b = FlowQueues.attach(a.handle);
  t.equal(b.flows, 2);
  t.equal(b.capacity, 8);
  t.same(b.dequeue(1), { id: 42, bytes: 100, time: 7 }, 'the attached view sees the same memory');
  const handle = a.handle;
  a.close();
  a.close();
  t.ok(a.closed);
  t.throws(() => a.enqueue(0, 1, 1, 1), /closed/);
  t.throws(() => a.handle, /closed/);
  t.equal(FlowQueues.liveRegions(), before + 1, 'b still holds it');
  t.ok(b.enqueue(0, 1, 1, 1));
  b.close();
  t.equal(FlowQueues.liveRegions(), before, 'freed on last close');
  t.throws(() => FlowQueues.attach(handle), /no live FlowQueues/);
  t.end();
});

t.test('a FlowQueues object that is garbage-collected without close() releases its reference', async (t) => {
  const v8 = await import('node:v8');
  const vm = await import('node:vm');
  v8.setFlagsFromString('--expose-gc');
  const gc = vm.runInNewContext('gc') as () => void;
  const before = FlowQueues.liveRegions();
  (() => {
    const q = FlowQueues.create({ flows: 8, capacity: 4096 });
    q.enqueue(3, 1, 2, 3);
  })();
  t.equal(FlowQueues.liveRegions(), before + 1);
  for (let i = 0; i < 50 && FlowQueues.liveRegions() > before; i++) {
    gc();
    await new Promise((r) => setImmediate(r));
  }
  t.equal(FlowQueues.liveRegions(), before, 'the finalizer freed the region');
});

t.test('rings are allocated on first push: a large region costs memory only for the flows used', (t) => {
  const rss0 = process.memoryUsage().rss;
  // 4096 x 8192 records would be ~800 MB if every ring were allocated up front
  const q = FlowQueues.create({ flows: 4096, capacity: 8192 });
  const out = new Uint32Array(4);
  t.equal(q.size(4095), 0);
  t.equal(q.dequeueBatch(7, out, 1), 0, 'popping an untouched flow is fine');
  t.notOk(q.peek(7, out));
  t.ok(q.enqueue(4095, 9, 8, 7));
  t.ok(q.enqueue(0, 1, 2, 3));
  const sizes = new Uint32Array(4096);
  t.equal(q.sizes(sizes), 2);
  t.same(q.dequeue(4095), { id: 9, bytes: 8, time: 7 });
  const grown = process.memoryUsage().rss - rss0;
  t.ok(grown < 64 * 1024 * 1024, `RSS grew ${(grown / 1048576).toFixed(1)} MB`);
  q.close();
  t.end();
});
