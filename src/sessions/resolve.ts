// Which conversation a request belongs to when its caller did not say (the
// Responses API passes its chain): the configured sources in order, the first
// that yields a non-empty string wins. Keys carry their source as a prefix,
// so a `user` value never collides with a session header's. No work beyond
// a property read per source when none yields a key.
import type { SessionSource } from '../config/sessions.js';

/** Longest session key taken from a request (longer values are ignored: keys are stored per session, maybe in Redis). */
export const MAX_SESSION_KEY = 256;

const HEADER = 0;
const CACHE_KEY = 1;
const USER = 2;
const CODE: Record<SessionSource, number> = { header: HEADER, prompt_cache_key: CACHE_KEY, user: USER };

export class SessionResolver {
  readonly #order: Uint8Array;

  constructor(sources: readonly SessionSource[]) {
    this.#order = Uint8Array.from(sources.map((s) => CODE[s]));
  }

  get reads(): boolean {
    return this.#order.length > 0;
  }

  /** True when the header source is configured (the transport then reads the header). */
  get readsHeader(): boolean {
    return this.#order.includes(HEADER);
  }

  /** The session key of a request from its session header value ('' when absent) and body; '' when no source yields one. */
  resolve(header: string, body: Readonly<Record<string, unknown>>): string {
    const order = this.#order;
    for (let i = 0; i < order.length; i++) {
      switch (order[i]) {
        case HEADER:
          if (header.length > 0 && header.length <= MAX_SESSION_KEY) return 's:' + header;
          break;
        case CACHE_KEY: {
          const v = body.prompt_cache_key;
          if (typeof v === 'string' && v.length > 0 && v.length <= MAX_SESSION_KEY) return 'c:' + v;
          break;
        }
        default: {
          const v = body.user;
          if (typeof v === 'string' && v.length > 0 && v.length <= MAX_SESSION_KEY) return 'u:' + v;
        }
      }
    }
    return '';
  }
}
