// The request fields of a Responses turn that become fields of the chat
// completion the engine gets: `tools` (function tools; built-in tool types a
// 400 naming them), `tool_choice` (none, auto, required, a named function,
// allowed_tools), `text.format` (json_object, json_schema → response_format).
// Each is checked and rendered once, as the JSON text the chat body carries,
// beside the value the Response object echoes.
import { ResponsesError } from './request-error.js';

function bad(message: string, param: string): ResponsesError {
  return new ResponsesError(400, message, param);
}

/** Names OpenAI allows for functions and JSON schemas. */
const NAME = /^[A-Za-z0-9_-]{1,64}$/;
/** The most tools a request may declare (as OpenAI's limit). */
export const MAX_TOOLS = 128;
const SCHEMA_TYPES = new Set(['object', 'array', 'string', 'number', 'integer', 'boolean', 'null']);
/** Built-in tool types of OpenAI's API: named in the 400 (the engines run functions only). */
const BUILT_IN = new Set([
  'file_search',
  'web_search',
  'web_search_preview',
  'web_search_preview_2025_03_11',
  'web_search_2025_08_26',
  'computer_use_preview',
  'computer',
  'code_interpreter',
  'image_generation',
  'mcp',
  'local_shell',
  'shell',
  'custom',
  'apply_patch',
]);

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/**
 * A JSON Schema's structure, checked where an engine's guided decoding would
 * trip on it: `type` a schema type (or a list of them), `properties` an object
 * of schemas, `items` a schema, `required` a list of strings, `enum` a list,
 * `anyOf`/`oneOf`/`allOf` lists of schemas, `additionalProperties` a boolean
 * or a schema. Nesting is bounded by the body's depth check.
 */
export function checkSchema(s: unknown, at: string): void {
  if (typeof s === 'boolean') return;
  if (!isObject(s)) throw bad(`'${at}' must be a JSON Schema object`, at);
  const t = s.type;
  if (t !== undefined) {
    const ok = typeof t === 'string' ? SCHEMA_TYPES.has(t) : Array.isArray(t) && t.length > 0 && t.every((x) => typeof x === 'string' && SCHEMA_TYPES.has(x));
    if (!ok) throw bad(`'${at}.type' must be one of ${[...SCHEMA_TYPES].join(', ')} (or a list of them); got ${JSON.stringify(t)}`, `${at}.type`);
  }
  const props = s.properties;
  if (props !== undefined) {
    if (!isObject(props)) throw bad(`'${at}.properties' must be an object of schemas`, `${at}.properties`);
    for (const k in props) checkSchema(props[k], `${at}.properties.${k}`);
  }
  const items = s.items;
  if (items !== undefined) {
    if (Array.isArray(items)) items.forEach((x, i) => checkSchema(x, `${at}.items[${i}]`));
    else checkSchema(items, `${at}.items`);
  }
  const req = s.required;
  if (req !== undefined && !(Array.isArray(req) && req.every((x) => typeof x === 'string'))) throw bad(`'${at}.required' must be a list of property names`, `${at}.required`);
  if (s.enum !== undefined && !Array.isArray(s.enum)) throw bad(`'${at}.enum' must be a list`, `${at}.enum`);
  for (const k of ['anyOf', 'oneOf', 'allOf'] as const) {
    const v = s[k];
    if (v === undefined) continue;
    if (!Array.isArray(v) || v.length === 0) throw bad(`'${at}.${k}' must be a non-empty list of schemas`, `${at}.${k}`);
    v.forEach((x, i) => checkSchema(x, `${at}.${k}[${i}]`));
  }
  const ap = s.additionalProperties;
  if (ap !== undefined && typeof ap !== 'boolean') checkSchema(ap, `${at}.additionalProperties`);
  for (const k of ['$defs', 'definitions'] as const) {
    const d = s[k];
    if (d === undefined) continue;
    if (!isObject(d)) throw bad(`'${at}.${k}' must be an object of schemas`, `${at}.${k}`);
    for (const n in d) checkSchema(d[n], `${at}.${k}.${n}`);
  }
}

export interface Tools {
  /** The tools as the Response object lists them (function tools, normalised). */
  readonly echo: Record<string, unknown>[];
  /** tool_choice as the Response object echoes it. */
  readonly choiceEcho: unknown;
  /** The chat body's `"tools":[...],"tool_choice":...` fields with a leading comma, or ''. */
  readonly chat: string;
  /** Function names declared (for the engine's answer: a call to another name is the engine's error). */
  readonly names: string[];
}

/** `tools` and `tool_choice` of a request body. */
export function parseTools(tools: unknown, choice: unknown): Tools {
  const echo: Record<string, unknown>[] = [];
  const chatTools: unknown[] = [];
  const names: string[] = [];
  if (tools !== undefined && tools !== null) {
    if (!Array.isArray(tools)) throw bad("'tools' must be a list of tools", 'tools');
    if (tools.length > MAX_TOOLS) throw bad(`'tools' holds ${tools.length} tools; at most ${MAX_TOOLS} are accepted`, 'tools');
    for (let i = 0; i < tools.length; i++) {
      const t = tools[i];
      const at = `tools[${i}]`;
      if (!isObject(t)) throw bad(`'${at}' must be an object`, at);
      if (t.type !== 'function') {
        if (typeof t.type === 'string' && BUILT_IN.has(t.type)) {
          throw bad(`'${at}.type' ${JSON.stringify(t.type)}: built-in tools are not supported by this router (the engines run function tools only)`, `${at}.type`);
        }
        throw bad(`'${at}.type' must be "function" (got ${JSON.stringify(t.type)})`, `${at}.type`);
      }
      if (typeof t.name !== 'string' || !NAME.test(t.name)) throw bad(`'${at}.name' must be 1-64 letters, digits, '_' or '-'`, `${at}.name`);
      if (names.includes(t.name)) throw bad(`'${at}.name' ${JSON.stringify(t.name)} is declared twice`, `${at}.name`);
      const desc = t.description;
      if (desc !== undefined && desc !== null && typeof desc !== 'string') throw bad(`'${at}.description' must be a string`, `${at}.description`);
      const params = t.parameters;
      if (params !== undefined && params !== null) {
        checkSchema(params, `${at}.parameters`);
        if (!isObject(params) || (params.type !== undefined && params.type !== 'object')) throw bad(`'${at}.parameters' must be a JSON Schema of type "object"`, `${at}.parameters`);
      }
      const strict = t.strict;
      if (strict !== undefined && strict !== null && typeof strict !== 'boolean') throw bad(`'${at}.strict' must be a boolean`, `${at}.strict`);
      for (const k in t) {
        if (k !== 'type' && k !== 'name' && k !== 'description' && k !== 'parameters' && k !== 'strict') throw bad(`Unknown parameter: '${at}.${k}'.`, `${at}.${k}`);
      }
      names.push(t.name);
      const fn: Record<string, unknown> = { name: t.name };
      if (typeof desc === 'string') fn.description = desc;
      fn.parameters = params ?? { type: 'object', properties: {} };
      if (typeof strict === 'boolean') fn.strict = strict;
      chatTools.push({ type: 'function', function: fn });
      echo.push({ type: 'function', name: t.name, description: typeof desc === 'string' ? desc : null, parameters: params ?? null, strict: typeof strict === 'boolean' ? strict : null });
    }
  }
  // tool_choice
  let choiceEcho: unknown = 'auto';
  let chatChoice: unknown = undefined;
  let sent = chatTools;
  if (choice !== undefined && choice !== null) {
    if (choice === 'none' || choice === 'auto' || choice === 'required') {
      if (choice === 'required' && names.length === 0) throw bad("tool_choice \"required\" needs at least one function in 'tools'", 'tool_choice');
      choiceEcho = choice;
      if (names.length > 0) chatChoice = choice;
    } else if (isObject(choice)) {
      if (choice.type === 'function') {
        if (typeof choice.name !== 'string') throw bad("'tool_choice.name' must name a function", 'tool_choice.name');
        if (!names.includes(choice.name)) throw bad(`'tool_choice.name': no function ${JSON.stringify(choice.name)} in 'tools'`, 'tool_choice.name');
        choiceEcho = { type: 'function', name: choice.name };
        chatChoice = { type: 'function', function: { name: choice.name } };
      } else if (choice.type === 'allowed_tools') {
        const mode = choice.mode;
        if (mode !== 'auto' && mode !== 'required') throw bad("'tool_choice.mode' must be \"auto\" or \"required\"", 'tool_choice.mode');
        const list = choice.tools;
        if (!Array.isArray(list) || list.length === 0) throw bad("'tool_choice.tools' must be a non-empty list of {type: \"function\", name}", 'tool_choice.tools');
        const allowed = new Set<string>();
        list.forEach((x, i) => {
          const at = `tool_choice.tools[${i}]`;
          if (!isObject(x) || x.type !== 'function' || typeof x.name !== 'string') throw bad(`'${at}' must be {type: "function", name}`, at);
          if (!names.includes(x.name)) throw bad(`'${at}.name': no function ${JSON.stringify(x.name)} in 'tools'`, `${at}.name`);
          allowed.add(x.name);
        });
        sent = chatTools.filter((t) => allowed.has(((t as { function: { name: string } }).function.name)));
        choiceEcho = { type: 'allowed_tools', mode, tools: list.map((x) => ({ type: 'function', name: (x as { name: string }).name })) };
        chatChoice = mode;
      } else {
        throw bad(`'tool_choice.type' ${JSON.stringify(choice.type)} is not supported by this router (function tools only: "function" or "allowed_tools")`, 'tool_choice.type');
      }
    } else {
      throw bad("'tool_choice' must be \"none\", \"auto\", \"required\", {type: \"function\", name} or {type: \"allowed_tools\", ...}", 'tool_choice');
    }
  }
  let chat = '';
  if (sent.length > 0) {
    chat = `,"tools":${JSON.stringify(sent)}`;
    if (chatChoice !== undefined) chat += `,"tool_choice":${JSON.stringify(chatChoice)}`;
  }
  return { echo, choiceEcho, chat, names };
}

export interface TextConfig {
  /** `text` as the Response object echoes it. */
  readonly echo: Record<string, unknown>;
  /** The chat body's `,"response_format":{...}` or ''. */
  readonly chat: string;
}

/** `text`: its format (text, json_object, json_schema) and verbosity. */
export function parseText(text: unknown): TextConfig {
  if (text === undefined || text === null) return { echo: { format: { type: 'text' }, verbosity: 'medium' }, chat: '' };
  if (!isObject(text)) throw bad("'text' must be an object ({format, verbosity})", 'text');
  for (const k in text) if (k !== 'format' && k !== 'verbosity') throw bad(`Unknown parameter: 'text.${k}'.`, `text.${k}`);
  const v = text.verbosity;
  if (v !== undefined && v !== null && v !== 'medium') {
    if (v === 'low' || v === 'high') throw bad("'text.verbosity' other than \"medium\" is not supported: the engines have no verbosity control", 'text.verbosity');
    throw bad("'text.verbosity' must be \"low\", \"medium\" or \"high\"", 'text.verbosity');
  }
  const f = text.format;
  if (f === undefined || f === null) return { echo: { format: { type: 'text' }, verbosity: 'medium' }, chat: '' };
  if (!isObject(f)) throw bad("'text.format' must be an object", 'text.format');
  switch (f.type) {
    case 'text':
      return { echo: { format: { type: 'text' }, verbosity: 'medium' }, chat: '' };
    case 'json_object':
      return { echo: { format: { type: 'json_object' }, verbosity: 'medium' }, chat: ',"response_format":{"type":"json_object"}' };
    case 'json_schema': {
      if (typeof f.name !== 'string' || !NAME.test(f.name)) throw bad("'text.format.name' must be 1-64 letters, digits, '_' or '-'", 'text.format.name');
      if (!isObject(f.schema)) throw bad("'text.format.schema' must be a JSON Schema object", 'text.format.schema');
      checkSchema(f.schema, 'text.format.schema');
      if (f.description !== undefined && f.description !== null && typeof f.description !== 'string') throw bad("'text.format.description' must be a string", 'text.format.description');
      if (f.strict !== undefined && f.strict !== null && typeof f.strict !== 'boolean') throw bad("'text.format.strict' must be a boolean", 'text.format.strict');
      const js: Record<string, unknown> = { name: f.name, schema: f.schema };
      const echo: Record<string, unknown> = { type: 'json_schema', name: f.name, schema: f.schema };
      if (typeof f.description === 'string') js.description = echo.description = f.description;
      if (typeof f.strict === 'boolean') js.strict = echo.strict = f.strict;
      return { echo: { format: echo, verbosity: 'medium' }, chat: `,"response_format":${JSON.stringify({ type: 'json_schema', json_schema: js })}` };
    }
    default:
      throw bad(`'text.format.type' must be "text", "json_object" or "json_schema" (got ${JSON.stringify(f.type)})`, 'text.format.type');
  }
}
