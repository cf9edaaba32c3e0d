// checkJsonl off the event loop: files up to INLINE_BYTES are checked in
// place (faster than a hand-off); larger ones in one worker thread
// (jsonl-worker.ts) that the upload's memory is transferred to and back, so a
// 64 MiB upload costs the loop two hand-offs, not a parse of every line.
import { Worker } from 'node:worker_threads';
import { checkJsonl } from './jsonl.js';

const INLINE_BYTES = 1024 * 1024;

interface Waiting {
  resolve: (r: { problem: string | null; ab: ArrayBuffer }) => void;
  reject: (e: Error) => void;
}

let worker: Worker | null = null;
let nextId = 0;
const waiting = new Map<number, Waiting>();

function theWorker(): Worker {
  if (worker !== null) return worker;
  const w = new Worker(new URL('./jsonl-worker.js', import.meta.url));
  w.unref();
  w.on('message', (m: { id: number; ab: ArrayBuffer; problem: string | null }) => {
    const p = waiting.get(m.id);
    waiting.delete(m.id);
    if (waiting.size === 0) w.unref();
    p?.resolve({ problem: m.problem, ab: m.ab });
  });
  const fail = (err: Error) => {
    if (worker === w) worker = null;
    for (const p of waiting.values()) p.reject(err);
    waiting.clear();
  };
  w.on('error', fail);
  w.on('exit', (code) => fail(new Error(`the JSONL check worker exited (${code})`)));
  return (worker = w);
}

/**
 * Why `data` is not JSONL of objects, or null; with `data` itself, or (after
 * a hand-off to the worker) a view of the same bytes in the memory that came
 * back: use the returned buffer, not the one passed in, afterwards. `owned`:
 * the caller owns all of `data`'s ArrayBuffer (it may be detached meanwhile).
 */
export async function checkJsonlOffLoop(data: Buffer, owned: boolean): Promise<{ problem: string | null; data: Buffer }> {
  if (data.length <= INLINE_BYTES || !owned || !(data.buffer instanceof ArrayBuffer)) return { problem: checkJsonl(data), data };
  const { buffer: ab, byteOffset: offset, length } = data;
  const w = theWorker();
  const id = nextId++;
  const answer = new Promise<{ problem: string | null; ab: ArrayBuffer }>((resolve, reject) => waiting.set(id, { resolve, reject }));
  w.ref();
  w.postMessage({ id, ab, offset, length }, [ab]);
  const r = await answer;
  return { problem: r.problem, data: Buffer.from(r.ab, offset, length) };
}
