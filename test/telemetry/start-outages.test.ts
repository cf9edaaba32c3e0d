// External dependencies that are not there when a real `switchyard serve`
// starts (needs dist/): a Kubernetes API server (discovery), an OTLP
// collector (tracing) and a ZMQ KV-event publisher (a precise pool), each at a
// closed loopback port and at a name that does not resolve (.invalid, RFC
// 6761). Each is ONE warn line naming the config block (its field path) and
// the address and saying what the router does (retries with backoff / serves
// without it), however many times it retries meanwhile; the router serves.
// A kubeconfig that names no cluster stops the start (exit 1) naming the block.
import t from 'tap';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startFleet } from '../../src/sim/index.js';
import { spawnServe } from '../support/router-util.js';
import { get, send, sleep } from '../support/sim-util.js';

const bin = fileURLToPath(new URL('../../bin/switchyard.js', import.meta.url));

interface Line {
  level: string;
  msg: string;
  event?: string;
  [k: string]: unknown;
}

const lines = (out: string): Line[] =>
  out
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as Line);

async function until(out: () => string, pred: (l: Line) => boolean, ms = 8000): Promise<Line | undefined> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    const hit = lines(out()).find(pred);
    if (hit) return hit;
    await sleep(25);
  }
  return undefined;
}

/** A loopback port nothing listens on (bound, then closed). */
async function closedPort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as { port: number }).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

function file(dir: string, name: string, text: string): string {
  const f = join(dir, name);
  writeFileSync(f, text);
  return f;
}

const kubeconfig = (dir: string, server: string) =>
  file(
    dir,
    'kubeconfig.yaml',
    `apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: { server: "${server}", insecure-skip-tls-verify: true }\nusers:\n- name: u\n  user: { token: t }\ncontexts:\n- name: c\n  context: { cluster: c, user: u, namespace: llm }\ncurrent-context: c\n`,
  );

t.test('Kubernetes discovery: an API server at a closed port, and at a name that does not resolve', async (t) => {
  const fleet = await startFleet(1, { models: ['m'], timeScale: 0 });
  t.teardown(() => fleet.close());
  for (const server of [`https://127.0.0.1:${await closedPort()}`, 'https://nosuch-apiserver.invalid:6443']) {
    await t.test(server, async (t) => {
      const dir = mkdtempSync(join(tmpdir(), 'swy-outage-'));
      const kc = kubeconfig(dir, server);
      const cfg = file(
        dir,
        'router.yaml',
        `apiVersion: switchyard/v1\nkind: Router\nlisten: { host: 127.0.0.1, port: 0 }\npools:\n  - { name: static, models: [m], endpoints: [{ name: e0, url: "${fleet.urls[0]}" }] }\n  - name: found\n    models: [other]\n    discovery: { kubernetes: { kubeconfig: "${kc}", labelSelector: { app: vllm }, targetPort: 8000, backoffInitialMs: 50, backoffMaxMs: 100, initialSyncTimeoutMs: 300 } }\n`,
      );
      const { child, url, out, exited } = await spawnServe(t, ['--config', cfg]);
      const line = await until(out, (l) => l.event === 'kubernetes.unreachable');
      t.ok(line, out().slice(-800));
      t.equal(line!.level, 'warn');
      t.match(line!.msg, /^kubernetes discovery \(pools\[1\]\.discovery\.kubernetes\): the API server at https:\/\/\S+ failed: .+; retrying with backoff \(50 ms doubling to 100 ms\), pool "found" served without its discovered endpoints meanwhile/);
      t.ok(line!.msg.includes(new URL(server).origin), 'names the URL');
      if (server.includes('.invalid')) t.match(line!.msg, /ENOTFOUND|EAI_AGAIN/, 'says the name does not resolve');
      else t.match(line!.msg, /ECONNREFUSED/, 'says the connection is refused');
      // it keeps retrying (50–100 ms apart) without another line
      await sleep(800);
      const all = lines(out());
      t.equal(all.filter((l) => l.event === 'kubernetes.unreachable').length, 1, 'one line, however many retries');
      t.equal(all.filter((l) => /kubernetes list\/watch failed/.test(l.msg) && l.level !== 'debug').length, 0, 'no line per retry');
      t.equal((await get(url, '/healthz')).status, 200, 'the router serves');
      t.equal((await send(url, 'POST', '/v1/completions', { model: 'm', prompt: 'hi', max_tokens: 1 }).done).status, 200, 'the static pool answers');
      child.kill('SIGTERM');
      t.same(await exited, [0, null]);
    });
  }
});

t.test('Kubernetes discovery with a kubeconfig that names no cluster: exit 1 naming the block', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'swy-outage-'));
  const kc = file(dir, 'kubeconfig.yaml', 'apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n');
  const cfg = file(dir, 'router.yaml', `apiVersion: switchyard/v1\nkind: Router\nlisten: { host: 127.0.0.1, port: 0 }\npools:\n  - name: found\n    models: [m]\n    discovery: { kubernetes: { kubeconfig: "${kc}", labelSelector: { app: vllm }, targetPort: 8000 } }\n`);
  const r = spawnSync(process.execPath, [bin, 'serve', '--config', cfg], { encoding: 'utf8', timeout: 30_000 });
  t.equal(r.status, 1, 'exit 1');
  const line = r.stdout.split('\n').find((l) => l.includes('failed to start'));
  t.ok(line, r.stdout.slice(-500));
  t.match(JSON.parse(line!).msg, /^the router failed to start: pools\[0\]\.discovery\.kubernetes \(pool "found"\): no Kubernetes cluster in /);
});

t.test('tracing: an OTLP collector at a closed port, and at a name that does not resolve', async (t) => {
  const fleet = await startFleet(1, { models: ['m'], timeScale: 0 });
  t.teardown(() => fleet.close());
  const cases: [string, string, RegExp][] = [
    ['http/protobuf', `http://127.0.0.1:${await closedPort()}/v1/traces`, /connection refused at 127\.0\.0\.1:\d+/],
    ['grpc', 'http://nosuch-collector.invalid:4317', /the name nosuch-collector\.invalid does not resolve/],
  ];
  for (const [protocol, endpoint, why] of cases) {
    await t.test(`${protocol} ${endpoint}`, async (t) => {
      const dir = mkdtempSync(join(tmpdir(), 'swy-outage-'));
      const cfg = file(
        dir,
        'router.yaml',
        `apiVersion: switchyard/v1\nkind: Router\nlisten: { host: 127.0.0.1, port: 0 }\npools:\n  - { name: p, models: [m], endpoints: [{ name: e0, url: "${fleet.urls[0]}" }] }\ntracing: { enabled: true, protocol: ${protocol}, endpoint: "${endpoint}", sampleRatio: 1, exportIntervalMs: 100, exportTimeoutMs: 1000 }\n`,
      );
      const { child, url, out, exited } = await spawnServe(t, ['--config', cfg]);
      const line = await until(out, (l) => l.event === 'tracing.unreachable');
      t.ok(line, out().slice(-800));
      t.equal(line!.level, 'warn');
      t.match(line!.msg, /^tracing \(tracing\.endpoint\): the OTLP collector at \S+ cannot be reached: .+; serving without it: /);
      t.ok(line!.msg.includes(endpoint), 'names the URL');
      t.match(line!.msg, why);
      // sampled requests whose exports fail: no line more
      for (let i = 0; i < 3; i++) t.equal((await send(url, 'POST', '/v1/completions', { model: 'm', prompt: 'hi', max_tokens: 1 }).done).status, 200, 'served');
      await sleep(1500);
      t.equal(lines(out()).filter((l) => l.event === 'tracing.unreachable').length, 1, 'one line, though exports failed since');
      child.kill('SIGTERM');
      t.same(await exited, [0, null]);
    });
  }
});

t.test('a precise pool: KV-event publishers at a closed port and at a name that does not resolve', async (t) => {
  const fleet = await startFleet(1, { models: ['m'], timeScale: 0 });
  t.teardown(() => fleet.close());
  const dir = mkdtempSync(join(tmpdir(), 'swy-outage-'));
  const port = await closedPort();
  const cfg = file(
    dir,
    'router.yaml',
    `apiVersion: switchyard/v1\nkind: Router\nlisten: { host: 127.0.0.1, port: 0 }\npools:\n  - name: p\n    models: [m]\n    prefix: { mode: precise, blockTokens: 16, tokenizer: { type: sim } }\n    endpoints:\n      - { name: e0, url: "${fleet.urls[0]}", kvEvents: { endpoint: "tcp://127.0.0.1:${port}" } }\n      - { name: e1, url: "${fleet.urls[0]}", kvEvents: { endpoint: "tcp://nosuch-engine.invalid:5557" } }\n`,
  );
  const { child, url, out, exited } = await spawnServe(t, ['--config', cfg]);
  const e0 = await until(out, (l) => l.event === 'kv_events.unreachable' && l.endpoint === 'e0');
  const e1 = await until(out, (l) => l.event === 'kv_events.unreachable' && l.endpoint === 'e1');
  t.ok(e0 && e1, out().slice(-800));
  t.equal(e0!.level, 'warn');
  t.match(e0!.msg, new RegExp(`^KV-event stream of e0 \\(pools\\[0\\]\\.endpoints\\[0\\]\\.kvEvents\\.endpoint\\): the publisher at tcp://127\\.0\\.0\\.1:${port} cannot be reached: nothing accepts connections there .*; precise scoring uses the approximate mode for e0`));
  t.match(e1!.msg, /^KV-event stream of e1 \(pools\[0\]\.endpoints\[1\]\.kvEvents\.endpoint\): the publisher at tcp:\/\/nosuch-engine\.invalid:5557 cannot be reached: the name nosuch-engine\.invalid does not resolve/);
  await sleep(1000); // libzmq retries every ~100 ms meanwhile
  t.equal(lines(out()).filter((l) => l.event === 'kv_events.unreachable').length, 2, 'one line per publisher, however many retries');
  t.equal((await send(url, 'POST', '/v1/completions', { model: 'm', prompt: 'hi', max_tokens: 1 }).done).status, 200, 'served (approximate scoring)');
  child.kill('SIGTERM');
  t.same(await exited, [0, null]);
});
