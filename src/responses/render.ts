// The Responses API's output shapes: the Response object and the streamed
// events (`event: <type>\ndata: <json>\n\n`, each with its sequence_number),
// built from what a turn knows. Field names and order follow OpenAI's API.
import type { TurnRequest } from './request.js';

export interface Usage {
  inputTokens: number;
  outputTokens: number;
  cachedTokens: number;
  reasoningTokens: number;
}

export type ResponseStatus = 'in_progress' | 'completed' | 'incomplete' | 'failed';

/** The fixed part of one turn's Response object. */
export interface ResponseHead {
  readonly id: string;
  readonly createdAt: number;
  readonly req: TurnRequest;
  /** False when `store: true` was asked but the turn could not be kept (over the tenant's byte budget): the object says store: false. */
  readonly stored: boolean;
}

/** The engine's usage object (chat completions) as Responses usage; null when absent. */
export function usageOf(u: unknown): Usage | null {
  if (typeof u !== 'object' || u === null) return null;
  const o = u as {
    prompt_tokens?: unknown;
    completion_tokens?: unknown;
    prompt_tokens_details?: { cached_tokens?: unknown } | null;
    completion_tokens_details?: { reasoning_tokens?: unknown } | null;
  };
  const details = o.prompt_tokens_details;
  const out = o.completion_tokens_details;
  return {
    inputTokens: typeof o.prompt_tokens === 'number' ? o.prompt_tokens : 0,
    outputTokens: typeof o.completion_tokens === 'number' ? o.completion_tokens : 0,
    cachedTokens: details && typeof details.cached_tokens === 'number' ? details.cached_tokens : 0,
    reasoningTokens: out && typeof out.reasoning_tokens === 'number' ? out.reasoning_tokens : 0,
  };
}

/**
 * Responses usage. `cache_write_tokens`: the prompt tokens the engine
 * computed rather than read from its prefix cache, which its automatic prefix
 * caching writes there.
 */
function usageObject(u: Usage) {
  return {
    input_tokens: u.inputTokens,
    input_tokens_details: { cached_tokens: u.cachedTokens, cache_write_tokens: Math.max(0, u.inputTokens - u.cachedTokens) },
    output_tokens: u.outputTokens,
    output_tokens_details: { reasoning_tokens: u.reasoningTokens },
    total_tokens: u.inputTokens + u.outputTokens,
  };
}

export function outputText(text: string, logprobs: unknown[] = []) {
  return { type: 'output_text', text, annotations: [], logprobs };
}

export type ItemStatus = 'in_progress' | 'completed' | 'incomplete';

export function messageItem(msgId: string, status: ItemStatus, text: string | null, logprobs: unknown[] = []) {
  return { id: msgId, type: 'message', status, role: 'assistant', content: text === null ? [] : [outputText(text, logprobs)] };
}

export function reasoningItem(id: string, status: ItemStatus, text: string | null) {
  return { id, type: 'reasoning', summary: [], content: text === null ? [] : [{ type: 'reasoning_text', text }], status };
}

export function functionCallItem(id: string, status: ItemStatus, callId: string, name: string, args: string) {
  return { id, type: 'function_call', status, arguments: args, call_id: callId, name };
}

export type ResponseError = { code: string; message: string } | null;

/**
 * The Response object. Fields OpenAI types as optional and not nullable
 * (usage, user, safety_identifier, prompt_cache_key) are left out when unset;
 * the nullable ones are null.
 */
export function responseObject(h: ResponseHead, status: ResponseStatus, output: unknown[], usage: Usage | null, error: ResponseError, incomplete: string | null = null): Record<string, unknown> {
  const r = h.req;
  const o: Record<string, unknown> = {
    id: h.id,
    object: 'response',
    created_at: h.createdAt,
    status,
    background: false,
    error,
    incomplete_details: status === 'incomplete' ? { reason: incomplete ?? 'max_output_tokens' } : null,
    instructions: r.instructions,
    max_output_tokens: r.maxOutputTokens,
    max_tool_calls: r.maxToolCalls,
    model: r.model,
    output,
    parallel_tool_calls: r.parallelToolCalls,
    previous_response_id: r.previousResponseId,
    prompt_cache_retention: r.promptCacheRetention,
    reasoning: r.reasoning,
    service_tier: 'default',
    store: h.stored,
    temperature: r.temperature ?? 1,
    text: r.text,
    tool_choice: r.toolChoice,
    tools: r.tools,
    top_logprobs: r.topLogprobs,
    top_p: r.topP ?? 1,
    truncation: r.truncation,
    metadata: r.metadata,
  };
  if (r.promptCacheKey !== null) o.prompt_cache_key = r.promptCacheKey;
  if (r.safetyIdentifier !== null) o.safety_identifier = r.safetyIdentifier;
  if (usage !== null) o.usage = usageObject(usage);
  if (r.user !== null) o.user = r.user;
  return o;
}

/** One SSE event. */
export function sseEvent(type: string, seq: number, fields: Record<string, unknown>): string {
  return `event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: seq, ...fields })}\n\n`;
}

/** A text delta event, built without an intermediate object (one per engine token). */
export function deltaEvent(seq: number, msgId: string, delta: string): string {
  return `event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":${seq},"item_id":"${msgId}","output_index":0,"content_index":0,"delta":${JSON.stringify(delta)},"logprobs":[]}\n\n`;
}

/** A streamed delta event (text, reasoning text or function-call arguments), built without an intermediate object. */
export function deltaOf(type: string, seq: number, itemId: string, outputIndex: number, delta: string, contentIndex: boolean, logprobs: string | null): string {
  const ci = contentIndex ? ',"content_index":0' : '';
  const lp = logprobs === null ? '' : `,"logprobs":${logprobs}`;
  return `event: ${type}\ndata: {"type":"${type}","sequence_number":${seq},"item_id":"${itemId}","output_index":${outputIndex}${ci},"delta":${JSON.stringify(delta)}${lp}}\n\n`;
}
