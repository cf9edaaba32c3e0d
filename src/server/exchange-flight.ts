// What a request's transport (HttpExchange, NativeExchange) and the drain need
// of the side that took its body over: the director's Flight or a Responses turn.
import type { Endpoint } from '../endpoints/endpoint.js';

/** What the exchange needs of the side that took its body over (the director's Flight, a Responses turn). */
export interface ExchangeFlight {
  readonly model: string;
  readonly path: string;
  readonly endpoint?: Endpoint;
  /** P/D: the endpoint whose prefill the decode leg used (x-switchyard-prefill-endpoint); null when none. */
  readonly prefillEndpoint?: Endpoint | null;
  /** The client went away (499), or the router cut the request (`status`: 503 at a drain's end). */
  clientAborted(status?: number): void;
  /** For the access log and the outcome metrics, where the side keeps them (the director's Flight does). */
  readonly completionTokens?: number;
  readonly responseBytes?: number;
  readonly retries?: number;
  pause(): void;
  resume(): void;
  /**
   * A drain's grace ended while its stream runs: the bytes the stream ends with in this side's own API shape
   * (a Responses turn: `error` and `response.failed` events); absent or null: the chat-shaped SSE error and
   * `[DONE]` (drain.ts shutdownEvent).
   */
  shutdownEvents?(code: string, message: string): string | null;
}
