// Classification: fairness id from API key / headers, band capped at the flow's declared band.
import t from 'tap';
import { Classifier, ANONYMOUS_FLOW } from '../../src/flow/classify.js';
import { validateFlowControl } from '../../src/flow/config.js';

function classifier(extra: Record<string, unknown> = {}) {
  const { value, errors } = validateFlowControl({
    flows: [
      { id: 'tenant:payments', priority: 'premium', minShare: 0.3 },
      { id: 'tenant:internal-tools', priority: 'best-effort' },
      { id: 'workload:nightly-batch', priority: 'batch' },
    ],
    tenants: { 'sk-pay': 'payments' },
    ...extra,
  });
  if (!value) throw new Error(errors.join('\n'));
  return new Classifier(value);
}

const h = (headers: Record<string, string>) => (name: string) => headers[name];

t.test('fairness id sources, in order (headers trusted: a gateway in front authenticates)', (t) => {
  const c = classifier({ trustHeaders: true });
  t.equal(c.flowId(h({ authorization: 'Bearer sk-pay', 'x-tenant-id': 'other' })), 'tenant:payments', 'API key wins');
  t.equal(c.flowId(h({ authorization: 'bearer   sk-pay ' })), 'tenant:payments', 'scheme is case-insensitive');
  t.equal(c.flowId(h({ authorization: 'Bearer unknown', 'x-tenant-id': 'internal-tools' })), 'tenant:internal-tools');
  t.equal(c.flowId(h({ 'x-llm-d-inference-fairness-id': 'team-7' })), 'team-7');
  t.equal(c.flowId(h({ 'x-workload-id': 'nightly-batch' })), 'workload:nightly-batch');
  t.equal(c.flowId(h({})), ANONYMOUS_FLOW);
  t.equal(c.flowId(h({ 'x-tenant-id': 'bad value with spaces' })), ANONYMOUS_FLOW, 'malformed ids are ignored');
  t.equal(c.flowId(h({ 'x-tenant-id': 'x'.repeat(200) })), ANONYMOUS_FLOW, 'overlong ids are ignored');
  t.end();
});

t.test('trustHeaders: false ignores x-tenant-id and tenant ids in other headers', (t) => {
  const c = classifier({ trustHeaders: false });
  t.equal(c.flowId(h({ 'x-tenant-id': 'payments' })), ANONYMOUS_FLOW);
  t.equal(c.flowId(h({ 'x-llm-d-inference-fairness-id': 'tenant:payments' })), ANONYMOUS_FLOW);
  t.equal(c.flowId(h({ 'x-tenant-id': 'payments', 'x-workload-id': 'w1' })), 'workload:w1');
  t.equal(c.flowId(h({ authorization: 'Bearer sk-pay' })), 'tenant:payments', 'API keys still map');
  t.end();
});

t.test('band: declared band, lowered by x-priority, never raised', (t) => {
  const c = classifier({ trustHeaders: true });
  const premium = c.bandIndex('premium');
  const standard = c.bandIndex('standard');
  const bestEffort = c.bandIndex('best-effort');
  const batch = c.bandIndex('batch');
  t.same([premium, standard, bestEffort, batch], [0, 1, 2, 3]);
  t.equal(c.classify(h({ 'x-tenant-id': 'payments' })).band, premium);
  t.equal(c.classify(h({ 'x-tenant-id': 'payments', 'x-priority': 'batch' })).band, batch, 'a flow may ask for less');
  t.equal(c.classify(h({ 'x-tenant-id': 'internal-tools', 'x-priority': 'premium' })).band, bestEffort, 'capped at declared');
  t.equal(c.classify(h({ 'x-tenant-id': 'someone-new', 'x-priority': 'premium' })).band, standard, 'undeclared: default band cap');
  t.equal(c.classify(h({ 'x-tenant-id': 'someone-new', 'x-priority': 'Batch ' })).band, batch);
  t.equal(c.classify(h({ 'x-tenant-id': 'payments', 'x-priority': 'urgent!!' })).band, premium, 'unknown priority ignored');
  t.equal(c.classify(h({ 'x-workload-id': 'nightly-batch' })).band, batch);
  t.end();
});

t.test('with API-key tenants and trustHeaders unset, identity comes from the key; headers may lower a band, never raise it', (t) => {
  const c = classifier({ flows: [
    { id: 'tenant:payments', priority: 'premium' },
    { id: 'workload:vip', priority: 'premium' },
    { id: 'workload:nightly-batch', priority: 'batch' },
  ] });
  const [premium, standard, batch] = [c.bandIndex('premium'), c.bandIndex('standard'), c.bandIndex('batch')];
  t.same(c.classify(h({ 'x-tenant-id': 'payments' })), { flowId: ANONYMOUS_FLOW, band: standard }, 'no key: x-tenant-id is not believed');
  t.same(c.classify(h({ authorization: 'Bearer nope', 'x-tenant-id': 'payments' })), { flowId: ANONYMOUS_FLOW, band: standard }, 'a wrong key neither');
  t.same(c.classify(h({ 'x-llm-d-inference-fairness-id': 'tenant:payments' })), { flowId: ANONYMOUS_FLOW, band: standard });
  t.same(c.classify(h({ authorization: 'Bearer sk-pay' })), { flowId: 'tenant:payments', band: premium }, 'the key maps');
  t.same(c.classify(h({ authorization: 'Bearer sk-pay', 'x-priority': 'batch' })), { flowId: 'tenant:payments', band: batch }, 'and may ask for less');
  t.same(c.classify(h({ 'x-workload-id': 'vip' })), { flowId: 'workload:vip', band: standard }, 'a header-claimed premium workload stays at the default band');
  t.same(c.classify(h({ 'x-workload-id': 'nightly-batch' })), { flowId: 'workload:nightly-batch', band: batch }, 'a header may lower the band');
  t.same(c.classify(h({ 'x-priority': 'premium' })), { flowId: ANONYMOUS_FLOW, band: standard }, 'x-priority never raises');
  t.end();
});
