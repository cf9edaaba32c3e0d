// deploy/grafana/switchyard-dashboard.json: every metric its queries use
// exists in a live router's /metrics (flow control and tracing on, and a
// second router with an HA lease, so their families exist), and the JSON has
// the shape Grafana imports.
import t from 'tap';
import { readFileSync } from 'node:fs';
import { startHttpReceiver } from '../support/otlp-receiver.js';
import { startTestRouter } from '../support/router-util.js';

const dashboard = JSON.parse(readFileSync(new URL('../../deploy/grafana/switchyard-dashboard.json', import.meta.url), 'utf8'));

interface Panel {
  id: number;
  type: string;
  title: string;
  gridPos: { h: number; w: number; x: number; y: number };
  datasource?: { uid: string };
  targets?: { refId: string; expr: string }[];
  panels?: Panel[];
}

function allPanels(ps: Panel[]): Panel[] {
  return ps.flatMap((p) => [p, ...allPanels(p.panels ?? [])]);
}

// PromQL words that are not metric names
const PROMQL = new Set(
  (
    'sum min max avg count stddev stdvar topk bottomk quantile count_values group by without on ignoring group_left group_right bool and or unless offset ' +
    'rate irate increase delta idelta deriv histogram_quantile clamp_min clamp_max clamp abs ceil floor round label_values label_replace label_join ' +
    'vector scalar time absent absent_over_time avg_over_time max_over_time min_over_time sum_over_time count_over_time last_over_time inf nan'
  ).split(' '),
);

/** The metric (series) names a PromQL expression reads. */
export function metricNames(expr: string): string[] {
  const s = expr
    .replace(/label_values\(([^,()]+),\s*\w+\)/g, '$1') // a variable query: label_values(metric, label)
    .replace(/"(?:[^"\\]|\\.)*"/g, '""') // string literals
    .replace(/\{[^}]*\}/g, ' ') // label matchers
    .replace(/\[[^\]]*\]/g, ' ') // range selectors
    .replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, ' ') // label lists
    .replace(/\$\w+/g, ' '); // dashboard variables
  const names = new Set<string>();
  for (const m of s.matchAll(/[A-Za-z_:][A-Za-z0-9_:]*/g)) {
    const w = m[0];
    if (PROMQL.has(w) || /^\d/.test(w)) continue;
    if (/^[0-9.e+-]+$/.test(w)) continue;
    names.add(w);
  }
  return [...names];
}

t.test('the dashboard is an importable Grafana dashboard', async (t) => {
  t.equal(typeof dashboard.title, 'string');
  t.equal(dashboard.uid, 'switchyard-router');
  t.ok(dashboard.schemaVersion >= 30, 'a current schema version');
  const vars = dashboard.templating.list.map((v: { name: string }) => v.name);
  t.ok(vars.includes('datasource'), 'the data source is a variable (no hard-coded uid)');
  const panels = allPanels(dashboard.panels);
  const ids = panels.map((p) => p.id);
  t.equal(new Set(ids).size, ids.length, 'panel ids are unique');
  for (const p of panels) {
    t.ok(p.gridPos.x + p.gridPos.w <= 24, `${p.title}: fits the 24-column grid`);
    if (p.type === 'row') continue;
    t.equal(p.datasource?.uid, '${datasource}', `${p.title}: uses the data source variable`);
    t.ok((p.targets ?? []).length > 0, `${p.title}: has a query`);
    for (const q of p.targets ?? []) {
      let depth = 0;
      for (const c of q.expr) {
        if (c === '(') depth++;
        if (c === ')') depth--;
        if (depth < 0) break;
      }
      t.equal(depth, 0, `${p.title} ${q.refId}: balanced parentheses`);
    }
  }
  const titles = panels.map((p) => p.title.toLowerCase()).join('\n');
  for (const want of ['requests', 'errors', 'time to first token', 'inter-token', 'prefix', 'band', 'sheds', 'ready', 'outcome', 'failure ratio', 'duration', 'upstream errors', 'ha:', 'sessions', 'responses']) t.match(titles, want, `a panel for ${want}`);
});

t.test('metricNames reads the metric names of a query', async (t) => {
  t.same(
    metricNames('histogram_quantile(0.95, sum by (le, endpoint) (rate(switchyard_upstream_ttft_seconds_bucket{instance=~"$instance"}[$__rate_interval])))'),
    ['switchyard_upstream_ttft_seconds_bucket'],
  );
  t.same(metricNames('sum(rate(a_total{x="y"}[5m])) / clamp_min(sum(rate(b_total[5m])), 1e-9)').sort(), ['a_total', 'b_total']);
  t.same(metricNames('label_values(switchyard_build_info, instance)'), ['switchyard_build_info']);
});

t.test('every metric the dashboard queries exists in a live router', async (t) => {
  const rx = await startHttpReceiver(t);
  const { url } = await startTestRouter(t, {
    n: 2,
    extra: {
      flowControl: { enabled: true },
      tracing: { enabled: true, endpoint: rx.url, sampleRatio: 1 },
    },
  });
  // some traffic, a stream (inter-token latency) and an error, so every family has samples
  const post = (body: object) =>
    fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) }).then((r) => r.text());
  await post({ model: 'open-model', messages: [{ role: 'user', content: 'hello' }], max_tokens: 4 });
  await post({ model: 'open-model', messages: [{ role: 'user', content: 'hello' }], max_tokens: 6, stream: true });
  await post({ model: 'no-such-model', messages: [] });
  // a second router with a standby pair's lease (ha), so the HA panels' families are there too
  const { startRedis } = await import('../support/redis-util.js');
  const redis = await startRedis(t);
  const ha = await startTestRouter(t, { n: 1, extra: { ha: { mode: 'standby', redis: redis.url } } });
  const text = (await (await fetch(`${url}/metrics`)).text()) + '\n' + (await (await fetch(`${ha.url}/metrics`)).text());
  const types = new Map<string, string>();
  for (const m of text.matchAll(/^# TYPE (\S+) (\S+)$/gm)) types.set(m[1]!, m[2]!);
  const samples = new Set<string>();
  for (const m of text.matchAll(/^([A-Za-z_:][A-Za-z0-9_:]*)[{ ]/gm)) samples.add(m[1]!);
  const used = new Set<string>();
  for (const p of allPanels(dashboard.panels)) for (const q of p.targets ?? []) for (const n of metricNames(q.expr)) used.add(n);
  for (const q of dashboard.templating.list) if (typeof q.definition === 'string') for (const n of metricNames(q.definition)) used.add(n);
  t.ok(used.size >= 10, `the dashboard reads ${used.size} metrics`);
  for (const name of used) {
    const family = name.replace(/_(bucket|sum|count)$/, '');
    const type = types.get(name) ?? types.get(family);
    t.ok(type, `${name}: a family on /metrics`);
    if (name !== family && !types.has(name)) t.equal(type, 'histogram', `${name}: ${family} is a histogram`);
    // a labelled family without observations yet has no sample lines (e.g. rejections): its TYPE line is there
    if (!samples.has(name)) t.comment(`${name}: no samples yet in this run`);
  }
  for (const must of ['switchyard_requests_total', 'switchyard_upstream_ttft_seconds_bucket', 'switchyard_upstream_itl_seconds_bucket', 'switchyard_flow_band_queue_length', 'switchyard_endpoint_ready', 'switchyard_request_outcomes_total', 'switchyard_request_duration_seconds_bucket', 'switchyard_ha_active']) {
    t.ok(samples.has(must), `${must}: has samples after the traffic`);
  }
});
