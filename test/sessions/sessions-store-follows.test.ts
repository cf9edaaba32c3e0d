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

t.test('active-active replicas take the session pins to ha.redis; the standby pair and an explicit store do not', async (t) => {
  t.same(base({ ha: { redis: 'redis://127.0.0.1:6392' } }).sessions.store, { url: 'redis://127.0.0.1:6392', keyPrefix: 'switchyard:session:', timeoutMs: 250 });
  t.equal(base({ ha: { redis: 'redis://127.0.0.1:6392', mode: 'standby' } }).sessions.store, 'memory');
  t.equal(base({ ha: { redis: 'redis://127.0.0.1:6392' }, sessions: { store: 'memory' } }).sessions.store, 'memory');
  const both = base({ ha: { redis: 'redis://127.0.0.1:6392' }, responses: { store: { type: 'redis', url: 'redis://127.0.0.1:6390' } } });
  t.equal((both.sessions.store as { url: string }).url, 'redis://127.0.0.1:6390', 'the Responses store\'s Redis first');
});
