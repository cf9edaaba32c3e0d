// Endpoint ids over a router's life: every endpoint added (config, admin API,
// reload, Kubernetes pods) takes a new id, ids are never reused, and the
// prefix index is sized for the last one. A fleet that churns pods must get a
// clear error at the limit, never a native range error on the request path.
import t from 'tap';
import { EndpointSet, MAX_ENDPOINT_IDS } from '../../src/endpoints/endpoint.js';
import { EndpointError } from '../../src/errors.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { PrefixIndex, MatchResult } from '../../bindings/index.js';

const config = validateConfig({
  apiVersion: API_VERSION,
  kind: 'Router',
  pools: [{ name: 'p', models: ['m'], endpoints: [{ name: 'first', url: 'http://127.0.0.1:9' }] }],
  dataLayer: { healthIntervalMs: 0 },
});

t.test('ids are handed out up to MAX_ENDPOINT_IDS, then a clear EndpointError', async (t) => {
  t.ok(MAX_ENDPOINT_IDS >= 16384, `room for a churning fleet (${MAX_ENDPOINT_IDS})`);
  const set = new EndpointSet(config.pools, config.dataLayer);
  const pool = config.pools[0]!;
  let last = set.all[0]!;
  // add and remove, as pods come and go: the set never holds more than two
  while (set.idsUsed < MAX_ENDPOINT_IDS) {
    const ep = set.add(pool, { ...pool.endpoints[0]!, name: `pod-${set.idsUsed}` }, 'kubernetes:p');
    set.delete(last);
    last = ep;
  }
  t.equal(last.id, MAX_ENDPOINT_IDS - 1, 'the last id is MAX - 1');
  t.equal(set.all.length, 1);
  const err = t.throws(() => set.add(pool, { ...pool.endpoints[0]!, name: 'one-too-many' }, 'kubernetes:p')) as EndpointError;
  t.ok(err instanceof EndpointError);
  t.equal(err.code, 'SWY_ERR_ENDPOINT_IDS');
  t.match(err.message, /restart/);
  t.equal(set.all.length, 1, 'the refused add left the set as it was');
});

t.test('the prefix index takes the highest id the set can hand out', async (t) => {
  const index = new PrefixIndex({ blockSize: 16, maxEndpoints: MAX_ENDPOINT_IDS });
  const hashes = new BigUint64Array([11n, 22n, 33n]);
  index.record(MAX_ENDPOINT_IDS - 1, hashes, 3);
  const r = index.matchHashes(hashes, 3, new Int32Array([0, MAX_ENDPOINT_IDS - 1]), new MatchResult());
  t.equal(r.matched[0], 0);
  t.equal(r.matched[1], 3, 'the last id holds what was recorded for it');
  t.throws(() => index.record(MAX_ENDPOINT_IDS, hashes, 3), RangeError, 'one past the limit is a range error');
});
