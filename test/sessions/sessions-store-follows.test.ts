// Session pins live where the Responses store lives: a Redis Responses store
// takes the pins along unless sessions.store says otherwise.
import t from 'tap';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { validatePlugin } from '../support/router-util.js';

const base = (extra: Record<string, unknown>) =>
  validateConfig({ apiVersion: API_VERSION, kind: 'Router', pools: [{ name: 'p', models: ['m'], endpoints: [{ name: 'e0', url: 'http://127.0.0.1:9' }] }], ...extra }, validatePlugin);

t.test('a Redis Responses store takes the session pins along', async (t) => {
  const cfg = base({ responses: { store: { type: 'redis', url: 'redis://127.0.0.1:6390' } } });
  t.same(cfg.sessions.store, { url: 'redis://127.0.0.1:6390', keyPrefix: 'switchyard:session:', timeoutMs: 250 });
});

t.test('an explicit sessions.store wins, memory included', async (t) => {
  const mem = base({ responses: { store: { type: 'redis', url: 'redis://127.0.0.1:6390' } }, sessions: { store: 'memory' } });
  t.equal(mem.sessions.store, 'memory');
  const other = base({ responses: { store: { type: 'redis', url: 'redis://127.0.0.1:6390' } }, sessions: { store: { redis: 'redis://127.0.0.1:6391' } } });
  t.equal((other.sessions.store as { url: string }).url, 'redis://127.0.0.1:6391');
});

t.test('memory and SQLite Responses stores leave the pins in memory', async (t) => {
  t.equal(base({}).sessions.store, 'memory');
  t.equal(base({ responses: { store: { type: 'sqlite', path: '/tmp/x.db' } } }).sessions.store, 'memory');
});
