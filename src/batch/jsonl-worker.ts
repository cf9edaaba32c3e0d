// The worker thread of jsonl-check.ts: it receives a file's memory
// (transferred, not copied), checks or validates its range and gives the
// memory back with the answer; or builds a run of result lines.
import { parentPort } from 'node:worker_threads';
import { batchBodies, buildResultLines, checkJsonl, validateBatchLines, type ResultLinesJob } from './jsonl.js';

interface Job {
  id: number;
  kind: 'check' | 'validate' | 'lines' | 'bodies';
  ab: ArrayBuffer;
  offset: number;
  length: number;
  endpoint: string;
  job: ResultLinesJob;
}

parentPort!.on('message', (j: Job) => {
  if (j.kind === 'lines') {
    parentPort!.postMessage({ id: j.id, lines: buildResultLines(j.job) });
    return;
  }
  const data = Buffer.from(j.ab, j.offset, j.length);
  if (j.kind === 'bodies') {
    const b = batchBodies(data);
    const text = new Uint8Array(b.text.length);
    text.set(b.text);
    parentPort!.postMessage({ id: j.id, text: text.buffer, ends: b.ends.buffer }, [text.buffer, b.ends.buffer as ArrayBuffer]);
    return;
  }
  if (j.kind === 'validate') {
    const v = validateBatchLines(data, j.endpoint);
    const ids = new Uint8Array(v.ids.length);
    ids.set(v.ids);
    parentPort!.postMessage({ id: j.id, total: v.total, errors: v.errors, ids: ids.buffer }, [ids.buffer]);
    return;
  }
  let problem: string | null;
  try {
    problem = checkJsonl(data);
  } catch (err) {
    problem = `cannot be checked (${(err as Error).message})`;
  }
  parentPort!.postMessage({ id: j.id, ab: j.ab, problem }, [j.ab]);
});
