// PrefixIndex edge cases: prompt sizes, raw bytes, tiny capacities, unknown
// endpoints, and wrong argument types (a TypeError/RangeError, never a crash),
// checked through the TS class and directly against the native class.
import t from 'tap';
import { randomBytes } from 'node:crypto';
import { MatchResult, PrefixIndex } from '../../bindings/prefix-index.js';
import { native } from '../../bindings/native.js';
import { hashPromptModel } from '../../testkit/reference/prefix-index-model.js';

const SEED = 0x1234n;
const all = (n: number) => Int32Array.from({ length: n }, (_, i) => i);

t.test('empty prompt and prompts shorter than one block', (t) => {
  const idx = new PrefixIndex();
  idx.setCapacity(0, [10, 0, 0]);
  for (const len of [0, 1, 63]) {
    const r = idx.matchPrompt(new Uint8Array(len), SEED, all(2));
    t.equal(r.hashCount, 0, `${len} bytes: no full block`);
    t.same([...r.matched.subarray(0, 2)], [0, 0]);
    idx.record(0, r.hashes, r.hashCount);
  }
  t.equal(idx.stats().entries[0], 0, 'recording zero blocks stores nothing');
  const r = idx.matchPrompt(new Uint8Array(64), SEED, all(1));
  t.equal(r.hashCount, 1, 'exactly one block');
  t.equal(idx.hashPrompt(new Uint8Array(127), SEED, new BigUint64Array(1)), 1, 'a partial trailing block is not hashed');
  t.equal(idx.hashPrompt(new Uint8Array(0), SEED, new BigUint64Array(0)), 0);
  t.end();
});

t.test('a 16 MiB prompt: one call, and the leading blocks survive a record larger than the tier', (t) => {
  const idx = new PrefixIndex();
  const prompt = randomBytes(16 << 20);
  const cands = all(2);
  const res = idx.matchPrompt(prompt, SEED, cands);
  t.equal(res.hashCount, (16 << 20) / 64);
  // the chain over the first blocks equals the model's hash of the first bytes
  t.same([...res.hashes.subarray(0, 4)], hashPromptModel(prompt.subarray(0, 256), 64, SEED));
  idx.setCapacity(0, [1000, 500, 0]);
  idx.record(0, res.hashes, res.hashCount);
  idx.matchPrompt(prompt, SEED, cands, res);
  t.equal(res.matched[0], 1500, 'endpoint 0 holds the first 1500 blocks (tail evicted first)');
  t.same([...res.tiers.subarray(0, 3)], [1000, 500, 0], 'leading blocks in tier 0, the next in tier 1');
  t.equal(res.matched[1], 0);
  const s = idx.stats();
  t.same(s.entries, [1000, 500, 0]);
  t.equal(s.blocks, 1500);
  t.end();
});

t.test('matchPrompt fills every hash, also past the block where the walk stops', (t) => {
  // matchPrompt hashes blocks as its walk reaches them and the rest after the
  // walk ends: every hash must equal hashPrompt's, wherever the walk stopped.
  const idx = new PrefixIndex({ maxEndpoints: 4 });
  const prompt = randomBytes(64 * 200 + 17);
  const want = new BigUint64Array(200);
  idx.hashPrompt(prompt, SEED, want);
  const res = new MatchResult(1, 1);
  const check = (label: string, cands: Int32Array) => {
    res.hashes.fill(0n);
    idx.matchPrompt(prompt, SEED, cands, res);
    t.equal(res.hashCount, 200, `${label}: count`);
    t.ok([...res.hashes.subarray(0, 200)].every((h, i) => h === want[i]), `${label}: all 200 hashes`);
  };
  check('no known candidate', all(4));
  check('no candidate at all', new Int32Array(0));
  for (const held of [1, 3, 17, 40, 199, 200]) {
    idx.clear(0);
    idx.record(0, want, held);
    check(`walk stops after ${held} blocks`, all(2));
    t.equal(res.matched[0], held, `endpoint 0 matches its ${held} blocks`);
  }
  t.end();
});

t.test('arbitrary non-UTF-8 bytes and typed-array views hash by their bytes only', (t) => {
  const idx = new PrefixIndex({ blockSize: 8 });
  const bytes = Uint8Array.from([0xff, 0xfe, 0x00, 0xc3, 0x28, 0xa0, 0xa1, 0xe2, 0x82, 0x28, 0xf0, 0x28, 0x8c, 0xbc, 0x80, 0x81]);
  const out = new BigUint64Array(2);
  idx.hashPrompt(bytes, SEED, out);
  t.same([...out], hashPromptModel(bytes, 8, SEED));
  // a view into a larger buffer at an odd offset, a Buffer, and a SharedArrayBuffer copy
  const big = new Uint8Array(64);
  big.set(bytes, 13);
  const view = big.subarray(13, 13 + 16);
  const out2 = new BigUint64Array(2);
  idx.hashPrompt(view, SEED, out2);
  t.same([...out2], [...out], 'subarray view');
  idx.hashPrompt(Buffer.from(bytes), SEED, out2);
  t.same([...out2], [...out], 'Buffer');
  const shared = new Uint8Array(new SharedArrayBuffer(16));
  shared.set(bytes);
  idx.hashPrompt(shared, SEED, out2);
  t.same([...out2], [...out], 'SharedArrayBuffer');
  idx.hashPrompt(bytes, SEED + 1n, out2);
  t.not(out2[0], out[0], 'the seed changes every hash');
  t.not(PrefixIndex.seedFor('model-a'), PrefixIndex.seedFor('model-b'));
  t.not(PrefixIndex.seedFor('model-a'), PrefixIndex.seedFor('model-a', 1n), 'cache salt changes the seed');
  t.end();
});

t.test('capacities 0 and 1', (t) => {
  const idx = new PrefixIndex();
  const keys = BigUint64Array.from([1n, 2n, 3n]);
  idx.setCapacity(0, [0, 0, 0]);
  idx.record(0, keys);
  t.same(idx.stats().entries, [0, 0, 0], 'all tiers absent: nothing stored');
  const r = idx.matchHashes(keys, 3, all(1));
  t.equal(r.matched[0], 0);

  idx.setCapacity(1, [1, 0, 0]);
  idx.record(1, keys);
  idx.matchHashes(keys, 3, Int32Array.of(1), r);
  t.equal(r.matched[0], 1, 'capacity 1 keeps the first block');

  idx.setCapacity(2, [0, 0, 1]);
  idx.record(2, keys);
  idx.matchHashes(keys, 3, Int32Array.of(2), r);
  t.same([r.matched[0], ...r.tiers.subarray(0, 3)], [1, 0, 0, 1], 'absent tiers are skipped: tier 2 only');

  idx.setCapacity(3, [1, 1, 1]);
  idx.record(3, keys);
  idx.matchHashes(keys, 3, Int32Array.of(3), r);
  t.same([r.matched[0], ...r.tiers.subarray(0, 3)], [3, 1, 1, 1], 'one block per tier');
  idx.record(3, keys, 1, 2); // block 1 moved to disk: block 3 (tier 2's LRU) drops out
  idx.matchHashes(keys, 3, Int32Array.of(3), r);
  t.same([r.matched[0], ...r.tiers.subarray(0, 3)], [2, 0, 1, 1], 'blocks 1 (disk) and 2 (host) left');
  idx.setCapacity(3, [0, 0, 0]);
  t.same(idx.stats().entries, [1, 0, 1], 'shrinking to 0 evicts all of endpoint 3; endpoints 1 and 2 keep theirs');
  t.end();
});

t.test('record promotes to tier 0, demotion order is least-recently-used first', (t) => {
  const idx = new PrefixIndex();
  idx.setCapacity(0, [2, 2, 0]);
  const a = BigUint64Array.of(10n);
  const b = BigUint64Array.of(11n);
  const c = BigUint64Array.of(12n);
  idx.record(0, a);
  idx.record(0, b);
  idx.record(0, c); // a (LRU) demoted to tier 1
  const r = new MatchResult();
  const tierOf = (k: BigUint64Array) => {
    idx.matchHashes(k, 1, Int32Array.of(0), r);
    return r.matched[0] === 0 ? -1 : [0, 1, 2].find((x) => r.tiers[x] === 1);
  };
  t.same([tierOf(a), tierOf(b), tierOf(c)], [1, 0, 0]);
  idx.matchHashes(a, 1, Int32Array.of(0), r); // matching does not refresh recency
  idx.record(0, a); // a hit: back to tier 0, b (now LRU) demoted
  t.same([tierOf(a), tierOf(b), tierOf(c)], [0, 1, 0]);
  idx.remove(0, b);
  t.equal(tierOf(b), -1);
  idx.clear(0);
  t.same(idx.stats().entries, [0, 0, 0]);
  t.equal(idx.stats().endpoints, 1, 'clear keeps the endpoint');
  idx.removeEndpoint(0);
  t.equal(idx.stats().endpoints, 0);
  t.end();
});

t.test('recording what already leads the list changes nothing; a near miss is recorded in full', (t) => {
  // native/prefix_core.h LeadsList: a prompt recorded again on its endpoint skips the per-block moves
  const idx = new PrefixIndex();
  idx.setCapacity(0, [3, 1, 0]);
  const r = new MatchResult();
  const tierOf = (k: bigint) => {
    idx.matchHashes(BigUint64Array.of(k), 1, Int32Array.of(0), r);
    return r.matched[0] === 0 ? -1 : [0, 1, 2].find((x) => r.tiers[x] === 1);
  };
  idx.record(0, BigUint64Array.of(1n, 2n, 3n)); // tier 0, most recent first: 1 2 3
  idx.record(0, BigUint64Array.of(1n, 2n, 3n)); // the same: still 1 2 3
  idx.record(0, BigUint64Array.of(9n)); // 3 (LRU) demoted
  t.same([tierOf(1n), tierOf(2n), tierOf(3n), tierOf(9n)], [0, 0, 1, 0]);
  idx.clear(0);
  idx.record(0, BigUint64Array.of(1n, 2n, 3n)); // 1 2 3
  idx.record(0, BigUint64Array.of(1n, 3n)); // leads with 1, then differs: 1 3 2
  idx.record(0, BigUint64Array.of(9n)); // 2 (LRU) demoted, not 3
  t.same([tierOf(1n), tierOf(2n), tierOf(3n), tierOf(9n)], [0, 1, 0, 0]);
  idx.clear(0);
  idx.record(0, BigUint64Array.of(1n, 2n, 3n));
  idx.record(0, BigUint64Array.of(1n, 2n, 3n), 3, 1); // leads tier 0's list, but asked for tier 1: moved there
  t.same([tierOf(1n), tierOf(2n), tierOf(3n)], [1, -1, -1], 'tier 1 holds one block: 1 (recorded last) stays');
  t.end();
});

t.test('unknown endpoint ids', (t) => {
  const idx = new PrefixIndex({ maxEndpoints: 8, defaultCapacity: [4, 0, 0] });
  const keys = BigUint64Array.of(1n, 2n);
  idx.record(3, keys); // first seen: default capacity
  const r = idx.matchHashes(keys, 2, Int32Array.of(-1, 3, 7, 8, 1 << 30, 3));
  t.same([...r.matched.subarray(0, 6)], [0, 2, 0, 0, 0, 2], 'unknown and out-of-range candidates match 0; duplicates agree');
  idx.remove(5, keys);
  idx.clear(5);
  idx.removeEndpoint(5);
  t.equal(idx.stats().endpoints, 1, 'remove/clear/removeEndpoint of an unknown endpoint are no-ops');
  for (const bad of [-1, 8, 1.5, NaN, Infinity, 2 ** 32]) {
    t.throws(() => idx.record(bad, keys), RangeError, `record(${bad})`);
    t.throws(() => idx.setCapacity(bad, [1, 1, 1]), RangeError, `setCapacity(${bad})`);
    t.throws(() => idx.remove(bad, keys), RangeError);
    t.throws(() => idx.clear(bad), RangeError);
    t.throws(() => idx.removeEndpoint(bad), RangeError);
  }
  idx.removeEndpoint(3);
  idx.setCapacity(3, [1, 0, 0]);
  idx.removeEndpoint(3);
  idx.record(3, keys);
  t.equal(idx.stats().entries[0], 2, 'after removeEndpoint the capacity is back to the default');
  t.end();
});

t.test('wrong argument types through the TS class', (t) => {
  const idx = new PrefixIndex();
  const keys = BigUint64Array.of(1n);
  const any = idx as any; // eslint-disable-line @typescript-eslint/no-explicit-any
  t.throws(() => new PrefixIndex({ blockSize: 0 }), RangeError);
  t.throws(() => new PrefixIndex({ blockSize: '64' as any }), TypeError); // eslint-disable-line @typescript-eslint/no-explicit-any
  t.throws(() => new PrefixIndex({ maxEndpoints: 16385 }), RangeError);
  t.throws(() => new PrefixIndex({ defaultCapacity: [1, 2] as any }), TypeError); // eslint-disable-line @typescript-eslint/no-explicit-any
  t.throws(() => new PrefixIndex({ defaultCapacity: [1, -2, 0] }), RangeError);
  t.throws(() => new PrefixIndex(null as any), TypeError); // eslint-disable-line @typescript-eslint/no-explicit-any
  t.throws(() => any.matchPrompt('hello', SEED, all(1)), TypeError);
  t.throws(() => any.matchPrompt(new Uint8Array(64), 5, all(1)), TypeError, 'number seed');
  t.throws(() => any.matchPrompt(new Uint8Array(64), -1n, all(1)), RangeError, 'negative seed');
  t.throws(() => any.matchPrompt(new Uint8Array(64), 1n << 64n, all(1)), RangeError, 'seed >= 2^64');
  t.throws(() => any.matchPrompt(new Uint8Array(64), SEED, [0, 1]), TypeError, 'plain array candidates');
  t.throws(() => any.matchPrompt(new Uint8Array(64), SEED, new Uint32Array(1)), TypeError);
  t.throws(() => any.matchPrompt(new Uint8Array(64), SEED, all(1), {}), TypeError, 'result must be a MatchResult');
  t.throws(() => any.matchHashes([1n], 1, all(1)), TypeError);
  t.throws(() => idx.matchHashes(keys, 2, all(1)), RangeError, 'count > length');
  t.throws(() => any.record(0, [1n]), TypeError);
  t.throws(() => any.record('0', keys), TypeError);
  t.throws(() => any.record(0, keys, 1, 3), RangeError, 'tier 3');
  t.throws(() => any.record(0, keys, 1, '0'), TypeError);
  t.throws(() => idx.record(0, keys, -1), RangeError);
  t.throws(() => any.remove(0, new Float64Array(1)), TypeError);
  t.throws(() => any.setCapacity(0, [1, 2, 3, 4]), TypeError);
  t.throws(() => any.setCapacity(0, 'big'), TypeError);
  t.throws(() => idx.setCapacity(0, [2 ** 32, 0, 0]), RangeError);
  t.throws(() => idx.hashPrompt(new Uint8Array(128), SEED, new BigUint64Array(1)), RangeError, 'out too small');
  t.throws(() => any.hashPrompt(new Uint8Array(128), SEED, new BigInt64Array(2)), TypeError, 'signed hash array');
  t.throws(() => any.clear(), TypeError);
  t.throws(() => (PrefixIndex as any).seedFor(5), TypeError); // eslint-disable-line @typescript-eslint/no-explicit-any
  t.equal(idx.stats().entries[0], 0, 'no failed call changed the index');
  t.end();
});

t.test('wrong argument types straight into the native class (no TS checks in front)', (t) => {
  const N = native.PrefixIndex;
  t.throws(() => new N(), TypeError, 'missing constructor args');
  t.throws(() => new N(0, 8, 1, 0, 0), RangeError);
  t.throws(() => new N(64, 0, 1, 0, 0), RangeError);
  t.throws(() => new N(64, 20000, 1, 0, 0), RangeError);
  t.throws(() => new N(64, 8, -1, 0, 0), RangeError);
  t.throws(() => N(64, 8, 1, 0, 0), TypeError, 'called without new');
  const h = new N(64, 8, 4, 0, 0);
  const keys = BigUint64Array.of(1n, 2n);
  t.throws(() => h.record(), TypeError);
  t.throws(() => h.record(0, keys), TypeError, 'count missing');
  t.throws(() => h.record(0, keys, 3, 0), RangeError, 'count > length');
  t.throws(() => h.record(0, keys, 2, 9), RangeError);
  t.throws(() => h.record(0, keys, 2), TypeError, 'tier missing');
  t.throws(() => h.matchHashes(keys, 2, all(4), new Uint32Array(3), new Uint32Array(12)), RangeError, 'matched too small');
  t.throws(() => h.matchHashes(keys, 2, all(4), new Uint32Array(4), new Uint32Array(11)), RangeError, 'tiers too small');
  t.throws(() => h.matchHashes(keys, 2, all(4), new Uint32Array(4), new Int32Array(12)), TypeError);
  t.throws(() => h.matchPrompt(new Uint8Array(128), 1n, new BigUint64Array(1), all(1), new Uint32Array(1), new Uint32Array(3)), RangeError);
  t.throws(() => h.matchPrompt(new Uint16Array(128), 1n, new BigUint64Array(4), all(1), new Uint32Array(1), new Uint32Array(3)), TypeError);
  t.throws(() => h.setCapacity(0, 1, 2), TypeError);
  t.throws(() => h.stats(new Float64Array(5)), RangeError);
  t.throws(() => h.stats([]), TypeError);
  t.throws(() => native.prefixSeed('x', 0n), TypeError);
  // typed arrays over a detached buffer read as empty
  const ab = new ArrayBuffer(128);
  const prompt = new Uint8Array(ab);
  structuredClone(ab, { transfer: [ab] });
  t.equal(h.hashPrompt(prompt, 1n, new BigUint64Array(0)), 0, 'detached prompt has no blocks');
  t.end();
});

t.test('MatchResult is reused without reallocating when it is big enough', (t) => {
  const idx = new PrefixIndex();
  const res = new MatchResult();
  const prompt = randomBytes(4096);
  idx.matchPrompt(prompt, SEED, all(64), res);
  const { hashes, matched, tiers } = res;
  idx.record(5, res.hashes, res.hashCount);
  idx.matchPrompt(prompt, SEED, all(64), res);
  t.equal(res.hashes, hashes);
  t.equal(res.matched, matched);
  t.equal(res.tiers, tiers);
  t.equal(res.matched[5], 64);
  t.equal(res.candidates, 64);
  idx.matchPrompt(prompt.subarray(0, 640), SEED, Int32Array.of(5), res);
  t.equal(res.hashCount, 10);
  t.equal(res.matched[0], 10, 'a shorter prompt with the same start matches its 10 blocks');
  t.end();
});

t.test('stats account bytes and stay bounded by the capacities', (t) => {
  const idx = new PrefixIndex({ maxEndpoints: 4 });
  for (let ep = 0; ep < 4; ep++) idx.setCapacity(ep, [500, 250, 250]);
  const keys = new BigUint64Array(4000);
  for (let round = 0; round < 5; round++) {
    for (let i = 0; i < keys.length; i++) keys[i] = BigInt(round * 100000 + i + 1);
    for (let ep = 0; ep < 4; ep++) idx.record(ep, keys);
  }
  const s = idx.stats();
  t.same(s.entries, [2000, 1000, 1000], 'every endpoint full in every tier, nothing more');
  t.equal(s.blocks, 1000, 'all endpoints hold the same 1000 blocks');
  t.ok(s.bytes > 0 && s.bytes < 4000 * 64 + 600_000, `bytes ${s.bytes}`);
  t.end();
});

t.test('applyOps: a batch of another router\'s records, removals and clears in one call, equal to the calls one by one; bad batches apply nothing', (t) => {
  const prompts = [randomBytes(64 * 6), randomBytes(64 * 4), randomBytes(64 * 5)];
  const hashes = prompts.map((p) => {
    const h = new BigUint64Array(p.length / 64);
    new PrefixIndex().hashPrompt(p, SEED, h);
    return h;
  });
  // ops: record p0 on 0, record p1 on 1, a skipped op (-1) carrying p2's hashes, remove p0's last two from 0, record p2 on 2, clear 1
  const ops = Int32Array.from([1, 0, 6, 1, 1, 4, 1, -1, 5, 2, 0, 2, 1, 2, 5, 3, 1, 0]);
  const all6 = new BigUint64Array([...hashes[0], ...hashes[1], ...hashes[2], ...hashes[0].subarray(4), ...hashes[2]]);
  const bulk = new PrefixIndex();
  t.equal(bulk.applyOps(ops, 6, all6, all6.length), 5, 'five ops applied (the -1 one skipped)');
  const one = new PrefixIndex();
  one.record(0, hashes[0]);
  one.record(1, hashes[1]);
  one.remove(0, hashes[0].subarray(4));
  one.record(2, hashes[2]);
  one.clear(1);
  for (const p of prompts) {
    const a = bulk.matchPrompt(p, SEED, all(3));
    const b = one.matchPrompt(p, SEED, all(3));
    t.same([...a.matched.subarray(0, 3)], [...b.matched.subarray(0, 3)], 'the same index as one call per op');
  }
  t.same([...bulk.matchPrompt(prompts[0], SEED, all(3)).matched.subarray(0, 3)], [4, 0, 0], 'p0: 4 blocks left on endpoint 0');
  t.same([...bulk.matchPrompt(prompts[2], SEED, all(3)).matched.subarray(0, 3)], [0, 0, 5], 'p2 on 2 only (the skipped op recorded nothing)');
  // bad batches: RangeError, nothing applied
  const fresh = new PrefixIndex({ maxEndpoints: 4 });
  const h = hashes[1];
  t.throws(() => fresh.applyOps(Int32Array.from([1, 0, 4, 1, 9, 0]), 2, h, h.length), RangeError, 'an endpoint out of range');
  t.throws(() => fresh.applyOps(Int32Array.from([1, 0, 4, 7, 0, 0]), 2, h, h.length), RangeError, 'an unknown kind');
  t.throws(() => fresh.applyOps(Int32Array.from([1, 0, 4, 1, 1, 1]), 2, h, h.length), RangeError, 'counts beyond nHashes');
  t.throws(() => fresh.applyOps(Int32Array.from([1, 0, -1]), 1, h, h.length), RangeError, 'a negative count');
  t.throws(() => fresh.applyOps(Int32Array.from([1, 0, 4]), 2, h, h.length), RangeError, 'nOps beyond ops');
  t.throws(() => fresh.applyOps(Int32Array.from([1, 0, 4]), 1, h, 9), RangeError, 'nHashes beyond hashes');
  t.throws(() => fresh.applyOps(new Uint32Array(3) as unknown as Int32Array, 1, h, h.length), TypeError, 'ops of the wrong type');
  t.same([...fresh.matchPrompt(prompts[1], SEED, all(2)).matched.subarray(0, 2)], [0, 0], 'nothing was applied by the refused batches');
  t.end();
});
