// Turn priority (docs/flow-control.md, "Turn priority"): inside a band, a
// request that continues an active conversation (RequestInfo.continuation) is
// dispatched ahead of cold ones; a cold request passed over for
// turnPriority.maxColdWait goes first (aging: it never starves). Real
// FlowQueues, real FlowController and FlowControlGate, driven with
// RequestInfo objects built here (the router sets `continuation` from its
// session tracking).
import t from 'tap';
import { FlowController, type AdmitResult } from '../../src/flow/controller.js';
import { validateFlowControl, type FlowControlConfig } from '../../src/flow/config.js';
import { FlowControlGate } from '../../src/flow/gate.js';
import type { RequestInfo } from '../../src/admission.js';
import { flush } from '../support/flow-util.js';

function config(raw: Record<string, unknown>): FlowControlConfig {
  const { value, errors } = validateFlowControl(raw);
  if (!value) throw new Error(errors.join('\n'));
  return value;
}

/** One slot; the test releases it to let the next request through. */
function harness(raw: Record<string, unknown>) {
  const clock = { now: 0 };
  let ctl!: FlowController;
  ctl = new FlowController({ config: config({ admission: { mode: 'off' }, ...raw }), utilisation: () => ctl.inFlight, now: () => clock.now, sweepTimer: false });
  t.teardown(() => ctl.close());
  const order: string[] = [];
  const tickets: number[] = [];
  const submit = (name: string, flowId: string, continuation: boolean) => {
    const r = ctl.admit({ flowId, band: 1, bytes: 1, continuation });
    const done = (x: AdmitResult) => {
      if (x.ok) {
        order.push(name);
        tickets.push(x.ticket);
      } else order.push(`${name}:${x.reason}`);
    };
    if (r instanceof Promise) r.then(done);
    else done(r);
  };
  const next = async () => {
    ctl.release(tickets.shift()!);
    await flush();
    await flush();
  };
  return { ctl, clock, order, submit, next };
}

t.test('a continuation goes ahead of cold requests queued before it, across flows and inside one', async (t) => {
  const { order, submit, next } = harness({});
  submit('busy', 'tenant:x', false);
  submit('c1', 'tenant:a', false);
  submit('c2', 'tenant:b', false);
  submit('c3', 'tenant:c', false);
  submit('w1', 'tenant:c', true);
  submit('c4', 'tenant:d', false);
  submit('w2', 'tenant:a', true);
  await flush();
  t.same(order, ['busy']);
  for (let i = 0; i < 6; i++) await next();
  t.same(order.slice(1, 3).sort(), ['w1', 'w2'], 'both continuations first (between them, the fair order of their flows)');
  t.same(order.slice(3).sort(), ['c1', 'c2', 'c3', 'c4'], 'then the cold ones');
});

t.test('aging: a cold request passed over for maxColdWait goes ahead of continuations', async (t) => {
  const { order, submit, next, clock } = harness({ turnPriority: { maxColdWait: '100ms' } });
  submit('busy', 'tenant:x', false);
  submit('cold', 'tenant:a', false);
  for (let i = 0; i < 5; i++) submit(`w${i}`, 'tenant:agent', true);
  await flush();
  clock.now = 50;
  await next();
  t.same(order, ['busy', 'w0'], 'at 50 ms the continuation goes first');
  clock.now = 100;
  await next();
  t.same(order, ['busy', 'w0', 'cold'], 'at 100 ms the cold request has waited long enough: it goes next');
  await next();
  t.same(order.at(-1), 'w1', 'then continuations again');
});

t.test('aging never starves cold work under a steady stream of continuations', async (t) => {
  const { order, submit, next, clock } = harness({ turnPriority: { maxColdWait: '20ms' } });
  submit('busy', 'tenant:x', false);
  for (let i = 0; i < 10; i++) submit(`cold${i}`, `tenant:c${i % 3}`, false);
  for (let step = 0; step < 200; step++) {
    submit(`w${step}`, 'tenant:agent', true);
    submit(`v${step}`, 'tenant:agent2', true);
    clock.now += 5;
    await next();
  }
  const cold = order.filter((x) => x.startsWith('cold'));
  t.equal(cold.length, 10, `every cold request was dispatched (${cold.length})`);
  t.ok(order.indexOf('cold9') < 150, `the last one within ${order.indexOf('cold9')} dispatches`);
});

t.test('turnPriority.enabled: false keeps arrival order (FIFO inside a flow, fair across flows)', async (t) => {
  const { order, submit, next } = harness({ turnPriority: { enabled: false } });
  submit('busy', 'tenant:x', false);
  submit('c1', 'tenant:a', false);
  submit('w1', 'tenant:a', true);
  submit('c2', 'tenant:a', false);
  await flush();
  for (let i = 0; i < 3; i++) await next();
  t.same(order, ['busy', 'c1', 'w1', 'c2']);
});

t.test('through the gate: RequestInfo.continuation puts a turn ahead of cold work in its band', async (t) => {
  const u = { value: 1 };
  const gate = new FlowControlGate({ config: config({ admission: { mode: 'off' } }), utilisation: () => u.value });
  t.teardown(() => gate.close());
  const info = (requestId: string, tenant: string, continuation: boolean): RequestInfo => ({
    requestId,
    model: 'm',
    path: '/v1/chat/completions',
    body: { model: 'm', messages: [{ role: 'user', content: 'next step' }], max_tokens: 16 },
    headers: { 'x-tenant-id': tenant },
    bodyBytes: 120,
    promptBytes: 40,
    sessionKey: continuation ? `sess-${tenant}` : '',
    continuation,
  });
  const order: string[] = [];
  const admitted: unknown[] = [];
  const reqs = [info('cold-1', 'batchy', false), info('cold-2', 'other', false), info('turn-1', 'agent', true), info('cold-3', 'batchy', false)];
  const held = reqs.map((r) =>
    Promise.resolve(gate.admit(r, { aborted: false, onabort: null })).then((a) => {
      order.push(r.requestId);
      if (a.admitted) admitted.push(a.ticket);
    }),
  );
  await flush();
  t.same(order, [], 'all held while the pool is full');
  const ctl = gate.controller('m');
  t.equal(ctl.flowState('tenant:agent', 1)!.continuations, 1);
  u.value = 0.5; // room for one at a time: the controller grants one per turn of the event loop
  for (let i = 0; i < 4; i++) {
    ctl.pump();
    await flush();
  }
  await Promise.all(held);
  t.equal(order[0], 'turn-1', 'the continuation went first');
  t.same(order.slice(1).sort(), ['cold-1', 'cold-2', 'cold-3']);
  for (const tk of admitted) gate.release(tk, 'ok');
});

t.test('config: turnPriority defaults on, maxColdWait 2 s; bad values name the field', async (t) => {
  const cfg = config({});
  t.same(cfg.turnPriority, { enabled: true, maxColdWaitMs: 2000 });
  const bad = validateFlowControl({ turnPriority: { enabled: 'yes', maxColdWait: 'soon', extra: 1 } });
  t.match(bad.errors.join('\n'), /flowControl\.turnPriority/);
  t.match(bad.errors.join('\n'), /flowControl\.turnPriority\.maxColdWait: must be a duration/);
  t.match(bad.errors.join('\n'), /flowControl\.turnPriority\.enabled: must be true or false/);
  const big = validateFlowControl({ maxFlows: 40000 });
  t.match(big.errors.join('\n'), /flowControl\.maxFlows: must be at most 32764 with turnPriority enabled/);
  t.same(validateFlowControl({ maxFlows: 40000, turnPriority: { enabled: false } }).errors, []);
});
