// OpenAI's object shapes, field by field, as the published API reference
// describes them (the Responses, Files, Batches and error sections, late
// 2026): each field's type, whether it is required, whether it may be null,
// and — for the optional ones that may not be null — that an unset value is
// left out rather than sent as null. Written for Switchyard's conformance
// tests (test/responses/conformance.test.ts, test/batch/conformance.test.ts);
// no schema file is copied in. A field the reference does not list is an
// error too: an object carries what the reference says, nothing else.
//
//   check(RESPONSE, value) → [] or the list of what is wrong, each with its path.

export type Shape =
  | { k: 'string' | 'number' | 'integer' | 'boolean' | 'any' }
  | { k: 'lit'; v: readonly (string | number | boolean)[] }
  | { k: 'array'; of: Shape }
  | { k: 'map'; of: Shape }
  | { k: 'object'; f: Record<string, Field> }
  | { k: 'union'; of: readonly Shape[]; tag?: string };

/** A field: its shape, and whether it must be present and may be null. */
export interface Field {
  s: Shape;
  /** Must be present. */
  req: boolean;
  /** May be null. */
  nul: boolean;
}

export const str: Shape = { k: 'string' };
export const num: Shape = { k: 'number' };
export const int: Shape = { k: 'integer' };
export const bool: Shape = { k: 'boolean' };
export const any: Shape = { k: 'any' };
export const lit = (...v: (string | number | boolean)[]): Shape => ({ k: 'lit', v });
export const arr = (of: Shape): Shape => ({ k: 'array', of });
export const map = (of: Shape): Shape => ({ k: 'map', of });
export const obj = (f: Record<string, Field>): Shape => ({ k: 'object', f });
/** A union of object shapes told apart by the `tag` field (usually `type`). */
export const tagged = (tag: string, ...of: Shape[]): Shape => ({ k: 'union', of, tag });
export const oneOf = (...of: Shape[]): Shape => ({ k: 'union', of });

/** Required, not nullable. */
export const R = (s: Shape): Field => ({ s, req: true, nul: false });
/** Required, nullable. */
export const RN = (s: Shape): Field => ({ s, req: true, nul: true });
/** Optional, not nullable: left out when unset, never null. */
export const O = (s: Shape): Field => ({ s, req: false, nul: false });
/** Optional, nullable. */
export const ON = (s: Shape): Field => ({ s, req: false, nul: true });

function typeOf(v: unknown): string {
  return v === null ? 'null' : Array.isArray(v) ? 'array' : typeof v;
}

/** What is wrong with `v` as `s` (empty: it conforms). */
export function check(s: Shape, v: unknown, path = '$'): string[] {
  const out: string[] = [];
  walk(s, v, path, out);
  return out;
}

function walk(s: Shape, v: unknown, path: string, out: string[]): void {
  switch (s.k) {
    case 'any':
      return;
    case 'string':
    case 'boolean':
      if (typeof v !== s.k) out.push(`${path}: ${s.k} expected, got ${typeOf(v)}`);
      return;
    case 'number':
      if (typeof v !== 'number' || !Number.isFinite(v)) out.push(`${path}: number expected, got ${typeOf(v)}`);
      return;
    case 'integer':
      if (typeof v !== 'number' || !Number.isInteger(v)) out.push(`${path}: integer expected, got ${JSON.stringify(v)}`);
      return;
    case 'lit':
      if (!s.v.includes(v as string)) out.push(`${path}: one of ${s.v.map((x) => JSON.stringify(x)).join(', ')} expected, got ${JSON.stringify(v)}`);
      return;
    case 'array':
      if (!Array.isArray(v)) out.push(`${path}: array expected, got ${typeOf(v)}`);
      else v.forEach((x, i) => walk(s.of, x, `${path}[${i}]`, out));
      return;
    case 'map':
      if (typeOf(v) !== 'object') out.push(`${path}: object expected, got ${typeOf(v)}`);
      else for (const k in v as object) walk(s.of, (v as Record<string, unknown>)[k], `${path}.${k}`, out);
      return;
    case 'object': {
      if (typeOf(v) !== 'object') {
        out.push(`${path}: object expected, got ${typeOf(v)}`);
        return;
      }
      const o = v as Record<string, unknown>;
      for (const name in s.f) {
        const f = s.f[name]!;
        const p = `${path}.${name}`;
        if (!(name in o)) {
          if (f.req) out.push(`${p}: required field missing`);
          continue;
        }
        const x = o[name];
        if (x === null) {
          if (!f.nul) out.push(f.req ? `${p}: must not be null` : `${p}: must be left out when unset, not null`);
          continue;
        }
        walk(f.s, x, p, out);
      }
      for (const name in o) if (!(name in s.f)) out.push(`${path}.${name}: not a field of this object`);
      return;
    }
    case 'union': {
      if (s.tag !== undefined && typeOf(v) === 'object') {
        const t = (v as Record<string, unknown>)[s.tag];
        const hit = s.of.find((x) => x.k === 'object' && x.f[s.tag!]?.s.k === 'lit' && (x.f[s.tag!]!.s as unknown as { v: unknown[] }).v.includes(t));
        if (hit === undefined) out.push(`${path}.${s.tag}: ${JSON.stringify(t)} is none of the variants`);
        else walk(hit, v, path, out);
        return;
      }
      let best: string[] | null = null;
      for (const alt of s.of) {
        const e: string[] = [];
        walk(alt, v, path, e);
        if (e.length === 0) return;
        if (best === null || e.length < best.length) best = e;
      }
      out.push(...(best ?? [`${path}: no variant`]));
      return;
    }
  }
}

// ---- errors ------------------------------------------------------------------------------

/** The error object: `code` a string or null (never the HTTP status), `param` a string or null. */
export const ERROR_OBJECT = obj({ message: R(str), type: R(str), param: RN(str), code: RN(str) });
/** An error answer's body. */
export const ERROR_BODY = obj({ error: R(ERROR_OBJECT) });
/** OpenAI's `type` values. */
export const ERROR_TYPES = ['invalid_request_error', 'authentication_error', 'permission_error', 'not_found_error', 'requests', 'tokens', 'rate_limit_exceeded', 'insufficient_quota', 'server_error'];

// ---- the Response object -----------------------------------------------------------------

const LOGPROB_TOP = obj({ token: R(str), bytes: R(arr(int)), logprob: R(num) });
const LOGPROB = obj({ token: R(str), bytes: R(arr(int)), logprob: R(num), top_logprobs: R(arr(LOGPROB_TOP)) });
export const OUTPUT_TEXT = obj({ type: R(lit('output_text')), text: R(str), annotations: R(arr(any)), logprobs: O(arr(LOGPROB)) });
const REFUSAL = obj({ type: R(lit('refusal')), refusal: R(str) });
const ITEM_STATUS = lit('in_progress', 'completed', 'incomplete');

export const OUTPUT_MESSAGE = obj({
  id: R(str),
  type: R(lit('message')),
  role: R(lit('assistant')),
  status: R(ITEM_STATUS),
  content: R(arr(tagged('type', OUTPUT_TEXT, REFUSAL))),
});
export const FUNCTION_CALL = obj({
  id: O(str),
  type: R(lit('function_call')),
  call_id: R(str),
  name: R(str),
  arguments: R(str),
  status: O(ITEM_STATUS),
});
export const REASONING_TEXT = obj({ type: R(lit('reasoning_text')), text: R(str) });
export const REASONING = obj({
  id: R(str),
  type: R(lit('reasoning')),
  summary: R(arr(obj({ type: R(lit('summary_text')), text: R(str) }))),
  content: O(arr(REASONING_TEXT)),
  encrypted_content: ON(str),
  status: O(ITEM_STATUS),
});
export const OUTPUT_ITEM = tagged('type', OUTPUT_MESSAGE, FUNCTION_CALL, REASONING);

const FUNCTION_TOOL = obj({ type: R(lit('function')), name: R(str), description: ON(str), parameters: RN(map(any)), strict: RN(bool) });
const TOOL_CHOICE = oneOf(
  lit('none', 'auto', 'required'),
  obj({ type: R(lit('function')), name: R(str) }),
  obj({ type: R(lit('allowed_tools')), mode: R(lit('auto', 'required')), tools: R(arr(map(any))) }),
);
const TEXT_FORMAT = tagged(
  'type',
  obj({ type: R(lit('text')) }),
  obj({ type: R(lit('json_object')) }),
  obj({ type: R(lit('json_schema')), name: R(str), schema: R(map(any)), description: O(str), strict: ON(bool) }),
);
export const USAGE = obj({
  input_tokens: R(int),
  input_tokens_details: R(obj({ cached_tokens: R(int), cache_write_tokens: O(int) })),
  output_tokens: R(int),
  output_tokens_details: R(obj({ reasoning_tokens: R(int) })),
  total_tokens: R(int),
});

/** An input message as input_items lists it. */
const INPUT_MESSAGE = obj({
  id: R(str),
  type: R(lit('message')),
  role: R(lit('user', 'system', 'developer')),
  status: O(ITEM_STATUS),
  content: R(arr(tagged('type', obj({ type: R(lit('input_text')), text: R(str) })))),
});
const FUNCTION_CALL_OUTPUT = obj({ id: R(str), type: R(lit('function_call_output')), call_id: R(str), output: R(oneOf(str, arr(map(any)))), status: O(ITEM_STATUS) });
/** An item of GET /v1/responses/{id}/input_items. */
export const INPUT_ITEM = oneOf(INPUT_MESSAGE, OUTPUT_MESSAGE, FUNCTION_CALL, FUNCTION_CALL_OUTPUT, REASONING);

export const RESPONSE = obj({
  id: R(str),
  object: R(lit('response')),
  created_at: R(num),
  status: O(lit('completed', 'failed', 'in_progress', 'cancelled', 'queued', 'incomplete')),
  background: ON(bool),
  conversation: ON(obj({ id: R(str) })),
  error: RN(obj({ code: R(str), message: R(str) })),
  incomplete_details: RN(obj({ reason: O(lit('max_output_tokens', 'content_filter')) })),
  instructions: RN(oneOf(str, arr(map(any)))),
  max_output_tokens: ON(int),
  max_tool_calls: ON(int),
  metadata: RN(map(str)),
  model: R(str),
  output: R(arr(OUTPUT_ITEM)),
  parallel_tool_calls: R(bool),
  previous_response_id: ON(str),
  prompt: ON(map(any)),
  prompt_cache_key: O(str),
  prompt_cache_retention: ON(lit('in-memory', '24h')),
  reasoning: ON(obj({ effort: ON(lit('none', 'minimal', 'low', 'medium', 'high', 'xhigh')), summary: ON(lit('auto', 'concise', 'detailed')), generate_summary: ON(str) })),
  safety_identifier: O(str),
  service_tier: ON(lit('auto', 'default', 'flex', 'scale', 'priority')),
  store: O(bool),
  temperature: RN(num),
  text: O(obj({ format: O(TEXT_FORMAT), verbosity: ON(lit('low', 'medium', 'high')) })),
  tool_choice: R(TOOL_CHOICE),
  tools: R(arr(FUNCTION_TOOL)),
  top_logprobs: ON(int),
  top_p: RN(num),
  truncation: ON(lit('auto', 'disabled')),
  usage: O(USAGE),
  user: O(str),
});

export const RESPONSE_DELETED = obj({ id: R(str), object: R(lit('response.deleted')), deleted: R(bool) });
export const list = (item: Shape) => obj({ object: R(lit('list')), data: R(arr(item)), first_id: RN(str), last_id: RN(str), has_more: R(bool) });

// ---- stream events -----------------------------------------------------------------------

const seq = R(int);
const at = { item_id: R(str), output_index: R(int) };
const part = { ...at, content_index: R(int) };
const ev = (type: string, f: Record<string, Field>) => obj({ type: R(lit(type)), sequence_number: seq, ...f });

export const STREAM_EVENT = tagged(
  'type',
  ev('response.created', { response: R(RESPONSE) }),
  ev('response.in_progress', { response: R(RESPONSE) }),
  ev('response.completed', { response: R(RESPONSE) }),
  ev('response.incomplete', { response: R(RESPONSE) }),
  ev('response.failed', { response: R(RESPONSE) }),
  ev('response.output_item.added', { output_index: R(int), item: R(OUTPUT_ITEM) }),
  ev('response.output_item.done', { output_index: R(int), item: R(OUTPUT_ITEM) }),
  ev('response.content_part.added', { ...part, part: R(tagged('type', OUTPUT_TEXT, REFUSAL, REASONING_TEXT)) }),
  ev('response.content_part.done', { ...part, part: R(tagged('type', OUTPUT_TEXT, REFUSAL, REASONING_TEXT)) }),
  ev('response.output_text.delta', { ...part, delta: R(str), logprobs: R(arr(LOGPROB)) }),
  ev('response.output_text.done', { ...part, text: R(str), logprobs: R(arr(LOGPROB)) }),
  ev('response.reasoning_text.delta', { ...part, delta: R(str) }),
  ev('response.reasoning_text.done', { ...part, text: R(str) }),
  ev('response.function_call_arguments.delta', { ...at, delta: R(str) }),
  ev('response.function_call_arguments.done', { ...at, arguments: R(str), name: O(str) }),
  ev('error', { code: RN(str), message: R(str), param: RN(str) }),
);

/**
 * The order rules of a Responses event stream: created, in_progress first;
 * one terminal event (completed, incomplete, failed) last; sequence numbers
 * 0..n-1; each output item added before its deltas and done after them, one
 * item open at a time, output indexes 0, 1, 2, ... in order; the terminal
 * response's output equals the items as done (for completed/incomplete).
 */
export function checkStreamOrder(events: Record<string, any>[]): string[] {
  const out: string[] = [];
  events.forEach((e, i) => {
    if (e.sequence_number !== i) out.push(`event ${i} (${e.type}): sequence_number ${e.sequence_number}, expected ${i}`);
  });
  if (events[0]?.type !== 'response.created') out.push(`first event ${events[0]?.type}, expected response.created`);
  if (events[1]?.type !== 'response.in_progress') out.push(`second event ${events[1]?.type}, expected response.in_progress`);
  const last = events[events.length - 1];
  const terminal = ['response.completed', 'response.incomplete', 'response.failed'];
  if (!terminal.includes(last?.type)) out.push(`last event ${last?.type}, expected a terminal event`);
  let open: { index: number; id: string; type: string } | null = null;
  const done: Record<string, any>[] = [];
  let next = 0;
  for (let i = 2; i < events.length - 1; i++) {
    const e = events[i]!;
    const where = `event ${i} (${e.type})`;
    if (terminal.includes(e.type) || e.type === 'response.created' || e.type === 'response.in_progress') {
      out.push(`${where}: only once, at its place`);
      continue;
    }
    if (e.type === 'error') {
      if (events[i + 1]?.type !== 'response.failed') out.push(`${where}: an error event is followed by response.failed`);
      continue;
    }
    if (e.type === 'response.output_item.added') {
      if (open !== null) out.push(`${where}: item ${open.index} is still open`);
      if (e.output_index !== next) out.push(`${where}: output_index ${e.output_index}, expected ${next}`);
      open = { index: e.output_index, id: e.item?.id, type: e.item?.type };
      if (e.item?.type === 'function_call' && e.item.arguments !== '') out.push(`${where}: a function_call is added with arguments ""`);
      continue;
    }
    if (open === null) {
      out.push(`${where}: no item is open`);
      continue;
    }
    if (e.type === 'response.output_item.done') {
      if (e.output_index !== open.index || e.item?.id !== open.id) out.push(`${where}: closes item ${e.output_index}, open is ${open.index}`);
      done.push(e.item);
      open = null;
      next++;
      continue;
    }
    if (e.item_id !== open.id || e.output_index !== open.index) out.push(`${where}: for item ${e.item_id}@${e.output_index}, open is ${open.id}@${open.index}`);
    const fc = e.type.startsWith('response.function_call_arguments.');
    if (fc !== (open.type === 'function_call')) out.push(`${where}: does not belong to a ${open.type} item`);
  }
  if (last !== undefined && last.type !== 'response.failed') {
    if (open !== null) out.push(`item ${open.index} never closed`);
    const final = last.response?.output ?? [];
    if (JSON.stringify(final) !== JSON.stringify(done)) out.push('the terminal response.output differs from the items as done');
  }
  return out;
}

// ---- Files and Batches -------------------------------------------------------------------

export const FILE = obj({
  id: R(str),
  object: R(lit('file')),
  bytes: R(int),
  created_at: R(int),
  expires_at: O(int),
  filename: R(str),
  purpose: R(lit('assistants', 'assistants_output', 'batch', 'batch_output', 'fine-tune', 'fine-tune-results', 'vision', 'user_data', 'evals')),
  status: O(lit('uploaded', 'processed', 'error')),
  status_details: O(str),
});
export const FILE_DELETED = obj({ id: R(str), object: R(lit('file')), deleted: R(bool) });

const BATCH_ERRORS = obj({ object: O(lit('list')), data: O(arr(obj({ code: O(str), message: O(str), param: ON(str), line: ON(int) }))) });
export const BATCH = obj({
  id: R(str),
  object: R(lit('batch')),
  endpoint: R(str),
  model: O(str),
  errors: O(BATCH_ERRORS),
  input_file_id: R(str),
  completion_window: R(str),
  status: R(lit('validating', 'failed', 'in_progress', 'finalizing', 'completed', 'expired', 'cancelling', 'cancelled')),
  output_file_id: O(str),
  error_file_id: O(str),
  created_at: R(int),
  in_progress_at: O(int),
  expires_at: O(int),
  finalizing_at: O(int),
  completed_at: O(int),
  failed_at: O(int),
  expired_at: O(int),
  cancelling_at: O(int),
  cancelled_at: O(int),
  request_counts: O(obj({ total: R(int), completed: R(int), failed: R(int) })),
  usage: O(map(any)),
  metadata: ON(map(str)),
});
/** A line of a batch's output or error file. */
export const BATCH_LINE = obj({
  id: R(str),
  custom_id: R(str),
  response: RN(obj({ status_code: R(int), request_id: R(str), body: R(any) })),
  error: RN(obj({ code: R(str), message: R(str) })),
});
