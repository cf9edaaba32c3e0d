// The Responses API's output shapes: the Response object and the streamed
// events (`event: <type>\ndata: <json>\n\n`, each with its sequence_number),
// built from what a turn knows. Field names and order follow OpenAI's API.
import type { TurnRequest } from './request.js';

export interface Usage {
  inputTokens: number;
  outputTokens: number;
  cachedTokens: number;
}

export type ResponseStatus = 'in_progress' | 'completed' | 'incomplete' | 'failed';

/** The fixed part of one turn's Response object. */
export interface ResponseHead {
  readonly id: string;
  readonly createdAt: number;
  readonly req: TurnRequest;
  readonly msgId: string;
  /** False when `store: true` was asked but the turn could not be kept (over the tenant's byte budget): the object says store: false. */
  readonly stored: boolean;
}

/** The engine's usage object (chat completions) as Responses usage; null when absent. */
export function usageOf(u: unknown): Usage | null {
  if (typeof u !== 'object' || u === null) return null;
  const o = u as { prompt_tokens?: unknown; completion_tokens?: unknown; prompt_tokens_details?: { cached_tokens?: unknown } | null };
  const details = o.prompt_tokens_details;
  return {
    inputTokens: typeof o.prompt_tokens === 'number' ? o.prompt_tokens : 0,
    outputTokens: typeof o.completion_tokens === 'number' ? o.completion_tokens : 0,
    cachedTokens: details && typeof details.cached_tokens === 'number' ? details.cached_tokens : 0,
  };
}

function usageObject(u: Usage | null) {
  if (u === null) return null;
  return {
    input_tokens: u.inputTokens,
    input_tokens_details: { cached_tokens: u.cachedTokens },
    output_tokens: u.outputTokens,
    output_tokens_details: { reasoning_tokens: 0 },
    total_tokens: u.inputTokens + u.outputTokens,
  };
}

export function outputText(text: string) {
  return { type: 'output_text', text, annotations: [], logprobs: [] };
}

export function messageItem(msgId: string, status: 'in_progress' | 'completed' | 'incomplete', text: string | null) {
  return { id: msgId, type: 'message', status, role: 'assistant', content: text === null ? [] : [outputText(text)] };
}

/** The Response object. `text` null: no output yet (or none, when failed). */
export function responseObject(
  h: ResponseHead,
  status: ResponseStatus,
  text: string | null,
  usage: Usage | null,
  error: { code: string; message: string } | null,
): Record<string, unknown> {
  const r = h.req;
  return {
    id: h.id,
    object: 'response',
    created_at: h.createdAt,
    status,
    background: false,
    error,
    incomplete_details: status === 'incomplete' ? { reason: 'max_output_tokens' } : null,
    instructions: r.instructions,
    max_output_tokens: r.maxOutputTokens,
    model: r.model,
    output: text === null ? [] : [messageItem(h.msgId, status === 'incomplete' ? 'incomplete' : 'completed', text)],
    parallel_tool_calls: true,
    previous_response_id: r.previousResponseId,
    reasoning: { effort: null, summary: null },
    store: h.stored,
    temperature: r.temperature ?? 1,
    text: { format: { type: 'text' } },
    tool_choice: 'auto',
    tools: [],
    top_p: r.topP ?? 1,
    truncation: 'disabled',
    usage: usageObject(usage),
    user: r.user,
    metadata: r.metadata,
  };
}

/** One SSE event. */
export function sseEvent(type: string, seq: number, fields: Record<string, unknown>): string {
  return `event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: seq, ...fields })}\n\n`;
}

/** A text delta event, built without an intermediate object (one per engine token). */
export function deltaEvent(seq: number, msgId: string, delta: string): string {
  return `event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":${seq},"item_id":"${msgId}","output_index":0,"content_index":0,"delta":${JSON.stringify(delta)},"logprobs":[]}\n\n`;
}

/** The assistant message of a turn as a chat message (what the next turn sends back to the engine). */
export function assistantMessage(text: string): string {
  return `{"role":"assistant","content":${JSON.stringify(text)}}`;
}

/** An input item as OpenAI lists it (input_items), from a stored chat message. */
export function inputItem(id: string, m: { role?: unknown; content?: unknown }) {
  const role = typeof m.role === 'string' ? m.role : 'user';
  const text = typeof m.content === 'string' ? m.content : '';
  return {
    id,
    type: 'message',
    status: 'completed',
    role,
    content: role === 'assistant' ? [{ type: 'output_text', text, annotations: [] }] : [{ type: 'input_text', text }],
  };
}
