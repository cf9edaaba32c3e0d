// A batch's output larger than the largest value Redis will hold (issue #30,
// F4): on a real redis-server whose proto-max-bulk-len is lowered to its
// floor (1 MB, standing in for the default 512 MB a large batch reaches),
// two routers finalise one batch whose output is about 1.8 MB. The output is
// written in list pieces of at most batch.fileChunkBytes, so it completes;
// every line is in it exactly once and in order (one router at a time writes
// the files: the finalisation lease); nothing is left behind in Redis.
import t from 'tap';
import OpenAI from 'openai';
import { Redis } from 'ioredis';
import { validateConfig } from '../../src/config/schema.js';
import { startRouter } from '../../src/server/router.js';
import { startFleet } from '../../src/sim/index.js';
import { batchConfigDoc, jsonl, startBatchRouter, until, type BatchRouterOptions } from '../support/batch-util.js';
import { startRedis } from '../support/redis-util.js';
import { get } from '../support/sim-util.js';
import { validatePlugin } from '../support/router-util.js';

const LINES = 800;
const CHUNK = 256 * 1024;
const line = (i: number) =>
  JSON.stringify({ custom_id: `big-${i}`, method: 'POST', url: '/v1/chat/completions', body: { model: 'open-model', messages: [{ role: 'user', content: `long answer ${i}` }], max_tokens: 400 } });

/** One router with a batch block on its own redis-server and engine; a Redis client and an SDK client on it. */
async function oneRouter(t: Tap.Test, o: BatchRouterOptions = {}) {
  const { router, url, redisUrl } = await startBatchRouter(t, o);
  const r = new Redis(redisUrl);
  t.teardown(() => r.disconnect());
  return { router, r, client: new OpenAI({ baseURL: `${url}/v1`, apiKey: 'none', maxRetries: 0 }) };
}

t.test('an output over Redis\'s largest value completes, written in pieces, each line once and in order, by two routers at once', async (t) => {
  const redis = await startRedis(t);
  const r = new Redis(redis.url);
  t.teardown(() => r.disconnect());
  await r.config('SET', 'proto-max-bulk-len', String(1024 * 1024));
  const engines = await startFleet(2, { timeScale: 0 });
  t.teardown(() => engines.close());
  const cfg = () => validateConfig(batchConfigDoc(engines.urls, redis.url, { fileChunkBytes: CHUNK, maxInFlight: 64 }), validatePlugin);
  const a = await startRouter(cfg(), { port: 0, host: '127.0.0.1' });
  t.teardown(() => a.close(200));
  const b = await startRouter(cfg(), { port: 0, host: '127.0.0.1' });
  t.teardown(() => b.close(200));
  const client = new OpenAI({ baseURL: `${a.url}/v1`, apiKey: 'none', maxRetries: 0 });

  const file = await client.files.create({ file: await jsonl(Array.from({ length: LINES }, (_, i) => line(i))), purpose: 'batch' });
  const batch = await client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  const end = await until(() => client.batches.retrieve(batch.id), (x) => x.status !== 'validating' && x.status !== 'in_progress' && x.status !== 'finalizing', 120_000, 'the batch to end');
  t.equal(end.status, 'completed', `completed (errors: ${JSON.stringify(end.errors ?? null).slice(0, 300)})`);
  t.equal(end.request_counts?.completed, LINES);

  const data = `swy:file:${end.output_file_id}:data`;
  t.equal(await r.type(data), 'list', 'the output is a list of pieces');
  const pieces = await r.llen(data);
  const lens = await Promise.all(Array.from({ length: pieces }, async (_, i) => (await r.lrangeBuffer(data, i, i))[0]!.length));
  t.ok(lens.every((n) => n <= CHUNK), `every piece at most fileChunkBytes (largest ${Math.max(...lens)})`);
  const total = lens.reduce((x, y) => x + y, 0);
  t.ok(total > 1024 * 1024, `the output (${total} bytes) is larger than the largest value this Redis holds`);

  const text = await (await client.files.content(end.output_file_id!)).text();
  t.equal(Buffer.byteLength(text), total, 'the download is every piece');
  const got = text.trim().split('\n').map((l) => JSON.parse(l) as { custom_id: string; response: { status_code: number; body: { choices: unknown[] } } });
  t.same(
    got.map((l) => l.custom_id),
    Array.from({ length: LINES }, (_, i) => `big-${i}`),
    'every custom_id once, in input order (no piece written twice by the two routers)',
  );
  t.ok(got.every((l) => l.response.status_code === 200 && l.response.body.choices.length === 1), 'every line a whole answer');
  const meta = await client.files.retrieve(end.output_file_id!);
  t.equal(meta.bytes, total, "the file's bytes as recorded");

  t.equal(await r.exists(`swy:batch:${batch.id}:finalizer`, `swy:batch:${batch.id}:out`, `swy:batch:${batch.id}:ids`), 0, 'no lease, result stream or snapshot left');
});

/** GET `path` over a raw HTTP/1.1 connection, reading slowly (a pause after the first bytes, then small reads): the answer's status, headers, bytes and whether its framing ended. */
async function slowGet(base: string, path: string): Promise<{ status: number; headers: Record<string, unknown>; body: Buffer; complete: boolean }> {
  const http = await import('node:http');
  return new Promise((resolve, reject) => {
    const req = http.get(`${base}${path}`, { agent: false }, (res) => {
      const parts: Buffer[] = [];
      let paused = false;
      res.on('data', (b: Buffer) => {
        parts.push(b);
        if (!paused) {
          // the router must stop reading Redis while this client takes nothing (its socket fills)
          paused = true;
          res.pause();
          setTimeout(() => res.resume(), 400);
        }
      });
      res.on('close', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(parts), complete: res.complete }));
      res.on('error', () => undefined);
    });
    req.on('error', reject);
  });
}

for (const frontEnd of ['native', 'uws'] as const) {
  t.test(`${frontEnd} front end: a 20 MB file is downloaded a piece at a time to a slow client, whole; a file whose data was cut behind the API is answered cut, never short`, async (t) => {
    const { router, r, client } = await oneRouter(t, { extra: { server: { frontEnd } } });
    const pad = 'x'.repeat(2000);
    const upload = Buffer.from(Array.from({ length: 10_000 }, (_, i) => line(i).replace('long answer', `${pad} `)).join('\n') + '\n');
    const { toFile } = await import('openai');
    const file = await client.files.create({ file: await toFile(upload, 'big.jsonl'), purpose: 'batch' });
    t.ok(upload.length > 20 * 1024 * 1024, `the upload is ${upload.length} bytes`);
    t.ok((await r.llen(`swy:file:${file.id}:data`)) > 4, 'stored as pieces');

    const got = await slowGet(router.url, `/v1/files/${file.id}/content`);
    t.equal(got.status, 200);
    t.equal(got.headers['transfer-encoding'], 'chunked', 'sent as it is read (chunked)');
    t.ok(got.complete, 'the answer ended');
    t.ok(got.body.equals(upload), 'the bytes downloaded are the bytes uploaded');
    t.equal((await get(router.url, '/healthz')).status, 200, 'the router serves on');

    // behind the API, the file loses all but its first piece: its record still says the whole size
    await r.ltrim(`swy:file:${file.id}:data`, 0, 0);
    const cut = await slowGet(router.url, `/v1/files/${file.id}/content`);
    t.equal(cut.status, 200, 'the head went out before the loss was seen');
    t.notOk(cut.complete, 'the answer is cut (its chunked framing never ends), not passed off as a whole file');
    t.ok(cut.body.length < upload.length, `${cut.body.length} bytes came`);
    t.equal((await get(router.url, '/healthz')).status, 200, 'the router serves on after the cut');
  });
}

t.test("a batch another router holds the finalisation lease of is not written here until the lease goes; then it completes", async (t) => {
  const { r, client } = await oneRouter(t);
  const file = await client.files.create({ file: await jsonl(Array.from({ length: 20 }, (_, i) => line(i))), purpose: 'batch' });
  const batch = await client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  const lease = `swy:batch:${batch.id}:finalizer`;
  await r.set(lease, 'another-router', 'PX', 60_000);
  await until(() => r.hget(`swy:batch:${batch.id}`, 'status'), (st) => st === 'finalizing', 30_000, 'finalizing');
  await new Promise((res) => setTimeout(res, 1000)); // five tracker ticks
  t.equal(await r.hget(`swy:batch:${batch.id}`, 'status'), 'finalizing', 'still finalizing: the files are the holder\'s to write');
  t.equal(await r.exists(`swy:file:file-${batch.id.slice('batch_'.length)}-output:data`), 0, 'not a piece written here');
  t.equal(await r.get(lease), 'another-router', 'the lease untouched');
  await r.del(lease); // the holder went away (its lease expired)
  const end = await until(() => client.batches.retrieve(batch.id), (x) => x.status === 'completed', 30_000, 'completed');
  const got = (await (await client.files.content(end.output_file_id!)).text()).trim().split('\n');
  t.equal(got.length, 20, 'then written here, whole');
  t.equal(await r.exists(lease), 0, 'and the lease released');
});

t.test('a file in the layout before lists (one string) downloads whole; one shorter than its record answers 500, never short', async (t) => {
  const { router, r } = await oneRouter(t, { batch: { fileChunkBytes: 65536 } });
  const bytes = Buffer.from(Array.from({ length: 3000 }, (_, i) => line(i)).join('\n') + '\n');
  const put = async (id: string, data: Buffer, recorded: number) => {
    await r.set(`swy:file:${id}:data`, data);
    await r.hset(`swy:file:${id}`, 'filename', 'old.jsonl', 'purpose', 'batch', 'bytes', String(recorded), 'created_at', '1700000000', 'tenant', '', 'expires_at', '');
    await r.zadd('swy:t:anon:files', Date.now(), id);
  };
  const id = `file-${'a'.repeat(32)}`;
  await put(id, bytes, bytes.length);
  const got = await slowGet(router.url, `/v1/files/${id}/content`);
  t.equal(got.status, 200);
  t.ok(got.complete && got.body.equals(bytes), `the ${bytes.length} bytes, read in fileChunkBytes ranges`);
  const short = `file-${'b'.repeat(32)}`;
  await put(short, bytes.subarray(0, 1000), bytes.length);
  const cut = await slowGet(router.url, `/v1/files/${short}/content`);
  t.equal(cut.status, 500, 'known before the head: an error answer');
  t.match(JSON.parse(cut.body.toString()), { error: { type: 'server_error', message: /not its recorded/ } });
});

t.test('native front end: a download pipelined behind a slow answer on one connection is sent whole (its wait for a drain does not hang)', async (t) => {
  const net = await import('node:net');
  const { router, client } = await oneRouter(t, { fleet: { timeScale: 1 }, extra: { server: { frontEnd: 'native' } } });
  const { toFile } = await import('openai');
  const upload = Buffer.from(Array.from({ length: 10_000 }, (_, i) => line(i).replace('long answer', `${'x'.repeat(2000)} `)).join('\n') + '\n');
  const file = await client.files.create({ file: await toFile(upload, 'big.jsonl'), purpose: 'batch' });
  const port = Number(new URL(router.url).port);
  const chat = JSON.stringify({ model: 'open-model', messages: [{ role: 'user', content: 'slow' }], max_tokens: 60 });
  // the download's slot fills while the chat answer is in front; once that is sent, the slot may go out whole at
  // once (no write completion, so no drain event): before the fix 2 of 12 such downloads stopped after one piece
  for (let round = 0; round < 10; round++) {
    const got = await new Promise<number>((resolve) => {
      const s = net.connect(port, '127.0.0.1');
      let n = 0;
      let tail = Buffer.alloc(0);
      const timer = setTimeout(() => {
        s.destroy();
        resolve(-n);
      }, 15_000);
      s.on('data', (b: Buffer) => {
        n += b.length;
        tail = Buffer.concat([tail, b]).subarray(-16);
        if (tail.includes('\r\n0\r\n\r\n')) {
          clearTimeout(timer);
          s.destroy();
          resolve(n);
        }
      });
      s.write(`POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(chat)}\r\n\r\n${chat}`);
      s.write(`GET /v1/files/${file.id}/content HTTP/1.1\r\nhost: x\r\n\r\n`);
    });
    if (got < 0) {
      t.fail(`round ${round}: the download stopped after ${-got} bytes`);
      return;
    }
    t.ok(got > upload.length, `round ${round}: both answers, whole (${got} bytes)`);
  }
});
