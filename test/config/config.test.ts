// Config loading and validation: defaults, every problem reported at once
// with its field path, flowControl validated with the rest, and the CLI's exit code 2.
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { loadConfigFile, parseConfig, quickConfig } from '../../src/config/load.js';
import { ConfigError } from '../../src/errors.js';
import { registry } from '../../src/scheduler/plugins/index.js';

const fixture = (f: string) => fileURLToPath(new URL(`../fixtures/${f}`, import.meta.url));
const validate = (kind: 'filter' | 'scorer' | 'picker', s: { type: string; params: Record<string, unknown> }) =>
  registry.validate(kind, s.type, s.params);

t.test('a valid file loads with defaults filled in', async (t) => {
  const c = await loadConfigFile(fixture('router-valid.yaml'), validate);
  t.equal(c.pools.length, 2);
  t.same(c.pools[0].endpoints[0], { name: 'a0', url: 'http://127.0.0.1:9001', role: 'both' });
  t.same(c.pools[0].endpoints[1], { name: 'a1', url: 'http://127.0.0.1:9002', role: 'decode', revision: 'r2' });
  t.same(c.pools[1].endpoints[0].capacity, { gpuBlocks: 100000, cpuBlocks: 50000, diskBlocks: 0 });
  t.equal(c.pools[1].engine, 'sglang');
  t.same(c.scheduling.scorers.map((s) => [s.type, s.weight]), [['prefix-cache', 3], ['queue', 2], ['kv-cache-utilization', 2]]);
  t.same(c.scheduling.filters.map((f) => f.type), ['model', 'healthy', 'role', 'session-affinity'], 'default filters');
  t.equal(c.scheduling.picker.type, 'max-score');
  t.equal(c.limits.maxBodyBytes, 1048576);
  t.equal(c.limits.requestBodyTimeoutMs, 30000, 'default body timeout');
  t.equal(c.dataLayer.scrapeIntervalMs, 50, 'default scrape interval');
  t.equal(c.dataLayer.staleAfterMs, 2000, 'default staleness');
  t.equal(c.proxy.maxRetries, 2);
  t.same(c.flowControl?.flows, [{ id: 'tenant:payments', priority: 'premium', minShare: 0.3 }], 'flowControl validated with the rest');
  t.equal(c.flowControl?.ttlMs, 2000, 'durations converted');
  t.equal(c.flowControl?.defaultBand, 'standard', 'flowControl defaults filled');
});

t.test('the minimal config: defaults everywhere', async (t) => {
  const c = parseConfig('apiVersion: switchyard/v1\nkind: Router\npools:\n  - { name: p, models: [m], endpoints: [{ url: "http://10.0.0.5:8000/" }] }\n', validate);
  t.same(c.listen, { host: '127.0.0.1', port: 8000 });
  t.equal(c.pools[0].endpoints[0].name, '10.0.0.5:8000', 'name defaults to host:port');
  t.equal(c.pools[0].endpoints[0].url, 'http://10.0.0.5:8000', 'trailing slash dropped');
  t.equal(c.pools[0].engine, 'vllm');
  t.equal(c.pools[0].accelerator, 'nvidia');
  t.equal(c.flowControl, undefined);
});

t.test('every problem is reported at once, each with its field path', async (t) => {
  const err = await loadConfigFile(fixture('router-invalid.yaml'), validate).then(
    () => null,
    (e: unknown) => e,
  );
  t.ok(err instanceof ConfigError, 'ConfigError');
  const issues = (err as ConfigError).issues.map((i) => `${i.path}: ${i.message}`);
  const expect: [string, RegExp][] = [
    ['apiVersion', /must be "switchyard\/v1"/],
    ['listen.port', /integer in \[0, 65535\]/],
    ['pools[0].engine', /one of: vllm, sglang/],
    ['pools[0].models', /at least one model/],
    ['pools[0].endpoints[1].url', /must be an http\(s\) URL/],
    ['pools[0].endpoints[2].name', /duplicate endpoint name "a0"/],
    ['pools[0].endpoints[2].role', /one of: both, prefill, decode, encode/],
    ['pools[1].name', /duplicate pool name "p1"/],
    ['pools[1].endpoints', /is required/],
    ['scheduling.scorers[0].weight', /number in \[0/],
    ['scheduling.scorers[0]', /params.blockSize must be an integer/],
    ['scheduling.scorers[1]', /unknown scorer type "telepathy"/],
    ['scheduling.picker', /params.epsilon/],
    ['proxy.maxRetries', /integer in \[0, 10\]/],
    ['loging', /unknown top-level field/],
  ];
  for (const [path, re] of expect) {
    t.ok(issues.some((i) => i.startsWith(`${path}: `) && re.test(i)), `${path} ${re}`);
  }
  t.equal(issues.length, expect.length, `exactly the expected problems:\n${issues.join('\n')}`);
  t.match((err as Error).message, /pools\[0\]\.endpoints\[1\]\.url: must be an http\(s\) URL/);
});

t.test('YAML syntax errors name the line', async (t) => {
  const err = await loadConfigFile(fixture('router-syntax.yaml')).catch((e: unknown) => e);
  t.ok(err instanceof ConfigError);
  t.match((err as Error).message, /line \d+, column \d+: YAML syntax error/);
  const missing = await loadConfigFile(fixture('does-not-exist.yaml')).catch((e: unknown) => e);
  t.match((missing as Error).message, /cannot read/);
});

t.test('not a mapping, wrong types', async (t) => {
  t.throws(() => parseConfig('- 1\n- 2\n'), ConfigError);
  t.throws(() => parseConfig('apiVersion: switchyard/v1\nkind: Router\npools: 5\n'), { message: /pools: must be a list/ });
  t.throws(() => parseConfig('apiVersion: switchyard/v1\nkind: Router\n'), { message: /pools: is required/ });
  t.throws(() => quickConfig(['not a url'], 'm', 'vllm'), { message: /pools\[0\]\.endpoints\[0\]\.url: must be an http\(s\) URL/ });
  const q = quickConfig(['http://127.0.0.1:9', 'http://127.0.0.1:10'], 'm', 'sglang');
  t.same(q.pools[0].endpoints.map((e) => e.name), ['e0', 'e1']);
});

t.test('--upstream with a bad port: the message names the port and the valid range', async (t) => {
  for (const [url, port] of [
    ['http://127.0.0.1:90001', '90001'],
    ['http://[::1]:65536', '65536'],
    ['https://engine.local:80a', '80a'],
  ]) {
    t.throws(() => quickConfig([url!], 'm', 'vllm'), { message: new RegExp(`pools\\[0\\]\\.endpoints\\[0\\]\\.url: port "${port}" is not a valid port: it must be an integer 1–65535.*${url!.replace(/[.[\]]/g, '\\$&')}`) }, url);
  }
  // the same in a config file
  t.throws(() => parseConfig('apiVersion: switchyard/v1\nkind: Router\npools: [{ name: p, models: [m], endpoints: [{ url: "http://10.0.0.5:123456" }] }]\n'), {
    message: /pools\[0\]\.endpoints\[0\]\.url: port "123456" is not a valid port/,
  });
  // other bad URLs keep the general message; a good port still loads
  t.throws(() => quickConfig(['http://127.0.0.1:8000/v1'], 'm', 'vllm'), { message: /must be an http\(s\) URL with no path/ });
  t.equal(quickConfig(['http://127.0.0.1:65535'], 'm', 'vllm').pools[0].endpoints[0].url, 'http://127.0.0.1:65535');
});

t.test('switchyard serve: exit code 2 and every problem on stderr', async (t) => {
  const bin = fileURLToPath(new URL('../../bin/switchyard.js', import.meta.url));
  const r = spawnSync(process.execPath, [bin, 'serve', '--config', fixture('router-invalid.yaml')], { encoding: 'utf8', timeout: 20000 });
  t.equal(r.status, 2, 'exit code 2');
  t.match(r.stderr, /^pools\[0\]\.endpoints\[1\]\.url: must be an http\(s\) URL/m);
  t.match(r.stderr, /loging: unknown top-level field/);
  const bad = spawnSync(process.execPath, [bin, 'serve', '--port', 'x', '--engine', 'foo'], { encoding: 'utf8', timeout: 20000 });
  t.equal(bad.status, 2, 'bad options: exit code 2');
  t.match(bad.stderr, /^--port: must be an integer/m);
  t.match(bad.stderr, /^--engine: must be one of/m);
  const flow = spawnSync(process.execPath, [bin, 'serve', '--config', fixture('router-flow-invalid.yaml'), '--port', '0'], { encoding: 'utf8', timeout: 20000 });
  t.equal(flow.status, 2, 'invalid flowControl block: exit code 2');
  t.match(flow.stderr, /flowControl\.flows\[0\]\.minShare/);
  const help = spawnSync(process.execPath, [bin, 'serve', '--help'], { encoding: 'utf8', timeout: 20000 });
  t.equal(help.status, 0);
  t.match(help.stdout, /--upstream URL/);
});

t.test('a broken flowControl block is a config error at its field path (parseConfig passed it through unvalidated)', async (t) => {
  const base = 'apiVersion: switchyard/v1\nkind: Router\npools:\n  - { name: p, models: [m], endpoints: [{ url: "http://10.0.0.5:8000" }] }\n';
  const err = (() => {
    try {
      parseConfig(base + 'listen: { port: -1 }\nflowControl:\n  flows:\n    - { id: "tenant:x", minShare: 1.5 }\n  ttl: forever\n  colour: blue\n', validate);
    } catch (e) {
      return e;
    }
    return null;
  })();
  t.ok(err instanceof ConfigError, 'ConfigError');
  const issues = (err as ConfigError).issues.map((i) => `${i.path}: ${i.message}`);
  t.ok(issues.some((i) => i.startsWith('flowControl.flows[0].minShare: must be a number in [0, 1], got 1.5')), issues.join('\n'));
  t.ok(issues.some((i) => i.startsWith('flowControl.ttl: must be a duration')));
  t.ok(issues.some((i) => i.startsWith('flowControl.colour: unknown field')));
  t.ok(issues.some((i) => i.startsWith('listen.port: ')), 'with the problems elsewhere in the file');
  t.equal(issues.length, 4, issues.join('\n'));
  t.throws(() => parseConfig(base + 'flowControl: { saturation: { staleAfter: 2s } }\n'), {
    name: 'ConfigError',
    message: /flowControl\.saturation\.staleAfter: removed: .*dataLayer\.staleAfterMs/,
  });
  t.throws(() => parseConfig(base + 'flowControl: 5\n'), { name: 'ConfigError', message: /flowControl: must be an object/ });
  const ok = parseConfig(base + 'flowControl: { tenants: { key-a: a } }\n');
  t.equal(ok.flowControl?.enabled, true, 'a present block is enabled');
  t.equal(ok.flowControl?.trustHeaders, false, 'with API-key tenants, headers are not trusted by default');
  t.equal(parseConfig(base + 'flowControl:\n').flowControl, undefined, 'an empty block is absent');
});
