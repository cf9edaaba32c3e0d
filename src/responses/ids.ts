// Response and item ids: `resp_` / `msg_` / `fc_` / `rs_` + 48 hex digits (OpenAI's shape),
// all 192 bits drawn from the CSPRNG: a response id is the capability that
// reads, continues or deletes a stored response (within its tenant), so it is
// unguessable from any other id: no per-process prefix, no counter. The random
// bytes come from a pool refilled 4 KiB at a time (one CSPRNG call per ~170
// ids, not one per id).
import { randomFillSync } from 'node:crypto';

const ID_BYTES = 24;
const pool = Buffer.alloc(ID_BYTES * 170);
let at = pool.length;

function next(): string {
  if (at + ID_BYTES > pool.length) {
    randomFillSync(pool);
    at = 0;
  }
  const s = pool.toString('hex', at, at + ID_BYTES);
  at += ID_BYTES;
  return s;
}

export function newResponseId(): string {
  return `resp_${next()}`;
}

export function newItemId(): string {
  return `msg_${next()}`;
}

/** A function_call output item's id. */
export function newCallItemId(): string {
  return `fc_${next()}`;
}

/** A reasoning output item's id. */
export function newReasoningId(): string {
  return `rs_${next()}`;
}

/** A call_id for a tool call the engine sent without one. */
export function newCallId(): string {
  return `call_${next()}`;
}
