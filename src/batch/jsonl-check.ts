// The batch JSONL work that would hold the event loop, in one worker thread
// (jsonl-worker.ts): the upload's check, a batch's validation at the start of
// its run and the line-building of its output and error files. Inputs up to
// INLINE_BYTES are handled in place (faster than a hand-off); larger ones go
// to the worker, their memory transferred there and back when the caller owns
// it (copied once when it does not), so a 64 MiB file costs the loop two
// hand-offs, not a parse of every line.
import { Worker } from 'node:worker_threads';
import { batchBodies, buildResultLines, checkJsonl, validateBatchLines, type BatchBodies, type BatchValidation, type ResultLinesJob, type ResultLines } from './jsonl.js';

const INLINE_BYTES = 1024 * 1024;

interface Waiting {
  resolve: (r: Record<string, unknown>) => void;
  reject: (e: Error) => void;
}

let worker: Worker | null = null;
let nextId = 0;
const waiting = new Map<number, Waiting>();

function theWorker(): Worker {
  if (worker !== null) return worker;
  const w = new Worker(new URL('./jsonl-worker.js', import.meta.url));
  w.unref();
  w.on('message', (m: Record<string, unknown> & { id: number }) => {
    const p = waiting.get(m.id);
    waiting.delete(m.id);
    if (waiting.size === 0) w.unref();
    p?.resolve(m);
  });
  const fail = (err: Error) => {
    if (worker === w) worker = null;
    for (const p of waiting.values()) p.reject(err);
    waiting.clear();
  };
  w.on('error', fail);
  w.on('exit', (code) => fail(new Error(`the JSONL worker exited (${code})`)));
  return (worker = w);
}

/** Sends one job to the worker; `transfer`: memory handed over with it. */
function job(msg: Record<string, unknown>, transfer: ArrayBuffer[]): Promise<Record<string, unknown>> {
  const w = theWorker();
  const id = nextId++;
  const answer = new Promise<Record<string, unknown>>((resolve, reject) => waiting.set(id, { resolve, reject }));
  w.ref();
  w.postMessage({ ...msg, id }, transfer);
  return answer;
}

/** `data`'s memory for a hand-off: its own ArrayBuffer when `owned` (it is detached meanwhile), else a copy. */
function handOff(data: Buffer, owned: boolean): { ab: ArrayBuffer; offset: number; length: number } {
  if (owned && data.buffer instanceof ArrayBuffer) return { ab: data.buffer, offset: data.byteOffset, length: data.length };
  const copy = new Uint8Array(data.length);
  copy.set(data);
  return { ab: copy.buffer, offset: 0, length: data.length };
}

/**
 * Why `data` is not JSONL of objects, or null; with `data` itself, or (after
 * a hand-off to the worker) a view of the same bytes in the memory that came
 * back: use the returned buffer, not the one passed in, afterwards. `owned`:
 * the caller owns all of `data`'s ArrayBuffer (it may be detached meanwhile).
 */
export async function checkJsonlOffLoop(data: Buffer, owned: boolean): Promise<{ problem: string | null; data: Buffer }> {
  if (data.length <= INLINE_BYTES || !owned || !(data.buffer instanceof ArrayBuffer)) return { problem: checkJsonl(data), data };
  const { ab, offset, length } = handOff(data, true);
  const r = await job({ kind: 'check', ab, offset, length }, [ab]);
  return { problem: r.problem as string | null, data: Buffer.from(r.ab as ArrayBuffer, offset, length) };
}

/** A batch input file's validation (jsonl.ts validateBatchLines), in the worker when it is large. `data` is not used afterwards. */
export async function validateBatchOffLoop(data: Buffer, endpoint: string, owned: boolean): Promise<BatchValidation> {
  if (data.length <= INLINE_BYTES) return validateBatchLines(data, endpoint);
  const { ab, offset, length } = handOff(data, owned);
  const r = await job({ kind: 'validate', ab, offset, length, endpoint }, [ab]);
  return { total: r.total as number, errors: r.errors as BatchValidation['errors'], ids: Buffer.from(r.ids as ArrayBuffer) };
}

/** Output and error file lines of a run of results (jsonl.ts buildResultLines), in the worker when they are large. */
export async function resultLinesOffLoop(j: ResultLinesJob, bytes: number): Promise<ResultLines> {
  if (bytes <= INLINE_BYTES / 4) return buildResultLines(j);
  const r = await job({ kind: 'lines', job: j }, []);
  return r.lines as ResultLines;
}

/** A validated batch input's bodies (jsonl.ts batchBodies), in the worker when it is large. `data` is not used afterwards. */
export async function batchBodiesOffLoop(data: Buffer, owned: boolean): Promise<BatchBodies> {
  if (data.length <= INLINE_BYTES) return batchBodies(data);
  const { ab, offset, length } = handOff(data, owned);
  const r = await job({ kind: 'bodies', ab, offset, length }, [ab]);
  return { text: Buffer.from(r.text as ArrayBuffer), ends: new Uint32Array(r.ends as ArrayBuffer) };
}
