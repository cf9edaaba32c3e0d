// Parsing and validation of one request: the body's fields, the prompt to block hashes, the output length,
// the P/D fields. Errors are BadRequest (status, message, param), answered in vLLM's shape by call.ts.

import { bootstrapTarget, checkRole, PdRuleError, pullTarget, roomKey, type BootstrapTarget, type PullTarget } from './pd.js';
import { hashByteBlocks, hashTokenBlocks } from './kv-cache.js';
import type { ResolvedSimOptions } from './options.js';
import { BYTES_PER_TOKEN, renderChat, type ChatMessage } from './tokenizer.js';
import { mix32, words } from './text.js';
import { MAX_LOGPROBS } from './logprobs.js';
import { planJsonContent, planToolCall, type ToolCall } from './tools.js';

/** A request the engine refuses: answered with `status` and the OpenAI error body. */
export { BadRequest } from './bad-request.js';
import { BadRequest } from './bad-request.js';

export const enum Kind {
  Completion = 0,
  Chat = 1,
  Tokenize = 2,
  Detokenize = 3,
  Embeddings = 4,
  Score = 5,
  Rerank = 6,
}

/** Past Python's default recursion limit a real engine's JSON decoder gives up. */
export const ENGINE_MAX_JSON_DEPTH = 1000;

const CHAT_MAX_KEYS = ['max_completion_tokens', 'max_tokens'] as const;
const COMPLETION_MAX_KEYS = ['max_tokens'] as const;

let scratch = Buffer.allocUnsafe(1 << 16);
const hashScratch: number[] = [];

/** What the parser needs of its engine. */
export interface RequestContext {
  readonly options: ResolvedSimOptions;
  /** Served model and adapter names → their JSON string. */
  readonly modelJson: Map<string, string>;
  /** LoRA adapter name → hash salt. */
  readonly loraSalt: Map<string, number>;
  /** KV events are published (then the parser keeps the prompt's block tokens). */
  readonly kvEvents: object | null;
  readonly sched: { blocksNeeded(promptTokens: number, outTokens: number): number };
}

/** The model a request names: its JSON string and whether it is an adapter. */
export interface ModelChoice {
  modelJson: string;
  lora: string | null;
}
const modelChoice: ModelChoice = { modelJson: '', lora: null };

/** Resolves body.model (default: the first served model). The answer is reused: valid until the next call. */
export function resolveModel(ctx: RequestContext, body: Record<string, unknown>): ModelChoice {
  let model = body.model;
  if (model === undefined || model === null) model = ctx.options.models[0];
  if (typeof model !== 'string') throw new BadRequest(400, "'model' must be a string", 'model');
  const modelJson = ctx.modelJson.get(model);
  if (modelJson === undefined) throw new BadRequest(404, `The model \`${model}\` does not exist.`, 'model');
  modelChoice.modelJson = modelJson;
  modelChoice.lora = ctx.loraSalt.has(model) ? model : null;
  return modelChoice;
}

/** A parsed generation request (completions or chat). */
export interface ParsedGeneration {
  stream: boolean;
  includeUsage: boolean;
  promptTokens: number;
  /** Full blocks of the prompt; their hashes are hashes[0, nBlocks). */
  nBlocks: number;
  /** Scratch: valid until the next parse (the caller copies the first nBlocks). */
  hashes: number[];
  /** The full blocks' token ids (for KV events), or null. */
  metaTokens: Uint32Array | null;
  outTokens: number;
  needBlocks: number;
  finishReason: 'stop' | 'length';
  textSeed: number;
  /** A decode leg: the prefill work was done elsewhere. */
  remotePrefill: boolean;
  /** A prefill leg (do_remote_decode): answers with kv_transfer_params. */
  remoteDecode: boolean;
  pullFrom: PullTarget | null;
  bootFrom: BootstrapTarget | null;
  room: string | null;
  /** Chat: the tool this request calls (tools.ts), or null. */
  tool: ToolCall | null;
  /** A fixed content text (response_format's JSON, or the text before a stop string), or null: generated words. */
  fixed: string | null;
  /** The stop string that ended the text (JSON), or "null". */
  stopJson: string;
  /** Completions with echo: the prompt, JSON-escaped without quotes, that precedes the text ('' without). */
  echo: string;
  /** Log probabilities asked for: -1 none, else the alternatives per token (chat top_logprobs, completions logprobs). */
  logprobs: number;
  /** Choices to generate (n). */
  n: number;
}
const parsed: ParsedGeneration = {
  stream: false,
  includeUsage: false,
  promptTokens: 0,
  nBlocks: 0,
  hashes: hashScratch,
  metaTokens: null,
  outTokens: 0,
  needBlocks: 0,
  finishReason: 'stop',
  textSeed: 0,
  remotePrefill: false,
  remoteDecode: false,
  pullFrom: null,
  bootFrom: null,
  room: null,
  tool: null,
  fixed: null,
  stopJson: 'null',
  echo: '',
  logprobs: -1,
  n: 1,
};

/**
 * Validates a completions/chat body and computes what the scheduler needs.
 * The answer is reused: valid until the next call (synchronous use only).
 */
export function parseGeneration(ctx: RequestContext, kind: Kind, rid: string, body: Record<string, unknown>, lora: string | null): ParsedGeneration {
  const o = ctx.options;
  const p = parsed;
  p.includeUsage = false;
  p.metaTokens = null;
  p.remoteDecode = false;
  p.pullFrom = null;
  p.bootFrom = null;
  p.room = null;
  p.tool = null;
  p.fixed = null;
  p.stopJson = 'null';
  p.echo = '';
  p.logprobs = parseLogprobs(kind, body);
  // Stream flags.
  const stream = body.stream;
  if (stream !== undefined && stream !== null && typeof stream !== 'boolean') throw new BadRequest(400, "'stream' must be a boolean", 'stream');
  p.stream = stream === true;
  const so = body.stream_options;
  if (so !== undefined && so !== null) {
    if (typeof so !== 'object' || Array.isArray(so)) throw new BadRequest(400, "'stream_options' must be an object", 'stream_options');
    const iu = (so as Record<string, unknown>).include_usage;
    if (iu !== undefined && iu !== null && typeof iu !== 'boolean') {
      throw new BadRequest(400, "'stream_options.include_usage' must be a boolean", 'stream_options');
    }
    if (!p.stream) throw new BadRequest(400, 'Stream options can only be defined when `stream=True`.', 'stream_options');
    p.includeUsage = iu === true;
  }
  const n = body.n;
  if (n !== undefined && n !== null && (typeof n !== 'number' || !Number.isInteger(n) || n < 1 || n > MAX_N)) {
    throw new BadRequest(400, `'n' must be an integer in [1, ${MAX_N}]`, 'n');
  }
  p.n = typeof n === 'number' ? n : 1;
  // Prompt → bytes or token ids → block hashes.
  const hashes = hashScratch;
  let promptTokens: number;
  let nBlocks: number;
  let metaTokens: Uint32Array | null = null;
  let seed = o.seed;
  let chat: ChatMessage[] | null = null;
  if (kind === Kind.Chat) {
    const messages = body.messages;
    if (!Array.isArray(messages) || messages.length === 0) throw new BadRequest(400, "'messages' must be a non-empty array", 'messages');
    for (let i = 0; i < messages.length; i++) checkMessage(messages[i], i);
    chat = messages as ChatMessage[];
    const text = renderChat(chat);
    const len = writeScratch(text);
    promptTokens = Math.ceil(len / BYTES_PER_TOKEN);
    nBlocks = hashByteBlocks(scratch, len, o.blockSize * BYTES_PER_TOKEN, hashes);
    seed ^= tailHash(scratch, nBlocks * o.blockSize * BYTES_PER_TOKEN, len);
    if (ctx.kvEvents !== null) metaTokens = byteBlockTokens(nBlocks * o.blockSize);
  } else {
    let prompt = body.prompt;
    if (Array.isArray(prompt) && prompt.length === 1 && (typeof prompt[0] === 'string' || Array.isArray(prompt[0]))) prompt = prompt[0];
    const echo = body.echo;
    if (echo !== undefined && echo !== null && typeof echo !== 'boolean') throw new BadRequest(400, "'echo' must be a boolean", 'echo');
    if (echo === true) {
      if (typeof prompt !== 'string') throw new BadRequest(400, "the simulator echoes string prompts only", 'echo');
      p.echo = JSON.stringify(prompt).slice(1, -1);
    }
    if (typeof prompt === 'string') {
      const len = writeScratch(prompt);
      promptTokens = Math.ceil(len / BYTES_PER_TOKEN);
      nBlocks = hashByteBlocks(scratch, len, o.blockSize * BYTES_PER_TOKEN, hashes);
      seed ^= tailHash(scratch, nBlocks * o.blockSize * BYTES_PER_TOKEN, len);
      if (ctx.kvEvents !== null) metaTokens = byteBlockTokens(nBlocks * o.blockSize);
    } else if (Array.isArray(prompt) && prompt.length > 0 && prompt.every((t) => Number.isInteger(t) && t >= 0)) {
      promptTokens = prompt.length;
      nBlocks = hashTokenBlocks(prompt as number[], o.blockSize, hashes);
      if (ctx.kvEvents !== null) metaTokens = Uint32Array.from((prompt as number[]).slice(0, nBlocks * o.blockSize));
      let h = prompt.length;
      for (let i = nBlocks * o.blockSize; i < prompt.length; i++) h = Math.imul(h ^ (prompt[i] as number), 0x01000193);
      seed ^= h;
    } else if (prompt === undefined || prompt === null) {
      throw new BadRequest(400, "'prompt' is required", 'prompt');
    } else if (Array.isArray(prompt) && prompt.length > 1) {
      throw new BadRequest(400, 'the simulator accepts one prompt per request (a string or an array of token ids)', 'prompt');
    } else {
      throw new BadRequest(400, "'prompt' must be a string or an array of token ids", 'prompt');
    }
  }
  if (promptTokens === 0) throw new BadRequest(400, 'The prompt is empty.', kind === Kind.Chat ? 'messages' : 'prompt');
  if (lora !== null) {
    // An adapter's KV differs from the base model's: its blocks hash apart (vLLM adds the LoRA id to the block key).
    const salt = ctx.loraSalt.get(lora)!;
    for (let i = 0; i < nBlocks; i++) hashes[i] = (hashes[i]! * 31 + salt) % 9007199254740881;
  }
  if (nBlocks > 0) seed ^= mix32(hashes[nBlocks - 1]! | 0);
  // Output length.
  let maxTokens: number | undefined;
  for (const key of kind === Kind.Chat ? CHAT_MAX_KEYS : COMPLETION_MAX_KEYS) {
    const v = body[key];
    if (v === undefined || v === null) continue;
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 1) throw new BadRequest(400, `'${key}' must be an integer >= 1`, key);
    maxTokens = v;
    break;
  }
  if (promptTokens > o.maxModelLen || promptTokens + (maxTokens ?? 1) > o.maxModelLen) {
    throw new BadRequest(
      400,
      maxTokens === undefined || promptTokens > o.maxModelLen
        ? `This model's maximum context length is ${o.maxModelLen} tokens. However, your request has ${promptTokens} input tokens. Please reduce the length of the input messages.`
        : `This model's maximum context length is ${o.maxModelLen} tokens. However, you requested ${promptTokens + maxTokens} tokens (${promptTokens} in the messages, ${maxTokens} in the completion). Please reduce the length of the messages or completion.`,
      kind === Kind.Chat ? 'messages' : 'prompt',
    );
  }
  const finishReason = maxTokens === undefined ? 'stop' : 'length';
  let outTokens = maxTokens ?? Math.min(o.defaultMaxTokens, o.maxModelLen - promptTokens);
  let needBlocks = ctx.sched.blocksNeeded(promptTokens, outTokens);
  if (needBlocks > o.kvCacheBlocks) {
    throw new BadRequest(400, `the request needs ${needBlocks} KV blocks but the cache holds ${o.kvCacheBlocks}`, 'max_tokens');
  }
  const rs = body.seed;
  if (rs !== undefined && rs !== null) {
    if (typeof rs !== 'number' || !Number.isInteger(rs)) throw new BadRequest(400, "'seed' must be an integer", 'seed');
    seed = mix32(o.seed ^ rs);
  }
  p.textSeed = mix32(seed);
  if (chat !== null) {
    const tool = planToolCall(body, chat, p.textSeed, o.toolCallRate);
    if (tool !== null) {
      // the call's arguments are the generated text: one fragment per token, no longer than max_tokens allows
      p.tool = tool;
      outTokens = Math.min(outTokens, Math.max(1, Math.ceil(tool.args.length / BYTES_PER_TOKEN)));
      needBlocks = ctx.sched.blocksNeeded(promptTokens, outTokens);
    }
    const json = planJsonContent(body, p.textSeed);
    if (json !== null && tool === null) {
      // structured output: the content is this JSON text, one fragment per token (whole even when max_tokens is short)
      p.fixed = json;
      outTokens = Math.min(outTokens, Math.max(1, Math.ceil(json.length / BYTES_PER_TOKEN)));
      needBlocks = ctx.sched.blocksNeeded(promptTokens, outTokens);
    }
  }
  let stopped = false;
  if (p.tool === null && p.fixed === null) {
    const stop = parseStop(body.stop);
    if (stop !== null) {
      // the text ends before the first stop string it holds (vLLM leaves the stop string out)
      const text = words(p.textSeed, 0, outTokens);
      let at = -1;
      let which = '';
      for (const s of stop) {
        const k = text.indexOf(s);
        if (k >= 0 && (at < 0 || k < at)) {
          at = k;
          which = s;
        }
      }
      if (at >= 0) {
        stopped = true;
        p.fixed = text.slice(0, at);
        p.stopJson = JSON.stringify(which);
        outTokens = Math.floor(at / BYTES_PER_TOKEN) + 1;
        needBlocks = ctx.sched.blocksNeeded(promptTokens, outTokens);
      }
    }
  }
  if (p.n > 1 && (p.tool !== null || p.fixed !== null || p.echo !== '')) {
    throw new BadRequest(400, "the simulator supports 'n' > 1 for free text only (no tool call, response_format, stop match or echo)", 'n');
  }
  // P/D: a prefill leg answers with kv_transfer_params; a decode leg skips the prefill work.
  let remotePrefill = false;
  const kv = body.kv_transfer_params;
  if (kv !== undefined && kv !== null) {
    if (typeof kv !== 'object' || Array.isArray(kv)) throw new BadRequest(400, "'kv_transfer_params' must be an object", 'kv_transfer_params');
    const k = kv as Record<string, unknown>;
    if (k.do_remote_prefill === true) remotePrefill = true;
    else if (k.do_remote_decode === true) p.remoteDecode = true;
  }
  try {
    checkRole(o.engine, o.role, body, rid);
    if (remotePrefill) p.pullFrom = pullTarget(kv as Record<string, unknown>);
    if (o.engine === 'sglang' && o.role === 'decode') {
      // a decode server pairs with the prefill server its bootstrap fields name
      p.bootFrom = bootstrapTarget(body);
      if (p.bootFrom !== null) remotePrefill = true;
    } else if (o.engine === 'sglang' && o.role === 'prefill') {
      // a prefill server computes the prompt and the first token for its decode side: nothing more
      p.room = roomKey(body.bootstrap_room);
      outTokens = 1;
    }
  } catch (err) {
    if (err instanceof PdRuleError) throw new BadRequest(err.status, err.message, err.param);
    throw err;
  }
  p.promptTokens = promptTokens;
  p.nBlocks = nBlocks;
  p.metaTokens = metaTokens;
  p.outTokens = outTokens;
  p.needBlocks = needBlocks;
  p.finishReason = p.tool !== null || stopped ? 'stop' : finishReason;
  p.remotePrefill = remotePrefill;
  return p;
}

/** Chat's logprobs (boolean) + top_logprobs, or completions' logprobs (an integer): -1 (none) or the count. */
function parseLogprobs(kind: Kind, body: Record<string, unknown>): number {
  const lp = body.logprobs;
  const inRange = (v: unknown): v is number => typeof v === 'number' && Number.isInteger(v) && v >= 0 && v <= MAX_LOGPROBS;
  if (kind === Kind.Chat) {
    if (lp !== undefined && lp !== null && typeof lp !== 'boolean') throw new BadRequest(400, "'logprobs' must be a boolean", 'logprobs');
    const top = body.top_logprobs;
    if (top === undefined || top === null) return lp === true ? 0 : -1;
    if (!inRange(top)) throw new BadRequest(400, `'top_logprobs' must be an integer in [0, ${MAX_LOGPROBS}]`, 'top_logprobs');
    if (lp !== true && top > 0) throw new BadRequest(400, 'when using `top_logprobs`, `logprobs` must be set to true.', 'top_logprobs');
    return lp === true ? top : -1;
  }
  if (lp === undefined || lp === null || lp === false) return -1;
  if (!inRange(lp)) throw new BadRequest(400, `'logprobs' must be an integer in [0, ${MAX_LOGPROBS}]`, 'logprobs');
  return lp;
}

/** The most choices (n) a request may ask for. */
const MAX_N = 64;
const MAX_STOP = 16;
const MAX_STOP_LEN = 1024;

/** body.stop: null (none), or its strings. */
function parseStop(v: unknown): string[] | null {
  if (v === undefined || v === null) return null;
  const list = typeof v === 'string' ? [v] : v;
  if (!Array.isArray(list) || list.length > MAX_STOP || !list.every((s) => typeof s === 'string' && s.length > 0 && s.length <= MAX_STOP_LEN)) {
    throw new BadRequest(400, `'stop' must be a non-empty string or a list of at most ${MAX_STOP} (each 1 to ${MAX_STOP_LEN} characters)`, 'stop');
  }
  return list.length === 0 ? null : (list as string[]);
}

/** vLLM's POST /tokenize: the prompt's (or rendered messages') simulated token ids. */
export function tokenizeIds(body: Record<string, unknown>): number[] {
  if (body.messages !== undefined) {
    const messages = body.messages;
    if (!Array.isArray(messages) || messages.length === 0) throw new BadRequest(400, "'messages' must be a non-empty array", 'messages');
    for (let i = 0; i < messages.length; i++) checkMessage(messages[i], i);
    return byteTokenIds(renderChat(messages as ChatMessage[]));
  }
  if (typeof body.prompt === 'string') return byteTokenIds(body.prompt);
  if (Array.isArray(body.prompt) && body.prompt.every((t) => Number.isInteger(t) && t >= 0)) return body.prompt as number[];
  throw new BadRequest(400, "'prompt' (a string or token ids) or 'messages' is required", 'prompt');
}

function checkMessage(m: unknown, i: number): void {
  if (typeof m !== 'object' || m === null || Array.isArray(m)) throw new BadRequest(400, `'messages[${i}]' must be an object`, 'messages');
  const msg = m as Record<string, unknown>;
  if (typeof msg.role !== 'string') throw new BadRequest(400, `'messages[${i}].role' must be a string`, 'messages');
  const c = msg.content;
  if (c === undefined || c === null || typeof c === 'string') return;
  if (!Array.isArray(c)) throw new BadRequest(400, `'messages[${i}].content' must be a string, an array of parts or null`, 'messages');
  for (const part of c) {
    if (typeof part === 'string') continue;
    if (typeof part !== 'object' || part === null || typeof (part as { type?: unknown }).type !== 'string') {
      throw new BadRequest(400, `'messages[${i}].content' parts must be objects with a 'type'`, 'messages');
    }
  }
}

/** Simulated token ids of a text: each 4-byte group of its UTF-8 bytes read as a little-endian uint32. */
function byteTokenIds(text: string): number[] {
  const len = writeScratch(text);
  const ids: number[] = [];
  for (let i = 0; i < len; i += BYTES_PER_TOKEN) {
    let v = 0;
    for (let j = Math.min(len, i + BYTES_PER_TOKEN) - 1; j >= i; j--) v = v * 256 + scratch[j]!;
    ids.push(v);
  }
  return ids;
}

/** The token ids of the scratch prompt's first `tokens` tokens (full blocks: 4 bytes each, little-endian). */
function byteBlockTokens(tokens: number): Uint32Array {
  const bytes = new Uint8Array(tokens * BYTES_PER_TOKEN);
  bytes.set(scratch.subarray(0, bytes.length));
  const out = new Uint32Array(tokens);
  const dv = new DataView(bytes.buffer);
  for (let i = 0; i < tokens; i++) out[i] = dv.getUint32(i * 4, true);
  return out;
}

/** FNV-1a of bytes [from, to) mixed with the length: the part of the prompt the block hashes do not cover. */
function tailHash(bytes: Uint8Array, from: number, to: number): number {
  let h = 0x811c9dc5 ^ to;
  for (let i = from; i < to; i++) h = Math.imul(h ^ bytes[i]!, 0x01000193);
  return h;
}

function writeScratch(s: string): number {
  // Worst case 3 bytes per UTF-16 unit.
  if (s.length * 3 > scratch.length) {
    const need = Buffer.byteLength(s);
    if (need > scratch.length) scratch = Buffer.allocUnsafe(Math.max(need, scratch.length * 2));
  }
  return scratch.write(s, 0);
}
