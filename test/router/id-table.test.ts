// The id table (src/id-table.ts) that holds the native front end's requests
// in flight, flow control's waiting requests and the SQLite store's pending
// calls: against a Map as the reference over random sets and deletes (ids
// that collide on the low bits, probe runs that wrap the array's end, growth
// in the middle), and the array a growth replaces left empty.
import t from 'tap';
import fc from 'fast-check';
import { IdTable } from '../../src/id-table.js';

interface Item {
  readonly id: number;
  readonly tag: number;
}

// ids drawn so that many share low bits (one probe run) and some are large (past 2^31, as ids are doubles)
const id = fc.oneof(
  { weight: 4, arbitrary: fc.integer({ min: 0, max: 40 }).map((k) => k * 16 + 15) },
  { weight: 3, arbitrary: fc.integer({ min: 0, max: 200 }) },
  { weight: 1, arbitrary: fc.integer({ min: 2 ** 31 - 20, max: 2 ** 31 + 20 }) },
  { weight: 1, arbitrary: fc.integer({ min: 0, max: 2 ** 40 }) },
);
const op = fc.oneof(
  { weight: 3, arbitrary: fc.record({ k: fc.constant('set' as const), id, tag: fc.nat() }) },
  { weight: 2, arbitrary: fc.record({ k: fc.constant('delete' as const), id, tag: fc.constant(0) }) },
  { weight: 1, arbitrary: fc.record({ k: fc.constant('get' as const), id, tag: fc.constant(0) }) },
);

t.test('an IdTable answers as a Map would', async (t) => {
  fc.assert(
    fc.property(fc.array(op, { maxLength: 400 }), fc.constantFrom(1, 16, 64), (ops, capacity) => {
      const table = new IdTable<Item>(capacity);
      const ref = new Map<number, Item>();
      for (const o of ops) {
        if (o.k === 'set') {
          const x = { id: o.id, tag: o.tag };
          table.set(x);
          ref.set(o.id, x);
        } else if (o.k === 'delete') {
          if (table.delete(o.id) !== ref.delete(o.id)) return false;
        } else if (table.get(o.id) !== ref.get(o.id)) return false;
        if (table.size !== ref.size) return false;
      }
      // every id the reference holds is found, and nothing else
      for (const [k, v] of ref) if (table.get(k) !== v || !table.has(k)) return false;
      const values = table.values();
      return values.length === ref.size && values.every((v) => ref.get(v.id) === v);
    }),
    { numRuns: 3000 },
  );
});

t.test('one set and one delete per request, as the front end does, keeps every live id and nothing else', async (t) => {
  const table = new IdTable<Item>(16);
  const live: Item[] = [];
  let failed = 0;
  for (let n = 1; n <= 100_000; n++) {
    const x = { id: n, tag: n };
    table.set(x);
    live.push(x);
    if (live.length > 24) {
      const gone = live.splice((n * 7) % live.length, 1)[0]!;
      if (!table.delete(gone.id) || table.get(gone.id) !== undefined) failed++;
    }
  }
  t.equal(failed, 0, 'every delete found its id and removed it');
  t.equal(table.size, live.length);
  t.ok(live.every((x) => table.get(x.id) === x), 'every live id is found');
  t.equal(table.get(100_001), undefined);
  table.clear();
  t.equal(table.size, 0);
  t.equal(table.values().length, 0);
  t.equal(table.get(live[0]!.id), undefined);
});
