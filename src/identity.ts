// Who a request belongs to: the seam between the router and whatever knows tenants
// (today flow control's classifier; later API-key authentication). A leaf: imports nothing.

/** Reads a request header by its lower-case name ('' when absent). */
export type HeaderGetter = (name: string) => string;

/** Names the tenant of a request from its headers. */
export interface Identity {
  /** The request's tenant, or '' when it names none (or nothing knows tenants). */
  tenantOf(get: HeaderGetter): string;
}
