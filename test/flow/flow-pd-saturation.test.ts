// Flow control in a P/D pool: saturation counts the endpoints that decode
// (role decode or both), never the prefill endpoints, which only run prefill
// legs. Before, an idle prefill endpoint made the pool look unsaturated and
// every request was admitted while the only decode endpoint was full.
// Real loopback sockets, two real simulated engines (prefill, decode), the router
// with its flow gate built from the config.
import t from 'tap';
import { startEngine } from '../../src/sim/index.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { startRouter } from '../../src/server/router.js';
import { validatePlugin } from '../support/router-util.js';
import { post, sleep, until } from '../support/sim-util.js';

t.test('a full decode endpoint saturates the pool although its prefill endpoint is idle', async (t) => {
  const opts = { timeScale: 1, itlMs: 25, prefillOverheadMs: 1, prefillUsPerToken: 0 };
  const prefill = await startEngine({ ...opts, role: 'prefill' });
  const decode = await startEngine({ ...opts, role: 'decode' });
  t.teardown(() => Promise.all([prefill.close(), decode.close()]));
  const cfg = validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [
        {
          name: 'p',
          models: ['open-model'],
          endpoints: [
            { name: 'p0', url: prefill.url, role: 'prefill' },
            { name: 'd0', url: decode.url, role: 'decode' },
          ],
        },
      ],
      logging: { level: 'silent' },
      dataLayer: { healthIntervalMs: 0 },
      // short prompts go direct: only the decode endpoint serves here
      disaggregation: { thresholdTokens: 100000 },
      flowControl: { admission: { mode: 'off' }, saturation: { maxConcurrency: 1 } },
    },
    validatePlugin,
  );
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(200));
  const first = post(router.url, '/v1/completions', { model: 'open-model', prompt: 'first', max_tokens: 40, stream: true });
  t.ok(await until(() => decode.stats().running === 1, 3000), 'the first request runs on the decode endpoint');
  const second = post(router.url, '/v1/completions', { model: 'open-model', prompt: 'second', max_tokens: 2 });
  await sleep(300); // the first runs ~1 s
  const s = decode.stats();
  t.equal(s.running + s.waiting + s.finished, 1, 'the second request is held by flow control, not sent to the full decode endpoint');
  t.equal(prefill.stats().finished + prefill.stats().running, 0, 'nothing went to the prefill endpoint');
  const [a, b] = await Promise.all([first, second]);
  t.equal(a.status, 200);
  t.equal(b.status, 200, 'the held request is served once the decode endpoint frees up');
  t.ok(b.firstByteMs > 500, `the second request waited for the first (${b.firstByteMs.toFixed(0)} ms)`);
});
