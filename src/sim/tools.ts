// Tool calling as vLLM's OpenAI server answers it (with --enable-auto-tool-choice): which tool a chat
// request calls (tools + tool_choice, a seeded rule for "auto") and its arguments, generated to satisfy
// the function's JSON Schema parameters (types, required properties, enums, bounds; simple). Structured
// output (response_format json_object / json_schema) draws its JSON content the same way.

import { BadRequest } from './bad-request.js';
import { messageText, type ChatMessage } from './tokenizer.js';
import { mix32, word } from './text.js';

/** At most this many tools per request, and this deep a parameters schema (deeper: null). */
const MAX_TOOLS = 128;
const MAX_SCHEMA_DEPTH = 8;
/** At most this many properties or array items generated per level. */
const MAX_WIDTH = 64;

/** The tool a request calls. */
export interface ToolCall {
  /** The function's name as a JSON string. */
  nameJson: string;
  /** The arguments, JSON text (as the `arguments` string holds it). */
  args: string;
}

/**
 * Validates body.tools and body.tool_choice and decides the call: null (no tool is called) or the
 * function and its arguments. `seed` is the request's text seed; `rate` the --tool-call-rate for "auto".
 */
export function planToolCall(body: Record<string, unknown>, messages: readonly ChatMessage[], seed: number, rate: number): ToolCall | null {
  const tools = body.tools;
  const choice = body.tool_choice;
  if (tools === undefined || tools === null) {
    if (choice === undefined || choice === null || choice === 'none' || choice === 'auto') return null;
    throw new BadRequest(400, "'tool_choice' other than \"none\" or \"auto\" requires 'tools'", 'tool_choice');
  }
  if (!Array.isArray(tools)) throw new BadRequest(400, "'tools' must be an array", 'tools');
  if (tools.length > MAX_TOOLS) throw new BadRequest(400, `'tools' holds ${tools.length} tools; at most ${MAX_TOOLS} are accepted`, 'tools');
  for (let i = 0; i < tools.length; i++) checkTool(tools[i], i);
  const fns = tools as { function: { name: string; parameters?: unknown } }[];
  let pick: number;
  if (choice === undefined || choice === null || choice === 'auto') {
    if (fns.length === 0 || !autoCalls(messages, seed, rate)) return null;
    pick = mix32(seed ^ 0x7001) % fns.length;
  } else if (choice === 'none') {
    return null;
  } else if (choice === 'required') {
    if (fns.length === 0) throw new BadRequest(400, "tool_choice 'required' needs at least one tool in 'tools'", 'tool_choice');
    pick = mix32(seed ^ 0x7001) % fns.length;
  } else if (typeof choice === 'object' && !Array.isArray(choice)) {
    const f = (choice as Record<string, unknown>).function;
    const name = typeof f === 'object' && f !== null ? (f as Record<string, unknown>).name : undefined;
    if ((choice as Record<string, unknown>).type !== 'function' || typeof name !== 'string') {
      throw new BadRequest(400, "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}", 'tool_choice');
    }
    pick = fns.findIndex((t) => t.function.name === name);
    if (pick < 0) throw new BadRequest(400, `Tool '${name}' named in tool_choice is not in 'tools'`, 'tool_choice');
  } else {
    throw new BadRequest(400, "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}", 'tool_choice');
  }
  const fn = fns[pick]!.function;
  const g = new ArgGen(seed);
  const params = fn.parameters ?? { type: 'object', properties: {} };
  const value = g.value(params, 0);
  // a function's arguments are an object, whatever its schema says
  const args = value !== null && typeof value === 'object' && !Array.isArray(value) ? value : {};
  return { nameJson: JSON.stringify(fn.name), args: JSON.stringify(args) };
}

/**
 * response_format: null (free text: absent or "text"), or the JSON text the answer holds: an object for
 * "json_object", a value satisfying json_schema.schema for "json_schema".
 */
export function planJsonContent(body: Record<string, unknown>, seed: number): string | null {
  const rf = body.response_format;
  if (rf === undefined || rf === null) return null;
  if (typeof rf !== 'object' || Array.isArray(rf)) throw new BadRequest(400, "'response_format' must be an object", 'response_format');
  const f = rf as Record<string, unknown>;
  const g = new ArgGen(seed ^ 0x150);
  switch (f.type) {
    case 'text':
      return null;
    case 'json_object':
      return JSON.stringify(g.value({ type: 'object', properties: { answer: { type: 'string' } }, required: ['answer'] }, 0));
    case 'json_schema': {
      const js = f.json_schema;
      const schema = typeof js === 'object' && js !== null && !Array.isArray(js) ? (js as Record<string, unknown>).schema : undefined;
      if (typeof schema !== 'object' || schema === null || Array.isArray(schema)) {
        throw new BadRequest(400, "'response_format.json_schema.schema' must be a JSON Schema object", 'response_format');
      }
      return JSON.stringify(g.value(schema, 0));
    }
    default:
      throw new BadRequest(400, "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"", 'response_format');
  }
}

function checkTool(t: unknown, i: number): void {
  if (typeof t !== 'object' || t === null || Array.isArray(t)) throw new BadRequest(400, `'tools[${i}]' must be an object`, 'tools');
  const tool = t as Record<string, unknown>;
  if (tool.type !== 'function') throw new BadRequest(400, `'tools[${i}].type' must be "function"`, 'tools');
  const f = tool.function;
  if (typeof f !== 'object' || f === null || Array.isArray(f)) throw new BadRequest(400, `'tools[${i}].function' must be an object`, 'tools');
  const fn = f as Record<string, unknown>;
  if (typeof fn.name !== 'string' || fn.name.length === 0) throw new BadRequest(400, `'tools[${i}].function.name' must be a non-empty string`, 'tools');
  const p = fn.parameters;
  if (p !== undefined && p !== null && (typeof p !== 'object' || Array.isArray(p))) {
    throw new BadRequest(400, `'tools[${i}].function.parameters' must be a JSON Schema object`, 'tools');
  }
}

/** "auto": a tool is called when a hash of the last user message (and the seed) falls under the rate. */
function autoCalls(messages: readonly ChatMessage[], seed: number, rate: number): boolean {
  if (rate <= 0) return false;
  if (rate >= 1) return true;
  let text = '';
  for (let i = messages.length - 1; i >= 0; i--) {
    if (messages[i]!.role === 'user') {
      text = messageText(messages[i]!.content);
      break;
    }
  }
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193);
  return mix32(h ^ mix32(seed)) / 4294967296 < rate;
}

/** Values for a JSON Schema, drawn from a seeded sequence. */
class ArgGen {
  #n = 0;
  constructor(readonly seed: number) {}

  #next(): number {
    return mix32((this.seed + Math.imul(++this.#n, 0x9e3779b9)) | 0);
  }

  value(s: unknown, depth: number): unknown {
    if (typeof s !== 'object' || s === null || Array.isArray(s) || depth > MAX_SCHEMA_DEPTH) return null;
    const schema = s as Record<string, unknown>;
    if ('const' in schema) return schema.const;
    if (Array.isArray(schema.enum) && schema.enum.length > 0) return schema.enum[this.#next() % schema.enum.length];
    for (const k of ['anyOf', 'oneOf', 'allOf'] as const) {
      const alts = schema[k];
      if (Array.isArray(alts) && alts.length > 0) return this.value(alts[0], depth + 1);
    }
    let type = schema.type;
    if (Array.isArray(type)) type = type.find((t) => t !== 'null') ?? 'null';
    if (type === undefined) type = typeof schema.properties === 'object' ? 'object' : schema.items !== undefined ? 'array' : 'string';
    switch (type) {
      case 'object':
        return this.#object(schema, depth);
      case 'array':
        return this.#array(schema, depth);
      case 'integer':
        return this.#number(schema, true);
      case 'number':
        return this.#number(schema, false);
      case 'boolean':
        return (this.#next() & 1) === 1;
      case 'null':
        return null;
      default:
        return this.#string(schema);
    }
  }

  #object(schema: Record<string, unknown>, depth: number): Record<string, unknown> {
    const out: Record<string, unknown> = {};
    const props = schema.properties;
    if (typeof props !== 'object' || props === null || Array.isArray(props)) return out;
    const required = new Set(Array.isArray(schema.required) ? schema.required : []);
    let n = 0;
    // required properties always; the others while the width allows
    for (const [k, v] of Object.entries(props)) {
      if (required.has(k) && n++ < MAX_WIDTH) out[k] = this.value(v, depth + 1);
    }
    for (const [k, v] of Object.entries(props)) {
      if (!required.has(k) && n++ < MAX_WIDTH) out[k] = this.value(v, depth + 1);
    }
    return out;
  }

  #array(schema: Record<string, unknown>, depth: number): unknown[] {
    const min = typeof schema.minItems === 'number' && schema.minItems > 0 ? Math.min(Math.ceil(schema.minItems), MAX_WIDTH) : 1;
    const max = typeof schema.maxItems === 'number' && schema.maxItems >= 0 ? Math.min(Math.floor(schema.maxItems), MAX_WIDTH) : min + 1;
    const n = max <= min ? max : min + (this.#next() % (max - min + 1));
    const out: unknown[] = [];
    for (let i = 0; i < n; i++) out.push(this.value(schema.items ?? { type: 'string' }, depth + 1));
    return out;
  }

  #number(schema: Record<string, unknown>, integer: boolean): number {
    const lo = typeof schema.minimum === 'number' ? schema.minimum : typeof schema.exclusiveMinimum === 'number' ? schema.exclusiveMinimum + 1 : 0;
    let hi = typeof schema.maximum === 'number' ? schema.maximum : typeof schema.exclusiveMaximum === 'number' ? schema.exclusiveMaximum - 1 : lo + 100;
    if (hi < lo) hi = lo;
    const span = hi - lo;
    if (integer) {
      const a = Math.ceil(lo);
      const b = Math.floor(hi);
      return b < a ? a : a + (this.#next() % (b - a + 1));
    }
    return lo + (span * (this.#next() % 1000)) / 1000;
  }

  #string(schema: Record<string, unknown>): string {
    const min = typeof schema.minLength === 'number' ? Math.min(schema.minLength, 4096) : 0;
    const max = typeof schema.maxLength === 'number' ? schema.maxLength : Infinity;
    let s = word(this.#next(), 0).slice(1) + word(this.#next(), 1);
    while (s.length < min) s += word(this.#next(), 2);
    if (s.length > max) s = s.slice(0, Math.max(0, max));
    return s;
  }
}
