// Worker-thread side of parsing a large request body (see body.ts): the same
// checks and prompt rendering as on the event loop, off it. Returns the
// scalar top-level fields and the rendered prompt bytes (transferred, not
// copied), or the error answer.
import { parseRequestBody, scalarFields } from './body.js';
import { PromptWriter } from './prompt.js';

export interface ParseTask {
  raw: Uint8Array;
  kind: number;
  maxDepth: number;
  /** A rule rewrites requests without a model (modelRewrites' default): `model` may be absent. */
  modelOptional?: boolean;
}

export type ParseReply =
  | { ok: true; model: string; fields: Record<string, unknown>; prompt: Uint8Array }
  | { ok: false; status: number; message: string; param: string | null };

const pw = new PromptWriter();

export default function parse(task: ParseTask): ParseReply {
  const raw = Buffer.from(task.raw.buffer, task.raw.byteOffset, task.raw.byteLength);
  const r = parseRequestBody(raw, task.kind, pw, task.maxDepth, task.modelOptional === true);
  if (!r.ok) return { ok: false, status: r.status, message: r.message, param: r.param };
  // a copy of exactly the prompt's bytes, in its own buffer, so it can be transferred
  const prompt = new Uint8Array(pw.length);
  prompt.set(pw.view());
  return { ok: true, model: r.model, fields: scalarFields(r.body), prompt };
}
