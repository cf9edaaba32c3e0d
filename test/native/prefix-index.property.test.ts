// Property tests: random sequences of setCapacity / record / match / remove /
// clear / removeEndpoint on the native PrefixIndex and on the plain TS
// reference model must give the same answers at every step. Capacities are
// tiny so eviction and demotion between tiers happen constantly. Also run by
// scripts/asan.js against the sanitizer build (PREFIX_PROPERTY_RUNS scales it).
import fc from 'fast-check';
import t from 'tap';
import { MatchResult, PrefixIndex } from '../../bindings/prefix-index.js';
import { hashPromptModel, PrefixIndexModel, seedModel } from '../../testkit/reference/prefix-index-model.js';

const RUNS = Number(process.env.PREFIX_PROPERTY_RUNS ?? 150);
const MAX_EPS = 6;
const DEFAULT_CAP: [number, number, number] = [3, 2, 1];

// A small key universe (with the extremes) so endpoints share blocks often.
const KEYS: bigint[] = [0n, 1n, 2n, 3n, 0xffffffffffffffffn, 0x8000000000000000n];
for (let i = 0; KEYS.length < 20; i++) KEYS.push(BigInt(i) * 0x9e3779b97f4a7c15n & 0xffffffffffffffffn);

type Op =
  | { op: 'setCapacity'; ep: number; cap: [number, number, number] }
  | { op: 'record'; ep: number; keys: number[]; tier: 0 | 1 | 2 }
  | { op: 'remove'; ep: number; keys: number[] }
  | { op: 'clear'; ep: number }
  | { op: 'removeEndpoint'; ep: number }
  | { op: 'match'; keys: number[]; cands: number[] }
  | { op: 'matchRecorded'; pick: number; extra: number[]; cands: number[] }
  | { op: 'recordAgain'; pick: number; ep: number; tier: 0 | 1 | 2 };

const epArb = fc.integer({ min: 0, max: MAX_EPS - 1 });
const keysArb = fc.array(fc.integer({ min: 0, max: KEYS.length - 1 }), { maxLength: 9 });
// Candidates include duplicates, unknown and out-of-range ids.
const candArb = fc.array(fc.integer({ min: -2, max: MAX_EPS + 2 }), { maxLength: 8 });
const capArb = fc.tuple(fc.integer({ min: 0, max: 4 }), fc.integer({ min: 0, max: 3 }), fc.integer({ min: 0, max: 3 }));

const opArb: fc.Arbitrary<Op> = fc.oneof(
  { arbitrary: fc.record({ op: fc.constant('setCapacity' as const), ep: epArb, cap: capArb }), weight: 2 },
  {
    arbitrary: fc.record({
      op: fc.constant('record' as const),
      ep: epArb,
      keys: keysArb,
      tier: fc.constantFrom(0 as const, 0 as const, 1 as const, 2 as const),
    }),
    weight: 8,
  },
  { arbitrary: fc.record({ op: fc.constant('remove' as const), ep: epArb, keys: keysArb }), weight: 2 },
  { arbitrary: fc.record({ op: fc.constant('clear' as const), ep: epArb }), weight: 1 },
  { arbitrary: fc.record({ op: fc.constant('removeEndpoint' as const), ep: epArb }), weight: 1 },
  { arbitrary: fc.record({ op: fc.constant('match' as const), keys: keysArb, cands: candArb }), weight: 3 },
  // a prompt recorded earlier, recorded again (on its endpoint or another): the no-change fast path
  // (native/prefix_core.h LeadsList) must leave the order and evictions as touching each block would
  {
    arbitrary: fc.record({
      op: fc.constant('recordAgain' as const),
      pick: fc.nat(),
      ep: epArb,
      tier: fc.constantFrom(0 as const, 0 as const, 1 as const, 2 as const),
    }),
    weight: 4,
  },
  // a prompt recorded earlier, possibly extended: long prefix hits
  {
    arbitrary: fc.record({
      op: fc.constant('matchRecorded' as const),
      pick: fc.nat(),
      extra: fc.array(fc.integer({ min: 0, max: KEYS.length - 1 }), { maxLength: 2 }),
      cands: candArb,
    }),
    weight: 4,
  },
);

function big(keys: number[]): BigUint64Array {
  return BigUint64Array.from(keys.map((k) => KEYS[k]!));
}

/** Where every (endpoint, key) sits, read through matchHashes one key at a time. */
function nativeState(idx: PrefixIndex, res: MatchResult): number[] {
  const cands = Int32Array.from({ length: MAX_EPS }, (_, i) => i);
  const out: number[] = [];
  const one = new BigUint64Array(1);
  for (const key of KEYS) {
    one[0] = key;
    idx.matchHashes(one, 1, cands, res);
    for (let c = 0; c < MAX_EPS; c++) {
      const tier = res.matched[c] === 0 ? -1 : [0, 1, 2].find((t) => res.tiers[c * 3 + t] === 1)!;
      out.push(tier);
    }
  }
  return out;
}

function modelState(model: PrefixIndexModel): number[] {
  const out: number[] = [];
  for (const key of KEYS) {
    const m = model.match([key], Array.from({ length: MAX_EPS }, (_, i) => i));
    for (let c = 0; c < MAX_EPS; c++) out.push(m.matched[c] === 0 ? -1 : [0, 1, 2].find((t) => m.tiers[c * 3 + t] === 1)!);
  }
  return out;
}

function applyBoth(idx: PrefixIndex, model: PrefixIndexModel, op: Op, res: MatchResult, recorded: number[][], recordedOps: Array<Extract<Op, { op: 'record' }>> = []): void {
  if (op.op === 'recordAgain') {
    const last = recorded.length === 0 ? null : recordedOps[op.pick % recorded.length]!;
    // half the time the very record before (same endpoint and tier: the fast path's case)
    // a third the record before with one block left out or two swapped (the list's head run then differs
    // after its first block), a third an earlier prompt on any endpoint and tier
    const prev = recordedOps[recordedOps.length - 1];
    const variant = op.pick % 3;
    if (last === null || prev === undefined) op = { op: 'record', ep: op.ep, keys: [], tier: op.tier };
    else if (variant === 0) op = { ...prev };
    else if (variant === 1) {
      const keys = [...prev.keys];
      const i = 1 + (op.pick % Math.max(1, keys.length - 1));
      if (i + 1 < keys.length && op.pick % 2 === 0) [keys[i], keys[i + 1]] = [keys[i + 1]!, keys[i]!];
      else keys.splice(i, 1);
      op = { ...prev, keys };
    } else op = { op: 'record', ep: op.ep, keys: last.keys, tier: op.tier };
  }
  if (op.op === 'matchRecorded') {
    const keys = recorded.length === 0 ? op.extra : [...recorded[op.pick % recorded.length]!, ...op.extra];
    op = { op: 'match', keys, cands: [...op.cands, ...Array.from({ length: MAX_EPS }, (_, i) => i)] };
  }
  switch (op.op) {
    case 'setCapacity':
      idx.setCapacity(op.ep, op.cap);
      model.setCapacity(op.ep, op.cap);
      return;
    case 'record': {
      // record through a longer array with an explicit count, as the router does
      const arr = new BigUint64Array(op.keys.length + 2);
      arr.set(big(op.keys));
      idx.record(op.ep, arr, op.keys.length, op.tier);
      recorded.push(op.keys);
      recordedOps.push(op);
      model.record(op.ep, op.keys.map((k) => KEYS[k]!), op.tier);
      return;
    }
    case 'remove':
      idx.remove(op.ep, big(op.keys));
      model.remove(op.ep, op.keys.map((k) => KEYS[k]!));
      return;
    case 'clear':
      idx.clear(op.ep);
      model.clear(op.ep);
      return;
    case 'removeEndpoint':
      idx.removeEndpoint(op.ep);
      model.removeEndpoint(op.ep);
      return;
    case 'match': {
      const r = idx.matchHashes(big(op.keys), op.keys.length, Int32Array.from(op.cands), res);
      const m = model.match(op.keys.map((k) => KEYS[k]!), op.cands);
      if (r.candidates !== op.cands.length) throw new Error(`candidates ${r.candidates} != ${op.cands.length}`);
      const got = { matched: [...r.matched.subarray(0, op.cands.length)], tiers: [...r.tiers.subarray(0, op.cands.length * 3)] };
      if (JSON.stringify(got) !== JSON.stringify(m)) {
        throw new Error(`match differs: native ${JSON.stringify(got)} model ${JSON.stringify(m)}`);
      }
    }
  }
}

t.test('native index agrees with the reference model on random operation sequences', (t) => {
  let demotedSeen = 0;
  let droppedSeen = 0;
  let matchedSeen = 0;
  fc.assert(
    fc.property(fc.array(opArb, { minLength: 1, maxLength: 60, size: 'max' }), (ops) => {
      const idx = new PrefixIndex({ maxEndpoints: MAX_EPS, defaultCapacity: DEFAULT_CAP });
      const model = new PrefixIndexModel(MAX_EPS, DEFAULT_CAP);
      const res = new MatchResult(4, 2); // small on purpose: it must grow
      const recorded: number[][] = [];
      const recordedOps: Array<Extract<Op, { op: 'record' }>> = [];
      for (const op of ops) {
        const before = model.stats().entries.reduce((a, b) => a + b, 0);
        const fresh = op.op === 'record' ? new Set(op.keys.filter((k) => model.match([KEYS[k]!], [op.ep]).matched[0] === 0)).size : 0;
        applyBoth(idx, model, op, res, recorded, recordedOps);
        const s = idx.stats();
        if (s.entries[1] + s.entries[2] > 0) demotedSeen++;
        if (op.op === 'record' && s.entries.reduce((a, b) => a + b, 0) < before + fresh) droppedSeen++;
        if ((op.op === 'match' || op.op === 'matchRecorded') && res.matched.subarray(0, res.candidates).some((m) => m > 1)) matchedSeen++;
        const ms = model.stats();
        if (JSON.stringify([s.entries, s.blocks, s.endpoints]) !== JSON.stringify([ms.entries, ms.blocks, ms.endpoints])) {
          throw new Error(`stats differ after ${JSON.stringify(op)}: native ${JSON.stringify(s)} model ${JSON.stringify(ms)}`);
        }
      }
      const ns = nativeState(idx, res);
      const ms = modelState(model);
      if (ns.join() !== ms.join()) throw new Error(`final state differs:\nnative ${ns.join()}\nmodel  ${ms.join()}`);
    }),
    { numRuns: RUNS, interruptAfterTimeLimit: 60_000, markInterruptAsFailure: true },
  );
  t.pass(`${RUNS} random sequences agree`);
  // the generator must exercise what it claims to
  t.ok(demotedSeen > RUNS, `states with demoted blocks: ${demotedSeen}`);
  t.ok(droppedSeen > RUNS / 2, `records that dropped blocks out of the index: ${droppedSeen}`);
  t.ok(matchedSeen > RUNS, `matches with a multi-block prefix hit: ${matchedSeen}`);
  t.end();
});

t.test('larger sequences with many blocks per record (tables grow, shrink and rehash)', (t) => {
  const bigOp = fc.oneof(
    {
      arbitrary: fc.record({
        op: fc.constant('record' as const),
        ep: epArb,
        keys: fc.array(fc.integer({ min: 0, max: 5000 }), { minLength: 1, maxLength: 200, size: 'max' }),
        tier: fc.constantFrom(0 as const, 0 as const, 1 as const, 2 as const),
      }),
      weight: 3,
    },
    fc.record({ op: fc.constant('remove' as const), ep: epArb, keys: fc.array(fc.integer({ min: 0, max: 5000 }), { maxLength: 200, size: 'max' }) }),
    fc.record({ op: fc.constant('setCapacity' as const), ep: epArb, cap: fc.tuple(fc.integer({ min: 0, max: 300 }), fc.integer({ min: 0, max: 200 }), fc.integer({ min: 0, max: 100 })) }),
    fc.record({ op: fc.constant('removeEndpoint' as const), ep: epArb }),
    fc.record({ op: fc.constant('match' as const), keys: fc.array(fc.integer({ min: 0, max: 5000 }), { maxLength: 200, size: 'max' }), cands: candArb }),
    // a recorded prompt again, possibly extended: long walks, most of them by one candidate (the walk's
    // single-candidate loop), across tiers and through blocks other endpoints hold too
    {
      arbitrary: fc.record({
        op: fc.constant('matchRecorded' as const),
        pick: fc.nat(),
        extra: fc.array(fc.integer({ min: 0, max: 5000 }), { maxLength: 3 }),
        cands: candArb,
      }),
      weight: 3,
    },
  );
  const keyOf = (k: number) => (BigInt(k) * 0x2545f4914f6cdd1dn) & 0xffffffffffffffffn;
  let longSeen = 0;
  let tieredSeen = 0;
  const runs = Math.max(10, Math.floor(RUNS / 5));
  fc.assert(
    fc.property(fc.array(bigOp, { minLength: 1, maxLength: 30, size: 'max' }), (ops) => {
      const idx = new PrefixIndex({ maxEndpoints: MAX_EPS, defaultCapacity: [120, 60, 30] });
      const model = new PrefixIndexModel(MAX_EPS, [120, 60, 30]);
      const res = new MatchResult();
      const recorded: number[][] = [];
      for (let op of ops) {
        if (op.op === 'matchRecorded') {
          const base = recorded.length === 0 ? [] : recorded[op.pick % recorded.length]!;
          op = { op: 'match', keys: [...base, ...op.extra], cands: [...op.cands, ...Array.from({ length: MAX_EPS }, (_, i) => i)] };
        }
        const keys = 'keys' in op ? BigUint64Array.from(op.keys.map(keyOf)) : new BigUint64Array(0);
        const list = [...keys];
        switch (op.op) {
          case 'record': idx.record(op.ep, keys, keys.length, op.tier); model.record(op.ep, list, op.tier); recorded.push(op.keys); break;
          case 'remove': idx.remove(op.ep, keys); model.remove(op.ep, list); break;
          case 'setCapacity': idx.setCapacity(op.ep, op.cap); model.setCapacity(op.ep, op.cap); break;
          case 'removeEndpoint': idx.removeEndpoint(op.ep); model.removeEndpoint(op.ep); break;
          case 'match': {
            const r = idx.matchHashes(keys, keys.length, Int32Array.from(op.cands), res);
            const m = model.match(list, op.cands);
            const got = JSON.stringify({ matched: [...r.matched.subarray(0, op.cands.length)], tiers: [...r.tiers.subarray(0, op.cands.length * 3)] });
            if (got !== JSON.stringify(m)) throw new Error(`match differs: native ${got} model ${JSON.stringify(m)}`);
            if (m.matched.some((x) => x >= 50)) longSeen++;
            if (m.matched.some((x, i) => x >= 20 && [0, 1, 2].filter((t) => m.tiers[3 * i + t]! > 0).length >= 2)) tieredSeen++;
          }
        }
        const s = idx.stats();
        const ms = model.stats();
        if (JSON.stringify([s.entries, s.blocks, s.endpoints]) !== JSON.stringify([ms.entries, ms.blocks, ms.endpoints])) {
          throw new Error(`stats differ after ${op.op}: native ${JSON.stringify(s)} model ${JSON.stringify(ms)}`);
        }
      }
    }),
    { numRuns: runs, interruptAfterTimeLimit: 60_000, markInterruptAsFailure: true },
  );
  t.pass('agree');
  // the generator must reach the long walks it is there for (counts vary from run to run: loose bounds)
  t.ok(longSeen >= Math.max(1, runs / 5), `matches of 50+ blocks: ${longSeen}`);
  t.ok(tieredSeen >= Math.max(1, runs / 10), `matches of 20+ blocks spanning two or more tiers: ${tieredSeen}`);
  t.end();
});

t.test('approximate mode: native chained hashes equal the model bit for bit', (t) => {
  fc.assert(
    fc.property(
      fc.uint8Array({ maxLength: 300, size: 'max' }),
      fc.integer({ min: 1, max: 70 }),
      fc.bigInt({ min: 0n, max: 0xffffffffffffffffn }),
      (bytes, blockSize, seed) => {
        const idx = new PrefixIndex({ blockSize, maxEndpoints: 2 });
        const out = new BigUint64Array(Math.floor(bytes.length / blockSize));
        const n = idx.hashPrompt(bytes, seed, out);
        const want = hashPromptModel(bytes, blockSize, seed);
        if (n !== want.length || [...out].join() !== want.join()) {
          throw new Error(`hashes differ: ${[...out].join()} vs ${want.join()}`);
        }
      },
    ),
    { numRuns: RUNS, interruptAfterTimeLimit: 60_000, markInterruptAsFailure: true },
  );
  t.equal(PrefixIndex.seedFor('llama-3-8b', 7n), seedModel('llama-3-8b', 7n), 'seedFor matches the model');
  t.end();
});

t.test('approximate mode: matchPrompt then record of its hashes agrees with the model', (t) => {
  // Prompts built from a few 8-byte pieces share prefixes with each other.
  const pieces = ['system: ', 'you are ', 'helpful ', 'user: hi', '\u00ff\u00fe\x00\x01abcd', 'tool-cal'].map((s) =>
    Buffer.from(s, 'latin1'),
  );
  const promptArb = fc.array(fc.integer({ min: 0, max: pieces.length - 1 }), { maxLength: 12 });
  const stepArb = fc.record({ prompt: promptArb, ep: epArb, cands: candArb, seedPick: fc.integer({ min: 0, max: 1 }), rec: fc.boolean() });
  fc.assert(
    fc.property(fc.array(stepArb, { minLength: 1, maxLength: 25, size: 'max' }), (steps) => {
      const idx = new PrefixIndex({ blockSize: 16, maxEndpoints: MAX_EPS, defaultCapacity: [4, 3, 2] });
      const model = new PrefixIndexModel(MAX_EPS, [4, 3, 2]);
      const res = new MatchResult(1, 1);
      const seeds = [11n, 0xdeadbeefcafef00dn];
      for (const s of steps) {
        const prompt = Buffer.concat(s.prompt.map((i) => pieces[i]!));
        const seed = seeds[s.seedPick]!;
        idx.matchPrompt(prompt, seed, Int32Array.from(s.cands), res);
        const keys = hashPromptModel(prompt, 16, seed);
        if (res.hashCount !== keys.length || [...res.hashes.subarray(0, res.hashCount)].join() !== keys.join()) {
          throw new Error('matchPrompt hashes differ from the model');
        }
        const m = model.match(keys, s.cands);
        const got = { matched: [...res.matched.subarray(0, s.cands.length)], tiers: [...res.tiers.subarray(0, s.cands.length * 3)] };
        if (JSON.stringify(got) !== JSON.stringify(m)) throw new Error(`matchPrompt differs: ${JSON.stringify(got)} vs ${JSON.stringify(m)}`);
        if (s.rec) {
          idx.record(s.ep, res.hashes, res.hashCount);
          model.record(s.ep, keys);
        }
      }
    }),
    { numRuns: RUNS, interruptAfterTimeLimit: 60_000, markInterruptAsFailure: true },
  );
  t.pass('agree');
  t.end();
});
