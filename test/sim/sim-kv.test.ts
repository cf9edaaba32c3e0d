// The simulator's KV cache (prefix blocks, pinning, LRU eviction) against a
// plain reference model, with fast-check; plus the chain hash's prefix property.
import t from 'tap';
import fc from 'fast-check';
import { KvCache, hashByteBlocks, hashTokenBlocks, type KvLease } from '../../src/sim/kv-cache.js';

/** Reference: a map of blocks with reference counts; idle blocks evicted by oldest release. */
class RefCache {
  blocks = new Map<number, { refs: number; seq: number }>();
  priv = 0;
  seq = 0;
  evictions = 0;
  constructor(readonly capacity: number, readonly blockSize: number) {}
  idle(): number {
    let n = 0;
    for (const b of this.blocks.values()) if (b.refs === 0) n++;
    return n;
  }
  canAdmit(hashes: number[], priv: number): boolean {
    const missing = hashes.filter((h) => !this.blocks.has(h)).length;
    const idleHits = hashes.filter((h) => this.blocks.get(h)?.refs === 0).length;
    return missing + priv <= this.capacity - this.blocks.size - this.priv + this.idle() - idleHits;
  }
  makeRoom(n: number): void {
    while (this.blocks.size + this.priv + n > this.capacity) {
      let victim: number | undefined;
      let best = Infinity;
      for (const [h, b] of this.blocks) if (b.refs === 0 && b.seq < best) [victim, best] = [h, b.seq];
      if (victim === undefined) return;
      this.blocks.delete(victim);
      this.evictions++;
    }
  }
  acquire(hashes: number[], priv: number, maxHit: number): number {
    let hit = 0;
    let contiguous = true;
    for (const h of hashes) {
      const b = this.blocks.get(h);
      if (!b) contiguous = false;
      else {
        if (contiguous) hit++;
        b.refs++;
      }
    }
    for (const h of hashes) {
      if (this.blocks.has(h)) continue;
      this.makeRoom(1);
      this.blocks.set(h, { refs: 1, seq: 0 });
    }
    this.makeRoom(priv);
    this.priv += priv;
    return Math.min(hit, maxHit) * this.blockSize;
  }
  release(hashes: number[], priv: number): void {
    for (let i = hashes.length - 1; i >= 0; i--) {
      const b = this.blocks.get(hashes[i]!)!;
      if (--b.refs === 0) b.seq = ++this.seq;
    }
    this.priv -= priv;
  }
  used(): number {
    let n = this.priv;
    for (const b of this.blocks.values()) if (b.refs > 0) n++;
    return n;
  }
}

type Op = { kind: 'acquire'; prompt: number[]; priv: number } | { kind: 'release'; which: number } | { kind: 'clear' };

t.test('KvCache matches the reference model', async (t) => {
  const ids = new Map<string, number>();
  const chain = (prompt: number[]) =>
    prompt.map((_, k) => {
      const key = prompt.slice(0, k + 1).join('.');
      if (!ids.has(key)) ids.set(key, ids.size + 1);
      return ids.get(key)!;
    });
  const op = fc.oneof(
    { weight: 5, arbitrary: fc.record({ kind: fc.constant('acquire' as const), prompt: fc.array(fc.integer({ min: 0, max: 2 }), { maxLength: 5 }), priv: fc.integer({ min: 0, max: 2 }) }) },
    { weight: 4, arbitrary: fc.record({ kind: fc.constant('release' as const), which: fc.nat() }) },
    { weight: 1, arbitrary: fc.record({ kind: fc.constant('clear' as const) }) },
  );
  let runs = 0;
  fc.assert(
    fc.property(fc.integer({ min: 1, max: 12 }), fc.array(op, { maxLength: 60 }), (capacity, ops: Op[]) => {
      runs++;
      const real = new KvCache(capacity, 4);
      const ref = new RefCache(capacity, 4);
      const live: { lease: KvLease; hashes: number[]; priv: number }[] = [];
      for (const o of ops) {
        if (o.kind === 'acquire') {
          const hashes = chain(o.prompt);
          const can = real.canAdmit(hashes, hashes.length, o.priv);
          if (can !== ref.canAdmit(hashes, o.priv)) return false;
          if (!can) continue;
          const maxHit = Math.max(0, hashes.length - 1);
          const lease = real.acquire(hashes, hashes.length, o.priv, maxHit);
          if (lease.cachedTokens !== ref.acquire(hashes, o.priv, maxHit)) return false;
          live.push({ lease, hashes, priv: o.priv });
        } else if (o.kind === 'release') {
          if (live.length === 0) continue;
          const [x] = live.splice(o.which % live.length, 1);
          real.release(x!.lease);
          ref.release(x!.hashes, x!.priv);
        } else {
          real.clear();
          for (const [h, b] of [...ref.blocks]) if (b.refs === 0) ref.blocks.delete(h), ref.evictions++;
        }
        if (real.cachedBlocks !== ref.blocks.size || real.usedBlocks !== ref.used() || real.idleBlocks !== ref.idle()) return false;
        if (real.evictions !== ref.evictions) return false;
        if (real.cachedBlocks + (real.usedBlocks - (real.cachedBlocks - real.idleBlocks)) > capacity) return false;
        for (const h of ref.blocks.keys()) if (!real.has(h)) return false;
      }
      return true;
    }),
    { numRuns: 400 },
  );
  t.equal(runs, 400);
});

t.test('chain hash: equal prefixes give equal hashes, a change changes every later block', async (t) => {
  const enc = new TextEncoder();
  const a: number[] = [];
  const b: number[] = [];
  const x = enc.encode('0123456789abcdef'.repeat(8)); // 128 bytes = 4 blocks of 32
  const y = x.slice();
  y[70] = 0x21; // inside block 2
  t.equal(hashByteBlocks(x, x.length, 32, a), 4);
  t.equal(hashByteBlocks(y, y.length, 32, b), 4);
  t.same(a.slice(0, 2), b.slice(0, 2));
  t.not(a[2], b[2]);
  t.not(a[3], b[3]);
  t.equal(hashByteBlocks(x, 127, 32, a), 3, 'only full blocks are hashed');
  t.ok(a.every((h) => Number.isSafeInteger(h) && h >= 0));
  // Same block content at a different position hashes differently (chained).
  const z = enc.encode('A'.repeat(64));
  hashByteBlocks(z, 64, 32, a);
  t.not(a[0], a[1]);
  t.equal(hashTokenBlocks([1, 2, 3, 4, 5, 6, 7, 8, 9], 4, a), 2);
  t.equal(hashTokenBlocks([1, 2, 3, 4, 5, 6, 7, 9], 4, b), 2);
  t.equal(a[0], b[0]);
  t.not(a[1], b[1]);
});
