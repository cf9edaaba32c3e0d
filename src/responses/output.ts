// A turn's output items, built from the engine's chat completion: the
// reasoning item (the engine's reasoning_content), the assistant message, and
// one function_call item per tool call (up to the request's call limit). For a
// streamed turn it also writes the Responses events as the engine's chunks
// arrive, in the order the SDKs expect: each item's output_item.added, its
// deltas, its .done events and output_item.done before the next item opens.
// The same state gives the final Response's output, the failed Response's
// partial output, and the assistant chat message the store keeps.
import { newCallId, newCallItemId, newItemId, newReasoningId } from './ids.js';
import { deltaOf, functionCallItem, messageItem, outputText, reasoningItem, sseEvent, type ItemStatus } from './render.js';

const KIND_REASONING = 0;
const KIND_MESSAGE = 1;
const KIND_CALL = 2;

interface Item {
  readonly kind: number;
  readonly id: string;
  readonly index: number;
  /** Text (reasoning, message) or arguments (call). */
  text: string;
  callId: string;
  name: string;
  logprobs: unknown[];
  done: boolean;
  /** Its status once done. */
  status: ItemStatus;
}

/** A tool call of the engine's answer, as chat completions carry it (whole, or a streamed fragment). */
export interface ChatToolCall {
  index?: unknown;
  id?: unknown;
  function?: { name?: unknown; arguments?: unknown } | null;
}

/** The engine answered something a Response cannot carry (a call to an undeclared function, arguments that are not JSON). */
export class EngineOutputError extends Error {}

/** The chat completion's logprobs of a choice, as Responses logprobs (token, logprob, bytes, top_logprobs). */
export function logprobsOf(lp: unknown): unknown[] {
  const content = (lp as { content?: unknown } | null)?.content;
  if (!Array.isArray(content)) return [];
  const out = new Array<unknown>(content.length);
  for (let i = 0; i < content.length; i++) {
    const t = content[i] as { token?: unknown; logprob?: unknown; bytes?: unknown; top_logprobs?: unknown };
    const tops = Array.isArray(t.top_logprobs) ? (t.top_logprobs as { token?: unknown; logprob?: unknown; bytes?: unknown }[]) : [];
    out[i] = {
      token: typeof t.token === 'string' ? t.token : '',
      bytes: Array.isArray(t.bytes) ? t.bytes : [],
      logprob: typeof t.logprob === 'number' ? t.logprob : 0,
      top_logprobs: tops.map((x) => ({ token: typeof x.token === 'string' ? x.token : '', bytes: Array.isArray(x.bytes) ? x.bytes : [], logprob: typeof x.logprob === 'number' ? x.logprob : 0 })),
    };
  }
  return out;
}

export class TurnOutput {
  readonly #items: Item[] = [];
  /** Engine tool-call index → item (null: beyond the call limit, dropped). */
  readonly #calls = new Map<number, Item | null>();
  #open: Item | null = null;
  #message: Item | null = null;
  #reasoning: Item | null = null;
  #callCount = 0;
  /** The stream's next sequence number. */
  seq = 0;

  constructor(
    readonly callLimit: number,
    readonly toolNames: readonly string[],
    readonly logprobs: boolean,
    readonly endpointName: () => string,
  ) {}

  get items(): number {
    return this.#items.length;
  }

  #add(kind: number, id: string): Item {
    const it: Item = { kind, id, index: this.#items.length, text: '', callId: '', name: '', logprobs: [], done: false, status: 'completed' };
    this.#items.push(it);
    return it;
  }

  #json(it: Item, status: ItemStatus): unknown {
    if (it.kind === KIND_REASONING) return reasoningItem(it.id, status, it.text);
    if (it.kind === KIND_MESSAGE) return messageItem(it.id, status, it.text, it.logprobs);
    return functionCallItem(it.id, status, it.callId, it.name, it.text);
  }

  /** Events that close the open item (its .done events, output_item.done); '' when none is open. */
  #close(status: ItemStatus = 'completed'): string {
    const it = this.#open;
    if (it === null) return '';
    if (it.kind === KIND_CALL) this.#checkCall(it); // throws: the item stays open (incomplete in the failed response)
    this.#open = null;
    it.done = true;
    it.status = status;
    const ix = { item_id: it.id, output_index: it.index };
    let out = '';
    if (it.kind === KIND_REASONING) {
      out =
        sseEvent('response.reasoning_text.done', this.seq++, { ...ix, content_index: 0, text: it.text }) +
        sseEvent('response.content_part.done', this.seq++, { ...ix, content_index: 0, part: { type: 'reasoning_text', text: it.text } });
    } else if (it.kind === KIND_MESSAGE) {
      out =
        sseEvent('response.output_text.done', this.seq++, { ...ix, content_index: 0, text: it.text, logprobs: it.logprobs }) +
        sseEvent('response.content_part.done', this.seq++, { ...ix, content_index: 0, part: outputText(it.text, it.logprobs) });
    } else {
      out = sseEvent('response.function_call_arguments.done', this.seq++, { ...ix, arguments: it.text, name: it.name });
    }
    return out + sseEvent('response.output_item.done', this.seq++, { output_index: it.index, item: this.#json(it, status) });
  }

  /** Opens an item: closes the open one, then output_item.added (and content_part.added for text). */
  #openItem(it: Item): string {
    let out = this.#close();
    this.#open = it;
    out += sseEvent('response.output_item.added', this.seq++, { output_index: it.index, item: this.#json(it, 'in_progress') });
    if (it.kind === KIND_REASONING) {
      out += sseEvent('response.content_part.added', this.seq++, { item_id: it.id, output_index: it.index, content_index: 0, part: { type: 'reasoning_text', text: '' } });
    } else if (it.kind === KIND_MESSAGE) {
      out += sseEvent('response.content_part.added', this.seq++, { item_id: it.id, output_index: it.index, content_index: 0, part: outputText('') });
    }
    return out;
  }

  #checkCall(it: Item): void {
    if (it.text === '') it.text = '{}';
    if (!this.toolNames.includes(it.name)) {
      throw new EngineOutputError(`endpoint ${this.endpointName()} answered a call to function ${JSON.stringify(it.name)}, which the request does not declare in 'tools'`);
    }
    try {
      JSON.parse(it.text);
    } catch {
      throw new EngineOutputError(`endpoint ${this.endpointName()} answered a call to ${it.name} with arguments that are not JSON: ${it.text.slice(0, 200)}`);
    }
  }

  // ---- streamed -----------------------------------------------------------------------

  /** A reasoning fragment: the events it makes. */
  reasoningDelta(d: string): string {
    let out = '';
    let it = this.#reasoning;
    if (it === null || it.done) {
      if (it !== null && it.done) return ''; // reasoning after the answer began: kept out of the closed item
      it = this.#reasoning = this.#add(KIND_REASONING, newReasoningId());
      out = this.#openItem(it);
    } else if (this.#open !== it) return '';
    it.text += d;
    return out + deltaOf('response.reasoning_text.delta', this.seq++, it.id, it.index, d, true, null);
  }

  /** A text fragment (with its chat logprobs, if asked): the events it makes. */
  textDelta(d: string, lp: unknown): string {
    let out = '';
    let it = this.#message;
    if (it === null) {
      it = this.#message = this.#add(KIND_MESSAGE, newItemId());
      out = this.#openItem(it);
    } else if (this.#open !== it) {
      if (it.done) return ''; // text after a tool call: the message item is closed (kept out, as the engines' parsers do)
      out = this.#openItem(it);
    }
    it.text += d;
    let lpJson: string | null = null;
    if (this.logprobs) {
      const l = logprobsOf(lp);
      for (const x of l) it.logprobs.push(x);
      lpJson = JSON.stringify(l);
    } else lpJson = '[]';
    return out + deltaOf('response.output_text.delta', this.seq++, it.id, it.index, d, true, lpJson);
  }

  /** A streamed tool-call fragment: the events it makes. */
  toolDelta(tc: ChatToolCall): string {
    const idx = typeof tc.index === 'number' ? tc.index : 0;
    let it = this.#calls.get(idx);
    let out = '';
    if (it === undefined) {
      if (this.#callCount >= this.callLimit) {
        this.#calls.set(idx, null);
        return '';
      }
      this.#callCount++;
      it = this.#add(KIND_CALL, newCallItemId());
      it.callId = typeof tc.id === 'string' && tc.id !== '' ? tc.id : newCallId();
      it.name = typeof tc.function?.name === 'string' ? tc.function.name : '';
      this.#calls.set(idx, it);
      out = this.#openItem(it);
    } else if (it === null || it.done) return '';
    else if (typeof tc.function?.name === 'string' && it.name === '') it.name = tc.function.name;
    const a = tc.function?.arguments;
    if (typeof a === 'string' && a.length > 0) {
      it.text += a;
      out += deltaOf('response.function_call_arguments.delta', this.seq++, it.id, it.index, a, false, null);
    }
    return out;
  }

  /** A stream that carried no output: an empty assistant message's events (a Response always holds an item). */
  emptyMessage(status: ItemStatus): string {
    const it = (this.#message = this.#add(KIND_MESSAGE, newItemId()));
    return this.#openItem(it) + this.#close(status);
  }

  /** The end of a streamed answer: closes the open item (throws EngineOutputError on a bad call). */
  finish(status: ItemStatus): string {
    return this.#close(status);
  }

  // ---- whole (a JSON answer) ------------------------------------------------------------

  /** Builds the items of a non-streamed answer's message (throws EngineOutputError). */
  whole(message: { content?: unknown; reasoning_content?: unknown; reasoning?: unknown; tool_calls?: unknown } | undefined, lp: unknown, status: ItemStatus): void {
    const r = message?.reasoning_content ?? message?.reasoning;
    if (typeof r === 'string' && r.length > 0) {
      const it = (this.#reasoning = this.#add(KIND_REASONING, newReasoningId()));
      it.text = r;
      it.done = true;
    }
    const c = message?.content;
    const calls = Array.isArray(message?.tool_calls) ? (message!.tool_calls as ChatToolCall[]) : [];
    if ((typeof c === 'string' && c.length > 0) || calls.length === 0) {
      const it = (this.#message = this.#add(KIND_MESSAGE, newItemId()));
      it.text = typeof c === 'string' ? c : '';
      if (this.logprobs) it.logprobs = logprobsOf(lp);
      it.done = true;
    }
    for (const tc of calls) {
      if (this.#callCount >= this.callLimit) break;
      this.#callCount++;
      const it = this.#add(KIND_CALL, newCallItemId());
      it.callId = typeof tc.id === 'string' && tc.id !== '' ? tc.id : newCallId();
      it.name = typeof tc.function?.name === 'string' ? tc.function.name : '';
      it.text = typeof tc.function?.arguments === 'string' ? tc.function.arguments : '';
      this.#checkCall(it);
      it.done = true;
    }
    // the answer's last item is the one a length stop cut short
    const last = this.#items[this.#items.length - 1];
    if (last !== undefined) last.status = status;
  }

  // ---- results ----------------------------------------------------------------------------

  /** The Response's output: every item with its status ('incomplete' for one still open, as in a failed stream). */
  output(): unknown[] {
    return this.#items.map((it) => this.#json(it, it.done ? it.status : 'incomplete'));
  }

  /** The assistant message the store keeps (what the next turn sends back to the engine). */
  chatMessage(): string {
    const o: Record<string, unknown> = { role: 'assistant', content: this.#message?.text ?? (this.#callCount > 0 ? null : '') };
    if (this.#reasoning !== null) o.reasoning_content = this.#reasoning.text;
    const calls = this.#items.filter((it) => it.kind === KIND_CALL);
    if (calls.length > 0) o.tool_calls = calls.map((it) => ({ id: it.callId, type: 'function', function: { name: it.name, arguments: it.text } }));
    return JSON.stringify(o);
  }

  /** That message's id entry (items.ts): reasoning, message and call item ids, '+'-joined. */
  idEntry(): string {
    let e = '';
    for (const it of this.#items) {
      const t = it.kind === KIND_REASONING ? `r:${it.id}` : it.kind === KIND_CALL ? `f:${it.id}` : it.id;
      e = e === '' ? t : `${e}+${t}`;
    }
    return e === '' ? newItemId() : e;
  }

  /** True when the answer holds a function call. */
  get calls(): number {
    return this.#callCount;
  }
}
