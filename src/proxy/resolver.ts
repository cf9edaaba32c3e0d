// DNS names of plain-http endpoints, for the native client (which connects to
// addresses only). A name is looked up asynchronously (node:dns, every
// address), its address used until the TTL passes, then looked up again in
// the background while calls keep using the address they have; a connect
// failure moves to the name's next address and, when every one failed, looks
// the name up again at once. No lookup is ever synchronous or per request.
import { lookup as dnsLookup } from 'node:dns/promises';
import { isIP } from 'node:net';

/** Resolves a host name to its addresses (the seam tests replace). */
export type LookupFn = (hostname: string) => Promise<readonly { address: string }[]>;

/** node:dns lookup with every address, in the resolver's order. */
export const systemLookup: LookupFn = (hostname) => dnsLookup(hostname, { all: true });

/** How long a looked-up address is used before the name is looked up again. */
export const DEFAULT_DNS_TTL_MS = 30_000;
/** After a failed lookup of a name that has addresses: when to try again. */
export const LOOKUP_RETRY_MS = 1_000;

/** The URL's host without IPv6 brackets, when it is a name rather than an IP literal; else null. */
export function hostName(url: URL): string | null {
  const host = url.hostname.replace(/^\[|\]$/g, '');
  return isIP(host) === 0 ? host : null;
}

/** One endpoint's DNS name: its addresses, the one in use, when to look again, the calls waiting for a first address. */
export class NamedHost<C> {
  readonly name: string;
  readonly port: number;
  readonly pool: number;
  addrs: readonly string[] = [];
  /** Index into addrs of the address new connections dial. */
  cur = 0;
  /** performance.now() after which the next call starts a lookup. */
  expires = 0;
  looking = false;
  /** Calls sent before any address was known (or after every address failed to connect). */
  waiting: C[] = [];

  constructor(name: string, port: number, pool: number) {
    this.name = name;
    this.port = port;
    this.pool = pool;
  }

  get address(): string | undefined {
    return this.addrs[this.cur];
  }

  /**
   * A lookup answered `list`: returns the address new connections should now
   * dial when it changed, else null (the address in use is kept while the name
   * still lists it, so a round-robin answer does not churn connections).
   */
  update(list: readonly string[], now: number, ttlMs: number): string | null {
    const current = this.address;
    this.addrs = list;
    this.expires = now + ttlMs;
    const keep = current === undefined ? -1 : list.indexOf(current);
    this.cur = keep >= 0 ? keep : 0;
    return keep >= 0 ? null : list[0]!;
  }

  /** The address `failed` did not connect: the next one, when there is one and it is not already in use, else null. */
  next(failed: string | undefined): string | null {
    if (this.addrs.length < 2 || this.address !== failed) return null;
    this.cur = (this.cur + 1) % this.addrs.length;
    return this.address!;
  }
}
