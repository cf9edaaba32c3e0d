// The Responses store: the seam between the Responses API and where turns are
// kept. Three implementations: memory (bounded, LRU; the embedded default),
// sqlite (a durable file) and redis (shared by router replicas). Each stored
// response carries the whole conversation up to and including its own output
// as rendered chat messages, so a turn reads ONE record (one Redis round trip)
// and never re-parses or re-renders its chain; eviction of any record cannot
// break another (docs/responses.md: the trade-off).
import { SwitchyardError } from '../errors.js';

export interface StoredResponse {
  /** The tenant that owns it ('' = the anonymous scope): part of the record's key in every store. */
  readonly tenant: string;
  readonly id: string;
  /** The first response of the conversation (its own id for a first turn): the session key. */
  readonly root: string;
  /** previous_response_id of the turn that made it ('' for a first turn). */
  readonly parent: string;
  /** Unix seconds. */
  readonly createdAt: number;
  /** The conversation's chat messages through this response's output, `instructions` excluded: a JSON fragment without brackets. */
  readonly conv: string;
  /** One item id per message of `conv`, comma-joined (input_items). */
  readonly ids: string;
  /** The Response object as JSON text (GET /v1/responses/{id}). */
  readonly response: string;
}

export function isPromise<T>(v: T | Promise<T>): v is Promise<T> {
  return typeof (v as Promise<T>)?.then === 'function';
}

/** The store cannot be reached or failed: the API answers 503 (chat completions are not affected). */
export class StoreUnavailableError extends SwitchyardError {
  override readonly code = 'SWY_ERR_STORE_UNAVAILABLE';
}

/** Approximate bytes a record holds (UTF-16 code units of its strings, plus a fixed overhead). */
export function recordBytes(r: StoredResponse): number {
  return r.conv.length + r.ids.length + r.response.length + r.id.length * 3 + 128;
}

/**
 * What the Responses API needs of a store. Methods may answer synchronously
 * (the memory store: no promise per turn) or with a promise; a failure throws
 * (or rejects with) StoreUnavailableError.
 */
export interface ResponseStore {
  readonly type: 'memory' | 'sqlite' | 'redis';
  /** False while the backing service is known to be unreachable: new turns get 503 before an engine is spent. */
  readonly available: boolean;
  /** The record `id` of `tenant` (another tenant's record with that id is not there: null). */
  get(tenant: string, id: string): StoredResponse | null | Promise<StoredResponse | null>;
  /** Stores `r` under (r.tenant, r.id); answers false when it was not kept (larger than a tenant's whole budget). */
  put(r: StoredResponse): boolean | Promise<boolean>;
  /** True if it was there (for this tenant). */
  delete(tenant: string, id: string): boolean | Promise<boolean>;
  /** Responses held (memory, sqlite; -1 where the store cannot say cheaply). */
  size(): number;
  close(): Promise<void>;
}
