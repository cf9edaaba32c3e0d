// The data layer against hand-written engines that misbehave on /metrics:
// one whose /metrics never ends, one whose /metrics is huge, one whose
// /metrics drops its load signals. Real loopback sockets, real scheduler.
import t from 'tap';
import { createServer, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { createScheduler } from '../../src/scheduler/scheduler.js';
import { DataLayer } from '../../src/endpoints/data-layer.js';
import { EndpointSet } from '../../src/endpoints/endpoint.js';
import { DEFAULTS } from '../../src/config/schema.js';
import { readEngineMetrics, type EngineMetrics } from '../../src/endpoints/engine-metrics.js';

interface FakeEngine {
  url: string;
  health: number;
  /** Called for every GET /metrics. */
  metrics: (res: ServerResponse) => void;
  healthCalls: number;
}

async function fakeEngine(t: Tap.Test, metrics: (res: ServerResponse) => void): Promise<FakeEngine> {
  const socks = new Set<Socket>();
  const timers = new Set<NodeJS.Timeout>();
  const eng: FakeEngine = { url: '', health: 200, metrics, healthCalls: 0 };
  const srv = createServer((req, res) => {
    res.on('error', () => {});
    if (req.url === '/health') {
      eng.healthCalls++;
      res.writeHead(eng.health, { 'content-length': '0' }).end();
    } else if (req.url === '/metrics') eng.metrics(res);
    else res.writeHead(404).end();
  });
  srv.on('connection', (s) => {
    socks.add(s);
    s.on('close', () => socks.delete(s));
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  eng.url = `http://127.0.0.1:${(srv.address() as { port: number }).port}`;
  t.teardown(
    () =>
      new Promise<void>((r) => {
        for (const x of timers) clearInterval(x);
        for (const s of socks) s.destroy();
        srv.close(() => r());
      }),
  );
  (eng as FakeEngine & { timers: Set<NodeJS.Timeout> }).timers = timers;
  return eng;
}

/** A scheduler over one endpoint at `url` with the given data-layer settings. */
function oneEngine(url: string, dataLayer: Record<string, number>) {
  return createScheduler({ pools: [{ name: 'p', models: ['m'], endpoints: [{ name: 'e0', url }] }], dataLayer });
}

/** A /metrics answer that sends a comment line every 20 ms and never ends. */
function trickle(eng: FakeEngine) {
  const timers = (eng as FakeEngine & { timers: Set<NodeJS.Timeout> }).timers;
  return (res: ServerResponse) => {
    res.writeHead(200, { 'content-type': 'text/plain' });
    res.write('vllm:num_requests_waiting{model_name="m"} 1\n');
    const iv = setInterval(() => res.write('# still here\n'), 20);
    timers.add(iv);
    res.on('close', () => {
      clearInterval(iv);
      timers.delete(iv);
    });
  };
}

const within = <T>(p: Promise<T>, ms: number): Promise<T | 'timeout'> =>
  Promise.race([p, new Promise<'timeout'>((r) => setTimeout(() => r('timeout'), ms).unref())]);

async function until(cond: () => boolean, ms: number): Promise<boolean> {
  const end = Date.now() + ms;
  while (!cond() && Date.now() < end) await new Promise((r) => setTimeout(r, 10));
  return cond();
}

t.test('a /metrics that never ends: the first round finishes within healthTimeoutMs and health checks still run', async (t) => {
  const eng = await fakeEngine(t, () => {});
  eng.metrics = trickle(eng);
  const s = oneEngine(eng.url, { scrapeIntervalMs: 20, healthIntervalMs: 50, healthTimeoutMs: 300 });
  t.teardown(() => s.close());
  // startRouter awaits this before listening: it must not wait forever
  t.not(await within(s.ready, 3000), 'timeout', 'first round of checks and scrapes ended');
  const ep = s.endpoints.all[0];
  t.equal(ep.health, 'up');
  t.notOk(ep.fresh(performance.now()), 'a scrape that never completes leaves no metrics');
  // a healthy engine whose /metrics hangs stays up: health checks run on their own
  let downSeen = false;
  const calls = eng.healthCalls;
  const end = Date.now() + 800;
  while (Date.now() < end) {
    if (ep.health !== 'up') downSeen = true;
    await new Promise((r) => setTimeout(r, 5));
  }
  t.notOk(downSeen, 'health stays up while /metrics hangs');
  t.ok(eng.healthCalls - calls >= 5, `health checks keep running (${eng.healthCalls - calls} in 800 ms at a 50 ms interval)`);
  eng.health = 503;
  t.ok(await until(() => ep.health === 'down', 3000), 'a /health 503 is seen while /metrics hangs');
});

t.test('a huge /metrics is refused (bounded memory), a normal one is read', async (t) => {
  const line = 'vllm:num_requests_waiting{model_name="m"} 4\n';
  const pad = `# ${'x'.repeat(1022)}\n`; // 1 KiB comment lines
  let huge = true;
  const eng = await fakeEngine(t, (res) => {
    res.writeHead(200, { 'content-type': 'text/plain' });
    res.write(line);
    if (!huge) return void res.end();
    // 40 MiB, written as the socket drains
    let left = 40 * 1024;
    const chunk = pad.repeat(256);
    const more = () => {
      while (left > 0) {
        left -= 256;
        if (!res.write(chunk)) return void res.once('drain', more);
      }
      res.end();
    };
    res.on('close', () => (left = 0));
    more();
  });
  const s = oneEngine(eng.url, { scrapeIntervalMs: 60_000, healthIntervalMs: 0, healthTimeoutMs: 5000 });
  t.teardown(() => s.close());
  await s.ready;
  const ep = s.endpoints.all[0];
  t.equal(ep.metricsAt, 0, 'a 40 MiB /metrics body is not read into memory');
  await s.close();
  huge = false;
  const s2 = oneEngine(eng.url, { scrapeIntervalMs: 60_000, healthIntervalMs: 0 });
  t.teardown(() => s2.close());
  await s2.ready;
  t.ok(s2.endpoints.all[0].metricsAt > 0, 'a small body is read');
  t.equal(s2.endpoints.all[0].metrics.waiting, 4);
});

t.test('a /metrics without load signals keeps the last values (which then go stale), not zeros that look fresh', async (t) => {
  let text = 'vllm:num_requests_waiting{model_name="m"} 9\nvllm:kv_cache_usage_perc{model_name="m"} 0.8\n';
  const eng = await fakeEngine(t, (res) => res.writeHead(200, { 'content-type': 'text/plain' }).end(text));
  const s = oneEngine(eng.url, { scrapeIntervalMs: 10, healthIntervalMs: 0, staleAfterMs: 60_000 });
  t.teardown(() => s.close());
  await s.ready;
  const ep = s.endpoints.all[0];
  t.equal(ep.metrics.waiting, 9);
  const at = ep.metricsAt;
  let scrapes = 0;
  s.onScrape(() => scrapes++);
  text = '# engine restarting: no gauges yet\n';
  t.ok(await until(() => scrapes >= 3, 3000), 'scraped again');
  t.equal(ep.metricsAt, at, 'not a successful scrape');
  t.ok(ep.fresh(performance.now()), 'the last good figures are still within staleAfterMs');
  t.equal(ep.metrics.waiting, 9, 'and they are the engine figures, not 0');
  t.equal(ep.metrics.kvUsage, 0.8);
});

t.test('negative, NaN and infinite queue counts do not count (a negative one made an endpoint look emptier than idle)', async (t) => {
  const m: EngineMetrics = { waiting: 0, running: 0, kvUsage: NaN, cacheBlocks: 0, cacheBlockTokens: 0, loraMax: 0, loraRunning: [], loraWaiting: [], loraBadSeries: 0 };
  const text = [
    'vllm:num_requests_waiting{engine="0",model_name="m"} -40',
    'vllm:num_requests_waiting{engine="1",model_name="m"} 3',
    'vllm:num_requests_waiting{engine="2",model_name="m"} NaN',
    'vllm:num_requests_waiting{engine="3",model_name="m"} +Inf',
    'vllm:num_requests_running{engine="0",model_name="m"} -1',
    'vllm:num_requests_running{engine="1",model_name="m"} 2',
    'vllm:kv_cache_usage_perc{model_name="m",note="a \\"quoted\\" } value"} -0.5',
    '',
  ].join('\n');
  t.ok(readEngineMetrics(text, m));
  t.equal(m.waiting, 3, 'only the valid rank counts');
  t.equal(m.running, 2);
  t.equal(m.kvUsage, 0, 'clamped to [0, 1], label with escaped quotes and a brace parsed');
});

t.test('a throwing capacity or scrape listener does not keep the others from hearing of the change', async (t) => {
  const eng = await fakeEngine(t, (res) => {
    res.writeHead(200, { 'content-type': 'text/plain' });
    res.end('vllm:cache_config_info{block_size="16",num_gpu_blocks="1000"} 1\nvllm:num_requests_waiting{model_name="m"} 2\n');
  });
  const set = new EndpointSet([{ name: 'p', engine: 'vllm', accelerator: 'nvidia', models: ['m'], endpoints: [{ name: 'e0', url: eng.url, role: 'both' }] }], {
    ...DEFAULTS.dataLayer,
    scrapeIntervalMs: 20,
    healthIntervalMs: 0,
  });
  const dl = new DataLayer(set);
  t.teardown(() => dl.close());
  const warnings: string[] = [];
  const onWarning = (w: Error & { code?: string }) => {
    if (w.code === 'SWITCHYARD_LISTENER_ERROR') warnings.push(w.message);
  };
  process.on('warning', onWarning);
  t.teardown(() => process.off('warning', onWarning));
  const capacity: number[] = [];
  let scrapes = 0;
  dl.onCapacity(() => {
    throw new Error('plugin bug');
  });
  dl.onCapacity((ep) => capacity.push(ep.metrics.cacheBlocks));
  dl.onScrape(() => {
    throw new Error('plugin bug');
  });
  dl.onScrape(() => scrapes++);
  await dl.start();
  await new Promise((r) => setTimeout(r, 120));
  t.same(capacity, [1000], 'the second capacity listener heard of the geometry once');
  t.ok(scrapes >= 2, `the second scrape listener ran on every scrape (${scrapes})`);
  t.equal(set.all[0]!.metrics.waiting, 2, 'metrics were read');
  t.equal(warnings.length, 1, `one warning (${warnings[0]})`);
});
