// Shared by the flow-controller tests: an abort signal the controller can
// hook, and a wait for the event loop to run queued callbacks.
import type { AbortHook } from '../src/flow/controller.js';

export const flush = () => new Promise<void>((r) => setImmediate(r));

export class Signal implements AbortHook {
  aborted = false;
  onabort: (() => void) | null = null;
  abort() {
    this.aborted = true;
    const cb = this.onabort;
    this.onabort = null;
    cb?.();
  }
}
