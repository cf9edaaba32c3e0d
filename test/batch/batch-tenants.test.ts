// Files and Batches belong to a tenant (issue #29): with
// `flowControl.tenants: { key-a: a, key-b: b }` on a real redis-server and real
// simulated engines, tenant b cannot read, download, list, cancel or delete
// a's file, batch, output or error file (404, never 403), a's own paths all
// work, the ids are unguessable, and a per-tenant file quota keeps one tenant
// from filling the store for another.
import t from 'tap';
import OpenAI from 'openai';
import { Redis } from 'ioredis';
import { chatLine, jsonl, startBatchRouter, until } from '../support/batch-util.js';

async function status(p: Promise<unknown>): Promise<number> {
  try {
    await p;
    return 200;
  } catch (err) {
    return (err as { status?: number }).status ?? -1;
  }
}

async function setup(t: Tap.Test, batch: Record<string, unknown> = {}, timeScale = 0) {
  const { router, redisUrl } = await startBatchRouter(t, { fleet: { timeScale }, batch, extra: { flowControl: { tenants: { 'key-a': 'a', 'key-b': 'b' } } } });
  const client = (key: string) => new OpenAI({ baseURL: `${router.url}/v1`, apiKey: key, maxRetries: 0 });
  return { a: client('key-a'), b: client('key-b'), anon: client('no-such-key'), router, redisUrl };
}

t.test("tenant b cannot reach a's files, batches, output and error files; a can", async (t) => {
  const { a, b, anon } = await setup(t);
  const file = await a.files.create({ file: await jsonl([chatLine('r0'), chatLine('r1'), chatLine('bad', 'no-such-model')]), purpose: 'batch' });
  t.match(file.id, /^file-[0-9a-f]{32}$/, 'a file id of 128 random bits');
  const batch = await a.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  t.match(batch.id, /^batch_[0-9a-f]{32}$/, 'a batch id of 128 random bits');
  const done = await until(() => a.batches.retrieve(batch.id), (x) => x.status === 'completed');
  t.ok(done.output_file_id && done.error_file_id, 'output and error files');

  for (const [who, c] of [['b', b], ['anonymous', anon]] as const) {
    for (const id of [file.id, done.output_file_id!, done.error_file_id!]) {
      t.equal(await status(c.files.retrieve(id)), 404, `${who}: GET /v1/files/${id} is 404`);
      t.equal(await status(c.files.content(id)), 404, `${who}: GET /v1/files/${id}/content is 404`);
      t.equal(await status(c.files.delete(id)), 404, `${who}: DELETE /v1/files/${id} is 404`);
    }
    t.equal(await status(c.batches.retrieve(batch.id)), 404, `${who}: GET /v1/batches/{id} is 404`);
    t.equal(await status(c.batches.cancel(batch.id)), 404, `${who}: cancel is 404`);
    t.same((await c.files.list()).data, [], `${who}: a's files are not in its list`);
    t.same((await c.batches.list()).data, [], `${who}: a's batches are not in its list`);
    // a's file as input of another tenant's batch: unknown
    t.equal(await status(c.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' })), 400, `${who}: a's file as its batch input is refused`);
    // paging after a's ids: no such file / batch (not an oracle of existence)
    t.equal(await status(c.files.list({ after: file.id } as never)), 400, `${who}: after a's file id`);
    t.equal(await status(c.batches.list({ after: batch.id })), 400, `${who}: after a's batch id`);
  }

  // a's own paths all work
  t.equal((await a.files.retrieve(file.id)).id, file.id);
  t.equal((await (await a.files.content(done.output_file_id!)).text()).trim().split('\n').length, 2);
  t.equal((await (await a.files.content(done.error_file_id!)).text()).trim().split('\n').length, 1);
  t.same((await a.files.list()).data.map((f) => f.id).sort(), [file.id, done.output_file_id!, done.error_file_id!].sort());
  t.same((await a.batches.list()).data.map((x) => x.id), [batch.id]);
  t.equal((await a.batches.retrieve(batch.id)).status, 'completed');
  t.equal(await status(a.batches.cancel(batch.id)), 400, 'a completed batch: not cancellable (its owner sees it)');
  t.equal((await a.files.delete(done.error_file_id!)).deleted, true);
  t.equal(await status(a.files.retrieve(done.error_file_id!)), 404, 'gone for its owner too');

  // b's own objects stay b's
  const fb = await b.files.create({ file: await jsonl([chatLine('x')]), purpose: 'batch' });
  t.equal(await status(a.files.retrieve(fb.id)), 404, "a cannot read b's file");
  t.same((await b.files.list()).data.map((f) => f.id), [fb.id]);
  t.equal((await b.files.delete(fb.id)).deleted, true);
});

t.test('a running batch: another tenant cannot cancel it; its owner can', async (t) => {
  const { a, b } = await setup(t);
  const file = await a.files.create({ file: await jsonl(Array.from({ length: 2000 }, (_, i) => chatLine(`q${i}`))), purpose: 'batch' });
  const batch = await a.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  t.equal(await status(b.batches.cancel(batch.id)), 404);
  const c = await a.batches.cancel(batch.id);
  t.ok(c.status === 'cancelling' || c.status === 'cancelled', `cancelled by its owner (${c.status})`);
});

t.test('per-tenant file quotas: one tenant at its limit does not stop another', async (t) => {
  const { a, b } = await setup(t, { fileQuota: { files: 2, bytes: 1_000_000 } });
  await a.files.create({ file: await jsonl([chatLine('1')]), purpose: 'batch' });
  const second = await a.files.create({ file: await jsonl([chatLine('2')]), purpose: 'batch' });
  let err: { status?: number; error?: { code?: string } } = {};
  try {
    await a.files.create({ file: await jsonl([chatLine('3')]), purpose: 'batch' });
  } catch (e) {
    err = e as typeof err;
  }
  t.equal(err.status, 429, 'the third file is over a’s quota');
  t.equal(err.error?.code, 'file_quota_exceeded');
  t.ok(await b.files.create({ file: await jsonl([chatLine('1')]), purpose: 'batch' }), "b's upload is not affected");
  await a.files.delete(second.id);
  t.ok(await a.files.create({ file: await jsonl([chatLine('3')]), purpose: 'batch' }), 'a delete frees its quota');
});

t.test('per-tenant byte quota', async (t) => {
  const { a, b } = await setup(t, { fileQuota: { files: 100, bytes: 400 } });
  const big = Array.from({ length: 3 }, (_, i) => chatLine(`b${i}`)); // ~420 bytes
  let st = 0;
  try {
    await a.files.create({ file: await jsonl(big), purpose: 'batch' });
  } catch (e) {
    st = (e as { status: number }).status;
  }
  t.equal(st, 429, 'over the byte quota');
  t.ok(await b.files.create({ file: await jsonl([chatLine('1')]), purpose: 'batch' }));
});

t.test('F12: a frozen Redis: the Batches API answers 503 with an OpenAI error after batch.commandTimeoutMs, not never', async (t) => {
  const { a, router, redisUrl } = await setup(t, { commandTimeoutMs: 300 });
  const file = await a.files.create({ file: await jsonl([chatLine('x')]), purpose: 'batch' });
  const admin = new Redis(redisUrl);
  t.teardown(() => admin.disconnect());
  await admin.call('CLIENT', 'PAUSE', '2500', 'ALL');
  for (const path of ['/v1/batches', `/v1/files/${file.id}`]) {
    const t0 = Date.now();
    const res = await fetch(`${router.url}${path}`, { headers: { authorization: 'Bearer key-a' } });
    const ms = Date.now() - t0;
    const body = (await res.json()) as { error?: { code?: string; type?: string } };
    t.equal(res.status, 503, `${path}: 503 while Redis is frozen`);
    t.match(body, { error: { code: 'store_unavailable', message: String } }, 'an OpenAI error body');
    t.ok(ms < 1500, `${path}: answered after ${ms} ms (the 300 ms timeout), not after the freeze`);
  }
  await new Promise((r) => setTimeout(r, 2600));
  t.equal((await a.files.retrieve(file.id)).id, file.id, 'served again once Redis answers');
});

t.test('F5: the input file of an active batch cannot be deleted (409 file_in_use); once the batch ended it can', async (t) => {
  const { a } = await setup(t, { maxInFlight: 1 }, 1);
  const file = await a.files.create({ file: await jsonl(Array.from({ length: 40 }, (_, i) => chatLine(`d${i}`))), purpose: 'batch' });
  const batch = await a.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  let err: { status?: number; error?: { code?: string } } = {};
  try {
    await a.files.delete(file.id);
  } catch (e) {
    err = e as typeof err;
  }
  t.equal(err.status, 409, 'refused while the batch runs');
  t.equal(err.error?.code, 'file_in_use');
  const done = await until(() => a.batches.retrieve(batch.id), (x) => x.status === 'completed', 60000);
  t.equal(done.request_counts?.completed, 40, 'the batch finished');
  t.equal((await a.files.delete(file.id)).deleted, true, 'deletable once the batch ended');
});

t.test('F5: a batch whose input bytes are lost mid-run still completes: its custom_ids were snapshotted at validation', async (t) => {
  const { a, redisUrl } = await setup(t, { maxInFlight: 1 }, 1);
  const file = await a.files.create({ file: await jsonl(Array.from({ length: 30 }, (_, i) => chatLine(`l${i}`))), purpose: 'batch' });
  const batch = await a.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  await until(() => a.batches.retrieve(batch.id), (x) => x.status === 'in_progress', 10000);
  const r = new Redis(redisUrl);
  t.teardown(() => r.disconnect());
  t.equal(await r.exists(`swy:batch:${batch.id}:ids`), 1, 'the snapshot is there');
  t.equal(await r.del(`swy:file:${file.id}:data`), 1, 'the input bytes lost behind the API');
  const end = await until(() => a.batches.retrieve(batch.id), (x) => x.status !== 'in_progress' && x.status !== 'finalizing', 30000);
  t.equal(end.status, 'completed');
  const lines = (await (await a.files.content(end.output_file_id!)).text()).trim().split('\n').map((l) => JSON.parse(l) as { custom_id: string });
  t.same(lines.map((l) => l.custom_id), Array.from({ length: 30 }, (_, i) => `l${i}`), 'every custom_id once, in input order');
  t.equal(await r.exists(`swy:batch:${batch.id}:ids`), 0, 'the snapshot goes with the batch');
});

t.test('F4: a batch whose input and custom_id snapshot are both lost mid-run ends failed, saying why, with an error file (not finalizing forever)', async (t) => {
  const { a, redisUrl } = await setup(t, { maxInFlight: 1 }, 1);
  const file = await a.files.create({ file: await jsonl(Array.from({ length: 30 }, (_, i) => chatLine(`l${i}`))), purpose: 'batch' });
  const batch = await a.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  await until(() => a.batches.retrieve(batch.id), (x) => x.status === 'in_progress', 10000);
  const r = new Redis(redisUrl);
  t.teardown(() => r.disconnect());
  t.equal(await r.del(`swy:file:${file.id}:data`, `swy:batch:${batch.id}:ids`), 2, 'the input bytes and the snapshot lost behind the API');
  // the bytes a finalisation cut short would leave: an output file's data with no record (kit t33: 480 MB a batch)
  const orphan = `swy:file:file-${batch.id.slice('batch_'.length)}-output:data`;
  await r.rpush(orphan, 'a part of an output file nobody will record');
  const end = await until(() => a.batches.retrieve(batch.id), (x) => x.status !== 'in_progress' && x.status !== 'finalizing', 30000);
  t.equal(end.status, 'failed');
  t.equal(await r.exists(orphan), 0, 'the output bytes no record points to are deleted with the failure');
  t.equal(await r.exists(`swy:batch:${batch.id}:finalizer`), 0, 'and the finalisation lease');
  t.match(end.errors?.data?.[0], { code: 'batch_failed', message: /deleted/ }, 'the reason in errors');
  t.ok(end.error_file_id, 'an error file');
  const lines = (await (await a.files.content(end.error_file_id!)).text()).trim().split('\n').map((l) => JSON.parse(l));
  t.match(lines[0], { error: { code: 'batch_failed', message: /deleted/ } }, 'the error file says why');
  t.equal(await r.sismember('swy:batches:active', batch.id), 0, 'no longer worked on');
});

t.test('a finalizing batch can be cancelled: it ends cancelled with the files of what ran', async (t) => {
  const { a, redisUrl } = await setup(t, { maxInFlight: 1 }, 1);
  const file = await a.files.create({ file: await jsonl(Array.from({ length: 10 }, (_, i) => chatLine(`f${i}`))), purpose: 'batch' });
  const batch = await a.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  await until(() => a.batches.retrieve(batch.id), (x) => x.status === 'in_progress', 10000);
  const r = new Redis(redisUrl);
  t.teardown(() => r.disconnect());
  // hold it in finalizing: without its custom_ids (snapshot and input moved away) each attempt to write its files fails
  const ids = `swy:batch:${batch.id}:ids`;
  await r.rename(ids, `${ids}:away`);
  await r.rename(`swy:file:${file.id}:data`, `swy:file:${file.id}:data:away`);
  await until(() => r.hmget(`swy:batch:${batch.id}`, 'status', 'failures'), ([st, f]) => st === 'finalizing' && f === '1', 30000);
  const c = await a.batches.cancel(batch.id);
  t.equal(c.status, 'finalizing', 'the cancel is taken while finalizing');
  // the next attempt can write the files (within MAX_FAILURES): it ends cancelled, not completed
  await r.rename(`${ids}:away`, ids);
  const end = await until(() => a.batches.retrieve(batch.id), (x) => x.status !== 'finalizing', 10000);
  t.equal(end.status, 'cancelled');
  t.ok(end.cancelled_at && end.cancelling_at, 'cancelled_at and cancelling_at set');
  t.ok(end.output_file_id, 'the output file of what ran');
  const lines = (await (await a.files.content(end.output_file_id!)).text()).trim().split('\n');
  t.equal(lines.length, 10, 'every line ran before the cancel');
});
