// grpc.health.v1.Health for the ext_proc server: Check and Watch over
// liveness (this process answers) and readiness (leading its standby pair, or
// no pair, and not draining), which the ext_proc service name also reports.
import * as grpc from '@grpc/grpc-js';

type WatchCall = grpc.ServerWritableStream<{ service?: string }, unknown>;

export class ExtProcHealth {
  readonly #ready: () => boolean;
  /** Open Health/Watch calls, each with the last status it was sent. */
  readonly #watches = new Map<WatchCall, number>();
  #watchTimer: NodeJS.Timeout | null = null;

  constructor(ready: () => boolean) {
    this.#ready = ready;
  }

  /** SERVING 1, NOT_SERVING 2, SERVICE_UNKNOWN 3 (grpc.health.v1). */
  #status(name: string): number {
    // liveness: this process answers; readiness (and the ext_proc service): leading and not draining
    if (name === 'liveness' || name === '') return 1;
    if (name === 'readiness' || name === 'envoy.service.ext_proc.v3.ExternalProcessor') return this.#ready() ? 1 : 2;
    return 3;
  }

  check(call: grpc.ServerUnaryCall<{ service?: string }, unknown>, cb: grpc.sendUnaryData<unknown>): void {
    const name = call.request?.service ?? '';
    const st = this.#status(name);
    if (st !== 3) cb(null, { status: st });
    else cb({ code: grpc.status.NOT_FOUND, details: `unknown health service ${quoted(name)} (liveness, readiness, envoy.service.ext_proc.v3.ExternalProcessor)` });
  }

  /**
   * Health/Watch: the current status at once, then each change (as the lease
   * moves to or from this router, or it starts draining). An unknown service
   * is SERVICE_UNKNOWN, not an error (grpc doc/health-checking.md). Changes
   * are noticed by one 50 ms check while any watch is open.
   */
  watch(call: WatchCall): void {
    const st = this.#status(call.request?.service ?? '');
    this.#watches.set(call, st);
    call.write({ status: st });
    const drop = () => {
      this.#watches.delete(call);
      if (this.#watches.size === 0 && this.#watchTimer !== null) {
        clearInterval(this.#watchTimer);
        this.#watchTimer = null;
      }
    };
    call.on('cancelled', drop);
    call.on('close', drop);
    call.on('error', drop);
    if (this.#watchTimer === null) {
      this.#watchTimer = setInterval(() => this.#pushWatches(), 50);
      this.#watchTimer.unref();
    }
  }

  #pushWatches(): void {
    for (const [call, last] of this.#watches) {
      const st = this.#status(call.request?.service ?? '');
      if (st === last) continue;
      this.#watches.set(call, st);
      call.write({ status: st });
    }
  }

  /** Watches are open-ended: tells them NOT_SERVING and ends them (or a server shutdown would wait for them). */
  close(): void {
    if (this.#watchTimer !== null) clearInterval(this.#watchTimer);
    this.#watchTimer = null;
    for (const call of this.#watches.keys()) {
      call.write({ status: 2 });
      call.end();
    }
    this.#watches.clear();
  }
}

/**
 * A caller's service name as the error's details show it: JSON-quoted (no
 * control characters) and cut at 128 characters. The details travel in the
 * grpc-message trailer, and a name as long as the message limit allows (4 MB)
 * would make trailers no client accepts, so the Check would never be answered.
 */
function quoted(name: string): string {
  return name.length > 128 ? `${JSON.stringify(name.slice(0, 128))}… (${name.length} characters)` : JSON.stringify(name);
}
