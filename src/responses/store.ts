// The Responses store: the seam between the Responses API and where turns are
// kept. Three implementations: memory (bounded, LRU; the embedded default),
// sqlite (a durable file) and redis (shared by router replicas). Each stored
// response carries the whole conversation up to and including its own output
// as rendered chat messages when it is read, so a turn reads ONE record and
// never re-parses or re-renders its chain. A store keeps of a continuation
// only what it adds (its input and output), linked to its parent's part: a
// branch costs what it adds, not a copy of its history. A record's part stays
// while any record below it needs it, so deleting or evicting a response never
// breaks a chain (docs/responses.md, "The store").
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
  /**
   * Set by the turn on put when `conv` is the parent's conv, a comma and this
   * (and `ids` likewise with addedIds): what this turn added. A store links
   * the record to its parent's part and keeps only these; without them (a
   * first turn, a truncated conversation) or when the parent's part is gone,
   * it keeps the whole conv. Never set on a record a store returns.
   */
  readonly addedConv?: string;
  readonly addedIds?: string;
}

/**
 * Links a conversation may chain in a store before a record holds its whole
 * conversation again (a checkpoint): a read assembles at most this many
 * parts, in every store, whatever the conversation's length.
 */
export const MAX_LINKS = 128;

/**
 * True when `r` can be kept as what it adds on top of its parent's part
 * (addedConv/addedIds set, shorter than the whole). Lengths only: reading a
 * character of `conv` would make V8 copy the whole joined conversation into
 * one string on every put; the turn builds conv as the parent's, a comma and
 * addedConv, so the rest holds by construction.
 */
export function linksParent(r: StoredResponse): boolean {
  const c = r.addedConv;
  const i = r.addedIds;
  return r.parent !== '' && c !== undefined && i !== undefined && c.length < r.conv.length && i.length < r.ids.length;
}

/** Bytes a record's own fields hold (its Response object and ids), apart from its conversation part. */
export function entryBytes(r: Pick<StoredResponse, 'id' | 'response'>): number {
  return r.response.length + r.id.length * 3 + 128;
}

/** Bytes a conversation part of `conv` and `ids` code units holds. */
export function partBytes(convLen: number, idsLen: number): number {
  return convLen + idsLen + 32;
}

export function isPromise<T>(v: T | Promise<T>): v is Promise<T> {
  return typeof (v as Promise<T>)?.then === 'function';
}

/** The store cannot be reached or failed: the API answers 503 (chat completions are not affected). */
export class StoreUnavailableError extends SwitchyardError {
  override readonly code = 'SWY_ERR_STORE_UNAVAILABLE';
}

/**
 * Approximate bytes storing `r` adds (UTF-16 code units of its strings, plus
 * a fixed overhead): its own fields and what it adds to its conversation
 * (linked), or its whole conversation (not linked).
 */
export function recordBytes(r: StoredResponse): number {
  const linked = linksParent(r);
  return entryBytes(r) + (linked ? partBytes(r.addedConv!.length, r.addedIds!.length) : partBytes(r.conv.length, r.ids.length));
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
