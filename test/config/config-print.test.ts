// What `switchyard check` and `serve --print-config` print is a config that
// validates again to the same thing, with every block in use (durations keep
// their unit, resolved shapes go back to their written form).
import t from 'tap';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { printableConfig } from '../../src/config/load.js';
import { validatePlugin } from '../support/router-util.js';

t.test('the printed config of every block validates again to the same config', async (t) => {
  const doc = {
    apiVersion: API_VERSION,
    kind: 'Router',
    pools: [
      {
        name: 'p',
        models: ['m'],
        accelerator: 'nvidia',
        prefix: { mode: 'precise' },
        endpoints: [
          { name: 'e', url: 'http://127.0.0.1:9', kvEvents: { endpoint: 'tcp://127.0.0.1:5557' } },
          { name: 'pf', url: 'http://127.0.0.1:10', role: 'prefill' },
          { name: 'd', url: 'http://127.0.0.1:11', role: 'decode' },
        ],
      },
    ],
    flowControl: { ttl: '90s', sweepInterval: '100ms', turnPriority: { maxColdWait: '1500ms' } },
    responses: { store: { type: 'redis', url: 'redis://127.0.0.1:1' } },
    batch: { redis: 'redis://127.0.0.1:1' },
    ha: { redis: 'redis://127.0.0.1:1' },
    extProc: {},
    admin: {},
    disaggregation: {},
    tracing: { enabled: true },
  };
  const cfg = validateConfig(doc, validatePlugin);
  const printed = printableConfig(cfg) as Record<string, Record<string, unknown>>;
  t.equal(printed.flowControl!.ttl, '90000ms', 'durations keep their unit');
  t.equal((printed.flowControl!.turnPriority as Record<string, unknown>).maxColdWait, '1500ms');
  t.same((printed.sessions!.store as Record<string, unknown>).redis, 'redis://127.0.0.1:1', 'sessions.store in its written form');
  const again = validateConfig(JSON.parse(JSON.stringify(printed)), validatePlugin);
  t.same(printableConfig(again), printed);
  t.equal(again.flowControl!.ttlMs, cfg.flowControl!.ttlMs);
  t.equal(again.flowControl!.turnPriority.maxColdWaitMs, 1500);
});
