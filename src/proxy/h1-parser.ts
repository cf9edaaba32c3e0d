// The HTTP/1.1 response parser of the TS h1 client: the same rules as the
// native client's parser (native/h1_parser.h; its header comment lists them),
// so the router behaves alike whichever client serves an endpoint.
// test/native-h1-parser.property.test.ts compares both parsers with the plain model
// in test/reference/h1-response.ts over generated responses and read splits;
// test/h1-conformance.test.ts runs both clients over real sockets.
//
// Body pieces are handed to the sink as ranges of the buffer given to feed()
// (no copy); a feed may yield several pieces (one per chunk).

/** Error reasons, numbered as the native client's (bindings/upstream-client.ts UpstreamErrorReason). */
export const enum H1Error {
  None = 0,
  BadStatus = 6,
  HeadTooLarge = 7,
  BadChunk = 8,
  BadLength = 9,
  Unexpected = 10,
}

export const enum H1Result {
  More = 0,
  Done = 1,
  Fail = 2,
  /** The sink returned false (it gave up the response): nothing more was parsed. */
  Stop = 3,
}

export const H1_MAX_HEAD = 64 * 1024;
export const H1_MAX_TRAILERS = 64 * 1024;
export const H1_MAX_CHUNK_EXT = 4096;
export const H1_MAX_CHUNK_DIGITS = 12;

export interface H1ParserSink {
  /** The final head (1xx heads are skipped). Return false to stop parsing. */
  onHead(status: number, contentType: string, contentLength: number): boolean;
  /** Body bytes buf[start, end). Return false to stop parsing. */
  onBody(buf: Buffer, start: number, end: number): boolean;
}

const enum St {
  Idle,
  Head,
  BodyLength,
  BodyClose,
  ChunkSize,
  ChunkExt,
  ChunkSizeLF,
  ChunkData,
  ChunkDataCR,
  ChunkDataLF,
  Trailer,
}

const CRLFCRLF = Buffer.from('\r\n\r\n');
const CONTENT_TYPE = Buffer.from('content-type');
const CONTENT_LENGTH = Buffer.from('content-length');
const TRANSFER_ENCODING = Buffer.from('transfer-encoding');
const CONNECTION = Buffer.from('connection');
const CLOSE = Buffer.from('close');
const KEEP_ALIVE = Buffer.from('keep-alive');
const CHUNKED = Buffer.from('chunked');

/** Case-insensitive: buf[a, b) equals lower-case `lower` (letters, digits and '-'). */
function eqLower(buf: Buffer, a: number, b: number, lower: Buffer): boolean {
  if (b - a !== lower.length) return false;
  for (let k = 0; k < lower.length; k++) {
    let c = buf[a + k]!;
    if (c >= 65 && c <= 90) c += 32;
    if (c !== lower[k]) return false;
  }
  return true;
}

const HTTP1 = Buffer.from('HTTP/1.');

/** buf[at, at + 7) is "HTTP/1." (byte compares: no string per response). */
function startsWithHttp1(buf: Buffer, at: number): boolean {
  for (let k = 0; k < 7; k++) if (buf[at + k] !== HTTP1[k]) return false;
  return true;
}

function isDigit(c: number | undefined): boolean {
  return c !== undefined && c >= 48 && c <= 57;
}

function hexValue(c: number): number {
  if (c >= 48 && c <= 57) return c - 48;
  if (c >= 97 && c <= 102) return c - 87;
  if (c >= 65 && c <= 70) return c - 55;
  return -1;
}

// token-list scan results (module scratch: no object per header)
let tokClose = false;
let tokKeepAlive = false;
let tokLastChunked = false;

/**
 * Scans a comma-separated list buf[a, b) (OWS trimmed, empty elements skipped):
 * a Connection list sets tokClose / tokKeepAlive, a Transfer-Encoding list tokLastChunked.
 */
function scanTokens(buf: Buffer, a: number, b: number, connection: boolean): void {
  let i = a;
  while (i <= b) {
    let j = i;
    while (j < b && buf[j] !== 44) j++;
    let s = i;
    let e = j;
    while (s < e && (buf[s] === 32 || buf[s] === 9)) s++;
    while (e > s && (buf[e - 1] === 32 || buf[e - 1] === 9)) e--;
    if (e > s) {
      if (!connection) tokLastChunked = eqLower(buf, s, e, CHUNKED);
      else if (eqLower(buf, s, e, CLOSE)) tokClose = true;
      else if (eqLower(buf, s, e, KEEP_ALIVE)) tokKeepAlive = true;
    }
    i = j + 1;
  }
}

export class H1ResponseParser {
  #st = St.Idle;
  #pending: Buffer | null = null;
  #remaining = 0;
  #chunkSize = 0;
  #digits = 0;
  #lineLen = 0;
  #lineCr = false;
  #trailerBytes = 0;
  keepAlive = true;
  error = H1Error.None;
  /** Bytes of the last feed() that belonged to the response (set on Done). */
  consumed = 0;

  /** Expect a new response (its head first). */
  start(): void {
    this.#st = St.Head;
    this.#pending = null;
    this.keepAlive = true;
    this.error = H1Error.None;
  }

  get inHead(): boolean {
    return this.#st === St.Head;
  }

  /** The peer closed: true when that ends the response (a body delimited by close). */
  eof(): boolean {
    if (this.#st !== St.BodyClose) return false;
    this.#st = St.Idle;
    this.keepAlive = false;
    return true;
  }

  #fail(e: H1Error): H1Result {
    this.error = e;
    this.#st = St.Idle;
    return H1Result.Fail;
  }

  #done(i: number): H1Result {
    this.consumed = i;
    this.#st = St.Idle;
    return H1Result.Done;
  }

  #sizeLineDone(): void {
    if (this.#chunkSize === 0) {
      this.#st = St.Trailer;
      this.#lineLen = 0;
      this.#lineCr = false;
      this.#trailerBytes = 0;
    } else {
      this.#st = St.ChunkData;
      this.#remaining = this.#chunkSize;
    }
  }

  #nextChunk(): void {
    this.#st = St.ChunkSize;
    this.#chunkSize = 0;
    this.#digits = 0;
  }

  /**
   * Feeds `buf` (which may be a shared read buffer: anything kept past this
   * call is copied). `consumed` counts bytes of `buf` on Done; a head that
   * spanned feeds counts only its bytes in this one.
   */
  feed(buf: Buffer, sink: H1ParserSink): H1Result {
    let i = 0;
    const n = buf.length;
    while (i < n) {
      switch (this.#st) {
        case St.Head: {
          let head = buf;
          let from = i;
          let old = 0;
          if (this.#pending !== null) {
            old = this.#pending.length;
            head = Buffer.concat([this.#pending, buf.subarray(i)]);
            from = 0;
          }
          const e = head.indexOf(CRLFCRLF, old >= 3 ? from + old - 3 : from);
          if (e < 0) {
            if (head.length - from >= H1_MAX_HEAD) return this.#fail(H1Error.HeadTooLarge);
            this.#pending = Buffer.from(head.subarray(from)); // a copy: buf may be the shared read buffer
            return H1Result.More;
          }
          const hl = e + 4 - from;
          if (hl > H1_MAX_HEAD) return this.#fail(H1Error.HeadTooLarge);
          this.#pending = null;
          const r = this.#parseHead(head, from, from + hl, sink);
          if (r !== H1Result.More) return r;
          i += hl - old;
          if ((this.#st as St) === St.BodyLength && this.#remaining === 0) return this.#done(i); // (#parseHead set #st)
          break;
        }
        case St.BodyLength: {
          const take = Math.min(this.#remaining, n - i);
          this.#remaining -= take;
          const a = i;
          i += take;
          if (this.#remaining === 0) {
            this.consumed = i;
            this.#st = St.Idle;
            if (!sink.onBody(buf, a, i)) return H1Result.Stop;
            return H1Result.Done;
          }
          if (!sink.onBody(buf, a, i)) return H1Result.Stop;
          break;
        }
        case St.BodyClose: {
          const a = i;
          i = n;
          if (!sink.onBody(buf, a, n)) return H1Result.Stop;
          break;
        }
        case St.ChunkSize: {
          const c = buf[i++]!;
          const v = hexValue(c);
          if (v >= 0) {
            if (++this.#digits > H1_MAX_CHUNK_DIGITS) return this.#fail(H1Error.BadChunk);
            this.#chunkSize = this.#chunkSize * 16 + v;
            break;
          }
          if (this.#digits === 0) return this.#fail(H1Error.BadChunk);
          if (c === 59 || c === 32 || c === 9) {
            this.#st = St.ChunkExt;
            this.#lineLen = 0;
          } else if (c === 13) this.#st = St.ChunkSizeLF;
          else if (c === 10) this.#sizeLineDone();
          else return this.#fail(H1Error.BadChunk);
          break;
        }
        case St.ChunkExt: {
          const nl = buf.indexOf(10, i);
          const end = nl < 0 ? n : nl;
          this.#lineLen += end - i;
          if (this.#lineLen > H1_MAX_CHUNK_EXT) return this.#fail(H1Error.BadChunk);
          i = end;
          if (nl >= 0) {
            i++;
            this.#sizeLineDone();
          }
          break;
        }
        case St.ChunkSizeLF:
          if (buf[i++] !== 10) return this.#fail(H1Error.BadChunk);
          this.#sizeLineDone();
          break;
        case St.ChunkData: {
          const take = Math.min(this.#remaining, n - i);
          this.#remaining -= take;
          const a = i;
          i += take;
          if (this.#remaining === 0) this.#st = St.ChunkDataCR;
          if (!sink.onBody(buf, a, i)) return H1Result.Stop;
          break;
        }
        case St.ChunkDataCR: {
          const c = buf[i++];
          if (c === 13) this.#st = St.ChunkDataLF;
          else if (c === 10) this.#nextChunk();
          else return this.#fail(H1Error.BadChunk);
          break;
        }
        case St.ChunkDataLF:
          if (buf[i++] !== 10) return this.#fail(H1Error.BadChunk);
          this.#nextChunk();
          break;
        case St.Trailer: {
          const c = buf[i++]!;
          if (++this.#trailerBytes > H1_MAX_TRAILERS) return this.#fail(H1Error.BadChunk);
          if (c === 10) {
            // a blank line ("" or a lone CR) ends the trailer section
            if (this.#lineLen === 0 || (this.#lineLen === 1 && this.#lineCr)) return this.#done(i);
            this.#lineLen = 0;
            this.#lineCr = false;
          } else {
            this.#lineCr = this.#lineLen === 0 && c === 13;
            this.#lineLen++;
          }
          break;
        }
        default:
          return this.#fail(H1Error.Unexpected);
      }
    }
    return H1Result.More;
  }

  /** One complete head buf[start, end) (ends with CRLFCRLF); More to go on, else Fail or Stop. */
  #parseHead(buf: Buffer, start: number, end: number, sink: H1ParserSink): H1Result {
    if (
      end - start < 13 ||
      !startsWithHttp1(buf, start) ||
      !isDigit(buf[start + 7]) ||
      buf[start + 8] !== 32 ||
      !isDigit(buf[start + 9]) ||
      !isDigit(buf[start + 10]) ||
      !isDigit(buf[start + 11]) ||
      (buf[start + 12] !== 32 && buf[start + 12] !== 13 && buf[start + 12] !== 10)
    )
      return this.#fail(H1Error.BadStatus);
    const status = (buf[start + 9]! - 48) * 100 + (buf[start + 10]! - 48) * 10 + (buf[start + 11]! - 48);
    // 101: the router never asks to switch protocols, so a 101 is not an interim head to skip
    if (status < 100 || status > 599 || status === 101) return this.#fail(H1Error.BadStatus);
    if (status < 200) return H1Result.More; // 1xx informational: the real response follows
    const http10 = buf[start + 7] === 48;
    tokClose = false;
    tokKeepAlive = false;
    let te = false;
    let chunked = false;
    let contentType = '';
    let contentLength = -1;
    let p = buf.indexOf(10, start);
    while (p >= 0 && p + 1 < end) {
      const a = p + 1;
      let q = buf.indexOf(10, a);
      if (q < 0 || q > end) q = -1;
      const lineEnd = q < 0 ? end : q;
      p = q;
      let colon = -1;
      for (let k = a; k < lineEnd && k - a <= 17; k++) {
        if (buf[k] === 58) {
          colon = k;
          break;
        }
      }
      const len = colon - a;
      if (len !== 12 && len !== 14 && len !== 17 && len !== 10) continue;
      let v0 = colon + 1;
      let v1 = lineEnd;
      while (v0 < v1 && (buf[v0] === 32 || buf[v0] === 9)) v0++;
      while (v1 > v0 && (buf[v1 - 1] === 32 || buf[v1 - 1] === 9 || buf[v1 - 1] === 13)) v1--;
      if (eqLower(buf, a, colon, CONTENT_TYPE)) contentType = buf.toString('latin1', v0, v1);
      else if (eqLower(buf, a, colon, CONTENT_LENGTH)) {
        // digits only, a safe integer, and the same value if repeated: else the body's end is unknowable (RFC 9112 6.3)
        if (v1 === v0) return this.#fail(H1Error.BadLength);
        let v = 0;
        for (let k = v0; k < v1; k++) {
          const c = buf[k]!;
          if (c < 48 || c > 57) return this.#fail(H1Error.BadLength);
          v = v * 10 + (c - 48);
          if (v > Number.MAX_SAFE_INTEGER) return this.#fail(H1Error.BadLength);
        }
        if (contentLength >= 0 && contentLength !== v) return this.#fail(H1Error.BadLength);
        contentLength = v;
      } else if (eqLower(buf, a, colon, TRANSFER_ENCODING)) {
        // the last coding over all Transfer-Encoding fields decides
        te = true;
        tokLastChunked = chunked;
        scanTokens(buf, v0, v1, false);
        chunked = tokLastChunked;
      } else if (eqLower(buf, a, colon, CONNECTION)) scanTokens(buf, v0, v1, true);
    }
    this.keepAlive = !tokClose && (!http10 || tokKeepAlive);
    if (status === 204 || status === 304) {
      // no body, whatever the head says
      this.#st = St.BodyLength;
      this.#remaining = 0;
      contentLength = 0;
    } else if (te) {
      if (contentLength >= 0) this.keepAlive = false; // both: Transfer-Encoding wins; the connection is not reused
      contentLength = -1;
      if (chunked) this.#nextChunk();
      else {
        this.#st = St.BodyClose;
        this.keepAlive = false;
      }
    } else if (contentLength >= 0) {
      this.#st = St.BodyLength;
      this.#remaining = contentLength;
    } else {
      this.#st = St.BodyClose;
      this.keepAlive = false;
    }
    if (!sink.onHead(status, contentType, contentLength)) return H1Result.Stop;
    return H1Result.More;
  }
}
