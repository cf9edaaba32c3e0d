// Response and item ids: `resp_` / `msg_` + 48 hex digits, as OpenAI's: 24
// random digits per process (router replicas sharing a store never collide)
// and a 24-digit counter starting at a random value. No crypto call per id.
import { randomBytes } from 'node:crypto';

const PREFIX = randomBytes(12).toString('hex');
let counter = Number.parseInt(randomBytes(4).toString('hex'), 16);

function next(): string {
  counter = (counter + 1) % 0x1_0000_0000_0000;
  return PREFIX + counter.toString(16).padStart(24, '0');
}

export function newResponseId(): string {
  return `resp_${next()}`;
}

export function newItemId(): string {
  return `msg_${next()}`;
}
