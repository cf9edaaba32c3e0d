// The request bodies' buffer pool (src/director/body-pool.ts): a buffer is
// handed to one holder at a time, give() of anything else is ignored, the free
// lists stay within their bound.
import t from 'tap';
import { BodyPool } from '../../src/director/body-pool.js';

t.test('take and give: one holder at a time, reuse by size class', (t) => {
  const p = new BodyPool(1 << 20);
  const a = p.take(5000);
  t.equal(a.length, 5000);
  t.equal(a.buffer.byteLength, 8192, 'a power-of-two class');
  const b = p.take(5000);
  t.not(a.buffer, b.buffer, 'two takes, two buffers');
  p.give(a);
  p.give(a); // a second give of the same buffer is ignored
  const c = p.take(6000);
  t.equal(c.buffer, a.buffer, 'reused');
  const d = p.take(7000);
  t.not(d.buffer, a.buffer, 'not handed out twice after a double give');
  t.not(d.buffer, b.buffer);
  t.equal(p.allocated, 3);
  p.give(Buffer.alloc(8192)); // not from the pool: ignored
  t.equal(p.freeBytes, 0);
  p.give(c.subarray(10, 20)); // a view of a taken buffer gives it back
  t.equal(p.freeBytes, 8192);
  t.end();
});

t.test('sizes outside the classes are plain buffers; the free lists are bounded', (t) => {
  const p = new BodyPool(3 * 65536);
  const small = p.take(100);
  t.equal(small.length, 100);
  p.give(small);
  t.equal(p.freeBytes, 0, 'a small body is not pooled');
  const huge = p.take(BodyPool.maxBytes + 1);
  p.give(huge);
  t.equal(p.freeBytes, 0, 'nor a huge one');
  const bs = [p.take(60_000), p.take(60_000), p.take(60_000), p.take(60_000)];
  for (const b of bs) p.give(b);
  t.equal(p.freeBytes, 3 * 65536, 'the fourth is left to the collector');
  t.equal(p.take(BodyPool.maxBytes).length, BodyPool.maxBytes);
  t.end();
});
