// A Flight's retries: before the first byte reaches the client, a failed
// attempt (5xx head, connect or reset error) is released as failed and the
// request picked again without the endpoints it tried, within
// proxy.maxRetries; SGLang P/D: a failed pair is re-paired (a fresh room, a
// `both` endpoint, or a clean error), a revision that cannot pair is left.
import { performance } from 'node:perf_hooks';
import type { Decision } from '../scheduler/scheduler.js';
import type { LatencyNote, SchedRequest } from '../scheduler/types.js';
import { PickingFlight } from './flight-pick.js';
import type { FallbackReason } from './pd.js';
import type { Endpoint } from '../endpoints/endpoint.js';

export abstract class RetryingFlight extends PickingFlight {
  // ---- retry ----------------------------------------------------------------------

  protected canRetry(): boolean {
    return !this.relayStarted && !this.aborted && this.attempts < this.director.maxRetries;
  }

  protected retry(reason: string): void {
    this.errorMessage = reason;
    if (this.trace !== null) this.trace.legEnd(performance.now(), reason);
    // SGLang: the prefill leg of the failed decode leg's room goes with it (a retry forms a new pair)
    this.pdState?.dropLeg();
    // nothing of the failed attempt's answer (status, a buffered error body) carries over
    this.status = 0;
    this.errorBody = null;
    this.call?.abort();
    this.call = null;
    this.release('failed');
    (this.tried ??= []).push(this.endpoint);
    this.attempts++;
    this.director.metrics.retries++;
    // runs inside upstream socket callbacks: a throwing plugin or gate must answer 500, not crash
    try {
      this.dispatch();
    } catch (err) {
      this.internalError(err);
    }
  }

  /**
   * SGLang: the pair failed before decode sent a byte (`prefill`: its prefill
   * endpoint). A `both` decode endpoint decodes alone (it prefills itself); a
   * decode-role one refuses a request without a room, so, within the retry
   * budget, a new pair with a fresh room (another prefill endpoint when there
   * is one, this decode endpoint: it was not at fault) or a `both` endpoint;
   * otherwise a clean 502.
   */
  override pairFailed(reason: FallbackReason, prefill: Endpoint | null): void {
    if (this.aborted || this.done || this.relayStarted) return;
    const pd = this.director.pd!;
    const p = this.pdAttempt();
    this.prefillEndpoint = null;
    p.dropLeg();
    this.call?.abort();
    this.call = null;
    this.status = 0;
    this.errorBody = null;
    if (this.trace !== null) this.trace.legEnd(performance.now(), reason);
    if (!pd.needsRoom(this.endpoint)) {
      pd.countFallback(reason);
      this.sendDecode(this.rawBody, this.rawBody);
      return;
    }
    const why = `the pair of decode endpoint ${this.endpoint.name} with prefill endpoint ${prefill?.name ?? '?'} failed (${reason})`;
    if (this.attempts >= this.director.maxRetries) {
      this.unservable(502, `upstream P/D pair for model \`${this.model}\` failed: ${why}`);
      return;
    }
    this.attempts++;
    this.director.metrics.retries++;
    pd.countNewPair(reason);
    this.errorMessage = why;
    if (prefill !== null) p.notePrefillFailed(prefill);
    const sreq = this.toSchedRequest(true);
    try {
      pd.repair(this, sreq, why);
    } catch (err) {
      this.internalError(err);
    } finally {
      sreq.prompt = undefined;
      sreq.tokens = undefined;
      sreq.role = null;
    }
  }

  /**
   * SGLang: moves the pick to a `both` endpoint of the picked endpoint's pool
   * and revision (the decode-role endpoint first picked would refuse the
   * request alone). The new pick is made first, so a false answer (none ready)
   * changes nothing; on success the first pick is released (no breaker
   * outcome) and the prefix blocks it recorded are forgotten. Cold path.
   */
  override toBoth(sreq: SchedRequest): boolean {
    const d = this.director;
    if (!this.picked || d.pd === null || !d.pd.hasBoth(this.endpoint)) return false;
    const old: Decision & LatencyNote = {
      endpoint: this.endpoint,
      seq: this.seq,
      promptBlocks: this.promptBlocks,
      matchedBlocks: this.matchedBlocks,
      latPending: this.latPending,
      latWork: this.latWork,
      latOwn: this.latOwn,
      latRunning: this.latRunning,
      latPredTtftMs: this.latPredTtftMs,
      latPredTpotMs: this.latPredTpotMs,
      latSloTtftMs: this.latSloTtftMs,
      latSloTpotMs: this.latSloTpotMs,
      latBand: this.latBand,
    };
    const pair = sreq.pair;
    sreq.role = 'both';
    sreq.pair = old.endpoint;
    let picked: Decision | null;
    try {
      picked = d.scheduler.pick(sreq, this.tried, this);
    } finally {
      sreq.role = null;
      sreq.pair = pair;
    }
    if (picked === null) return false;
    if (this.prefillTokens !== 0 && this.answersAfterDecode()) d.scheduler.prefilled(this);
    d.scheduler.complete(old, 'aborted');
    if (d.scheduler.prefix !== null && old.promptBlocks > old.matchedBlocks && sreq.prompt !== undefined) d.scheduler.prefix.forget(old.endpoint, old, sreq);
    return true;
  }

  /** SGLang: this revision cannot pair its decode endpoints: pick again without them (503 when nothing is left). */
  override noPairInRevision(): void {
    const ep = this.endpoint;
    this.pdAttempt().noPair = true;
    this.unpick();
    const tried = (this.tried ??= []);
    for (const e of this.director.scheduler.endpoints.all) if (e.pool === ep.pool && e.revision === ep.revision && e.role !== 'both' && !tried.includes(e)) tried.push(e);
    if (!tried.includes(ep)) tried.push(ep);
    this.dispatch();
  }

  /** SGLang: nothing can serve the request: `status` before any byte; the decode pick is released without a breaker failure. */
  override unservable(status: number, message: string): void {
    if (this.aborted || this.done) return;
    this.unpick();
    this.reply(status, message, null, null);
  }
}
