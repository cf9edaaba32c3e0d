// Plain reference model of how the router reads one HTTP/1.1 response from an
// engine (RFC 9112 as the native parser, native/h1_parser.h, and the TS one,
// src/proxy/h1-parser.ts, apply it; the rules are listed in h1_parser.h).
// Written as a whole-input reader over a string, with no streaming state, so
// it shares no code or structure with the parsers it checks:
// test/native-h1-parser.property.test.ts feeds both parsers the same bytes in random
// read splits and compares them with this.

export const MAX_HEAD = 64 * 1024;
export const MAX_TRAILERS = 64 * 1024;
export const MAX_CHUNK_EXT = 4096;
export const MAX_CHUNK_DIGITS = 12;

export const ERR = { none: 0, badStatus: 6, headTooLarge: 7, badChunk: 8, badLength: 9 } as const;

export interface ModelResult {
  /** done: complete; eof: a body delimited by close ended with the input; fail: malformed; more: incomplete. */
  outcome: 'done' | 'eof' | 'fail' | 'more';
  error: number;
  /** 1 when a final head was read (then status, type, length are set). */
  heads: number;
  status: number;
  type: string;
  length: number;
  /** Whether the connection may be reused (meaningful for done and eof). */
  keepAlive: boolean;
  /** Bytes that belonged to the response (done and eof). */
  consumed: number;
  body: string;
}

const trimOws = (s: string): string => s.replace(/^[ \t]+/, '').replace(/[ \t]+$/, '');
const tokens = (v: string): string[] => v.split(',').map(trimOws).filter((x) => x !== '');
const lowerAscii = (s: string): string => s.replace(/[A-Z]/g, (c) => c.toLowerCase());

/** Reads one response from `input` (latin1: one char per byte). `eof`: the peer closed after the last byte. */
export function readResponse(input: string, eof: boolean): ModelResult {
  const r: ModelResult = { outcome: 'more', error: 0, heads: 0, status: 0, type: '', length: -1, keepAlive: true, consumed: 0, body: '' };
  const fail = (error: number): ModelResult => ({ ...r, outcome: 'fail', error });
  let pos = 0;
  // heads: any number of 1xx, then the final one
  let framing: 'length' | 'close' | 'chunked';
  let length = 0;
  for (;;) {
    const end = input.indexOf('\r\n\r\n', pos);
    if (end < 0) return input.length - pos >= MAX_HEAD ? fail(ERR.headTooLarge) : r;
    if (end + 4 - pos > MAX_HEAD) return fail(ERR.headTooLarge);
    const head = input.slice(pos, end + 4);
    pos = end + 4;
    const m = /^HTTP\/1\.([0-9]) ([0-9]{3})[ \r\n]/.exec(head);
    if (m === null) return fail(ERR.badStatus);
    const status = Number(m[2]);
    if (status < 100 || status > 599 || status === 101) return fail(ERR.badStatus);
    if (status < 200) continue;
    let type = '';
    let contentLength = -1;
    let te: string[] | null = null;
    const conn: string[] = [];
    for (const line of head.split('\n').slice(1)) {
      const colon = line.indexOf(':');
      if (colon < 0) continue;
      const name = lowerAscii(line.slice(0, colon));
      const value = line.slice(colon + 1).replace(/^[ \t]+/, '').replace(/[ \t\r]+$/, '');
      if (name === 'content-type') type = value;
      else if (name === 'content-length') {
        if (!/^[0-9]+$/.test(value) || BigInt(value) > BigInt(Number.MAX_SAFE_INTEGER)) return fail(ERR.badLength);
        const v = Number(value);
        if (contentLength >= 0 && v !== contentLength) return fail(ERR.badLength);
        contentLength = v;
      } else if (name === 'transfer-encoding') (te ??= []).push(...tokens(value));
      else if (name === 'connection') conn.push(...tokens(value).map(lowerAscii));
    }
    r.heads = 1;
    r.status = status;
    r.type = type;
    r.keepAlive = !conn.includes('close') && (m[1] !== '0' || conn.includes('keep-alive'));
    if (status === 204 || status === 304) {
      framing = 'length';
      length = 0;
      r.length = 0;
    } else if (te !== null) {
      if (contentLength >= 0) r.keepAlive = false;
      r.length = -1;
      const last = te.length > 0 ? lowerAscii(te[te.length - 1]!) : '';
      framing = last === 'chunked' ? 'chunked' : 'close';
    } else if (contentLength >= 0) {
      framing = 'length';
      length = contentLength;
      r.length = contentLength;
    } else {
      framing = 'close';
      r.length = -1;
    }
    if (framing === 'close') r.keepAlive = false;
    break;
  }
  const done = (at: number): ModelResult => ({ ...r, outcome: 'done', consumed: at });
  if (framing === 'length') {
    r.body = input.slice(pos, pos + length);
    return input.length - pos >= length ? done(pos + length) : r;
  }
  if (framing === 'close') {
    r.body = input.slice(pos);
    return eof ? { ...r, outcome: 'eof', consumed: input.length } : r;
  }
  // chunked
  for (;;) {
    const digits = /^[0-9a-fA-F]*/.exec(input.slice(pos, pos + MAX_CHUNK_DIGITS + 1))![0];
    if (digits.length > MAX_CHUNK_DIGITS) return fail(ERR.badChunk);
    pos += digits.length;
    if (pos >= input.length) return r;
    if (digits.length === 0) return fail(ERR.badChunk);
    const size = parseInt(digits, 16);
    const c = input[pos]!;
    if (c === ';' || c === ' ' || c === '\t') {
      const nl = input.indexOf('\n', pos + 1);
      const extLen = (nl < 0 ? input.length : nl) - (pos + 1);
      if (extLen > MAX_CHUNK_EXT) return fail(ERR.badChunk);
      if (nl < 0) return r;
      pos = nl + 1;
    } else if (c === '\r') {
      if (pos + 1 >= input.length) return r;
      if (input[pos + 1] !== '\n') return fail(ERR.badChunk);
      pos += 2;
    } else if (c === '\n') pos += 1;
    else return fail(ERR.badChunk);
    if (size === 0) break;
    r.body += input.slice(pos, pos + size);
    if (input.length - pos < size) return r;
    pos += size;
    // the chunk's data ends with CRLF (or a bare LF)
    if (input.startsWith('\r\n', pos)) pos += 2;
    else if (input[pos] === '\n') pos += 1;
    else if (pos >= input.length || (input[pos] === '\r' && pos + 1 >= input.length)) return r;
    else return fail(ERR.badChunk);
  }
  // trailer section: lines up to a blank one ("" or "\r"), at most MAX_TRAILERS bytes in all
  const start = pos;
  for (;;) {
    const nl = input.indexOf('\n', pos);
    if (nl < 0) return input.length - start > MAX_TRAILERS ? fail(ERR.badChunk) : r;
    if (nl + 1 - start > MAX_TRAILERS) return fail(ERR.badChunk);
    const line = input.slice(pos, nl);
    pos = nl + 1;
    if (line === '' || line === '\r') return done(pos);
  }
}
