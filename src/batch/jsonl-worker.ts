// The worker thread that checks uploaded JSONL off the event loop
// (jsonl-check.ts): it receives the upload's memory (transferred, not
// copied), checks the file's range and gives the memory back with the answer.
import { parentPort } from 'node:worker_threads';
import { checkJsonl } from './jsonl.js';

interface Job {
  id: number;
  ab: ArrayBuffer;
  offset: number;
  length: number;
}

parentPort!.on('message', (j: Job) => {
  let problem: string | null;
  try {
    problem = checkJsonl(Buffer.from(j.ab, j.offset, j.length));
  } catch (err) {
    problem = `cannot be checked (${(err as Error).message})`;
  }
  parentPort!.postMessage({ id: j.id, ab: j.ab, problem }, [j.ab]);
});
