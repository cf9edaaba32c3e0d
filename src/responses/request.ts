// A POST /v1/responses body: checked field by field (a bad field is a 400
// naming it, `input[2].content[0].type` style), and its input rendered once
// into chat messages as a JSON fragment (`{"role":..,"content":..},...`), the
// form the store keeps, so no later turn parses or renders it again.
import { SwitchyardError } from '../errors.js';
import { jsonNestsDeeper } from '../json-depth.js';
import { newItemId } from './ids.js';

/** A request the Responses layer answers itself, in OpenAI's error shape: `status`, `param` and `code` (the OpenAI error code, undefined: the status's default). */
export class ResponsesError extends SwitchyardError<string | undefined> {
  constructor(
    readonly status: number,
    message: string,
    readonly param: string | null = null,
    override readonly code: string | undefined = undefined,
  ) {
    super(message);
  }

  override get swyCode(): string {
    return 'SWY_ERR_RESPONSES_REQUEST';
  }
}

export interface TurnRequest {
  readonly model: string;
  readonly instructions: string | null;
  readonly previousResponseId: string | null;
  readonly store: boolean;
  readonly stream: boolean;
  readonly maxOutputTokens: number | null;
  readonly temperature: number | null;
  readonly topP: number | null;
  readonly metadata: Record<string, string>;
  readonly user: string | null;
  /** This turn's input as chat messages: a JSON fragment without brackets. */
  readonly inputFragment: string;
  /** Item ids of those messages, comma-joined, in order. */
  readonly inputIds: string;
  /** Bytes of the input text (for the conversation bound). */
  readonly inputBytes: number;
}

/** Fields of OpenAI's request this router does not serve: the field named in the 400. */
const UNSUPPORTED: Record<string, string> = {
  tools: 'tools (function calling, built-in tools) are not supported by this router',
  tool_choice: 'tool_choice is not supported (no tools)',
  background: 'background responses are not supported',
  conversation: 'the Conversations API is not supported: chain turns with previous_response_id',
  prompt: 'prompt templates are not supported',
  include: 'include is not supported',
};

/** Roles an input message may have; `developer` goes to engines as `system` (chat templates know that one). */
const ROLE_TO_CHAT: Record<string, string> = { user: 'user', system: 'system', developer: 'system', assistant: 'assistant' };

const MAX_METADATA_KEYS = 16;

function bad(message: string, param: string): ResponsesError {
  return new ResponsesError(400, message, param);
}

function optNumber(b: Record<string, unknown>, key: string, lo: number, hi: number, integer = false): number | null {
  const v = b[key];
  if (v === undefined || v === null) return null;
  if (typeof v !== 'number' || !Number.isFinite(v) || v < lo || v > hi || (integer && !Number.isInteger(v))) {
    throw bad(`'${key}' must be ${integer ? 'an integer' : 'a number'} in [${lo}, ${hi}] (got ${JSON.stringify(v)})`, key);
  }
  return v;
}

function optBool(b: Record<string, unknown>, key: string, dflt: boolean): boolean {
  const v = b[key];
  if (v === undefined || v === null) return dflt;
  if (typeof v !== 'boolean') throw bad(`'${key}' must be a boolean`, key);
  return v;
}

function optString(b: Record<string, unknown>, key: string): string | null {
  const v = b[key];
  if (v === undefined || v === null) return null;
  if (typeof v !== 'string') throw bad(`'${key}' must be a string`, key);
  return v;
}

/** The text of a message's content: a string, or text parts (joined by newlines, as chat templates join text parts). */
function contentText(c: unknown, role: string, at: string): string {
  if (typeof c === 'string') return c;
  if (!Array.isArray(c)) throw bad(`'${at}.content' must be a string or a list of content parts`, `${at}.content`);
  let text = '';
  for (let j = 0; j < c.length; j++) {
    const part = c[j] as Record<string, unknown> | null;
    const p = `${at}.content[${j}]`;
    if (typeof part !== 'object' || part === null || Array.isArray(part)) throw bad(`'${p}' must be an object`, p);
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

/** Parses and checks a body; throws ResponsesError. `maxDepth` bounds nesting before JSON.parse (as for chat bodies). */
export function parseTurnRequest(raw: Buffer, maxDepth: number): TurnRequest {
  if (jsonNestsDeeper(raw, maxDepth)) throw new ResponsesError(400, `the request body nests arrays or objects deeper than ${maxDepth} levels (limits.maxJsonDepth)`);
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw.toString('utf8'));
  } catch (err) {
    throw new ResponsesError(400, `invalid JSON in request body: ${(err as Error).message}`);
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) throw new ResponsesError(400, 'the request body must be a JSON object');
  const b = parsed as Record<string, unknown>;
  const model = b.model;
  if (typeof model !== 'string' || model.length === 0) throw bad("missing required field 'model' (a non-empty string)", 'model');
  for (const key in UNSUPPORTED) {
    const v = b[key];
    if (v === undefined || v === null) continue;
    // empty tools / tool_choice "none" / background false / include [] ask for nothing
    if ((Array.isArray(v) && v.length === 0) || v === false || (key === 'tool_choice' && (v === 'none' || v === 'auto'))) continue;
    throw bad(UNSUPPORTED[key]!, key);
  }
  const text = b.text as Record<string, unknown> | undefined | null;
  if (text !== undefined && text !== null) {
    const fmt = typeof text === 'object' ? (text.format as Record<string, unknown> | undefined) : undefined;
    if (typeof text !== 'object' || (fmt !== undefined && fmt !== null && fmt.type !== 'text')) {
      throw bad("only plain text output is supported ('text.format.type' must be \"text\")", 'text.format');
    }
  }
  const truncation = b.truncation;
  if (truncation !== undefined && truncation !== null && truncation !== 'disabled') throw bad("'truncation' must be \"disabled\" (the router does not truncate)", 'truncation');
  const instructions = optString(b, 'instructions');
  const previousResponseId = optString(b, 'previous_response_id');
  if (previousResponseId !== null && previousResponseId.length === 0) throw bad("'previous_response_id' must not be empty", 'previous_response_id');
  const store = optBool(b, 'store', true);
  const stream = optBool(b, 'stream', false);
  const maxOutputTokens = optNumber(b, 'max_output_tokens', 1, 2 ** 31 - 1, true);
  const temperature = optNumber(b, 'temperature', 0, 2);
  const topP = optNumber(b, 'top_p', 0, 1);
  const user = optString(b, 'user');
  let metadata: Record<string, string> = {};
  const md = b.metadata;
  if (md !== undefined && md !== null) {
    if (typeof md !== 'object' || Array.isArray(md)) throw bad("'metadata' must be an object of string values", 'metadata');
    const keys = Object.keys(md);
    if (keys.length > MAX_METADATA_KEYS) throw bad(`'metadata' may have at most ${MAX_METADATA_KEYS} keys`, 'metadata');
    for (const k of keys) {
      const v = (md as Record<string, unknown>)[k];
      if (typeof v !== 'string' || k.length > 64 || v.length > 512) throw bad(`'metadata.${k}' must be a string of at most 512 characters (keys at most 64)`, `metadata.${k}`);
    }
    metadata = md as Record<string, string>;
  }
  // input → chat messages, rendered once
  const input = b.input;
  let fragment = '';
  let ids = '';
  let bytes = 0;
  if (typeof input === 'string') {
    if (input.length === 0) throw bad("'input' must not be empty", 'input');
    fragment = `{"role":"user","content":${JSON.stringify(input)}}`;
    ids = newItemId();
    bytes = input.length;
  } else if (Array.isArray(input)) {
    if (input.length === 0) throw bad("'input' must not be an empty list", 'input');
    for (let i = 0; i < input.length; i++) {
      const it = input[i] as Record<string, unknown> | null;
      const at = `input[${i}]`;
      if (typeof it !== 'object' || it === null || Array.isArray(it)) throw bad(`'${at}' must be an object (a message with role and content)`, at);
      const type = it.type;
      if (type !== undefined && type !== 'message') {
        throw bad(`'${at}.type' ${JSON.stringify(type)} is not supported by this router: input items must be messages (no function calls, tool outputs, reasoning or item references)`, `${at}.type`);
      }
      const role = it.role;
      const chatRole = typeof role === 'string' ? ROLE_TO_CHAT[role] : undefined;
      if (chatRole === undefined) throw bad(`'${at}.role' must be one of user, system, developer, assistant (got ${JSON.stringify(role)})`, `${at}.role`);
      const content = contentText(it.content, role as string, at);
      const msg = `{"role":"${chatRole}","content":${JSON.stringify(content)}}`;
      fragment = i === 0 ? msg : `${fragment},${msg}`;
      const id = newItemId();
      ids = i === 0 ? id : `${ids},${id}`;
      bytes += content.length;
    }
  } else {
    throw bad("'input' is required: a string or a list of message items", 'input');
  }
  return {
    model,
    instructions,
    previousResponseId,
    store,
    stream,
    maxOutputTokens,
    temperature,
    topP,
    metadata,
    user,
    inputFragment: fragment,
    inputIds: ids,
    inputBytes: bytes,
  };
}
