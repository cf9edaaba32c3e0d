// Typed surface over the native HTTP/1.1 front end's request parser (native/h1_request_parser.h).
import { native } from './native.js';

/** What h1RequestParseForTest saw (see native/h1_request_probe.cc). */
export interface H1RequestProbe {
  /** done: a whole head was parsed; fail: invalid (status says the answer); more: incomplete. */
  outcome: 'done' | 'fail' | 'more';
  /** The answer for an invalid head (400, 417, 431, 501, 505), else 0. */
  status: number;
  /** A request line was begun (a timeout then answers 408). */
  begun: boolean;
  // the rest only when outcome is 'done'
  method?: string;
  /** One char per byte (latin1), as sent. */
  target?: string;
  form?: 'origin' | 'absolute' | 'authority' | 'asterisk';
  minor?: 0 | 1;
  /** Content-Length, -1 when absent. */
  length?: number;
  chunked?: boolean;
  keepAlive?: boolean;
  expectContinue?: boolean;
  headLen?: number;
  /** [name, value] per field line, one char per byte, the value's SP/HTAB trimmed. */
  fields?: [string, string][];
  /** done: the whole body was read; fail: bad chunked framing (400); more: the body is incomplete. */
  bodyOutcome?: 'done' | 'fail' | 'more';
  body?: Buffer;
  /** Bytes of the input that were this request (head and body) when bodyOutcome is done. */
  consumed?: number;
}

/**
 * Test-only: feeds `bytes` to one native strict request parser as a head buffer growing at the
 * offsets in `splits` (increasing, inside bytes), then decodes its body in the same pieces.
 * Not for request paths: it builds a JS object per call.
 */
export function h1RequestParseForTest(bytes: Uint8Array, splits: Uint32Array, maxHead = 64 * 1024, maxLines = 100): H1RequestProbe {
  return native.h1RequestParseForTest(bytes, splits, maxHead, maxLines) as H1RequestProbe;
}
