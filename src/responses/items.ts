// Input items ↔ chat messages. A turn's input items (messages, function_call,
// function_call_output, reasoning) are rendered once into the chat messages an
// engine takes (`{"role":..,...}` objects, `role` always the first key: the
// stored conversation is split at `},{"role":"`); each message keeps the ids
// of the items it came from as one entry of the record's comma-joined id list:
//   entry  = token ('+' token)*      one entry per chat message
//   token  = [kind ':'] id           kind: 'd' developer message (sent as system),
//                                     'r' reasoning, 'f' function_call; none: a
//                                     message (or, in a tool message, its output item)
// so input_items lists the very items given, with their ids, types and roles.
import { newCallItemId, newItemId, newReasoningId } from './ids.js';
import { ResponsesError } from './request-error.js';

function bad(message: string, param: string): ResponsesError {
  return new ResponsesError(400, message, param);
}

/** Roles an input message may have, and what the engine gets (`developer` goes as `system`: chat templates know that one). */
const ROLE_TO_CHAT: Record<string, string> = { user: 'user', system: 'system', developer: 'system', assistant: 'assistant' };
/** Ids a client may give its items: they land in the record's id list, so no ',', '+' or ':'. */
const CLIENT_ID = /^[A-Za-z0-9_-]{1,128}$/;
const MAX_CALL_ID = 256;

/** A chat message under construction. */
interface Msg {
  role: string;
  content: string | null;
  reasoning?: string;
  tool_calls?: { id: string; type: 'function'; function: { name: string; arguments: string } }[];
  tool_call_id?: string;
  tokens: string[];
}

export interface RenderedInput {
  /** The chat messages, a JSON fragment without brackets ('' for none). */
  fragment: string;
  /** One id entry per message, comma-joined. */
  ids: string;
  /** Bytes of the texts (for the conversation bound). */
  bytes: number;
  /** call_ids that function_call_output items answer and no function_call of this input made: they must be in the chain. */
  refs: { callId: string; param: string }[];
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** The text of a message's content: a string, or text parts (joined by newlines, as chat templates join text parts). */
function contentText(c: unknown, role: string, at: string, field = 'content'): string {
  if (typeof c === 'string') return c;
  if (!Array.isArray(c)) throw bad(`'${at}.${field}' must be a string or a list of content parts`, `${at}.${field}`);
  let text = '';
  for (let j = 0; j < c.length; j++) {
    const part = c[j] as Record<string, unknown> | null;
    const p = `${at}.${field}[${j}]`;
    if (!isObject(part)) throw bad(`'${p}' must be an object`, p);
    const type = part.type;
    if (type === 'input_text' || type === 'output_text' || type === 'text') {
      if (type === 'output_text' && role !== 'assistant') throw bad(`'${p}.type' output_text is only valid in assistant messages`, `${p}.type`);
      if (type === 'input_text' && role === 'assistant') throw bad(`'${p}.type' input_text is not valid in assistant messages (use output_text)`, `${p}.type`);
      if (typeof part.text !== 'string') throw bad(`'${p}.text' must be a string`, `${p}.text`);
      text = j === 0 ? part.text : `${text}\n${part.text}`;
    } else if (type === 'refusal' && role === 'assistant') {
      if (typeof part.refusal !== 'string') throw bad(`'${p}.refusal' must be a string`, `${p}.refusal`);
      text = j === 0 ? part.refusal : `${text}\n${part.refusal}`;
    } else if (type === 'input_image' || type === 'input_file' || type === 'input_audio') {
      throw bad(`'${p}.type' ${type} is not supported by this router (text only)`, `${p}.type`);
    } else {
      throw bad(`'${p}.type' must be input_text (or output_text in assistant messages); got ${JSON.stringify(type)}`, `${p}.type`);
    }
  }
  return text;
}

/** An item's own id when the client gave one (checked), else a new one. */
function itemId(it: Record<string, unknown>, at: string, fresh: () => string): string {
  const id = it.id;
  if (id === undefined || id === null) return fresh();
  if (typeof id !== 'string' || !CLIENT_ID.test(id)) throw bad(`'${at}.id' must be 1-128 letters, digits, '_' or '-'`, `${at}.id`);
  return id;
}

function callId(v: unknown, at: string): string {
  if (typeof v !== 'string' || v.length === 0 || v.length > MAX_CALL_ID) throw bad(`'${at}.call_id' must be a non-empty string of at most ${MAX_CALL_ID} characters`, `${at}.call_id`);
  return v;
}

/** The reasoning text of a reasoning input item: its reasoning_text content, else its summary texts. */
function reasoningText(it: Record<string, unknown>, at: string): string {
  const parts = Array.isArray(it.content) && it.content.length > 0 ? it.content : it.summary;
  if (!Array.isArray(parts)) throw bad(`'${at}.summary' must be a list of summary_text parts`, `${at}.summary`);
  let text = '';
  for (let j = 0; j < parts.length; j++) {
    const p = parts[j];
    if (!isObject(p) || typeof p.text !== 'string' || (p.type !== 'summary_text' && p.type !== 'reasoning_text')) {
      throw bad(`'${at}.${parts === it.content ? 'content' : 'summary'}[${j}]' must be {type: "summary_text" | "reasoning_text", text}`, `${at}.summary[${j}]`);
    }
    text = j === 0 ? p.text : `${text}\n${p.text}`;
  }
  return text;
}

function render(m: Msg): string {
  const o: Record<string, unknown> = { role: m.role, content: m.content };
  if (m.reasoning !== undefined) o.reasoning_content = m.reasoning;
  if (m.tool_calls !== undefined) o.tool_calls = m.tool_calls;
  if (m.tool_call_id !== undefined) o.tool_call_id = m.tool_call_id;
  return JSON.stringify(o);
}

/**
 * Input items (or `instructions` given as items, `at` = "instructions") as chat
 * messages. Consecutive function_call items (and a preceding assistant message
 * or reasoning item) make one assistant message, as an engine produced them.
 */
export function renderItems(input: unknown[], at: string, messagesOnly: boolean): RenderedInput {
  const msgs: Msg[] = [];
  let bytes = 0;
  /** The assistant message function_call items attach to (the last message when it is one made by this input). */
  let open: Msg | null = null;
  let pendingReasoning: { text: string; token: string } | null = null;
  const made = new Set<string>();
  const refs: { callId: string; param: string }[] = [];
  const assistant = (content: string | null): Msg => {
    const m: Msg = { role: 'assistant', content, tokens: [] };
    if (pendingReasoning !== null) {
      m.reasoning = pendingReasoning.text;
      m.tokens.push(pendingReasoning.token);
      pendingReasoning = null;
    }
    msgs.push(m);
    return m;
  };
  for (let i = 0; i < input.length; i++) {
    const it = input[i];
    const p = `${at}[${i}]`;
    if (!isObject(it)) throw bad(`'${p}' must be an object (an input item)`, p);
    const type = it.type ?? 'message';
    if (messagesOnly && type !== 'message') throw bad(`'${p}.type' must be "message" (instructions hold messages only)`, `${p}.type`);
    switch (type) {
      case 'message': {
        const role = it.role;
        const chatRole = typeof role === 'string' ? ROLE_TO_CHAT[role] : undefined;
        if (chatRole === undefined) throw bad(`'${p}.role' must be one of user, system, developer, assistant (got ${JSON.stringify(role)})`, `${p}.role`);
        const text = contentText(it.content, role as string, p);
        bytes += text.length;
        const id = itemId(it, p, newItemId);
        if (chatRole === 'assistant') {
          open = assistant(text);
          open.tokens.push(id);
        } else {
          if (pendingReasoning !== null) throw bad(`'${p}': a reasoning item must be followed by the assistant's output (a message or function_call)`, p);
          open = null;
          msgs.push({ role: chatRole, content: text, tokens: [role === 'developer' ? `d:${id}` : id] });
        }
        break;
      }
      case 'function_call': {
        const cid = callId(it.call_id, p);
        if (typeof it.name !== 'string' || it.name.length === 0) throw bad(`'${p}.name' must be the function's name`, `${p}.name`);
        const args = it.arguments;
        if (typeof args !== 'string') throw bad(`'${p}.arguments' must be a string of JSON`, `${p}.arguments`);
        try {
          JSON.parse(args);
        } catch {
          throw bad(`'${p}.arguments' is not valid JSON`, `${p}.arguments`);
        }
        bytes += args.length + it.name.length;
        const id = itemId(it, p, newCallItemId);
        if (open === null || pendingReasoning !== null) open = assistant(null);
        (open.tool_calls ??= []).push({ id: cid, type: 'function', function: { name: it.name, arguments: args } });
        open.tokens.push(`f:${id}`);
        made.add(cid);
        break;
      }
      case 'function_call_output': {
        const cid = callId(it.call_id, p);
        let out: string;
        if (typeof it.output === 'string') out = it.output;
        else if (Array.isArray(it.output)) out = contentText(it.output, 'user', p, 'output');
        else throw bad(`'${p}.output' must be a string or a list of input_text parts`, `${p}.output`);
        if (pendingReasoning !== null) throw bad(`'${p}': a reasoning item must be followed by the assistant's output (a message or function_call)`, p);
        bytes += out.length;
        open = null;
        msgs.push({ role: 'tool', content: out, tool_call_id: cid, tokens: [itemId(it, p, newItemId)] });
        if (!made.has(cid)) refs.push({ callId: cid, param: `${p}.call_id` });
        break;
      }
      case 'reasoning': {
        if (pendingReasoning !== null) throw bad(`'${p}': two reasoning items in a row`, p);
        const text = reasoningText(it, p);
        bytes += text.length;
        pendingReasoning = { text, token: `r:${itemId(it, p, newReasoningId)}` };
        open = null;
        break;
      }
      case 'item_reference':
        throw bad(`'${p}.type' item_reference is not supported by this router: send the item itself, or continue with previous_response_id`, `${p}.type`);
      default:
        throw bad(
          `'${p}.type' ${JSON.stringify(type)} is not supported by this router: input items are messages, function_call, function_call_output and reasoning`,
          `${p}.type`,
        );
    }
  }
  if (pendingReasoning !== null) assistant('');
  let fragment = '';
  let ids = '';
  for (let k = 0; k < msgs.length; k++) {
    const m = msgs[k]!;
    fragment = k === 0 ? render(m) : `${fragment},${render(m)}`;
    const entry = m.tokens.join('+');
    ids = k === 0 ? entry : `${ids},${entry}`;
  }
  return { fragment, ids, bytes, refs };
}

/** The text input (a string) as one user message. */
export function renderText(input: string): RenderedInput {
  return { fragment: `{"role":"user","content":${JSON.stringify(input)}}`, ids: newItemId(), bytes: input.length, refs: [] };
}

/** A tool call as items.ts and output.ts render it: `{"id":<JSON string>,"type":"function"`. */
const CALL = /\{"id":("(?:[^"\\]|\\.)*"),"type":"function"/g;

/** The call ids (JSON-quoted) of the tool calls in the conversation fragment `conv`: one pass, however many outputs are checked. */
export function chainCalls(conv: string): Set<string> {
  const out = new Set<string>();
  for (const m of conv.matchAll(CALL)) out.add(m[1]!);
  return out;
}

// ---- stored messages → items (input_items) -------------------------------------------

/** A stored chat message (parsed). */
export interface ChatMessage {
  role?: unknown;
  content?: unknown;
  reasoning_content?: unknown;
  tool_calls?: { id?: unknown; function?: { name?: unknown; arguments?: unknown } }[];
  tool_call_id?: unknown;
}

/** How many items an id entry stands for. */
export function entryItems(entry: string): number {
  let n = 1;
  for (let i = entry.indexOf('+'); i >= 0; i = entry.indexOf('+', i + 1)) n++;
  return n;
}

function textOf(c: unknown): string {
  return typeof c === 'string' ? c : '';
}

/** Item `k` of a stored message whose id entry is `entry`. */
export function itemOf(m: ChatMessage, entry: string, k: number): Record<string, unknown> {
  const tokens = entry.split('+');
  const token = tokens[k] ?? '';
  const colon = token.indexOf(':');
  const kind = colon === 1 ? token[0] : '';
  const id = colon === 1 ? token.slice(2) : token;
  const role = typeof m.role === 'string' ? m.role : 'user';
  if (role === 'tool') return { id, type: 'function_call_output', call_id: textOf(m.tool_call_id), output: textOf(m.content), status: 'completed' };
  if (kind === 'r') {
    return { id, type: 'reasoning', summary: [], content: [{ type: 'reasoning_text', text: textOf(m.reasoning_content) }], status: 'completed' };
  }
  if (kind === 'f') {
    let n = 0;
    for (let j = 0; j < k; j++) if (tokens[j]!.startsWith('f:')) n++;
    const call = m.tool_calls?.[n];
    return {
      id,
      type: 'function_call',
      call_id: textOf(call?.id),
      name: textOf(call?.function?.name),
      arguments: textOf(call?.function?.arguments),
      status: 'completed',
    };
  }
  const text = textOf(m.content);
  if (role === 'assistant') return { id, type: 'message', status: 'completed', role, content: [{ type: 'output_text', text, annotations: [], logprobs: [] }] };
  return { id, type: 'message', status: 'completed', role: kind === 'd' ? 'developer' : role, content: [{ type: 'input_text', text }] };
}

// ---- the stored conversation, split at message boundaries ------------------------------

/** The separator between two stored chat messages: only message boundaries contain it (inside a JSON string every '"' is escaped). */
const MESSAGE_SEP = '},{"role":"';

/**
 * Start and end offsets of messages [lo, hi) of a stored conversation
 * fragment of `count` messages (`{"role":..,"content":".."},...`, as
 * items.ts and output.ts write it): found by native string search from the
 * nearer end, never by parsing; null when the fragment does not split there.
 */
export function messageBounds(conv: string, count: number, lo: number, hi: number): number[] | null {
  const out = new Array<number>(2 * (hi - lo));
  if (lo <= count - hi) {
    let start = 0;
    for (let i = 0; i < hi; i++) {
      let end: number;
      if (i === count - 1) end = conv.length;
      else {
        const k = conv.indexOf(MESSAGE_SEP, start);
        if (k < 0) return null;
        end = k + 1;
      }
      if (i >= lo) {
        out[2 * (i - lo)] = start;
        out[2 * (i - lo) + 1] = end;
      }
      start = end + 1;
    }
  } else {
    let end = conv.length;
    for (let i = count - 1; i >= lo; i--) {
      let start: number;
      if (i === 0) start = 0;
      else {
        const k = conv.lastIndexOf(MESSAGE_SEP, end - 2); // not the separator that ends message i
        if (k < 0) return null;
        start = k + 2;
      }
      if (i < hi) {
        out[2 * (i - lo)] = start;
        out[2 * (i - lo) + 1] = end;
      }
      end = start - 1;
    }
  }
  return out;
}

