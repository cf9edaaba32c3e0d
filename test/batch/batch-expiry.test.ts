// expires_after on uploads and output_expires_after on batches (OpenAI's
// {anchor: "created_at", seconds}), over a real router, a real redis-server
// and the openai SDK: the objects carry expires_at, disappear once past it
// (404, gone from lists, their keys deleted, the tenant's usage given back),
// and bad policies answer 400 naming the field. `minExpiresAfterSeconds: 1`
// so a test does not wait OpenAI's hour.
import t from 'tap';
import OpenAI from 'openai';
import { Redis } from 'ioredis';
import { chatLine, jsonl, startBatchRouter, until } from '../support/batch-util.js';

async function failure(p: Promise<unknown>): Promise<{ status: number; param: unknown; code: unknown }> {
  try {
    await p;
  } catch (err) {
    const e = err as { status: number; error?: { param?: unknown; code?: unknown } };
    return { status: e.status, param: e.error?.param, code: e.error?.code };
  }
  throw new Error('expected an error');
}

async function setup(t: Tap.Test, batch: Record<string, unknown> = {}) {
  const { url, redisUrl } = await startBatchRouter(t, { batch: { minExpiresAfterSeconds: 1, ...batch } });
  const r = new Redis(redisUrl);
  t.teardown(() => r.disconnect());
  return { client: new OpenAI({ baseURL: `${url}/v1`, apiKey: 'k', maxRetries: 0 }), r };
}

t.test('an upload with expires_after has expires_at and disappears after it, its usage given back', async (t) => {
  const { client, r } = await setup(t);
  const keep = await client.files.create({ file: await jsonl([chatLine('k')]), purpose: 'batch' });
  t.equal(keep.expires_at, keep.created_at + 2_592_000, "no policy: the default, OpenAI's 30 days for purpose batch");
  const f = await client.files.create({ file: await jsonl([chatLine('a')]), purpose: 'batch', expires_after: { anchor: 'created_at', seconds: 2 } });
  t.equal(f.expires_at, f.created_at + 2, 'expires_at = created_at + seconds');
  t.equal((await client.files.retrieve(f.id)).expires_at, f.expires_at);
  const usage = await r.hgetall('swy:t:anon:usage');
  t.equal(usage.files, '2');
  await until(() => failure(client.files.retrieve(f.id)).catch(() => ({ status: 200 })), (x) => x.status === 404, 10000);
  t.equal((await failure(client.files.content(f.id))).status, 404, 'its content is gone too');
  const list = await client.files.list();
  t.same(list.data.map((x) => x.id), [keep.id], 'not listed');
  await until(() => r.exists(`swy:file:${f.id}`, `swy:file:${f.id}:data`), (n) => n === 0, 10000);
  const after = await r.hgetall('swy:t:anon:usage');
  t.equal(after.files, '1', "the tenant's file count given back");
  t.equal(Number(after.bytes), keep.bytes, 'and its bytes');
  t.equal((await client.files.retrieve(keep.id)).id, keep.id, 'the file without a policy stays');
});

t.test('batch.fileExpiresAfterSeconds: uploads without a policy expire after it; 0 keeps them until deleted', async (t) => {
  const short = await setup(t, { fileExpiresAfterSeconds: 2 });
  const f = await short.client.files.create({ file: await jsonl([chatLine('d')]), purpose: 'batch' });
  t.equal(f.expires_at, f.created_at + 2, 'the configured default');
  const own = await short.client.files.create({ file: await jsonl([chatLine('o')]), purpose: 'batch', expires_after: { anchor: 'created_at', seconds: 3600 } });
  t.equal(own.expires_at, own.created_at + 3600, "the upload's own policy wins");
  await until(() => short.r.exists(`swy:file:${f.id}`, `swy:file:${f.id}:data`), (n) => n === 0, 10000);
  t.equal((await failure(short.client.files.retrieve(f.id))).status, 404, 'gone after it');
  const never = await setup(t, { fileExpiresAfterSeconds: 0 });
  const k = await never.client.files.create({ file: await jsonl([chatLine('k')]), purpose: 'batch' });
  t.notOk('expires_at' in k, '0: no expiry (expires_at left out, not null)');
});

t.test('bad expiry policies answer 400 naming the field', async (t) => {
  const { client } = await setup(t);
  const up = async (ea: unknown) => client.files.create({ file: await jsonl([chatLine('x')]), purpose: 'batch', expires_after: ea as never });
  t.match(await failure(up({ anchor: 'last_active_at', seconds: 3600 })), { status: 400, param: 'expires_after.anchor', code: 'invalid_value' });
  t.match(await failure(up({ anchor: 'created_at', seconds: 0 })), { status: 400, param: 'expires_after.seconds' });
  t.match(await failure(up({ anchor: 'created_at', seconds: 2_592_001 })), { status: 400, param: 'expires_after.seconds' });
  t.match(await failure(up({ anchor: 'created_at', seconds: 'soon' })), { status: 400, param: 'expires_after.seconds' });
  t.match(await failure(up({ seconds: 60 })), { status: 400, param: 'expires_after.anchor' });
  const file = await client.files.create({ file: await jsonl([chatLine('y')]), purpose: 'batch' });
  const mk = (oe: unknown) => client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h', output_expires_after: oe as never });
  t.match(await failure(mk({ anchor: 'created_at', seconds: -5 })), { status: 400, param: 'output_expires_after.seconds' });
  t.match(await failure(mk('1h')), { status: 400, param: 'output_expires_after' });
});

t.test("a batch's output_expires_after: its output and error files expire from their own creation", async (t) => {
  const { client, r } = await setup(t);
  const file = await client.files.create({ file: await jsonl([chatLine('o1'), chatLine('o2'), JSON.stringify({ custom_id: 'bad', method: 'POST', url: '/v1/chat/completions', body: { model: 'no-such-model', messages: [] } })]), purpose: 'batch' });
  const b = await client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h', output_expires_after: { anchor: 'created_at', seconds: 2 } });
  const done = await until(() => client.batches.retrieve(b.id), (x) => x.status === 'completed');
  const out = await client.files.retrieve(done.output_file_id!);
  const err = await client.files.retrieve(done.error_file_id!);
  t.equal(out.expires_at, out.created_at + 2, 'the output file expires');
  t.equal(err.expires_at, err.created_at + 2, 'the error file expires');
  const input = await client.files.retrieve(file.id);
  t.equal(input.expires_at, input.created_at + 2_592_000, 'the input keeps its own policy (the default)');
  await until(() => r.exists(`swy:file:${out.id}`, `swy:file:${err.id}`), (n) => n === 0, 10000);
  t.equal((await failure(client.files.content(out.id))).status, 404, 'the output is gone');
  t.equal((await client.files.retrieve(file.id)).id, file.id, 'the input stays');
});
