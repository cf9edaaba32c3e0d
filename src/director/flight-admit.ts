// A Flight's first layer: the body parsed (on the loop, or the answer of a
// parse worker), the model checked, the x-slo-* objectives read, the session
// resolved (a shared store read through first), tokenization started
// (precise pools), and the gate's admission, synchronous or held; an admitted
// request goes on to the pick (flight-pick.ts) once its tokens are in.
import { performance } from 'node:perf_hooks';
import type { Admission } from '../admission.js';
import type { TokenSource } from '../tokenize/source.js';
import { parseRequestBody, renderPrompt } from './body.js';
import { isPassthrough } from './kinds.js';
import { withFields } from './pd.js';
import type { ParseReply } from './parse-worker.js';
import { FlightState, SLO_HEADERS } from './flight-state.js';

export abstract class AdmittingFlight extends FlightState {
  // ---- parse and admit ----------------------------------------------------------

  start(raw: Buffer): void {
    this.raw = raw;
    this.clientRaw = raw;
    this.bodyBytes = raw.length;
    const d = this.director;
    const sc = d.scanner;
    if (sc !== null && raw.length <= d.scanOnLoopBytes) {
      // the fast path: one native scan; null when only the JavaScript parse can give the answer
      const s = sc.scan(raw, this.kind, d.prompt, d.maxJsonDepth);
      if (s !== null) {
        this.scanned = true;
        this.body = s.body;
        this.model = s.model;
        this.promptBytes = d.prompt.length;
        this.admit();
        return;
      }
    }
    if (raw.length > d.parseOffloadBytes) {
      this.clientRaw = null; // a queued task reads it when a worker takes it: never given back
      d.parseOffLoop(this, raw);
      return;
    }
    const r = parseRequestBody(raw, this.kind, d.prompt, d.maxJsonDepth, d.rewrites.hasDefault);
    if (!r.ok) {
      this.reply(r.status, r.message, r.param, null);
      return;
    }
    this.body = r.body;
    this.model = r.model;
    this.promptBytes = d.prompt.length;
    this.admit();
  }

  /** The worker's answer for a body parsed off the event loop. */
  parsed(r: ParseReply): void {
    if (this.aborted || this.done) return;
    try {
      if (!r.ok) {
        this.reply(r.status, r.message, r.param, null);
        return;
      }
      this.body = r.fields;
      this.model = r.model;
      this.promptCopy = r.prompt; // the body's other fields stay in the worker: never rendered again here
      this.promptBytes = r.prompt.length;
      this.admit();
    } catch (err) {
      this.internalError(err);
    }
  }

  protected rerenderPrompt(): void {
    const d = this.director;
    if (this.scanned && this.raw !== null) d.scanner!.scan(this.raw, this.kind, d.prompt, d.maxJsonDepth);
    else renderPrompt(d.prompt, this.kind, this.body);
  }

  protected admit(): void {
    const d = this.director;
    let model = this.model;
    const asked = model;
    if (d.rewrites.active) {
      // the session first: a conversation keeps the target its first request got
      const passthrough = isPassthrough(this.kind);
      if (!passthrough && this.sessionKey === '') this.sessionKey = d.resolver.resolve(this.sessionHeader, this.body);
      const target = d.rewrites.apply(model, passthrough ? '' : this.sessionKey);
      if (target !== model) {
        // the engine reads the last `model` of the body: appended, the bytes before stay the client's
        this.raw = withFields(this.raw!, `"model":${JSON.stringify(target)}`);
        this.bodyBytes = this.raw.length;
        model = this.model = target;
      }
    }
    if (model === '') {
      // a passthrough body without `model` (the engine would default to its own)
      if (d.soleModel === '') {
        this.reply(400, "missing required field 'model' (the router serves several models)", 'model', null);
        return;
      }
      model = this.model = d.soleModel;
    }
    // a model outside the caller's allow-list is answered exactly as one that does not exist (existence does not leak)
    // the allow-list is of the names callers ask for (a rewrite's target is the router's business)
    if (!d.scheduler.hasModel(model) || (this.caller.models !== null && !this.caller.models.has(asked === '' ? model : asked))) {
      this.reply(404, `The model \`${asked === '' ? model : asked}\` does not exist.`, 'model', null);
      return;
    }
    if (d.scheduler.latency && !this.readSlo()) return;
    if (isPassthrough(this.kind)) {
      this.sessionKey = '';
      this.admitGate();
      return;
    }
    if (this.sessionKey === '') this.sessionKey = d.resolver.resolve(this.sessionHeader, this.body);
    const key = this.sessionKey;
    if (key !== '') {
      // the turn tracker: a continuation of an active conversation (turn priority); with a
      // shared store (Redis) the session is read through first (the pick never waits for it)
      const sessions = d.sessions;
      const load = sessions.load(key, Date.now());
      if (load !== null) {
        this.promptCopy ??= Uint8Array.prototype.slice.call(d.prompt.view());
        load.then(() => {
          if (this.aborted || this.done) return;
          try {
            this.continuation = sessions.continues(key, Date.now());
            this.admitGate();
          } catch (err) {
            this.internalError(err);
          }
        });
        return;
      }
      this.continuation = sessions.continues(key, Date.now());
    }
    this.admitGate();
  }

  protected admitGate(): void {
    const d = this.director;
    const tr = this.trace;
    if (tr !== null) {
      tr.parsed(this.model, this.body);
      tr.admissionStart(performance.now());
    }
    // tokenize while admission runs; the pick waits for it (never inside the pick)
    if (d.tokens !== null && !isPassthrough(this.kind)) this.tokenize(d.tokens);
    const a = d.gate.admit(this, this);
    if (typeof (a as Promise<Admission>).then === 'function') {
      this.promptCopy ??= Uint8Array.prototype.slice.call(d.prompt.view());
      (a as Promise<Admission>).then(
        (r) => {
          try {
            this.onAdmission(r);
          } catch (err) {
            this.internalError(err);
          }
        },
        (err: Error) => {
          try {
            this.onAdmission({ admitted: false, status: 503, message: `admission failed: ${err.message}`, reason: 'gate-error' });
          } catch (e) {
            this.internalError(e);
          }
        },
      );
    } else this.onAdmission(a as Admission);
  }

  protected onAdmission(a: Admission): void {
    if (this.trace !== null) this.trace.admissionEnd(performance.now(), a.admitted, a.admitted ? '' : a.reason);
    if (a.admitted) {
      if (this.aborted || this.done) {
        this.director.gate.release(a.ticket, 'aborted');
        return;
      }
      this.admitted = true;
      this.ticket = a.ticket;
      if (this.tokensWait !== null) {
        void this.tokensWait.then(() => {
          if (this.aborted || this.done) {
            this.director.gate.release(this.ticket, 'aborted');
            return;
          }
          try {
            this.dispatch();
          } catch (err) {
            this.internalError(err);
          }
        });
        return;
      }
      this.dispatch();
      return;
    }
    if (this.aborted || this.done) return;
    const rejected = this.director.metrics.rejected;
    rejected.set(a.reason, (rejected.get(a.reason) ?? 0) + 1);
    this.reply(a.status, a.message, null, a);
  }

  protected tokenize(src: TokenSource): void {
    if (!src.has(this.model)) return;
    // a scanned body's messages and prompt were never parsed: the tokenizer is the one reader that asks for them
    const b = this.scanned && this.raw !== null ? (JSON.parse(this.raw.toString('utf8')) as Record<string, unknown>) : (this.body as Record<string, unknown>);
    const r = src.tokens({ model: this.model, messages: b.messages, prompt: b.prompt }, this.promptCopy ?? this.director.prompt.view());
    if (r instanceof Promise) {
      this.tokensWait = r.then((v) => {
        this.tokens = v;
        this.tokensWait = null;
        return v;
      });
    } else this.tokens = r;
  }

  /** Reads x-slo-ttft-ms / x-slo-tpot-ms; false after answering 400 for a value that is not a positive number. */
  protected readSlo(): boolean {
    const h = this.headers;
    for (let i = 0; i < SLO_HEADERS.length; i++) {
      const name = SLO_HEADERS[i];
      const v = h[name];
      if (v === undefined || v === '') continue;
      const ms = Number(v);
      if (!(ms > 0) || !Number.isFinite(ms)) {
        this.reply(400, `header ${name} must be a positive number of milliseconds (got ${JSON.stringify(v.slice(0, 64))})`, name, null);
        return false;
      }
      if (i === 0) this.sloTtft = ms;
      else this.sloTpot = ms;
    }
    return true;
  }
}
