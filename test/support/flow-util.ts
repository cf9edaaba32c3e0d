// Shared by the flow-control tests: an abort signal the controller can hook,
// a wait for the event loop to run queued callbacks, and the operator's
// flowControl block as docs/flow-control.md shows it.
import { readFileSync } from 'node:fs';
import type { AbortHook } from '../../src/flow/controller.js';

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

/** The flowControl block of docs/flow-control.md's "Configuration" section, read from the doc so the
 * tests that use it also keep the documented example valid. */
export const OPERATOR_FLOW_BLOCK = (() => {
  const doc = readFileSync(new URL('../../docs/flow-control.md', import.meta.url), 'utf8');
  // the first yaml block under the heading; its flowControl block runs to the block's end (the auth block comes first)
  const m = /## Configuration\s+```yaml\n[\s\S]*?^(flowControl:[\s\S]*?)```/m.exec(doc);
  if (!m) throw new Error('docs/flow-control.md has no yaml flowControl block under "## Configuration"');
  return m[1]!;
})();
