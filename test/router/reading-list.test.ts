// The router's list of requests still reading their body (swap-remove array
// with an index on each request): random adds and deletes against a Set.
import t from 'tap';
import fc from 'fast-check';
import { ReadingList } from '../../src/server/core.js';
import type { HttpExchange } from '../../src/server/http-exchange.js';

t.test('ReadingList behaves like a Set of requests', async (t) => {
  fc.assert(
    fc.property(fc.array(fc.tuple(fc.boolean(), fc.nat(15), fc.nat(100)), { maxLength: 200 }), (ops) => {
      const reqs = Array.from({ length: 16 }, () => ({ readSlot: -1, readStart: 0 }) as unknown as HttpExchange);
      const list = new ReadingList();
      const model = new Set<HttpExchange>();
      for (const [add, k, start] of ops) {
        const r = reqs[k]!;
        if (add) {
          if (!model.has(r)) r.readStart = start;
          list.add(r);
          model.add(r);
        } else {
          list.delete(r);
          model.delete(r);
        }
        if (list.size !== model.size) return false;
        for (const q of reqs) if (list.has(q) !== model.has(q)) return false;
      }
      const late = new Set(list.startedBefore(50));
      for (const q of model) if (late.has(q) !== q.readStart < 50) return false;
      return late.size === [...model].filter((q) => q.readStart < 50).length;
    }),
    { numRuns: 300 },
  );
  t.pass('300 random add/delete sequences agree with a Set');
});
