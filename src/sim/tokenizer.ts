// The simulator's tokenizer: deliberately simple, documented and exact, so that
// the router (or anyone) can reproduce the token counts an engine reports.
//
//   tokens(text) = ceil(utf8ByteLength(text) / 4)
//
// Token i covers the utf8 bytes [4i, 4i+4) of the rendered prompt; a KV block of
// B tokens covers the bytes [4Bk, 4B(k+1)). Chat requests are first rendered
// with the fixed template of renderChat() and then counted the same way.
// A prompt given as token ids (an array of integers) counts one token per id.
//
// This file imports nothing so it can be used from any layer.

/** Bytes of rendered prompt text per simulated token. */
export const BYTES_PER_TOKEN = 4;

/** UTF-8 length of a JS string without allocating (lone surrogates count as U+FFFD, 3 bytes). */
export function utf8ByteLength(s: string): number {
  let n = 0;
  const len = s.length;
  for (let i = 0; i < len; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) n += 1;
    else if (c < 0x800) n += 2;
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < len) {
      const d = s.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) {
        n += 4;
        i++;
      } else n += 3;
    } else n += 3;
  }
  return n;
}

/**
 * Number of tokens of a text (string, or its UTF-8 bytes) or of a token-id
 * array: ceil(bytes / 4) for text, the array length for token ids.
 */
export function countTokens(input: string | Uint8Array | ArrayLike<number>): number {
  if (typeof input === 'string') return Math.ceil(utf8ByteLength(input) / BYTES_PER_TOKEN);
  if (input instanceof Uint8Array) return Math.ceil(input.length / BYTES_PER_TOKEN);
  return input.length;
}

/** A chat message as the simulator accepts it (OpenAI shape; only text parts count). */
export interface ChatMessage {
  role: string;
  content?: string | null | ReadonlyArray<{ type?: string; text?: string } | string>;
  name?: string;
}

/** The text of a message's content: a string, or its text parts joined with "\n". */
export function messageText(content: ChatMessage['content']): string {
  if (content == null) return '';
  if (typeof content === 'string') return content;
  let out = '';
  for (let i = 0; i < content.length; i++) {
    const part = content[i];
    const text = typeof part === 'string' ? part : part && typeof part.text === 'string' ? part.text : '';
    out = i === 0 ? text : out + '\n' + text;
  }
  return out;
}

/**
 * The fixed chat template. Each message renders as `<|ROLE|>\nCONTENT\n`, in
 * order, and the prompt ends with `<|assistant|>\n` (the generation prompt).
 * Example: [{role:'user',content:'hi'}] renders as "<|user|>\nhi\n<|assistant|>\n"
 * (22 bytes, 6 tokens).
 */
export function renderChat(messages: ReadonlyArray<ChatMessage>): string {
  let out = '';
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i]!;
    out += '<|' + m.role + '|>\n' + messageText(m.content) + '\n';
  }
  return out + '<|assistant|>\n';
}
