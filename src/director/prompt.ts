// Extracts the bytes the prefix index matches on from a parsed request body,
// into one growable buffer reused across requests (the pick that reads it is
// synchronous). Chat: each message as role, newline, text content, newline.
// Completions: the prompt string (or the first of a batch; token-id prompts as
// little-endian uint32s).

export class PromptWriter {
  #buf: Buffer = Buffer.allocUnsafe(64 * 1024);
  #len = 0;

  get length(): number {
    return this.#len;
  }

  /** The bytes written so far (a view; valid until the next reset). */
  view(): Uint8Array {
    return this.#buf.subarray(0, this.#len);
  }

  reset(): void {
    this.#len = 0;
  }

  /** Empties the writer and returns its buffer, at least `min` bytes, for a native renderer; then commit(). */
  writable(min: number): Buffer {
    this.#len = 0;
    if (this.#buf.length < min) this.#buf = Buffer.allocUnsafe(Math.max(min, this.#buf.length * 2));
    return this.#buf;
  }

  /** Takes the first `len` bytes of the buffer writable() returned as the prompt. */
  commit(len: number): void {
    this.#len = len;
  }

  #ensure(extra: number): void {
    const need = this.#len + extra;
    if (need <= this.#buf.length) return;
    const next = Buffer.allocUnsafe(Math.max(need, this.#buf.length * 2));
    this.#buf.copy(next, 0, 0, this.#len);
    this.#buf = next;
  }

  str(s: string): void {
    this.#ensure(s.length * 3);
    this.#len += this.#buf.write(s, this.#len, 'utf8');
  }

  byte(b: number): void {
    this.#ensure(1);
    this.#buf[this.#len++] = b;
  }

  u32(v: number): void {
    this.#ensure(4);
    this.#buf.writeUInt32LE(v >>> 0, this.#len);
    this.#len += 4;
  }

  /** Writes chat messages; returns false if `messages` is not a non-empty list. */
  chat(messages: unknown): boolean {
    if (!Array.isArray(messages) || messages.length === 0) return false;
    for (let i = 0; i < messages.length; i++) {
      const m = messages[i] as { role?: unknown; content?: unknown } | null;
      if (typeof m !== 'object' || m === null) return false;
      if (typeof m.role === 'string') this.str(m.role);
      this.byte(10);
      const c = m.content;
      if (typeof c === 'string') this.str(c);
      else if (Array.isArray(c)) {
        for (let j = 0; j < c.length; j++) {
          const part = c[j] as { text?: unknown; image_url?: { url?: unknown } } | null;
          if (part && typeof part.text === 'string') this.str(part.text);
          else if (part && part.image_url && typeof part.image_url.url === 'string') this.str(part.image_url.url);
        }
      }
      this.byte(10);
    }
    return true;
  }

  /** Writes a completions prompt; returns false if it is missing or of the wrong type. */
  completion(prompt: unknown): boolean {
    if (typeof prompt === 'string') {
      this.str(prompt);
      return true;
    }
    if (!Array.isArray(prompt) || prompt.length === 0) return false;
    const first = prompt[0];
    if (typeof first === 'string') {
      this.str(first);
      return true;
    }
    const ids = Array.isArray(first) ? first : prompt;
    for (let i = 0; i < ids.length; i++) {
      const v = ids[i];
      if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) return false;
      this.u32(v);
    }
    return true;
  }
}
