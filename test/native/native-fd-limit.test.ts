// raiseFdLimit(): RLIMIT_NOFILE's soft limit goes up to the hard limit, and
// the returned numbers are the process's limits after the call.
import t from 'tap';
import { readFileSync } from 'node:fs';
import { raiseFdLimit } from '../../bindings/index.js';

/** [soft, hard] "Max open files" from /proc/self/limits (Linux), or null elsewhere. */
function procLimits(): [number, number] | null {
  let text: string;
  try {
    text = readFileSync('/proc/self/limits', 'utf8');
  } catch {
    return null;
  }
  const m = /^Max open files\s+(\S+)\s+(\S+)/m.exec(text);
  if (m === null) return null;
  const n = (s: string) => (s === 'unlimited' ? Infinity : Number(s));
  return [n(m[1]!), n(m[2]!)];
}

t.test('raises the soft limit to the hard limit and reports both', (t) => {
  const before = procLimits();
  const r = raiseFdLimit();
  t.type(r.soft, 'number');
  t.type(r.hard, 'number');
  t.equal(r.soft, r.hard, 'soft = hard after the call');
  const after = procLimits();
  if (before !== null && after !== null) {
    t.same(after, [r.soft, r.hard], 'the process limits are the returned ones');
    t.ok(r.soft >= before[0], `not lowered (${before[0]} -> ${r.soft})`);
    t.equal(r.hard, before[1], 'the hard limit is unchanged');
  }
  t.same(raiseFdLimit(), r, 'a second call changes nothing');
  t.end();
});

t.test('takes no arguments', (t) => {
  t.throws(() => (raiseFdLimit as unknown as (x: number) => unknown).call(null, 1), TypeError);
  t.end();
});

t.test('the native export checks its arguments too', async (t) => {
  const { native } = await import('../../bindings/native.js');
  t.throws(() => native.raiseFdLimit(1), TypeError);
});
