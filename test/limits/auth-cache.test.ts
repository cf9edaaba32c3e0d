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

t.test('the header as sent is the cache key: every spelling, one entry, the same answers', async (t) => {
  const a = table(keys.slice(0, 3));
  const k = keys[1]!;
  t.equal(a.cached, 0);
  const other = a.authenticate(get(`bearer\t${k} `)) as Caller;
  t.equal(other.tenant, 't1', 'another spelling first');
  t.equal(a.cached, 1);
  t.equal(a.authenticate(get(`Bearer ${k}`)), other, 'then "Bearer <key>": found under that spelling, no new entry');
  t.equal(a.cached, 1);
  t.ok(isRefusal(a.authenticate(get(`Bearer ${k.slice(0, -1)}x`))), 'a key one character off: refused');
  t.ok(isRefusal(a.authenticate(get(`Bearer ${k}x`))), 'a key with a character more: refused');
  t.ok(isRefusal(a.authenticate(get(`Bearer  ${k}\u00e9`))), 'not visible ASCII: refused');
  t.ok(isRefusal(a.authenticate(get(`Basic ${k}`))), 'another scheme: refused');
  t.ok(isRefusal(a.authenticate(get(''))), 'no header: refused');
  t.equal(a.cached, 1, 'refusals remember nothing');
  // a trusted gateway's tenant still applies to a caller found in the cache
  const gw = new ApiKeyAuthenticator({ required: true, trustHeaders: true }, [{ digest: sha(k), tenant: 'own' }]);
  const hdr = (auth: string, tenant: string) => (name: string) => (name === 'authorization' ? auth : name === 'x-tenant-id' ? tenant : '');
  t.equal((gw.authenticate(hdr(`Bearer ${k}`, '')) as Caller).tenant, 'own');
  const named = gw.authenticate(hdr(`Bearer ${k}`, 'acme')) as Caller;
  t.equal(named.tenant, 'acme', 'the cached key, the header names the tenant');
  t.equal(named.keyId, sha(k).slice(0, 16), 'still that key');
  t.equal((gw.authenticate(hdr(`Bearer ${k}`, '')) as Caller).tenant, 'own', 'the key alone again: its own tenant');
});
