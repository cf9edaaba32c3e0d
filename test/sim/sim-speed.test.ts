// Per-engine speed in the simulator: cost factors and named accelerator
// profiles make a fleet of fast and slow engines (measured over loopback).
import t from 'tap';
import { resolveSimOptions, SimOptionError, startEngine } from '../../src/sim/index.js';
import { parseSimArgs } from '../../src/sim/cli.js';
import { post } from '../support/sim-util.js';

t.test('a profile sets both cost factors; explicit factors win', async (t) => {
  const slow = resolveSimOptions({ accelerator: 'sim-slow' });
  t.equal(slow.prefillCostFactor, 3);
  t.equal(slow.decodeCostFactor, 3);
  const mixed = resolveSimOptions({ accelerator: 'sim-slow', decodeCostFactor: 1.5 });
  t.equal(mixed.prefillCostFactor, 3);
  t.equal(mixed.decodeCostFactor, 1.5);
  const plain = resolveSimOptions({});
  t.equal(plain.prefillCostFactor, 1);
  t.equal(plain.accelerator, '');
  t.throws(() => resolveSimOptions({ accelerator: 'quantum-9000' }), SimOptionError);
  t.throws(() => resolveSimOptions({ prefillCostFactor: 0 }), /prefillCostFactor/);
  t.throws(() => parseSimArgs(['--accelerator', 'nope']), /--accelerator: unknown accelerator profile "nope"/);
  t.throws(() => parseSimArgs(['--decode-cost-factor', 'x']), /--decode-cost-factor expects a number/);
  const o = parseSimArgs(['--accelerator', 'sim-slow', '--prefill-cost-factor', '2']);
  t.not(o, 'help');
  if (o !== 'help') t.match(o, { accelerator: 'sim-slow', prefillCostFactor: 2 });
});

t.test('a 3× slower engine takes 3× as long to prefill and to decode', async (t) => {
  const base = { timeScale: 0.5, prefillOverheadMs: 0, prefillUsPerToken: 400, itlMs: 8, decodeSlowdown: 0 };
  const fast = await startEngine(base);
  const slow = await startEngine({ ...base, accelerator: 'sim-slow' });
  t.teardown(() => Promise.all([fast.close(), slow.close()]));
  t.equal(slow.options.prefillUsPerToken, 400, 'the options keep what was asked for');
  // 250 uncached tokens × 400 µs = 100 model ms = 50 ms wall on the fast engine, 150 ms on the slow one
  const body = (p: string) => ({ model: 'open-model', prompt: p.repeat(1000), max_tokens: 11, stream: true });
  const f = await post(fast.url, '/v1/completions', body('a'));
  const s = await post(slow.url, '/v1/completions', body('b'));
  t.ok(f.firstByteMs >= 45 && f.firstByteMs < 110, `fast TTFT ${f.firstByteMs.toFixed(1)} ms ≈ 50`);
  t.ok(s.firstByteMs >= 140, `slow TTFT ${s.firstByteMs.toFixed(1)} ms ≈ 150`);
  // 10 more tokens × 8 ms model = 40 ms wall fast, 120 ms slow
  const fd = f.totalMs - f.firstByteMs;
  const sd = s.totalMs - s.firstByteMs;
  t.ok(sd > 2 * fd, `slow decode ${sd.toFixed(1)} ms > 2 × fast ${fd.toFixed(1)} ms`);
});
