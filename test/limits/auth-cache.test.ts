// The authenticator's token → caller cache (src/auth/authenticator.ts): a
// known key is hashed once and remembered; unknown tokens (a hostile client's
// random ones) are never remembered, so they neither grow the cache nor push
// a real key out; the same token spelled with other whitespace or case of
// "Bearer" is one entry; a new key table (a reload) starts empty.
import t from 'tap';
import { createHash, randomBytes } from 'node:crypto';
import { ApiKeyAuthenticator } from '../../src/auth/authenticator.js';
import { isRefusal, type Caller } from '../../src/identity.js';

const sha = (k: string) => createHash('sha256').update(k).digest('hex');
const keys = Array.from({ length: 50 }, (_, i) => `sk-cache-${i}-${randomBytes(8).toString('hex')}`);
const table = (ks: string[]) => new ApiKeyAuthenticator({ required: true, trustHeaders: false }, ks.map((k, i) => ({ digest: sha(k), tenant: `t${i}`, requestsPerMinute: 5 })));
const get = (auth: string) => (name: string) => (name === 'authorization' ? auth : '');

t.test('only known keys are remembered; random tokens do not grow it or evict', async (t) => {
  const a = table(keys);
  const first = a.authenticate(get(`Bearer ${keys[3]}`)) as Caller;
  t.equal(first.tenant, 't3');
  t.same(first.limits, { requestsPerMinute: 5, tokensPerMinute: undefined, tokensPerDay: undefined }, "the key's limits on its caller");
  t.equal(a.cached, 1);
  let refused = 0;
  for (let i = 0; i < 20_000; i++) if (isRefusal(a.authenticate(get(`Bearer sk-${randomBytes(12).toString('hex')}`)))) refused++;
  t.equal(refused, 20_000, 'every random token refused');
  t.equal(a.cached, 1, '20,000 random tokens: nothing remembered');
  t.equal(a.authenticate(get(`bearer   ${keys[3]}  `)), first, 'another spelling of the header: the same caller, the same entry');
  t.equal(a.cached, 1);
  for (const k of keys) a.authenticate(get(`Bearer ${k}`));
  t.equal(a.cached, keys.length, 'at most one entry per key');
  const b = table(keys.slice(1));
  t.equal(b.cached, 0, 'a new key table starts empty');
  t.ok(isRefusal(b.authenticate(get(`Bearer ${keys[0]}`))), 'a removed key is refused by the new table');
});
