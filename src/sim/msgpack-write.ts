// A small MessagePack writer for the simulator's KV-event batches: nil, bool,
// integers (uint64/int64 from JS numbers up to 2^53, as the engines write
// them), float64, str, bin, array and map headers. Written from the
// MessagePack spec (github.com/msgpack/msgpack/blob/master/spec.md); one
// growable buffer reused across batches.

export class MsgpackWriter {
  #buf: Buffer = Buffer.allocUnsafe(64 * 1024);
  #len = 0;

  reset(): void {
    this.#len = 0;
  }

  /** A copy of the bytes written (ZMQ keeps the buffer it is given). */
  take(): Buffer {
    return Buffer.from(this.#buf.subarray(0, this.#len));
  }

  #ensure(n: number): void {
    if (this.#len + n <= this.#buf.length) return;
    const next = Buffer.allocUnsafe(Math.max(this.#len + n, this.#buf.length * 2));
    this.#buf.copy(next, 0, 0, this.#len);
    this.#buf = next;
  }

  nil(): void {
    this.#ensure(1);
    this.#buf[this.#len++] = 0xc0;
  }

  bool(v: boolean): void {
    this.#ensure(1);
    this.#buf[this.#len++] = v ? 0xc3 : 0xc2;
  }

  /** An integer in [-2^53, 2^53] in its shortest form. */
  int(v: number): void {
    this.#ensure(9);
    const b = this.#buf;
    if (v >= 0) {
      if (v < 0x80) b[this.#len++] = v;
      else if (v < 0x100) {
        b[this.#len++] = 0xcc;
        b[this.#len++] = v;
      } else if (v < 0x10000) {
        b[this.#len++] = 0xcd;
        b.writeUInt16BE(v, this.#len);
        this.#len += 2;
      } else if (v < 0x100000000) {
        b[this.#len++] = 0xce;
        b.writeUInt32BE(v, this.#len);
        this.#len += 4;
      } else {
        b[this.#len++] = 0xcf;
        b.writeUInt32BE(Math.floor(v / 0x100000000), this.#len);
        b.writeUInt32BE(v >>> 0, this.#len + 4);
        this.#len += 8;
      }
    } else if (v >= -32) {
      b[this.#len++] = v & 0xff;
    } else if (v >= -0x80000000) {
      b[this.#len++] = 0xd2;
      b.writeInt32BE(v, this.#len);
      this.#len += 4;
    } else {
      b[this.#len++] = 0xd3;
      b.writeBigInt64BE(BigInt(v), this.#len);
      this.#len += 8;
    }
  }

  float(v: number): void {
    this.#ensure(9);
    this.#buf[this.#len++] = 0xcb;
    this.#buf.writeDoubleBE(v, this.#len);
    this.#len += 8;
  }

  str(s: string): void {
    const n = Buffer.byteLength(s);
    this.#ensure(n + 5);
    const b = this.#buf;
    if (n < 32) b[this.#len++] = 0xa0 | n;
    else if (n < 0x100) {
      b[this.#len++] = 0xd9;
      b[this.#len++] = n;
    } else if (n < 0x10000) {
      b[this.#len++] = 0xda;
      b.writeUInt16BE(n, this.#len);
      this.#len += 2;
    } else {
      b[this.#len++] = 0xdb;
      b.writeUInt32BE(n, this.#len);
      this.#len += 4;
    }
    this.#len += b.write(s, this.#len, 'utf8');
  }

  bin(bytes: Uint8Array): void {
    const n = bytes.length;
    this.#ensure(n + 5);
    const b = this.#buf;
    if (n < 0x100) {
      b[this.#len++] = 0xc4;
      b[this.#len++] = n;
    } else {
      b[this.#len++] = 0xc6;
      b.writeUInt32BE(n, this.#len);
      this.#len += 4;
    }
    b.set(bytes, this.#len);
    this.#len += n;
  }

  /** Bytes already encoded elsewhere. */
  raw(bytes: Uint8Array): void {
    this.#ensure(bytes.length);
    this.#buf.set(bytes, this.#len);
    this.#len += bytes.length;
  }

  /** The bytes written (a view; valid until the next write or reset). */
  view(): Buffer {
    return this.#buf.subarray(0, this.#len);
  }

  array(n: number): void {
    this.#header(n, 0x90, 0xdc, 0xdd);
  }

  map(n: number): void {
    this.#header(n, 0x80, 0xde, 0xdf);
  }

  #header(n: number, fix: number, h16: number, h32: number): void {
    this.#ensure(5);
    const b = this.#buf;
    if (n < 16) b[this.#len++] = fix | n;
    else if (n < 0x10000) {
      b[this.#len++] = h16;
      b.writeUInt16BE(n, this.#len);
      this.#len += 2;
    } else {
      b[this.#len++] = h32;
      b.writeUInt32BE(n, this.#len);
      this.#len += 4;
    }
  }
}
