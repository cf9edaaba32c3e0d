// A Flight's pick and dispatch: the scheduler's request (the shared prompt
// writer, or the copy an async admission kept), the pick, the decide-mode
// hand-over, the P/D collaborator's turn (src/director/pd.ts), the upstream
// send with every leg's headers (one x-request-id, the trace headers), the
// P/D legs' hooks, and the scheduler's accounting of an attempt (release,
// unpick).
import { performance } from 'node:perf_hooks';
import type { Rejected } from '../admission.js';
import type { Endpoint } from '../endpoints/endpoint.js';
import { appendTraceHeaders } from '../proxy/trace-context.js';
import type { UpstreamSink } from '../proxy/upstream.js';
import type { Outcome } from '../scheduler/scheduler.js';
import type { SchedRequest } from '../scheduler/types.js';
import { EMPTY, EMPTY_BODY } from './flight-state.js';
import { AdmittingFlight } from './flight-admit.js';
import { PdAttempt } from './pd-attempt.js';
import type { FallbackReason, PdFlight, PrefillLeg } from './pd.js';
import type { DecisionPortOf } from './ports.js';
import type { Holdable } from './adapter-hold.js';

export abstract class PickingFlight extends AdmittingFlight implements PdFlight, UpstreamSink, Holdable {
  // what the P/D collaborator and the upstream client call: defined by the later layers
  abstract pairFailed(reason: FallbackReason, prefill: Endpoint | null): void;
  abstract toBoth(sreq: SchedRequest): boolean;
  abstract noPairInRevision(): void;
  abstract unservable(status: number, message: string): void;
  abstract onUpstreamHeaders(status: number, contentType: string, contentLength: number): void;
  abstract onUpstreamData(chunk: Buffer): void;
  abstract onUpstreamEnd(): void;
  abstract onUpstreamError(err: Error): void;

  // ---- pick and dispatch ------------------------------------------------------------

  /** The prompt for the scheduler: the shared writer's bytes (rendered again after a retry reused it), or the copy an async admission kept. */
  protected toSchedRequest(rerender: boolean): SchedRequest {
    const d = this.director;
    const sreq = d.schedRequest;
    sreq.model = this.model;
    sreq.sessionKey = this.sessionKey;
    sreq.tokens = this.tokens ?? undefined;
    sreq.pair = this.prefillEndpoint; // a decode retry stays in the prefill's revision
    sreq.role = null;
    if (d.scheduler.latency) {
      sreq.sloTtftMs = this.sloTtft;
      sreq.sloTpotMs = this.sloTpot;
      sreq.band = this.admitted ? (d.gate.bandName?.(this.ticket) ?? '') : '';
    }
    if (this.promptCopy !== null) sreq.prompt = this.promptCopy;
    else {
      if (rerender) this.rerenderPrompt();
      sreq.prompt = d.prompt.view();
    }
    return sreq;
  }

  protected override dispatch(): void {
    const d = this.director;
    let exclude: readonly Endpoint[] | null = this.tried;
    if (this.attempts === 0 && exclude === null) {
      // a LoRA adapter: held in the router while no candidate has a GPU adapter slot for it (adapter-hold.ts)
      const hold = d.adapterHold;
      if (this.held === 2) exclude = hold.exclude;
      else if (hold.applies(this.model)) {
        // the held requests that can go now go first (they use their own prompt copies)
        if (hold.held > 0) this.promptCopy ??= Uint8Array.prototype.slice.call(d.prompt.view());
        const now = performance.now();
        if (hold.mustWait(this.model, now)) {
          this.promptCopy ??= Uint8Array.prototype.slice.call(d.prompt.view());
          this.held = 1;
          hold.hold(this, this.model, (this.raw?.length ?? 0) + this.promptCopy.length, now);
          return;
        }
        exclude = hold.exclude;
      }
    }
    const sreq = this.toSchedRequest(this.attempts > 0); // the first pick follows the render at once
    const t0 = performance.now();
    const picked = d.scheduler.pick(sreq, exclude, this, t0);
    const t1 = performance.now();
    d.metrics.decision.observe((t1 - t0) / 1000);
    if (this.trace !== null) {
      const s = d.scheduler;
      this.trace.scheduled(t0, t1, picked === null ? null : this.endpoint, s.lastCandidates, s.lastScore, this.promptBlocks, this.matchedBlocks);
    }
    if (picked === null) {
      sreq.prompt = undefined;
      sreq.tokens = undefined;
      if (this.pdState !== null && this.pdState.noPair) this.reply(503, `no ready endpoint for model \`${this.model}\`: no revision has a ready prefill endpoint for its SGLang decode endpoints (they refuse a request without a bootstrap room) or a ready both endpoint`, null, null);
      else if (this.adapterLoadError !== '') this.reply(503, `no endpoint could serve adapter \`${this.model}\`: ${this.adapterLoadError}`, null, null);
      else if (this.tried !== null) this.reply(502, `all endpoints tried for model \`${this.model}\` failed: ${this.errorMessage}`, null, null);
      else this.reply(503, `no ready endpoint for model \`${this.model}\``, null, null);
      return;
    }
    this.picked = true;
    // its first body byte is the whole answer, long after the prefill: not in the backlog
    if (this.prefillTokens !== 0 && this.answersAfterDecode()) d.scheduler.prefilled(this);
    d.metrics.promptBlocks += this.promptBlocks;
    d.metrics.matchedBlocks += this.matchedBlocks;
    this.dispatchedAt = t1;
    if (this.decideOnly) {
      // the proxy dispatches (and retries down its own fallback list): nothing to retry here;
      // the router never sees its first byte, so it holds no prefill backlog either
      d.scheduler.prefilled(this);
      this.relayStarted = true;
      (this.port as DecisionPortOf<PickingFlight>).picked(this);
      return;
    }
    if (this.adapter !== '' && !this.endpoint.adapters.has(this.adapter)) {
      // a pool that loads adapters on demand: this engine lacks it; the request goes once it has it
      sreq.prompt = undefined;
      sreq.tokens = undefined;
      this.loadAdapterThenSend();
      return;
    }
    const pd = d.pd;
    // NIXL: a retry reuses the prefill's transfer parameters; SGLang: a decode-role endpoint only takes pairs
    if (pd !== null && (this.attempts === 0 || pd.needsRoom(this.endpoint)) && pd.begin(this, sreq)) {
      // the prefill leg computes the prompt (counted in its prefill endpoint's backlog): the decode endpoint gets its KV
      this.prefilled();
      sreq.prompt = undefined;
      sreq.tokens = undefined; // a prefill leg runs first (or both legs are out): the collaborator calls sendDecode
      return;
    }
    sreq.prompt = undefined;
    sreq.tokens = undefined;
    this.send(this.pdState?.retryBody ?? this.raw);
  }

  /** The adapter hold lets this request go: the pick runs now (Holdable). */
  holdReleased(): void {
    if (this.aborted || this.done) return;
    this.held = 2;
    try {
      this.dispatch();
    } catch (err) {
      this.internalError(err);
    }
  }

  /** The adapter hold refuses this request (full, timed out, closing): a 503 with its Retry-After (Holdable). */
  holdRefused(r: Rejected): void {
    if (this.aborted || this.done) return;
    const rejected = this.director.metrics.rejected;
    rejected.set(r.reason, (rejected.get(r.reason) ?? 0) + 1);
    this.reply(r.status, r.message, null, r);
  }

  /**
   * Asks the picked engine to load the request's adapter, then sends there;
   * a refused or timed-out load tries another endpoint (one that has it, or
   * another load) without this one, and with none left answers 503.
   * (After a load the request goes as one leg, without P/D.)
   */
  protected loadAdapterThenSend(): void {
    const ep = this.endpoint;
    void this.director.adapterLoader.load(ep, this.adapter).then((why) => {
      if (this.aborted || this.done) return; // the abort or the reply released the pick
      try {
        if (why === '') {
          this.send(this.raw);
          return;
        }
        this.adapterLoadError = why;
        this.unpick();
        (this.tried ??= []).push(ep);
        this.dispatch();
      } catch (err) {
        this.internalError(err);
      }
    });
  }

  protected send(body: Buffer | null): void {
    const call = this.director.upstream.send(this.endpoint, { method: 'POST', path: this.path, headers: this.legHeaders(this.endpoint), body }, this);
    // a client may fail the call synchronously (a closed pool): the nested retry or end already took over
    if (this.call === null && !this.done) this.call = call;
  }

  /**
   * Appends the trace headers (traceparent, tracestate, baggage) one upstream
   * leg to `endpoint` carries and returns `headers`. Every leg calls it: this
   * dispatch, each retry, a prefill leg before the decode leg. When the
   * request is traced it also starts the leg's span (ended by the next leg or
   * the request's end) and the engine gets that span as parent.
   */
  traceLeg(headers: string[], endpoint: Endpoint, now: number): string[] {
    const tr = this.trace;
    if (tr !== null) return appendTraceHeaders(headers, this.headers, tr.legStart(now, endpoint));
    return this.headers === EMPTY ? headers : appendTraceHeaders(headers, this.headers);
  }

  /**
   * The headers of an upstream request to `endpoint`: every leg of a request
   * (dispatch, retry, a P/D prefill leg) gets the same ones (one x-request-id)
   * plus its trace headers (traceLeg).
   */
  legHeaders(endpoint: Endpoint): string[] {
    return this.traceLeg(
      // the client's Authorization never goes upstream: the endpoint's pool key (upstreamAuth), if any
      endpoint.upstreamAuthorization !== ''
        ? ['content-type', 'application/json', 'x-request-id', this.requestId, 'authorization', endpoint.upstreamAuthorization]
        : ['content-type', 'application/json', 'x-request-id', this.requestId],
      endpoint,
      this.trace !== null ? performance.now() : 0,
    );
  }

  get rawBody(): Buffer {
    return this.raw ?? EMPTY_BODY;
  }

  get started(): boolean {
    return this.relayStarted;
  }

  setLeg(leg: PrefillLeg | null): void {
    if (leg !== null || this.pdState !== null) this.pdAttempt().leg = leg;
  }

  /** The decode leg, after the prefill leg (or at once, SGLang); `retryBody` is what a retry elsewhere sends. */
  sendDecode(body: Buffer, retryBody: Buffer): void {
    if (this.aborted || this.done) return;
    const p = this.pdAttempt();
    p.retryBody = retryBody;
    p.paired = body !== retryBody;
    this.dispatchedAt = performance.now();
    try {
      this.send(body);
    } catch (err) {
      this.internalError(err);
    }
  }

  /** The prefill leg answered 4xx: that is the client's answer. */
  prefillRejected(status: number, message: string): void {
    // the decode endpoint never saw the prompt: its slot is released (no breaker outcome) and the blocks its pick recorded go
    this.unpick();
    this.reply(status, message, null, null);
  }

  /** This request's P/D state, created on first use (only P/D requests get here). */
  protected pdAttempt(): PdAttempt {
    return (this.pdState ??= new PdAttempt());
  }

  get triedPrefill(): readonly Endpoint[] | null {
    return this.pdState?.triedPrefill ?? null;
  }

  /** Releases the current pick as never sent (no breaker outcome) and forgets the prefix blocks it recorded. */
  protected unpick(): void {
    if (!this.picked) return;
    this.picked = false;
    const scheduler = this.director.scheduler;
    scheduler.complete(this, 'aborted');
    if (scheduler.prefix !== null && this.promptBlocks > this.matchedBlocks) {
      const sreq = this.toSchedRequest(true);
      try {
        scheduler.prefix.forget(this.endpoint, this, sreq);
      } finally {
        sreq.prompt = undefined;
        sreq.tokens = undefined;
      }
    }
    const hold = this.director.adapterHold;
    if (hold.held > 0) hold.wake();
  }

  /** Completes the scheduler's accounting for the current attempt (once). */
  protected release(outcome: Outcome): void {
    if (!this.picked) return;
    this.picked = false;
    const scheduler = this.director.scheduler;
    // a slot (or its adapter's last request there) may be free now: the adapter hold looks, after this event
    const hold = this.director.adapterHold;
    if (hold.held > 0) hold.wake();
    if (outcome === 'failed' && (!this.relayStarted || this.status >= 500) && this.promptBlocks > this.matchedBlocks) {
      // cold path: the engine never took the prompt, so the prefix producer
      // forgets the blocks this pick recorded (it needs the prompt again)
      const sreq = this.toSchedRequest(true);
      try {
        scheduler.complete(this, outcome, sreq);
      } finally {
        sreq.prompt = undefined;
      }
      return;
    }
    scheduler.complete(this, outcome);
  }
}
