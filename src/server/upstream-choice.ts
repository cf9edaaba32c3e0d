// Which upstream HTTP client the router uses (`proxy.client`).
import { hostIsIp, type ProxyConfig } from '../config/schema.js';
import type { EndpointSet } from '../endpoints/endpoint.js';
import { UndiciUpstreamClient } from '../proxy/undici-client.js';
import { H1UpstreamClient } from '../proxy/h1-client.js';
import { NativeUpstreamClient } from '../proxy/native-client.js';
import type { UpstreamClient } from '../proxy/upstream.js';

/**
 * The upstream client `proxy.client` names. `auto`: undici if any endpoint is
 * https; else the native client when every endpoint's host is an IP address
 * (it does no DNS lookups; `localhost` goes to h1, which tries both ::1 and
 * 127.0.0.1); else h1.
 */
export function newUpstreamClient(cfg: ProxyConfig, set: EndpointSet): UpstreamClient {
  const c = cfg.client;
  if (c === 'undici' || (c === 'auto' && set.all.some((ep) => ep.url.startsWith('https:')))) return new UndiciUpstreamClient(cfg);
  if (c === 'native' || (c === 'auto' && set.all.every((ep) => hostIsIp(ep.url)))) return new NativeUpstreamClient(cfg);
  return new H1UpstreamClient(cfg);
}
