// A POST /v1/responses body: checked field by field (a bad field is a 400
// naming it, `input[2].content[0].type` style; a field OpenAI's API does not
// have is a 400 too), and its input rendered once into chat messages as a JSON
// fragment (`{"role":..,"content":..},...`, items.ts), the form the store
// keeps, so no later turn parses or renders it again. The fields that become
// fields of the engine's chat completion are rendered here too (`chat`).
import { jsonNestsDeeper } from '../json-depth.js';
import { renderItems, renderText, type RenderedInput } from './items.js';
import { ResponsesError } from './request-error.js';
import { parseText, parseTools } from './tools.js';

export { ResponsesError } from './request-error.js';

export interface TurnRequest {
  readonly model: string;
  /** `instructions` as given (a string, or input items), echoed; null when absent. */
  readonly instructions: string | unknown[] | null;
  /** The instructions as chat messages ('' for none): sent before the conversation, never stored. */
  readonly instructionsFragment: string;
  readonly previousResponseId: string | null;
  readonly store: boolean;
  readonly stream: boolean;
  readonly maxOutputTokens: number | null;
  readonly temperature: number | null;
  readonly topP: number | null;
  readonly metadata: Record<string, string>;
  readonly user: string | null;
  readonly safetyIdentifier: string | null;
  readonly promptCacheKey: string | null;
  readonly promptCacheRetention: string | null;
  readonly serviceTier: string | null;
  /** Function tools as the Response lists them. */
  readonly tools: Record<string, unknown>[];
  readonly toolChoice: unknown;
  /** Names of the declared functions. */
  readonly toolNames: string[];
  readonly parallelToolCalls: boolean;
  readonly maxToolCalls: number | null;
  /** The most function_call items a response of this request holds (parallel_tool_calls false: 1; max_tool_calls). */
  readonly callLimit: number;
  readonly reasoning: { effort: string | null; summary: string | null };
  readonly text: Record<string, unknown>;
  readonly truncation: 'auto' | 'disabled';
  /** top_logprobs (0 when absent); logprobs are returned when > 0 or include names them. */
  readonly topLogprobs: number;
  readonly logprobs: boolean;
  readonly include: string[];
  /** The chat body's fields beyond model/messages/stream/sampling, with leading commas: tools, tool_choice, response_format, reasoning_effort, logprobs. */
  readonly chat: string;
  /** This turn's input as chat messages: a JSON fragment without brackets. */
  readonly inputFragment: string;
  /** The id entries of those messages (items.ts), comma-joined, in order. */
  readonly inputIds: string;
  /** Bytes of the input text (for the conversation bound). */
  readonly inputBytes: number;
  /** call_ids answered by function_call_output items that must be in the chain (previous_response_id). */
  readonly callRefs: { callId: string; param: string }[];
}

/** Fields of OpenAI's request this router does not serve: the field named in the 400. */
const UNSUPPORTED: Record<string, string> = {
  background: 'background responses are not supported',
  conversation: 'the Conversations API is not supported: chain turns with previous_response_id',
  prompt: 'prompt templates are not supported',
};

/** Every field of OpenAI's CreateResponse: anything else is a 400 naming it. */
const KNOWN = new Set([
  'model',
  'input',
  'instructions',
  'previous_response_id',
  'store',
  'stream',
  'stream_options',
  'max_output_tokens',
  'temperature',
  'top_p',
  'metadata',
  'user',
  'safety_identifier',
  'prompt_cache_key',
  'prompt_cache_retention',
  'service_tier',
  'tools',
  'tool_choice',
  'parallel_tool_calls',
  'max_tool_calls',
  'reasoning',
  'text',
  'truncation',
  'top_logprobs',
  'include',
  'background',
  'conversation',
  'prompt',
]);

const EFFORTS = new Set(['none', 'minimal', 'low', 'medium', 'high', 'xhigh']);
const SUMMARIES = new Set(['auto', 'concise', 'detailed']);
/** include values served: the output text's logprobs. Others name data this router does not have. */
const INCLUDE_LOGPROBS = 'message.output_text.logprobs';

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

function optString(b: Record<string, unknown>, key: string, max = Infinity): string | null {
  const v = b[key];
  if (v === undefined || v === null) return null;
  if (typeof v !== 'string') throw bad(`'${key}' must be a string`, key);
  if (v.length > max) throw bad(`'${key}' must be at most ${max} characters`, key);
  return v;
}

function optEnum(b: Record<string, unknown>, key: string, allowed: readonly string[]): string | null {
  const v = b[key];
  if (v === undefined || v === null) return null;
  if (typeof v !== 'string' || !allowed.includes(v)) throw bad(`'${key}' must be one of ${allowed.map((x) => JSON.stringify(x)).join(', ')}`, key);
  return v;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
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
  if (!isObject(parsed)) throw new ResponsesError(400, 'the request body must be a JSON object');
  const b = parsed;
  for (const k in b) if (!KNOWN.has(k)) throw bad(`Unknown parameter: '${k}'.`, k);
  const model = b.model;
  if (typeof model !== 'string' || model.length === 0) throw bad("missing required field 'model' (a non-empty string)", 'model');
  for (const key in UNSUPPORTED) {
    const v = b[key];
    if (v === undefined || v === null || v === false) continue;
    throw bad(UNSUPPORTED[key]!, key);
  }
  const truncation = (optEnum(b, 'truncation', ['auto', 'disabled']) ?? 'disabled') as 'auto' | 'disabled';
  const previousResponseId = optString(b, 'previous_response_id');
  if (previousResponseId !== null && previousResponseId.length === 0) throw bad("'previous_response_id' must not be empty", 'previous_response_id');
  const store = optBool(b, 'store', true);
  const stream = optBool(b, 'stream', false);
  const so = b.stream_options;
  if (so !== undefined && so !== null) {
    if (!isObject(so)) throw bad("'stream_options' must be an object", 'stream_options');
    if (!stream) throw bad("'stream_options' is only allowed with stream: true", 'stream_options');
    for (const k in so) {
      // include_obfuscation pads events against length side channels; this router never pads, so true and false both hold
      if (k !== 'include_obfuscation') throw bad(`Unknown parameter: 'stream_options.${k}'.`, `stream_options.${k}`);
      if (typeof so[k] !== 'boolean') throw bad("'stream_options.include_obfuscation' must be a boolean", 'stream_options.include_obfuscation');
    }
  }
  const maxOutputTokens = optNumber(b, 'max_output_tokens', 1, 2 ** 31 - 1, true);
  const temperature = optNumber(b, 'temperature', 0, 2);
  const topP = optNumber(b, 'top_p', 0, 1);
  const user = optString(b, 'user', 512);
  const safetyIdentifier = optString(b, 'safety_identifier', 64);
  const promptCacheKey = optString(b, 'prompt_cache_key', 1024);
  const promptCacheRetention = optEnum(b, 'prompt_cache_retention', ['in-memory', '24h']);
  if (promptCacheRetention === '24h') throw bad("'prompt_cache_retention' \"24h\" is not supported: the engines' prefix caches hold what fits in memory (\"in-memory\")", 'prompt_cache_retention');
  const serviceTier = optEnum(b, 'service_tier', ['auto', 'default', 'flex', 'scale', 'priority']);
  if (serviceTier !== null && serviceTier !== 'auto' && serviceTier !== 'default') {
    throw bad(`'service_tier' ${JSON.stringify(serviceTier)} is not supported by this router ("auto" or "default")`, 'service_tier');
  }
  const parallelToolCalls = optBool(b, 'parallel_tool_calls', true);
  const maxToolCalls = optNumber(b, 'max_tool_calls', 1, 1024, true);
  const topLogprobs = optNumber(b, 'top_logprobs', 0, 20, true) ?? 0;
  const include: string[] = [];
  const inc = b.include;
  if (inc !== undefined && inc !== null) {
    if (!Array.isArray(inc)) throw bad("'include' must be a list", 'include');
    inc.forEach((v, i) => {
      if (v !== INCLUDE_LOGPROBS) {
        throw bad(`'include[${i}]' ${JSON.stringify(v)} is not supported by this router (only "${INCLUDE_LOGPROBS}")`, `include[${i}]`);
      }
      include.push(v);
    });
  }
  const logprobs = topLogprobs > 0 || include.length > 0;
  // reasoning: effort goes to the engine as reasoning_effort; the engine's reasoning text comes back as reasoning items
  let reasoning: { effort: string | null; summary: string | null } = { effort: null, summary: null };
  const rs = b.reasoning;
  if (rs !== undefined && rs !== null) {
    if (!isObject(rs)) throw bad("'reasoning' must be an object ({effort, summary})", 'reasoning');
    for (const k in rs) if (k !== 'effort' && k !== 'summary' && k !== 'generate_summary') throw bad(`Unknown parameter: 'reasoning.${k}'.`, `reasoning.${k}`);
    const effort = rs.effort ?? null;
    if (effort !== null && (typeof effort !== 'string' || !EFFORTS.has(effort))) throw bad(`'reasoning.effort' must be one of ${[...EFFORTS].join(', ')}`, 'reasoning.effort');
    const summary = rs.summary ?? rs.generate_summary ?? null;
    if (summary !== null && (typeof summary !== 'string' || !SUMMARIES.has(summary))) throw bad(`'reasoning.summary' must be one of ${[...SUMMARIES].join(', ')}`, 'reasoning.summary');
    reasoning = { effort: effort as string | null, summary: summary as string | null };
  }
  const tools = parseTools(b.tools, b.tool_choice);
  const text = parseText(b.text);
  let chat = tools.chat;
  if (tools.chat !== '' && !parallelToolCalls) chat += ',"parallel_tool_calls":false';
  chat += text.chat;
  if (reasoning.effort !== null) chat += `,"reasoning_effort":${JSON.stringify(reasoning.effort)}`;
  if (logprobs) chat += `,"logprobs":true,"top_logprobs":${topLogprobs}`;
  let metadata: Record<string, string> = {};
  const md = b.metadata;
  if (md !== undefined && md !== null) {
    if (!isObject(md)) throw bad("'metadata' must be an object of string values", 'metadata');
    const keys = Object.keys(md);
    if (keys.length > MAX_METADATA_KEYS) throw bad(`'metadata' may have at most ${MAX_METADATA_KEYS} keys`, 'metadata');
    for (const k of keys) {
      const v = md[k];
      if (typeof v !== 'string' || k.length > 64 || v.length > 512) throw bad(`'metadata.${k}' must be a string of at most 512 characters (keys at most 64)`, `metadata.${k}`);
    }
    metadata = md as Record<string, string>;
  }
  // instructions: a string, or message items (rendered as the conversation's first messages)
  const ins = b.instructions;
  let instructions: string | unknown[] | null = null;
  let instructionsFragment = '';
  if (typeof ins === 'string') {
    instructions = ins;
    instructionsFragment = `{"role":"system","content":${JSON.stringify(ins)}}`;
  } else if (Array.isArray(ins)) {
    instructions = ins;
    instructionsFragment = renderItems(ins, 'instructions', true).fragment;
  } else if (ins !== undefined && ins !== null) {
    throw bad("'instructions' must be a string or a list of message items", 'instructions');
  }
  // input → chat messages, rendered once
  const input = b.input;
  let r: RenderedInput;
  if (typeof input === 'string') {
    if (input.length === 0) throw bad("'input' must not be empty", 'input');
    r = renderText(input);
  } else if (Array.isArray(input)) {
    if (input.length === 0) throw bad("'input' must not be an empty list", 'input');
    r = renderItems(input, 'input', false);
  } else {
    throw bad("'input' is required: a string or a list of input items", 'input');
  }
  if (r.refs.length > 0 && previousResponseId === null) {
    const ref = r.refs[0]!;
    throw bad(`No tool call found for function call output with call_id ${JSON.stringify(ref.callId)} (no function_call item in the input makes it, and there is no previous_response_id)`, ref.param);
  }
  const callLimit = Math.min(parallelToolCalls ? Infinity : 1, maxToolCalls ?? Infinity);
  return {
    model,
    instructions,
    instructionsFragment,
    previousResponseId,
    store,
    stream,
    maxOutputTokens,
    temperature,
    topP,
    metadata,
    user,
    safetyIdentifier,
    promptCacheKey,
    promptCacheRetention,
    serviceTier,
    tools: tools.echo,
    toolChoice: tools.choiceEcho,
    toolNames: tools.names,
    parallelToolCalls,
    maxToolCalls,
    callLimit,
    reasoning,
    text: text.echo,
    truncation,
    topLogprobs,
    logprobs,
    include,
    chat,
    inputFragment: r.fragment,
    inputIds: r.ids,
    inputBytes: r.bytes,
    callRefs: r.refs,
  };
}
