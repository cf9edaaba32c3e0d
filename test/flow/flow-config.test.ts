// The flowControl config block: the operator's exact snippet, defaults, and
// field-path error messages.
import t from 'tap';
import { parse } from 'yaml';
import { validateFlowControl, defaultFlowControl, parseDurationMs } from '../../src/flow/config.js';
import { OPERATOR_FLOW_BLOCK } from '../support/flow-util.js';


t.test("the issue's exact YAML block loads unchanged", (t) => {
  const doc = parse(OPERATOR_FLOW_BLOCK) as { flowControl: unknown };
  const { value, errors } = validateFlowControl(doc.flowControl);
  t.same(errors, []);
  t.ok(value);
  t.equal(value!.enabled, true);
  t.same(value!.bands, ['premium', 'standard', 'best-effort', 'batch']);
  t.same(value!.flows, [
    { id: 'tenant:payments', priority: 'premium', minShare: 0.3 },
    { id: 'tenant:internal-tools', priority: 'best-effort', minShare: 0 },
    { id: 'workload:nightly-batch', priority: 'batch', minShare: 0 },
  ]);
  t.same(value!.admission, { mode: 'probabilistic', maxUtilisation: 0.85, shedding: 'fair', targetMs: 1000, intervalMs: 10_000, reserveWindowMs: 1000 });
  t.equal(value!.defaultBand, 'standard');
  t.equal(value!.ttlMs, 60_000, 'TTL defaults to 60 s');
  t.equal(value!.trustHeaders, true);
  t.equal(value!.limits.maxRequests, Infinity);
  t.end();
});

t.test('absent block: flow control off; enabled: false keeps it off', (t) => {
  t.same(validateFlowControl(undefined), { value: defaultFlowControl(false), errors: [] });
  t.equal(validateFlowControl(null).value!.enabled, false);
  t.equal(validateFlowControl({ enabled: false }).value!.enabled, false);
  t.equal(validateFlowControl({}).value!.enabled, true, 'a present block defaults to enabled');
  t.end();
});

t.test('every optional field', (t) => {
  const { value, errors } = validateFlowControl(
    parse(`
enabled: true
bands: [gold, silver, bronze]
defaultBand: bronze
flows:
  - { id: "tenant:a", priority: gold, minShare: 0.5 }
  - { id: "tenant:b" }
admission: { mode: "off" }
limits:
  maxRequests: 1000
  maxBytes: 1048576
  bands:
    bronze: { maxRequests: 10 }
ttl: 30s
sweepInterval: 100ms
retryAfterSeconds: 3
saturation: { queueDepthThreshold: 8, kvThreshold: 0.8, maxConcurrency: 16, prefillBacklogTokens: 512 }
tenants: { "sk-alpha": a, "sk-beta": b }
trustHeaders: false
maxFlows: 64
queueCapacity: 512
`),
  );
  t.same(errors, []);
  const v = value!;
  t.same(v.bands, ['gold', 'silver', 'bronze']);
  t.equal(v.defaultBand, 'bronze');
  t.same(v.flows[1], { id: 'tenant:b', priority: 'bronze', minShare: 0 }, 'undeclared priority = default band');
  t.equal(v.admission.mode, 'off');
  t.same(v.limits, { maxRequests: 1000, maxBytes: 1048576, bands: { bronze: { maxRequests: 10, maxBytes: Infinity } } });
  t.equal(v.ttlMs, 30_000);
  t.equal(v.sweepIntervalMs, 100);
  t.equal(v.retryAfterSeconds, 3);
  t.same(v.saturation, { queueDepthThreshold: 8, kvThreshold: 0.8, maxConcurrency: 16, prefillBacklogTokens: 512 });
  t.same(v.tenants, { 'sk-alpha': 'a', 'sk-beta': 'b' });
  t.equal(v.trustHeaders, false);
  t.equal(v.maxFlows, 64);
  t.equal(v.queueCapacity, 512);
  t.end();
});

t.test('errors name the field path and the reason, all at once', (t) => {
  const { value, errors } = validateFlowControl({
    enabled: 'yes',
    flows: [
      { id: 'tenant:ok', priority: 'premium', minShare: 0.2 },
      { id: 'tenant:x', priority: 'premium', minShare: 1.5 },
      { id: 'bad id!', priority: 'platinum' },
      'nope',
      { id: 'tenant:ok', extra: 1 },
    ],
    admission: { mode: 'random', maxUtilisation: 0 },
    limits: { maxRequests: -1, bands: { gold: {} } },
    ttl: 'forever',
    tenants: { 'sk-secret-key': 42 },
    colour: 'blue',
  });
  t.equal(value, undefined);
  const expected = [
    'flowControl.colour: unknown field',
    'flowControl.enabled: must be true or false, got "yes"',
    'flowControl.flows[1].minShare: must be a number in [0, 1], got 1.5',
    'flowControl.flows[2].id: must be a flow id',
    'flowControl.flows[2].priority: must be one of the bands (premium, standard, best-effort, batch), got "platinum"',
    'flowControl.flows[3]: must be an object',
    'flowControl.flows[4].extra: unknown field',
    'flowControl.flows[4].id: duplicate flow id "tenant:ok"',
    'flowControl.admission.mode: must be one of probabilistic, utilisation, off, got "random"',
    'flowControl.admission.maxUtilisation: must be a number in (0, 1], got 0',
    'flowControl.limits.maxRequests: must be a positive integer',
    'flowControl.limits.bands.gold: unknown band',
    'flowControl.ttl: must be a duration',
    'flowControl.tenants[key sk-s…]: must be a tenant id',
  ];
  for (const e of expected) t.ok(errors.some((x) => x.startsWith(e)), e);
  t.notOk(errors.some((x) => x.includes('sk-secret-key')), 'API keys are never echoed');
  t.end();
});

t.test('admission.target and admission.interval: durations, the interval at least the target', (t) => {
  const ok = validateFlowControl({ admission: { mode: 'utilisation', target: '250ms', interval: 2 } });
  t.same(ok.errors, []);
  t.same(ok.value!.admission, { mode: 'utilisation', maxUtilisation: 0.85, shedding: 'fair', targetMs: 250, intervalMs: 2000, reserveWindowMs: 1000 });
  const bad = validateFlowControl({ admission: { target: '5s', interval: '1s' } });
  t.same(bad.errors, ['flowControl.admission.interval: must be at least admission.target (5000 ms), got 1000 ms']);
  const worse = validateFlowControl({ admission: { target: 'soon', interval: -1 } });
  t.ok(worse.errors.some((e) => e.startsWith('flowControl.admission.target: must be a duration')), worse.errors.join('; '));
  t.ok(worse.errors.some((e) => e.startsWith('flowControl.admission.interval: must be a duration')), worse.errors.join('; '));
  t.end();
});

t.test('admission.reserveWindow: a duration, 0 turns the reserve off', (t) => {
  t.equal(validateFlowControl({ admission: { reserveWindow: 0 } }).value!.admission.reserveWindowMs, 0);
  t.equal(validateFlowControl({ admission: { reserveWindow: '250ms' } }).value!.admission.reserveWindowMs, 250);
  t.equal(validateFlowControl({ admission: { reserveWindow: 2 } }).value!.admission.reserveWindowMs, 2000);
  const bad = validateFlowControl({ admission: { reserveWindow: -1 } });
  t.ok(bad.errors.some((e) => e.startsWith('flowControl.admission.reserveWindow: must be a duration')), bad.errors.join('; '));
  const tiny = validateFlowControl({ admission: { reserveWindow: 1e-10 } });
  t.same(tiny.errors, ['flowControl.admission.reserveWindow: must be 0 (off) or a duration of at least 1 ms'], 'a window under 1 ms is refused (it could not be printed back as a duration)');
  t.end();
});

t.test('minShares of one band may not add up to more than 1; custom path prefix', (t) => {
  const { errors } = validateFlowControl(
    { flows: [{ id: 'a', priority: 'premium', minShare: 0.6 }, { id: 'b', priority: 'premium', minShare: 0.6 }] },
    'spec.flowControl',
  );
  t.same(errors, ['spec.flowControl.flows: the minShare values of band "premium" add up to 1.2, more than 1']);
  t.same(validateFlowControl([1]).errors, ['flowControl: must be an object, got a list']);
  t.end();
});

t.test('durations', (t) => {
  t.equal(parseDurationMs(60), 60_000);
  t.equal(parseDurationMs('250ms'), 250);
  t.equal(parseDurationMs('2m'), 120_000);
  t.equal(parseDurationMs('1.5s'), 1500);
  t.ok(Number.isNaN(parseDurationMs('-1s')));
  t.ok(Number.isNaN(parseDurationMs(-1)));
  t.ok(Number.isNaN(parseDurationMs({})));
  t.end();
});

t.test('one staleness setting: saturation.staleAfter / staleAfterMs are errors pointing at dataLayer.staleAfterMs', (t) => {
  for (const key of ['staleAfter', 'staleAfterMs']) {
    const { value, errors } = validateFlowControl({ saturation: { maxConcurrency: 4, [key]: key === 'staleAfter' ? '2s' : 2000 } });
    t.equal(value, undefined, key);
    t.same(errors.length, 1, errors.join('\n'));
    t.match(errors[0], new RegExp(`^flowControl\\.saturation\\.${key}: removed: .*dataLayer\\.staleAfterMs`), key);
  }
  t.notOk('staleAfterMs' in validateFlowControl({}).value!.saturation, 'no staleness field in the validated config');
  t.end();
});

t.test('trustHeaders: defaults to true without API-key tenants, to false with them; explicit values win', (t) => {
  t.equal(validateFlowControl({}).value!.trustHeaders, true, 'no tenants: headers trusted');
  t.equal(validateFlowControl({ tenants: {} }).value!.trustHeaders, true, 'empty tenants: headers trusted');
  t.equal(validateFlowControl({ tenants: { 'key-a': 'a' } }).value!.trustHeaders, false, 'tenants: identity from the key');
  t.equal(validateFlowControl({ tenants: { 'key-a': 'a' }, trustHeaders: true }).value!.trustHeaders, true, 'a gateway that authenticates');
  t.equal(validateFlowControl({ trustHeaders: false }).value!.trustHeaders, false);
  t.end();
});

t.test('a validated block passes through validateFlowControl unchanged', (t) => {
  const v = validateFlowControl({ flows: [{ id: 'tenant:a', priority: 'premium' }], ttl: '5s' }).value!;
  const again = validateFlowControl(v);
  t.equal(again.value, v, 'the same object');
  t.same(again.errors, []);
  t.end();
});
