// The native addon inside worker threads and at environment teardown: a
// worker uses its own PrefixIndex and gets the same answers as the main
// thread; workers that exit or are terminated while holding large indexes
// (their memory is freed by the finalizers run at environment teardown) leave
// the process healthy; indexes dropped by the GC give their memory back.
import t from 'tap';
import { Worker } from 'node:worker_threads';
import { once } from 'node:events';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { existsSync, statSync } from 'node:fs';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { MatchResult, PrefixIndex } from '../../bindings/prefix-index.js';

// Workers load the compiled binding from dist/ when it is up to date (npm test
// compiles first; starting a worker with the TypeScript loader is slow, above
// all under the sanitizer), else the .ts source through tap's loader, which an
// eval'd worker does not inherit by itself (--import=...).
function bindingsFor(): { url: string; loaders: string[] } {
  const src = ['../../bindings/prefix-index.ts', '../../bindings/native.ts'].map((f) => fileURLToPath(new URL(f, import.meta.url)));
  const dist = ['../../dist/bindings/prefix-index.js', '../../dist/bindings/native.js'].map((f) => fileURLToPath(new URL(f, import.meta.url)));
  const fresh = dist.every((d, i) => existsSync(d) && statSync(d).mtimeMs >= statSync(src[i]!).mtimeMs);
  if (fresh) return { url: pathToFileURL(dist[0]!).href, loaders: [] };
  return {
    url: new URL('../../bindings/prefix-index.ts', import.meta.url).href,
    loaders: process.execArgv.filter((a) => a.startsWith('--import=')).map((a) => a.slice('--import='.length)),
  };
}
const { url: bindingsUrl, loaders } = bindingsFor();

function runWorker(body: string, workerData: unknown): Worker {
  const src = `
    const { parentPort, workerData: data } = require('node:worker_threads');
    (async () => { for (const l of ${JSON.stringify(loaders)}) await import(l); return import(${JSON.stringify(bindingsUrl)}); })()
      .then(async (pi) => { ${body} })
      .catch((err) => { parentPort.postMessage({ error: String(err && err.stack || err) }); });
  `;
  return new Worker(src, { eval: true, workerData });
}

async function exitOf(w: Worker): Promise<number> {
  const [code] = (await once(w, 'exit')) as [number];
  return code;
}

function promptOf(i: number, len: number): Buffer {
  const b = Buffer.alloc(len);
  for (let k = 0; k < len; k++) b[k] = (k * 31 + (k >> 9) * i) & 0xff;
  return b;
}

t.test('a worker thread uses its own index and agrees with the main thread', async (t) => {
  const body = `
    const idx = new pi.PrefixIndex({ maxEndpoints: 16 });
    const res = new pi.MatchResult();
    const out = [];
    for (let i = 0; i < data.prompts.length; i++) {
      const p = Buffer.from(data.prompts[i], 'base64');
      idx.matchPrompt(p, data.seed, Int32Array.of(0, 1, 2, 3), res);
      out.push([...res.matched.subarray(0, 4)]);
      idx.record(i % 4, res.hashes, res.hashCount);
    }
    parentPort.postMessage({ out, stats: idx.stats() });
  `;
  const prompts = Array.from({ length: 12 }, (_, i) => promptOf(i % 3, 2048 + 512 * (i % 4)));
  const seed = PrefixIndex.seedFor('m');
  const w = runWorker(body, { prompts: prompts.map((p) => p.toString('base64')), seed });
  const [msg] = (await once(w, 'message')) as [{ out?: number[][]; stats?: unknown; error?: string }];
  t.notOk(msg.error, msg.error ?? 'no error in the worker');
  const idx = new PrefixIndex({ maxEndpoints: 16 });
  const res = new MatchResult();
  const want: number[][] = [];
  for (let i = 0; i < prompts.length; i++) {
    idx.matchPrompt(prompts[i]!, seed, Int32Array.of(0, 1, 2, 3), res);
    want.push([...res.matched.subarray(0, 4)]);
    idx.record(i % 4, res.hashes, res.hashCount);
  }
  t.same(msg.out, want, 'same matches in the worker as on the main thread');
  t.same(msg.stats, idx.stats());
  t.ok(want.some((m) => m.some((x) => x > 0)), 'the sequence has prefix hits');
  t.equal(await exitOf(w), 0);
});

t.test('workers exiting or terminated while holding indexes: teardown frees them, no crash', async (t) => {
  // Each worker builds a few indexes with ~100k entries and then leaves in a
  // different way while they are still referenced.
  const body = `
    const keep = [];
    for (let n = 0; n < 3; n++) {
      const idx = new pi.PrefixIndex({ maxEndpoints: 8 });
      const keys = new BigUint64Array(32768);
      for (let ep = 0; ep < 4; ep++) {
        for (let i = 0; i < keys.length; i++) keys[i] = BigInt(n * 1e6 + ep * 1e5 + i + 1);
        idx.setCapacity(ep, [8192, 8192, 8192]);
        idx.record(ep, keys);
      }
      keep.push(idx);
    }
    globalThis.keep = keep;
    if (data.mode === 'exit') process.exit(0);
    if (data.mode === 'return') { parentPort.postMessage({ ready: true }); parentPort.close(); }
    if (data.mode === 'busy') {
      parentPort.postMessage({ ready: true });
      const res = new pi.MatchResult();
      const p = Buffer.alloc(32768, 7);
      for (;;) { keep[0].matchPrompt(p, 1n, Int32Array.of(0, 1, 2, 3), res); keep[0].record(1, res.hashes, res.hashCount); }
    }
  `;
  for (const mode of ['exit', 'return', 'busy']) {
    const w = runWorker(body, { mode });
    const exited = exitOf(w);
    const errors: string[] = [];
    w.on('message', (m: { error?: string }) => m.error && errors.push(m.error));
    if (mode === 'busy') {
      await once(w, 'message');
      await new Promise((r) => setTimeout(r, 50));
      await w.terminate();
    }
    const code = await exited;
    t.same(errors, [], `${mode}: no error`);
    t.ok(mode === 'busy' ? code === 1 : code === 0, `${mode}: worker exit code ${code}`);
  }
  // the main thread's addon is unaffected
  const idx = new PrefixIndex();
  idx.record(0, BigUint64Array.of(1n, 2n));
  t.same(idx.stats().entries, [2, 0, 0]);
});

t.test('several workers at once, each with its own index', async (t) => {
  const body = `
    const idx = new pi.PrefixIndex({ maxEndpoints: 64 });
    const res = new pi.MatchResult();
    const p = Buffer.alloc(8192);
    let hits = 0;
    for (let i = 0; i < 400; i++) {
      p.writeUInt32LE(i % 20, 4096);
      idx.matchPrompt(p, BigInt(data.id), Int32Array.of(0, 1, 2, 3, 4, 5, 6, 7), res);
      hits += res.matched[i % 8] > 0 ? 1 : 0;
      idx.record(i % 8, res.hashes, res.hashCount);
    }
    parentPort.postMessage({ hits, stats: idx.stats() });
  `;
  const ws = Array.from({ length: 3 }, (_, id) => runWorker(body, { id }));
  const exits = ws.map(exitOf);
  const msgs = await Promise.all(ws.map(async (w) => ((await once(w, 'message')) as [{ hits?: number; error?: string }])[0]));
  for (const m of msgs) {
    t.notOk(m.error, m.error ?? 'ok');
    t.ok((m.hits ?? 0) > 300, `prefix hits in a worker: ${m.hits}`);
  }
  t.same(new Set(msgs.map((m) => JSON.stringify((m as { stats?: unknown }).stats))).size, 1, 'all workers built identical indexes');
  t.same(await Promise.all(exits), [0, 0, 0]);
});

t.test('indexes dropped by the garbage collector give their memory back', { skip: process.env.SWITCHYARD_UNDER_ASAN === '1' && 'ASan quarantines freed memory' }, async (t) => {
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  const keys = new BigUint64Array(100_000);
  for (let i = 0; i < keys.length; i++) keys[i] = BigInt(i + 1);
  const fill = () => {
    const idx = new PrefixIndex();
    idx.setCapacity(0, [100_000, 0, 0]);
    idx.record(0, keys);
    return idx.stats().bytes;
  };
  const per = fill();
  for (let i = 0; i < 5; i++) fill();
  gc();
  await new Promise((r) => setTimeout(r, 10));
  gc();
  const before = process.memoryUsage().rss;
  const rounds = 60;
  for (let i = 0; i < rounds; i++) {
    fill();
    if (i % 5 === 4) {
      gc();
      await new Promise((r) => setTimeout(r, 1));
    }
  }
  gc();
  await new Promise((r) => setTimeout(r, 10));
  gc();
  const grown = process.memoryUsage().rss - before;
  t.ok(grown < (per * rounds) / 4, `RSS grew ${(grown / 1e6).toFixed(1)} MB; leaking would be ${((per * rounds) / 1e6).toFixed(0)} MB`);
});

t.test('native memory is reported to V8, so dropped indexes are collected without explicit gc()', { skip: process.env.SWITCHYARD_UNDER_ASAN === '1' && 'ASan quarantines freed memory' }, async (t) => {
  const keys = new BigUint64Array(100_000);
  for (let i = 0; i < keys.length; i++) keys[i] = BigInt(i + 1);
  const before = process.memoryUsage().rss;
  let per = 0;
  const rounds = 100;
  for (let i = 0; i < rounds; i++) {
    const idx = new PrefixIndex();
    idx.setCapacity(0, [100_000, 0, 0]);
    idx.record(0, keys);
    per = idx.stats().bytes;
    await new Promise((r) => setImmediate(r)); // finalizers run from the event loop
  }
  const grown = process.memoryUsage().rss - before;
  t.ok(grown < (per * rounds) / 2, `RSS grew ${(grown / 1e6).toFixed(0)} MB; without collection it would be ${((per * rounds) / 1e6).toFixed(0)} MB`);
});
