// Cost fairness (docs/flow-control.md, "Cost fairness"): inside a band with
// `fairness: tokens`, flows share estimated tokens of work, not requests; a
// request with no usable estimate costs a documented default, never 0; a flow
// whose answers are longer than it declared is charged its real usage at
// release. Real FlowController over the native queues, and a real router over
// simulated engines for the usage the director reads from answers.
import t from 'tap';
import { FlowController, type AdmitResult, type FlowUsage } from '../../src/flow/controller.js';
import { validateFlowControl, type FlowControlConfig } from '../../src/flow/config.js';
import { FlowControlGate } from '../../src/flow/gate.js';
import { flush } from '../support/flow-util.js';
import { startTestRouter } from '../support/router-util.js';

function config(raw: Record<string, unknown>): FlowControlConfig {
  const { value, errors } = validateFlowControl(raw);
  if (!value) throw new Error(errors.join('\n'));
  return value;
}

interface Kind {
  flowId: string;
  promptTokens: number;
  maxTokens: number;
  /** Output tokens the "engine" produces (reported at release). */
  realOutput: number;
  band?: number;
}

/**
 * Every flow keeps a backlog of 3 in a pool of `slots`; requests end in
 * dispatch order and are released with their real usage. Returns requests and
 * real tokens (prompt + output) served per flow.
 */
async function run(raw: Record<string, unknown>, kinds: Kind[], steps: number, slots = 2) {
  let ctl!: FlowController;
  ctl = new FlowController({ config: config(raw), utilisation: () => ctl.inFlight / slots, now: () => 0, sweepTimer: false });
  const served = new Map<string, { requests: number; tokens: number }>(kinds.map((k) => [k.flowId, { requests: 0, tokens: 0 }]));
  const backlog = new Map<string, number>(kinds.map((k) => [k.flowId, 0]));
  const running: { ticket: number; usage: FlowUsage; k: Kind }[] = [];
  const submit = (k: Kind) => {
    backlog.set(k.flowId, backlog.get(k.flowId)! + 1);
    const r = ctl.admit({ flowId: k.flowId, band: k.band ?? 1, bytes: 1, promptTokens: k.promptTokens, maxTokens: k.maxTokens });
    const done = (x: AdmitResult) => {
      backlog.set(k.flowId, backlog.get(k.flowId)! - 1);
      if (x.ok) running.push({ ticket: x.ticket, k, usage: { promptTokens: k.promptTokens, maxTokens: k.maxTokens, uncached: 1, outputTokens: k.realOutput } });
    };
    if (r instanceof Promise) r.then(done);
    else done(r);
  };
  for (let step = 0; step < steps; step++) {
    for (const k of kinds) while (backlog.get(k.flowId)! < 3) submit(k);
    await flush();
    const r = running.shift();
    if (r !== undefined) {
      const s = served.get(r.k.flowId)!;
      s.requests++;
      s.tokens += r.k.promptTokens + Math.max(r.k.realOutput, 0);
      ctl.release(r.ticket, r.usage);
    }
  }
  ctl.close();
  return served;
}

const ADMIT_ALL = { admission: { mode: 'off', maxUtilisation: 1 } };

t.test('fairness: tokens shares tokens of work between a long-prompt and a short-prompt flow; requests shares requests', async (t) => {
  const kinds: Kind[] = [
    { flowId: 'tenant:long', promptTokens: 2048, maxTokens: 64, realOutput: 64 },
    { flowId: 'tenant:short', promptTokens: 64, maxTokens: 64, realOutput: 64 },
  ];
  const tokens = await run({ ...ADMIT_ALL }, kinds, 3000);
  const lt = tokens.get('tenant:long')!;
  const st = tokens.get('tenant:short')!;
  const ratio = lt.tokens / st.tokens;
  t.ok(ratio > 0.8 && ratio < 1.25, `tokens: served tokens long/short ${ratio.toFixed(3)} within 1.25:1 (requests ${lt.requests} vs ${st.requests})`);
  t.ok(st.requests > 10 * lt.requests, 'the short flow gets many more requests through');

  const requests = await run({ ...ADMIT_ALL, fairness: 'requests' }, kinds, 3000);
  const lr = requests.get('tenant:long')!;
  const sr = requests.get('tenant:short')!;
  t.ok(Math.abs(lr.requests - sr.requests) <= 2, `requests: equal request counts (${lr.requests} vs ${sr.requests})`);
  t.ok(lr.tokens / sr.tokens > 10, `so the long flow takes most tokens (${(lr.tokens / sr.tokens).toFixed(1)}×)`);
});

t.test('fairness per band: bands.batch: requests counts requests there while other bands count tokens', async (t) => {
  const kinds: Kind[] = [
    { flowId: 'tenant:long', promptTokens: 2048, maxTokens: 64, realOutput: 64, band: 3 },
    { flowId: 'tenant:short', promptTokens: 64, maxTokens: 64, realOutput: 64, band: 3 },
  ];
  const served = await run({ ...ADMIT_ALL, fairness: { mode: 'tokens', bands: { batch: 'requests' } } }, kinds, 1500);
  const l = served.get('tenant:long')!;
  const s = served.get('tenant:short')!;
  t.ok(Math.abs(l.requests - s.requests) <= 2, `batch counts requests: ${l.requests} vs ${s.requests}`);
  const ctl = new FlowController({ config: config({ fairness: { mode: 'tokens', bands: { batch: 'requests' } } }), utilisation: () => 0, sweepTimer: false });
  t.same([0, 1, 2, 3].map((b) => ctl.countsTokens(b)), [true, true, true, false]);
  ctl.close();
});

t.test('a request with no usable estimate costs fairness.defaultOutputTokens (never 0)', async (t) => {
  const kinds: Kind[] = [
    // no prompt, no max_tokens, output never reported: the default cost stands
    { flowId: 'tenant:unknown', promptTokens: 0, maxTokens: -1, realOutput: -1 },
    { flowId: 'tenant:known', promptTokens: 200, maxTokens: 50, realOutput: 50 },
  ];
  const served = await run({ ...ADMIT_ALL, fairness: { defaultOutputTokens: 1000 } }, kinds, 2000);
  const u = served.get('tenant:unknown')!.requests;
  const k = served.get('tenant:known')!.requests;
  t.ok(u > 100, `the unknown flow is served (${u})`);
  t.ok(k / u > 3.3 && k / u < 4.8, `costs 1000 vs 250: the known flow gets about 4× the requests (${(k / u).toFixed(2)})`);
});

t.test('the gate estimates from the request: prompt bytes / 4 (the body when the prompt is unknown), max_tokens, the default', async (t) => {
  const cfg = config({ fairness: { defaultOutputTokens: 300 }, admission: { mode: 'off' } });
  const u = { value: 1 };
  const gate = new FlowControlGate({ config: cfg, utilisation: () => u.value, now: () => 0 });
  t.teardown(() => gate.close());
  const ctl = gate.controller('m');
  const cases = [
    { tenant: 'p', promptBytes: 4000, body: { max_tokens: 24 }, cost: 1024 },
    { tenant: 'q', promptBytes: 4000, body: { max_completion_tokens: 10, max_tokens: 99 }, cost: 1010 },
    { tenant: 'r', promptBytes: 0, body: {}, cost: 100 + 300 }, // unparseable prompt: the 400-byte body; no max_tokens: the default
    { tenant: 's', promptBytes: 0, body: { max_tokens: 'lots' }, cost: 100 + 300 },
  ];
  for (const c of cases) {
    // queued while the pool is full, then dispatched alone (weight 1): its virtual time moves by its cost
    u.value = 1;
    const held = gate.admit({ model: 'm', headers: { 'x-tenant-id': c.tenant }, bodyBytes: 400, promptBytes: c.promptBytes, body: c.body }, { aborted: false, onabort: null });
    t.ok(held instanceof Promise, 'queued');
    const before = ctl.flowState(`tenant:${c.tenant}`, 1)!.pass;
    u.value = 0;
    ctl.pump();
    t.equal(((await held) as { admitted: boolean }).admitted, true);
    t.equal(ctl.flowState(`tenant:${c.tenant}`, 1)!.pass - before, c.cost, `tenant ${c.tenant} charged ${c.cost}`);
  }
});

t.test('a flow that declares tiny outputs and answers long ones is charged its real usage', async (t) => {
  const kinds: Kind[] = [
    { flowId: 'tenant:liar', promptTokens: 10, maxTokens: 1, realOutput: 1000 },
    { flowId: 'tenant:honest', promptTokens: 10, maxTokens: 1000, realOutput: 1000 },
    { flowId: 'tenant:small', promptTokens: 10, maxTokens: 10, realOutput: 10 },
  ];
  const served = await run({ ...ADMIT_ALL }, kinds, 6000, 1);
  const liar = served.get('tenant:liar')!.tokens;
  const honest = served.get('tenant:honest')!.tokens;
  const small = served.get('tenant:small')!.tokens;
  t.ok(liar / honest < 1.25 && honest / liar < 1.25, `liar and honest served alike (${liar} vs ${honest} tokens)`);
  t.ok(liar / small < 1.25 && small / liar < 1.25, `and the small flow gets its share of tokens (${small})`);
});

t.test('through the router: the director reads usage.completion_tokens from answers and the flow learns its output', async (t) => {
  const { router, url } = await startTestRouter(t, { extra: { flowControl: { enabled: true } } });
  const send = async (body: Record<string, unknown>) => {
    const r = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-tenant-id': 'agent' },
      body: JSON.stringify({ model: 'open-model', prompt: 'count the sheep', ...body }),
    });
    t.equal(r.status, 200);
    await r.text();
  };
  await send({ max_tokens: 7 });
  const gate = router.core.gate as FlowControlGate;
  t.ok(gate.wantsUsage, 'a gate with a tokens band asks for usage');
  const ctl = gate.controller('open-model');
  t.equal(ctl.flowState('tenant:agent', 1)!.learntOutput, 7, 'learnt from a JSON answer');
  await send({ max_tokens: 15, stream: true, stream_options: { include_usage: true } });
  t.equal(ctl.flowState('tenant:agent', 1)!.learntOutput, 7 + 0.25 * (15 - 7), 'and from a stream that asked for usage');
});
