// Sparse flows first (docs/flow-control.md, "New flows"): a flow that becomes
// active without being ahead of its band's virtual time is dispatched ahead of
// the band's backlogged flows for one quantum of cost
// (fairness.newFlowQuantum × the band's mean request cost), and is charged for
// it; a flow whose queue holds more than the quantum is a backlog, not a new
// flow. Real FlowQueues and FlowController over a one-slot pool the test
// releases by hand (no timing).
import t from 'tap';
import { FlowController, type AdmitResult } from '../../src/flow/controller.js';
import { validateFlowControl, type FlowControlConfig } from '../../src/flow/config.js';
import { flush } from '../support/flow-util.js';

function config(raw: Record<string, unknown>): FlowControlConfig {
  const { value, errors } = validateFlowControl(raw);
  if (!value) throw new Error(errors.join('\n'));
  return value;
}

interface Sent {
  flowId: string;
  continuation?: boolean;
  promptTokens?: number;
  maxTokens?: number;
}

/** One slot, band standard; `next()` ends the oldest running request and lets the dispatch loop run. */
function harness(t: Tap, raw: Record<string, unknown>) {
  let ctl!: FlowController;
  ctl = new FlowController({ config: config({ admission: { mode: 'off' }, ...raw }), utilisation: () => ctl.inFlight, now: () => 0, sweepTimer: false });
  t.teardown(() => ctl.close());
  const order: string[] = [];
  const tickets: number[] = [];
  const submit = (s: Sent, n = 1) => {
    for (let i = 0; i < n; i++) {
      const r = ctl.admit({ band: 1, bytes: 1, ...s });
      const done = (x: AdmitResult) => {
        if (x.ok) {
          order.push(s.continuation === true ? `${s.flowId}:warm` : s.flowId);
          tickets.push(x.ticket);
        } else order.push(`${s.flowId}:${x.reason}`);
      };
      if (r instanceof Promise) r.then(done);
      else done(r);
    }
  };
  const next = async (n = 1) => {
    for (let i = 0; i < n; i++) {
      ctl.release(tickets.shift()!);
      await flush();
      await flush();
    }
  };
  return { ctl, order, submit, next };
}
type Tap = Parameters<Parameters<typeof t.test>[1]>[0];

const count = (xs: string[], x: string) => xs.filter((y) => y === x).length;

t.test("a light flow's burst goes ahead of a flood it arrives behind; with newFlowQuantum 0 it shares turns with it", async (t) => {
  for (const quantum of [undefined, 0]) {
    const { order, submit, next } = harness(t, quantum === undefined ? {} : { fairness: { newFlowQuantum: quantum } });
    submit({ flowId: 'tenant:a' }, 40);
    await flush();
    await next(10); // the flood has been served a while: its virtual time is the band's
    submit({ flowId: 'tenant:b' }, 5);
    submit({ flowId: 'tenant:c' }, 5);
    await flush();
    const before = order.length;
    await next(10);
    const after = order.slice(before);
    if (quantum === undefined) {
      t.same(after.slice().sort(), [...Array(5).fill('tenant:b'), ...Array(5).fill('tenant:c')], 'default: b and c, all ten, before a again');
      t.not(after[0], after[1], 'b and c take turns between them');
      await next(1);
      t.equal(order.at(-1), 'tenant:a', 'then the flood again');
    } else {
      t.ok(count(after, 'tenant:a') >= 3, `off: the flood keeps its turn among the three (${count(after, 'tenant:a')} of the next 10)`);
    }
  }
});

t.test('service a flow got while no one else waited is in order: it returns as a new flow once the flood has been served', async (t) => {
  const { ctl, order, submit, next } = harness(t, { fairness: { newFlowQuantum: 4 } });
  submit({ flowId: 'tenant:b' }, 5); // alone: one at once, four queued and served (its whole quantum) with no one else waiting
  await flush();
  await next(5);
  t.same(order, Array(5).fill('tenant:b'));
  t.equal(ctl.flowState('tenant:b', 1)!.credit, 0, 'quantum used up');
  submit({ flowId: 'tenant:a' }, 30);
  await flush();
  await next(3); // the flood is served three times
  submit({ flowId: 'tenant:b' }, 3);
  await flush();
  t.ok(ctl.flowState('tenant:b', 1)!.credit > 0, 'b is a new flow again');
  const before = order.length;
  await next(4);
  t.same(order.slice(before), [...Array(3).fill('tenant:b'), 'tenant:a'], "b's three first, then the flood");
});

t.test('a flood is not a new flow: a queue longer than the quantum loses the credit', async (t) => {
  const { ctl, order, submit, next } = harness(t, { fairness: { newFlowQuantum: 4 } });
  submit({ flowId: 'tenant:b' }, 1); // b is running: the slot is busy
  submit({ flowId: 'tenant:a' }, 3);
  t.ok(ctl.flowState('tenant:a', 1)!.credit > 0, 'three queued fit in a quantum of 4: a is a new flow');
  submit({ flowId: 'tenant:a' }, 2);
  t.equal(ctl.flowState('tenant:a', 1)!.credit, 0, 'five do not: a is a backlog');
  submit({ flowId: 'tenant:c' }, 8);
  t.equal(ctl.flowState('tenant:c', 1)!.credit, 0, 'nor is a burst of 8');
  await next(10);
  const after = order.slice(1);
  t.ok(count(after, 'tenant:a') >= 4 && count(after, 'tenant:c') >= 4, `a and c share turns (${after.join(' ')})`);
});

t.test('a flow that keeps coming back is charged for its turns: no more than its share over time', async (t) => {
  const { ctl, order, submit, next } = harness(t, {});
  submit({ flowId: 'tenant:a' }, 600);
  await flush();
  await next(20);
  const start = order.length;
  // b sends a burst of 3 whenever it has nothing queued: each burst would be a new flow's if it were free
  for (let i = 0; i < 400; i++) {
    if ((ctl.flowState('tenant:b', 1)?.queued ?? 0) === 0) submit({ flowId: 'tenant:b' }, 3);
    await next(1);
  }
  const served = order.slice(start);
  const share = count(served, 'tenant:b') / served.length;
  t.ok(share > 0.4 && share < 0.56, `b's share of 400 dispatches against a backlogged flood: ${share.toFixed(3)} (fair: 0.5)`);
});

t.test('turn priority first: a continuation of the flood goes ahead of a new flow; the new flow ahead of cold backlog', async (t) => {
  const { order, submit, next } = harness(t, {});
  submit({ flowId: 'tenant:a' }, 30);
  await flush();
  await next(5);
  submit({ flowId: 'tenant:b' }, 3);
  submit({ flowId: 'tenant:a', continuation: true });
  await flush();
  const before = order.length;
  await next(5);
  t.same(order.slice(before), ['tenant:a:warm', 'tenant:b', 'tenant:b', 'tenant:b', 'tenant:a']);
});

t.test('with fairness: tokens the quantum is cost: newFlowQuantum × the mean request cost of the band', async (t) => {
  // a's requests cost 100 (36 prompt + 64 output); the quantum is 4 → 400 tokens of work
  const { ctl, order, submit, next } = harness(t, { fairness: { mode: 'tokens', newFlowQuantum: 4 } });
  const small = { promptTokens: 36, maxTokens: 64 };
  submit({ flowId: 'tenant:a', ...small }, 30);
  await flush();
  await next(10);
  submit({ flowId: 'tenant:b', promptTokens: 236, maxTokens: 64 }); // 300: fits
  t.equal(ctl.flowState('tenant:b', 1)!.credit, 400, 'credit = 4 × the band mean (100)');
  submit({ flowId: 'tenant:c', promptTokens: 236, maxTokens: 64 }, 2); // 600: a backlog
  t.equal(ctl.flowState('tenant:c', 1)!.credit, 0, 'two requests of 300 are more than 400: no credit');
  await flush();
  const before = order.length;
  await next(1);
  t.same(order.slice(before), ['tenant:b'], 'b first');
  t.equal(ctl.flowState('tenant:b', 1)!.credit, 100, 'charged 300 of its credit');
});

t.test('fairness.newFlowQuantum is validated with its path', (t) => {
  const { errors } = validateFlowControl({ fairness: { newFlowQuantum: -1 } });
  t.ok(errors.some((e) => e.startsWith('flowControl.fairness.newFlowQuantum: must be a number in [0, 1000000], got -1')), errors.join('; '));
  const { value } = validateFlowControl({ fairness: 'requests' });
  t.equal(value!.fairness.newFlowQuantum, 16, 'default 16 with the shorthand');
  t.end();
});
