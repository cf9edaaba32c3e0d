// The official Python `openai` SDK, unchanged, against the Responses API over
// loopback (test/fixtures/responses_sdk.py). Needs python3 with the `openai`
// package importable (PYTHONPATH may point at it, e.g. a `pip install
// --target` directory): when it is not, the test is skipped and says so.
import t from 'tap';
import { execFile, execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { startTestRouter } from '../support/router-util.js';

const script = fileURLToPath(new URL('../fixtures/responses_sdk.py', import.meta.url));

function pythonSdk(): string | null {
  try {
    return execFileSync('python3', ['-c', 'import openai; print(openai.__version__)'], { encoding: 'utf8' }).trim();
  } catch {
    return null;
  }
}

const version = pythonSdk();
t.test('the Python openai SDK: create, chain, branch, stream, retrieve, delete, errors', { skip: version === null ? 'python3 cannot import openai (pip install openai, or set PYTHONPATH)' : false }, async (t) => {
  const { url } = await startTestRouter(t, { n: 2, fleet: { timeScale: 0.01 } });
  const out = await new Promise<string>((resolve, reject) =>
    execFile('python3', [script, url], { timeout: 150_000 }, (err, stdout, stderr) => (err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(stdout))),
  );
  const o = JSON.parse(out.trim().split('\n').pop()!);
  t.comment(`python openai ${o.sdk}`);
  t.equal(o.a_status, 'incomplete');
  t.ok(o.a_text.length > 0);
  t.equal(o.a_usage[1], 6);
  t.equal(o.a_usage[2], o.a_usage[0] + o.a_usage[1]);
  t.ok(o.b_prev);
  t.ok(o.b_grew);
  t.same(o.branch_items, ['Hello from Python.', 'Another branch.']);
  t.same(o.stream_types.slice(0, 4), ['response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added']);
  t.same(o.stream_types.slice(-4), ['response.output_text.done', 'response.content_part.done', 'response.output_item.done', 'response.completed']);
  t.ok(o.stream_seq_ok, 'sequence numbers 0..n');
  t.ok(o.stream_text_ok, 'final text = the deltas');
  t.ok(o.retrieved);
  t.same(o.deleted_error, [404, 'previous_response_not_found', 'previous_response_id']);
  // the five-turn tool loops
  for (const mode of ['plain', 'stream']) {
    t.equal(o[`${mode}_calls`].length, 4, `${mode}: four calls`);
    t.ok(o[`${mode}_calls`].every((c: unknown[] | null) => c !== null && typeof c[0] === 'string' && c[1] === 'get_weather' && c[2] === true), `${mode}: each turn a get_weather call with JSON arguments`);
    t.equal(o[`${mode}_final_calls`], 0, `${mode}: tool_choice none ends the loop with text`);
    t.same(o[`${mode}_item_types`], ['message', ...Array(4).fill(['function_call', 'function_call_output']).flat()], `${mode}: input_items of the chain`);
    t.ok(o[`${mode}_pairs_ok`], `${mode}: each output answers its call`);
  }
  for (const e of ['response.output_item.added', 'response.function_call_arguments.delta', 'response.function_call_arguments.done', 'response.output_item.done', 'response.completed']) {
    t.ok(o.stream_tool_events.includes(e), `the Python stream helper saw ${e}`);
  }
});

const failScript = fileURLToPath(new URL('../fixtures/responses_sdk_fail.py', import.meta.url));
t.test('the Python openai SDK: a stream that fails mid-way yields an error event, then response.failed', { skip: version === null ? 'python3 cannot import openai' : false }, async (t) => {
  const { url } = await startTestRouter(t, { n: 1, fleet: { timeScale: 0.01, failureRate: 1, failureKinds: ['error-mid-stream'] } });
  const out = await new Promise<string>((resolve, reject) =>
    execFile('python3', [failScript, url], { timeout: 150_000 }, (err, stdout, stderr) => (err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(stdout))),
  );
  const o = JSON.parse(out.trim().split('\n').pop()!);
  t.equal(o.raised, null, 'the iterator does not raise');
  t.same(o.types.slice(-2), ['error', 'response.failed']);
  t.same(o.seqs, o.seqs.map((_: number, i: number) => i));
  t.equal(o.error.code, 'server_error');
  t.equal(o.failed.status, 'failed');
  t.equal(o.failed.message, o.error.message);
});
