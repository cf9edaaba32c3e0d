// Worker-thread side of parsing a large POST /v1/responses body (the same
// piscina mechanism and threshold as the director's chat bodies,
// director.parseOffloadBytes): the same checks and rendering as on the event
// loop, off it. Returns the parsed turn, or the error answer's fields.
import { parseTurnRequest, ResponsesError, type TurnRequest } from './request.js';

export interface TurnParseTask {
  raw: Uint8Array;
  maxDepth: number;
}

export type TurnParseReply = { ok: true; req: TurnRequest } | { ok: false; status: number; message: string; param: string | null; code: string | undefined };

export default function parse(task: TurnParseTask): TurnParseReply {
  const raw = Buffer.from(task.raw.buffer, task.raw.byteOffset, task.raw.byteLength);
  try {
    return { ok: true, req: parseTurnRequest(raw, task.maxDepth) };
  } catch (err) {
    if (err instanceof ResponsesError) return { ok: false, status: err.status, message: err.message, param: err.param, code: err.code };
    throw err;
  }
}
