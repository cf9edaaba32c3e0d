// Parsing an inference request body, bounded so that no body can hold the
// event loop or cost memory far beyond its size:
//
// - nesting: a body nested deeper than MAX_JSON_DEPTH arrays/objects is a 400
//   before JSON.parse sees it (V8's JSON.parse takes ~15 ms for 8 Ki nested
//   arrays, 1.7 s and ~60 MB for 1 Mi, far beyond the bytes they need). The
//   check is cheap for ordinary bodies: counting '[' and '{' stops at the
//   limit, and only a body with more brackets than that is walked (strings
//   skipped with indexOf);
// - size: bodies above `limits.parseOffloadBytes` are parsed in a worker
//   thread (parse-worker.ts), which hands back the few fields the router
//   reads and the rendered prompt; the bytes relayed to the engine are the
//   client's own.
import { jsonNestsDeeper } from '../json-depth.js';
import { KIND_CHAT, isPassthrough } from './kinds.js';
import type { PromptWriter } from './prompt.js';

/** Deepest nesting of arrays and objects a request body may have by default (tools' JSON schemas stay well under it). */
export const MAX_JSON_DEPTH = 128;

export interface BodyError {
  readonly ok: false;
  readonly status: number;
  readonly message: string;
  readonly param: string | null;
}

export interface ParsedBody {
  readonly ok: true;
  readonly model: string;
  readonly body: Record<string, unknown>;
}

function fail(status: number, message: string, param: string | null = null): BodyError {
  return { ok: false, status, message, param };
}

/**
 * Parses and checks a body and renders its prompt into `pw` (reset first).
 * Checks: depth, JSON, an object, `model`, and `messages` (chat) or `prompt`.
 */
export function parseRequestBody(raw: Buffer, kind: number, pw: PromptWriter, maxDepth = MAX_JSON_DEPTH, modelOptional = false): ParsedBody | BodyError {
  if (jsonNestsDeeper(raw, maxDepth)) return fail(400, `the request body nests arrays or objects deeper than ${maxDepth} levels (limits.maxJsonDepth)`);
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw.toString('utf8'));
  } catch (err) {
    return fail(400, `invalid JSON in request body: ${(err as Error).message}`);
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) return fail(400, 'the request body must be a JSON object');
  const body = parsed as Record<string, unknown>;
  const model = body.model;
  if (isPassthrough(kind)) {
    // relayed as is: the engine checks its own fields; `model` may be absent (the director
    // then picks the router's only model, as an engine defaults to its own)
    pw.reset();
    if (model === undefined) return { ok: true, model: '', body };
    if (typeof model !== 'string' || model.length === 0) return fail(400, "field 'model' must be a non-empty string", 'model');
    return { ok: true, model, body };
  }
  // absent, with a rewrite rule for requests that name no model (modelRewrites' default): '' goes to it
  const none = model === undefined && modelOptional;
  if (!none && (typeof model !== 'string' || model.length === 0)) return fail(400, "missing required field 'model' (a non-empty string)", 'model');
  if (!renderPrompt(pw, kind, body)) {
    const field = kind === KIND_CHAT ? 'messages' : 'prompt';
    const what = kind === KIND_CHAT ? 'a non-empty list of {role, content} objects' : 'a string, a list of strings or a list of token ids';
    return fail(400, `missing or invalid field '${field}' (${what})`, field);
  }
  return { ok: true, model: none ? '' : (model as string), body };
}

export function renderPrompt(pw: PromptWriter, kind: number, body: Readonly<Record<string, unknown>>): boolean {
  pw.reset();
  if (isPassthrough(kind)) return true;
  return kind === KIND_CHAT ? pw.chat(body.messages) : pw.completion(body.prompt);
}

/** The top-level fields of a body that are not objects or arrays (what a gate may read of a body parsed elsewhere). */
export function scalarFields(body: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const k of Object.keys(body)) {
    const v = body[k];
    if (v === null || typeof v !== 'object') out[k] = v;
  }
  return out;
}
