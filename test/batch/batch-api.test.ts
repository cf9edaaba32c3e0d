// The Files and Batches API over real sockets, a real redis-server and real
// simulated engines, driven by the openai SDK: upload, create, retrieve, the
// output and error files, bad input (400 naming the param, 413), list, cancel,
// the routes without a `batch:` block, and a router SIGKILLed mid-batch whose
// batch another router finishes with every custom_id answered exactly once.
import t from 'tap';
import { writeFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI, { toFile } from 'openai';
import { Redis } from 'ioredis';
import { validateConfig } from '../../src/config/schema.js';
import { startFleet, type FleetOptions } from '../../src/sim/index.js';
import { startRouter } from '../../src/server/router.js';
import { startRedis } from '../support/redis-util.js';
import { batchConfigDoc, chatLine, jsonl, until } from '../support/batch-util.js';
import { spawnServe, startTestRouter, validatePlugin } from '../support/router-util.js';

const config = (urls: string[], redisUrl: string, batch: Record<string, unknown> = {}) => batchConfigDoc(urls, redisUrl, batch);

async function setup(t: Tap.Test, fleet: FleetOptions, batch: Record<string, unknown> = {}) {
  const redis = await startRedis(t);
  const engines = await startFleet(2, fleet);
  const cfg = validateConfig(config(engines.urls, redis.url, batch), validatePlugin);
  t.teardown(() => engines.close());
  return { redis, engines, cfg };
}


/** An HTTP error from the SDK as {status, param, code}. */
async function apiError(p: Promise<unknown>): Promise<{ status: number; param: unknown; code: unknown; message: string }> {
  try {
    await p;
  } catch (err) {
    const e = err as { status: number; error?: { param?: unknown; code?: unknown; message?: string } };
    return { status: e.status, param: e.error?.param, code: e.error?.code, message: e.error?.message ?? '' };
  }
  throw new Error('expected an error');
}

t.test('upload, batch, retrieve, output and error files through the openai SDK', async (t) => {
  const { cfg } = await setup(t, { timeScale: 0 }, { maxFileBytes: 64 * 1024 });
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(200));
  const client = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: 'k', maxRetries: 0 });

  const lines = Array.from({ length: 30 }, (_, i) => chatLine(`req-${i}`));
  lines.push(chatLine('unknown-model', 'no-such-model')); // answered 404 by the router: the error file
  const file = await client.files.create({ file: await jsonl(lines), purpose: 'batch' });
  t.match(file, { object: 'file', purpose: 'batch', filename: 'in.jsonl', status: 'processed' });
  t.match(file.id, /^file-/);
  t.equal((await client.files.retrieve(file.id)).bytes, file.bytes);
  t.equal(await (await client.files.content(file.id)).text(), lines.join('\n') + '\n', 'the content as uploaded');

  const created = await client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h', metadata: { job: 'nightly' } });
  t.match(created, { object: 'batch', endpoint: '/v1/chat/completions', input_file_id: file.id, completion_window: '24h', metadata: { job: 'nightly' } });
  t.match(created.id, /^batch_/);
  const done = await until(() => client.batches.retrieve(created.id), (b) => b.status === 'completed', 30000, 'completed');
  t.same(done.request_counts, { total: 31, completed: 30, failed: 1 });
  t.ok(done.in_progress_at !== null && done.finalizing_at !== null && done.completed_at !== null, 'timestamps of each stage');
  t.ok(done.output_file_id && done.error_file_id, 'output and error files');
  const out = (await (await client.files.content(done.output_file_id!)).text()).trim().split('\n').map((l) => JSON.parse(l));
  t.equal(out.length, 30);
  t.same(out.map((o) => o.custom_id), lines.slice(0, 30).map((_, i) => `req-${i}`), 'each custom_id once, in input order');
  t.match(out[0], { id: /^batch_req_/, custom_id: 'req-0', response: { status_code: 200, request_id: String, body: { object: 'chat.completion', choices: Array } }, error: null });
  const errs = (await (await client.files.content(done.error_file_id!)).text()).trim().split('\n').map((l) => JSON.parse(l));
  t.equal(errs.length, 1);
  t.match(errs[0], { custom_id: 'unknown-model', response: { status_code: 404, body: { error: { message: String } } } });
  t.equal((await client.files.retrieve(done.output_file_id!)).purpose, 'batch_output');

  // bad input: 400 naming the param
  t.match(await apiError(client.files.create({ file: await jsonl([chatLine('x')]), purpose: 'fine-tune' })), { status: 400, param: 'purpose' });
  t.match(await apiError(client.files.create({ file: await toFile(Buffer.from('{"custom_id":"a"}\n{not json\n'), 'bad.jsonl'), purpose: 'batch' })), { status: 400, param: 'file', message: /line 2/ });
  t.match(await apiError(client.files.create({ file: await toFile(Buffer.alloc(70 * 1024, 0x20), 'big.jsonl'), purpose: 'batch' })), { status: 413 });
  t.match(await apiError(client.batches.create({ input_file_id: 'file-nope', endpoint: '/v1/chat/completions', completion_window: '24h' })), { status: 400, param: 'input_file_id' });
  t.match(await apiError(client.batches.create({ input_file_id: '', endpoint: '/v1/chat/completions', completion_window: '24h' })), { status: 400, param: 'input_file_id' });
  t.match(await apiError(client.batches.create({ input_file_id: file.id, endpoint: '/v1/moderations' as '/v1/chat/completions', completion_window: '24h' })), { status: 400, param: 'endpoint' });
  t.match(await apiError(client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '1h' as '24h' })), { status: 400, param: 'completion_window' });
  t.match(await apiError(client.batches.create({ input_file_id: done.output_file_id!, endpoint: '/v1/chat/completions', completion_window: '24h' })), { status: 400, param: 'input_file_id', code: 'invalid_file_purpose' });
  t.match(await apiError(client.batches.retrieve('batch_nope')), { status: 404 });
  t.match(await apiError(client.files.retrieve('file-nope')), { status: 404 });
  // an id that is not one of ours never names another Redis key (here: the content of the uploaded file)
  t.match(await apiError(client.files.retrieve(`${file.id}:data`)), { status: 404 });
  t.match(await apiError(client.files.delete(`${file.id}:data`)), { status: 404 });
  t.match(await apiError(client.batches.retrieve(`${created.id}:out`)), { status: 404 });

  // lines that are JSON but not valid requests: the batch fails validation with the lines' errors
  const bad = await client.files.create({
    file: await jsonl([chatLine('a'), chatLine('a'), JSON.stringify({ custom_id: 'c', method: 'POST', url: '/v1/completions', body: { model: 'open-model', prompt: 'x' } }), JSON.stringify({ custom_id: 'd', method: 'POST', url: '/v1/chat/completions', body: { messages: [] } })]),
    purpose: 'batch',
  });
  const badBatch = await client.batches.create({ input_file_id: bad.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  const failed = await until(() => client.batches.retrieve(badBatch.id), (b) => b.status === 'failed', 10000, 'failed');
  t.same(
    failed.errors?.data?.map((e) => [e.line, e.param, e.code]),
    [
      [2, 'custom_id', 'duplicate_custom_id'],
      [3, 'url', 'mismatched_url'],
      [4, 'body.model', 'missing_required_parameter'],
    ],
  );
    t.ok(typeof failed.failed_at === 'number' && !('output_file_id' in failed), 'failed: failed_at set, no output file (left out, not null)');

  // list, newest first, with after / limit
  const page1 = await client.batches.list({ limit: 1 });
  t.same(page1.data.map((b) => b.id), [badBatch.id]);
  t.equal(page1.has_more, true);
  const page2 = await client.batches.list({ limit: 5, after: badBatch.id });
  t.same(page2.data.map((b) => b.id), [created.id]);
  t.equal(page2.has_more, false);
  t.match(await apiError(client.batches.list({ limit: 1000 })), { status: 400, param: 'limit' });

  // files: listed newest first (or oldest first), by purpose, with after / limit
  const outputs = [done.output_file_id!, done.error_file_id!].sort();
  const all = await client.files.list();
  t.equal(all.data.length, 4, 'the input files and the two result files');
  t.same([all.data[0]!.id, all.data[3]!.id], [bad.id, file.id], 'newest first');
  t.same(all.data.slice(1, 3).map((f) => f.id).sort(), outputs);
  t.equal(all.has_more, false);
  t.same((await client.files.list({ purpose: 'batch_output' })).data.map((f) => f.id).sort(), outputs);
  t.same((await client.files.list({ purpose: 'batch' })).data.map((f) => f.id), [bad.id, file.id]);
  const oldest = await client.files.list({ order: 'asc', limit: 1 });
  t.same([oldest.data.map((f) => f.id), oldest.has_more], [[file.id], true]);
  const next = await client.files.list({ order: 'asc', limit: 2, after: file.id });
  t.same([next.data.map((f) => f.id).sort(), next.has_more], [outputs, true]);
  const last = await client.files.list({ purpose: 'batch', limit: 1, after: bad.id });
  t.same([last.data.map((f) => f.id), last.has_more], [[file.id], false], 'a purpose filter pages past the other purpose');
  t.match(await apiError(client.files.list({ limit: 0 })), { status: 400, param: 'limit' });
  t.match(await apiError(client.files.list({ purpose: 'fine-tune' })), { status: 400, param: 'purpose' });
  t.match(await apiError(client.files.list({ after: 'file-nope' })), { status: 400, param: 'after' });

  // a finished batch cannot be cancelled; files can be deleted
  t.match(await apiError(client.batches.cancel(created.id)), { status: 400 });
  t.match(await client.files.delete(bad.id), { id: bad.id, deleted: true });
  t.match(await apiError(client.files.retrieve(bad.id)), { status: 404 });
  t.notOk((await client.files.list()).data.some((f) => f.id === bad.id), 'a deleted file leaves the list');
  t.match(await apiError(client.files.delete(bad.id)), { status: 404 });
});

t.test('cancel: lines not yet dispatched are skipped, the batch ends cancelled with the files of what ran', async (t) => {
  const { cfg } = await setup(t, { timeScale: 1, itlMs: 30 }, { maxInFlight: 2 });
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(200));
  const client = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: 'k', maxRetries: 0 });
  const file = await client.files.create({ file: await jsonl(Array.from({ length: 60 }, (_, i) => chatLine(`c${i}`))), purpose: 'batch' });
  const b = await client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  await until(() => client.batches.retrieve(b.id), (x) => x.request_counts!.completed >= 2, 20000, 'some done');
  const c = await client.batches.cancel(b.id);
  t.ok(c.status === 'cancelling' || c.status === 'cancelled', `cancel answered ${c.status}`);
  const end = await until(() => client.batches.retrieve(b.id), (x) => x.status === 'cancelled', 20000, 'cancelled');
  t.ok(end.request_counts!.completed < 60, `${end.request_counts!.completed} of 60 ran`);
  t.ok(end.cancelled_at !== null && end.output_file_id !== null);
  const out = (await (await client.files.content(end.output_file_id!)).text()).trim().split('\n');
  t.equal(out.length, end.request_counts!.completed, 'the output file holds what ran');
});

t.test('expiry: a batch past its window ends expired; what ran is in the output file, the rest in the error file as batch_expired', async (t) => {
  const { cfg } = await setup(t, { timeScale: 1, itlMs: 30 }, { maxInFlight: 2, expireAfterSeconds: 2 });
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(200));
  const client = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: 'k', maxRetries: 0 });
  const N = 60;
  const file = await client.files.create({ file: await jsonl(Array.from({ length: N }, (_, i) => chatLine(`x${i}`))), purpose: 'batch' });
  const b = await client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  t.equal(b.expires_at, b.created_at + 2, 'expires_at is created_at + expireAfterSeconds');
  const end = await until(() => client.batches.retrieve(b.id), (x) => x.status === 'expired', 20000, 'expired');
  t.ok(end.expired_at !== null && end.expired_at! >= b.created_at + 2, `expired at ${end.expired_at} (created ${b.created_at})`);
  const ran = end.request_counts!.completed;
  t.ok(ran > 0 && ran < N, `${ran} of ${N} ran before the window closed`);
  const out = (await (await client.files.content(end.output_file_id!)).text()).trim().split('\n').map((l) => JSON.parse(l) as { custom_id: string });
  const errs = (await (await client.files.content(end.error_file_id!)).text()).trim().split('\n').map((l) => JSON.parse(l) as { custom_id: string; response: unknown; error: { code: string } | null });
  t.equal(out.length, ran, 'the output file holds what ran');
  t.equal(errs.length, N - ran, 'every line that did not run is in the error file');
  t.ok(errs.every((e) => e.response === null && e.error?.code === 'batch_expired'), 'as batch_expired');
  t.equal(new Set([...out, ...errs].map((l) => l.custom_id)).size, N, 'each custom_id once across both files');
  t.match(await apiError(client.batches.cancel(b.id)), { status: 400 }, 'an expired batch cannot be cancelled');
});

t.test("tenants: a batch's lines belong to its creator's tenant (the API key's), and count against that tenant's quota", async (t) => {
  const redis = await startRedis(t);
  const engines = await startFleet(2, { timeScale: 0 });
  t.teardown(() => engines.close());
  const raw = config(engines.urls, redis.url, { quotas: { windowMs: 60000, tenants: { acme: { requests: 3 } } }, reclaimIdleMs: 100000 });
  const cfg = validateConfig({ ...raw, flowControl: { tenants: { 'sk-acme': 'acme' } } }, validatePlugin);
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(200));
  const acme = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: 'sk-acme', maxRetries: 0 });
  const anon = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: 'sk-unknown', maxRetries: 0 });
  const lines = Array.from({ length: 6 }, (_, i) => chatLine(`t${i}`));
  const fa = await acme.files.create({ file: await jsonl(lines), purpose: 'batch' });
  const ba = await acme.batches.create({ input_file_id: fa.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  const fb = await anon.files.create({ file: await jsonl(lines), purpose: 'batch' });
  const bb = await anon.batches.create({ input_file_id: fb.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  // the anonymous batch runs under the default quota (unlimited); acme's stops at its 3 requests a minute
  const doneB = await until(() => anon.batches.retrieve(bb.id), (x) => x.status === 'completed', 20000, 'anonymous batch completed');
  t.equal(doneB.request_counts!.completed, 6);
  await until(async () => router.batch!.stats.deferredByQuota, (n) => n > 0, 10000, 'acme deferred by its quota');
  const a = await acme.batches.retrieve(ba.id);
  t.equal(a.status, 'in_progress');
  t.equal(a.request_counts!.completed, 3, "acme's batch ran only its quota's 3 requests");
  const r = new Redis(redis.url);
  t.teardown(() => r.disconnect());
  const entries = (await r.xrange('jobs', '-', '+')) as [string, string[]][];
  const tenantOf = (batch: string) => new Set(entries.filter(([, f]) => f[f.indexOf('batch') + 1] === batch).map(([, f]) => f[f.indexOf('tenant') + 1]));
  t.same([...tenantOf(ba.id)], ['acme']);
  t.same([...tenantOf(bb.id)], ['']);
});

t.test('without a batch block the routes answer an OpenAI error saying so', async (t) => {
  const { url } = await startTestRouter(t, {});
  for (const [method, path] of [
    ['GET', '/v1/batches'],
    ['POST', '/v1/batches'],
    ['GET', '/v1/files/file-x'],
    ['POST', '/v1/files'],
  ]) {
    const r = await fetch(`${url}${path}`, { method, ...(method === 'POST' ? { body: '{}', headers: { 'content-type': 'application/json' } } : {}) });
    t.equal(r.status, 404, `${method} ${path}`);
    t.equal(r.headers.get('content-type'), 'application/json');
    const body = (await r.json()) as { error: { code: string; message: string } };
    t.equal(body.error.code, 'batch_not_configured');
    t.match(body.error.message, /batch:/);
  }
});

t.test('a router SIGKILLed mid-batch: another router resumes the batch; every custom_id answered exactly once', async (t) => {
  const { redis, engines } = await setup(t, { timeScale: 1, itlMs: 10 });
  const dir = mkdtempSync(join(tmpdir(), 'swy-batches-'));
  const file = join(dir, 'a.yaml');
  const a = config(engines.urls, redis.url, { consumer: 'a', maxInFlight: 4, reclaimIdleMs: 400 });
  writeFileSync(file, JSON.stringify({ ...a, listen: { host: '127.0.0.1', port: 0 }, logging: { level: 'info' } }));
  const serve = await spawnServe(t, ['--config', file], 60000); // a loaded machine starts a process slowly
  const N = 120;
  const clientA = new OpenAI({ baseURL: `${serve.url}/v1`, apiKey: 'k', maxRetries: 0 });
  const f = await clientA.files.create({ file: await jsonl(Array.from({ length: N }, (_, i) => chatLine(`k${i}`))), purpose: 'batch' });
  const b = await clientA.batches.create({ input_file_id: f.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  const mid = await until(() => clientA.batches.retrieve(b.id), (x) => x.request_counts!.completed >= 10, 30000, 'some done');
  // killed while it holds entries: the processor may pause between lines (the fleet's spare capacity, read
  // from engines a loaded machine slows), and a kill in such a gap would leave nothing to reclaim
  const probe = new Redis(redis.url);
  await until(async () => Number(((await probe.xpending('jobs', 'g')) as [number])[0]), (n) => n > 0, 30000, 'router a holds entries');
  probe.disconnect();
  serve.child.kill('SIGKILL');
  await serve.exited;
  const held = new Redis(redis.url);
  const heldAtKill = Number(((await held.xpending('jobs', 'g')) as [number])[0]);
  held.disconnect();
  t.equal(mid.status, 'in_progress');
  t.ok(mid.request_counts!.completed < N, `killed with ${mid.request_counts!.completed} of ${N} done`);

  const cfgB = validateConfig(config(engines.urls, redis.url, { consumer: 'b', maxInFlight: 4, reclaimIdleMs: 400 }), validatePlugin);
  const routerB = await startRouter(cfgB, { port: 0, host: '127.0.0.1' });
  t.teardown(() => routerB.close(200));
  const clientB = new OpenAI({ baseURL: `${routerB.url}/v1`, apiKey: 'k', maxRetries: 0 });
  const done = await until(() => clientB.batches.retrieve(b.id), (x) => x.status === 'completed', 60000, 'completed on router b');
  t.same(done.request_counts, { total: N, completed: N, failed: 0 });
  const out = (await (await clientB.files.content(done.output_file_id!)).text()).trim().split('\n').map((l) => JSON.parse(l) as { custom_id: string });
  t.equal(out.length, N);
  t.equal(new Set(out.map((o) => o.custom_id)).size, N, 'each custom_id exactly once');
  // the request stream: one entry per line (the enqueue was not repeated)
  const r = new Redis(redis.url);
  t.teardown(() => r.disconnect());
  t.equal(await r.xlen('jobs'), N);
  // what the dead router held: its answers may already be stored (so the batch can complete without them), but
  // its entries stay pending until router b claims them after reclaimIdleMs and finds them done
  t.ok(heldAtKill > 0, `router a held ${heldAtKill} entries when killed`);
  await until(async () => Number(((await r.xpending('jobs', 'g')) as [number])[0]), (n) => n === 0, 10000, 'no entry left pending');
  t.ok(routerB.batch!.stats.reclaimed >= heldAtKill, `router b reclaimed ${routerB.batch!.stats.reclaimed} entries (router a held ${heldAtKill})`);
});
