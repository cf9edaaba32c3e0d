// Conformance of the Files and Batches API: real uploads, a real batch run by
// a real router over simulated engines and a real redis-server, each answer
// checked field by field against OpenAI's published shapes
// (testkit/openai-shapes.ts): File, the file list, the deleted file, Batch
// (at creation and completed), the batch list, every line of the output and
// error files, and the Error object of the APIs' bad input.
import t from 'tap';
import { startBatchRouter } from '../support/batch-util.js';
import { BATCH, BATCH_LINE, check, ERROR_BODY, FILE, FILE_DELETED, list, RESPONSE, type Shape } from '../../testkit/openai-shapes.js';

function conforms(t: Tap.Test, shape: Shape, v: unknown, what: string): void {
  const errs = check(shape, v);
  t.same(errs, [], `${what} conforms${errs.length > 0 ? ': ' + errs.slice(0, 6).join('; ') : ''}`);
}

async function setup(t: Tap.Test) {
  return (await startBatchRouter(t, { engines: 2 })).url;
}

async function upload(url: string, text: string, purpose = 'batch'): Promise<{ status: number; json: any }> {
  const form = new FormData();
  form.append('purpose', purpose);
  form.append('file', new Blob([text], { type: 'application/jsonl' }), 'in.jsonl');
  const res = await fetch(`${url}/v1/files`, { method: 'POST', body: form });
  return { status: res.status, json: await res.json() };
}

async function req(url: string, method: string, path: string, body?: unknown): Promise<{ status: number; json: any; text: string }> {
  const res = await fetch(url + path, { method, headers: body === undefined ? {} : { 'content-type': 'application/json' }, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await res.text();
  let json: any = null;
  try {
    json = JSON.parse(text);
  } catch {}
  return { status: res.status, json, text };
}

const line = (id: string, model = 'open-model') => JSON.stringify({ custom_id: id, method: 'POST', url: '/v1/chat/completions', body: { model, messages: [{ role: 'user', content: `hi ${id}` }], max_tokens: 3 } });

t.test('File, Batch, their lists and the result files conform', async (t) => {
  const url = await setup(t);
  const up = await upload(url, [line('a'), line('b'), line('c', 'no-such-model')].join('\n') + '\n');
  t.equal(up.status, 200);
  conforms(t, FILE, up.json, 'uploaded file');
  conforms(t, FILE, (await req(url, 'GET', `/v1/files/${up.json.id}`)).json, 'retrieved file');
  conforms(t, list(FILE), (await req(url, 'GET', '/v1/files')).json, 'file list');
  const created = await req(url, 'POST', '/v1/batches', { input_file_id: up.json.id, endpoint: '/v1/chat/completions', completion_window: '24h', metadata: { run: '1' } });
  t.equal(created.status, 200, created.text);
  conforms(t, BATCH, created.json, 'created batch');
  let b = created.json;
  const end = Date.now() + 30_000;
  while (!['completed', 'failed', 'expired', 'cancelled'].includes(b.status) && Date.now() < end) {
    await new Promise((r) => setTimeout(r, 100));
    b = (await req(url, 'GET', `/v1/batches/${b.id}`)).json;
  }
  t.equal(b.status, 'completed');
  conforms(t, BATCH, b, 'completed batch');
  t.same(b.request_counts, { total: 3, completed: 2, failed: 1 });
  conforms(t, list(BATCH), (await req(url, 'GET', '/v1/batches')).json, 'batch list');
  const out = (await req(url, 'GET', `/v1/files/${b.output_file_id}/content`)).text.trim().split('\n').map((l) => JSON.parse(l));
  t.equal(out.length, 2);
  out.forEach((l, i) => conforms(t, BATCH_LINE, l, `output line ${i}`));
  const err = (await req(url, 'GET', `/v1/files/${b.error_file_id}/content`)).text.trim().split('\n').map((l) => JSON.parse(l));
  t.equal(err.length, 1);
  conforms(t, BATCH_LINE, err[0], 'error line');
  if (err[0].response !== null) conforms(t, ERROR_BODY, err[0].response.body, 'error line body');
  conforms(t, FILE, (await req(url, 'GET', `/v1/files/${b.output_file_id}`)).json, 'output file');
  const del = await req(url, 'DELETE', `/v1/files/${b.output_file_id}`);
  conforms(t, FILE_DELETED, del.json, 'deleted file');
});

async function runBatch(t: Tap.Test, url: string, endpoint: string, lines: string[]): Promise<{ batch: any; out: any[] }> {
  const up = await upload(url, lines.join('\n') + '\n');
  t.equal(up.status, 200, `${endpoint}: uploaded`);
  const created = await req(url, 'POST', '/v1/batches', { input_file_id: up.json.id, endpoint, completion_window: '24h' });
  t.equal(created.status, 200, `${endpoint}: created ${created.status === 200 ? '' : created.text}`);
  conforms(t, BATCH, created.json, `${endpoint} batch`);
  let b = created.json;
  const end = Date.now() + 30_000;
  while (!['completed', 'failed', 'expired', 'cancelled'].includes(b.status) && Date.now() < end) {
    await new Promise((r) => setTimeout(r, 100));
    b = (await req(url, 'GET', `/v1/batches/${b.id}`)).json;
  }
  conforms(t, BATCH, b, `${endpoint} batch, finished`);
  const out = b.output_file_id ? (await req(url, 'GET', `/v1/files/${b.output_file_id}/content`)).text.trim().split('\n').map((l) => JSON.parse(l)) : [];
  out.forEach((l, i) => conforms(t, BATCH_LINE, l, `${endpoint} output line ${i}`));
  return { batch: b, out };
}

t.test('batches of /v1/responses and /v1/embeddings requests', async (t) => {
  const url = await setup(t);
  const rl = (id: string) => JSON.stringify({ custom_id: id, method: 'POST', url: '/v1/responses', body: { model: 'open-model', input: `hi ${id}`, max_output_tokens: 3 } });
  const r = await runBatch(t, url, '/v1/responses', [rl('r1'), rl('r2')]);
  t.equal(r.batch.status, 'completed');
  t.equal(r.out.length, 2);
  for (const l of r.out) {
    t.equal(l.response.status_code, 200);
    conforms(t, RESPONSE, l.response.body, `Response of ${l.custom_id}`);
    const got = await req(url, 'GET', `/v1/responses/${l.response.body.id}`);
    t.equal(got.status, 200, 'the batch turn is stored and can be continued');
  }
  const el = (id: string) => JSON.stringify({ custom_id: id, method: 'POST', url: '/v1/embeddings', body: { model: 'open-model', input: `text ${id}` } });
  const e = await runBatch(t, url, '/v1/embeddings', [el('e1'), el('e2'), el('e3')]);
  t.equal(e.batch.status, 'completed');
  t.equal(e.out.length, 3);
  for (const l of e.out) {
    t.equal(l.response.status_code, 200);
    t.equal(l.response.body.object, 'list');
    t.type(l.response.body.data[0].embedding[0], 'number');
  }
  const bad = await upload(url, JSON.stringify({ custom_id: 'x', method: 'POST', url: '/v1/responses', body: { model: 'open-model' } }) + '\n');
  const b = await req(url, 'POST', '/v1/batches', { input_file_id: bad.json.id, endpoint: '/v1/responses', completion_window: '24h' });
  let st = b.json;
  const end = Date.now() + 30_000;
  while (!['completed', 'failed'].includes(st.status) && Date.now() < end) {
    await new Promise((r) => setTimeout(r, 100));
    st = (await req(url, 'GET', `/v1/batches/${b.json.id}`)).json;
  }
  t.equal(st.status, 'failed', 'a line without input fails validation');
  t.equal(st.errors.data[0].param, 'body.input');
});

t.test('the Files and Batches APIs answer bad input with the Error object', async (t) => {
  const url = await setup(t);
  const up = await upload(url, line('a') + '\n');
  const cases: [string, Promise<{ status: number; json: any }>, number][] = [
    ['bad endpoint', req(url, 'POST', '/v1/batches', { input_file_id: up.json.id, endpoint: '/v1/nope', completion_window: '24h' }), 400],
    ['no such file', req(url, 'POST', '/v1/batches', { input_file_id: 'file-nope', endpoint: '/v1/chat/completions', completion_window: '24h' }), 400],
    ['bad window', req(url, 'POST', '/v1/batches', { input_file_id: up.json.id, endpoint: '/v1/chat/completions', completion_window: '1h' }), 400],
    ['unknown batch', req(url, 'GET', '/v1/batches/batch_nope'), 404],
    ['unknown file', req(url, 'GET', '/v1/files/file-nope'), 404],
    ['not JSONL', upload(url, 'not json\n'), 400],
  ];
  for (const [name, p, status] of cases) {
    const r = await p;
    t.equal(r.status, status, name);
    conforms(t, ERROR_BODY, r.json, name);
  }
});
