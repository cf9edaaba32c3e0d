// Which upstream HTTP client the router uses (`proxy.client`).
import type { ProxyConfig } from '../config/schema.js';
import type { EndpointSet } from '../endpoints/endpoint.js';
import { UndiciUpstreamClient } from '../proxy/undici-client.js';
import { NativeUpstreamClient } from '../proxy/native-client.js';
import type { UpstreamClient } from '../proxy/upstream.js';

/**
 * The upstream client `proxy.client` names. `auto`: undici if any endpoint is
 * https, else the native client (endpoints named by DNS name are resolved in
 * TypeScript and dialled by address: src/proxy/resolver.ts). `h1` is an older
 * name of `native`.
 */
export function newUpstreamClient(cfg: ProxyConfig, set: EndpointSet): UpstreamClient {
  const c = cfg.client;
  if (c === 'undici' || (c === 'auto' && set.all.some((ep) => ep.url.startsWith('https:')))) return new UndiciUpstreamClient(cfg);
  return new NativeUpstreamClient(cfg);
}
