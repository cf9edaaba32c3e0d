// One P/D request's state across its legs (src/director/pd.ts drives them):
// the prefill leg in flight, what a decode retry sends, whether the decode leg
// carries an SGLang bootstrap room, the prefill endpoints of failed pairs.
// A Flight creates one only when disaggregation is configured and the request
// goes through it: other requests carry a null and allocate nothing.
import type { Endpoint } from '../endpoints/endpoint.js';
import type { PrefillLeg } from './pd.js';

export class PdAttempt {
  /** The prefill leg in flight (or done), or null. */
  leg: PrefillLeg | null = null;
  /** What a decode retry sends (the body with the prefill's transfer parameters, or the raw body); null: the raw body. */
  retryBody: Buffer | null = null;
  /** SGLang: the decode leg in flight carries a bootstrap room (its KV comes from the prefill leg's engine). */
  paired = false;
  /** SGLang: prefill endpoints of failed pairs (a new pair prefers another); null: none failed. */
  triedPrefill: Endpoint[] | null = null;
  /** SGLang: a pick found no revision able to pair its decode endpoint: a pick that finds nothing answers 503. */
  noPair = false;

  /** The attempt failed or the request ended: the prefill leg goes with it, and the next decode leg is unpaired until sent. */
  dropLeg(): void {
    this.leg?.abort();
    this.paired = false;
  }

  /** Remembers a failed pair's prefill endpoint (once). */
  notePrefillFailed(prefill: Endpoint): void {
    const tried = (this.triedPrefill ??= []);
    if (!tried.includes(prefill)) tried.push(prefill);
  }
}
