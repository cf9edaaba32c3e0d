// Per-tenant and per-key usage counters for the admin API (GET /admin/tenants):
// requests begun and in flight. Two Map lookups a request (the tenant, the key
// id: short strings V8 has hashed already), plain numbers after that. Bounded:
// at most `maxTenants` tenants keep their own counts (a trusted header may
// name any tenant), later ones share `(overflow)`; keys are bounded by the key
// table (ids of keys since removed stay until restart, with their counts).
import { OVERFLOW_LABEL } from '../metrics/label-cap.js';

export interface Counts {
  /** Inference requests begun (past authentication). */
  requests: number;
  inFlight: number;
}

export class UsageCounters {
  readonly #maxTenants: number;
  readonly tenants = new Map<string, Counts>();
  readonly keys = new Map<string, Counts>();

  constructor(maxTenants: number) {
    this.#maxTenants = maxTenants;
  }

  /** The counts of `tenant` ('' = anonymous), made on first use. */
  tenant(tenant: string): Counts {
    let c = this.tenants.get(tenant);
    if (c === undefined) {
      if (this.tenants.size >= this.#maxTenants) return this.tenant(OVERFLOW_LABEL);
      this.tenants.set(tenant, (c = { requests: 0, inFlight: 0 }));
    }
    return c;
  }

  /** The counts of a key by its id; null for '' (no key). */
  key(keyId: string): Counts | null {
    if (keyId === '') return null;
    let c = this.keys.get(keyId);
    if (c === undefined) this.keys.set(keyId, (c = { requests: 0, inFlight: 0 }));
    return c;
  }
}
