// Issue 13, benchmark 3: the cost of state. Router CPU per request of a
// Responses turn at chain length 1, 10 and 100 against the equivalent chat
// completion (the same messages, sent by the client) through the same router,
// for the memory, SQLite and Redis stores. One simulated engine at
// --time-scale 0 (answers at once) and each router in its own process; a
// closed loop of `--concurrency` clients for `--seconds` per window; windows
// alternate chat / responses so drift hits both (wrk when installed). CPU per request = the
// router process's utime + stime over a window / requests in it.
//
// A turn "at chain length L" continues the L-1'th response of one chain
// (every measured turn branches off the same response: each reads one record
// holding L-1 turns and stores a new one holding L). Turns are ~256 bytes of
// input and 8 output tokens, so the rebuilt conversation at L = 100 is
// ~30 KB. The store's own cost on the event loop is measured too, in-process:
// get + put per turn (µs) for each store and chain length.
//   node dist/bench/responses-state.js [--seconds 3] [--rounds 3] [--concurrency 8] [--ops-only] [--json]
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { spawn } from 'node:child_process';
import { CLI, cpuSeconds, freePort, start, waitReady, runMain, option, type Proc } from '../lib/proc.js';
import { median } from '../lib/stats.js';
import { hasWrk, runWrk } from '../lib/wrk.js';
import { MemoryStore } from '../../src/responses/memory-store.js';
import { SqliteStore } from '../../src/responses/sqlite-store.js';
import { SyncSqliteStore } from '../lib/sqlite-sync-store.js';
import { performance as perfHooks } from 'node:perf_hooks';
import { RedisStore } from '../../src/responses/redis-store.js';
import type { ResponseStore, StoredResponse } from '../../src/responses/store.js';
import { RESPONSES_DEFAULTS, type ResponsesConfig } from '../../src/config/responses.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const argv = process.argv.slice(2);
const seconds = Number(option(argv, '--seconds') ?? '3');
const rounds = Number(option(argv, '--rounds') ?? '3');
const concurrency = Number(option(argv, '--concurrency') ?? '8');
const LENGTHS = [1, 10, 100];
const TURN_INPUT = 256;
const MAX_OUT = 8;
let useWrk = false;

function text(seed: number, n: number): string {
  let s = `turn ${seed}: `;
  while (s.length < n) s += `word${(seed * 31 + s.length) % 97} `;
  return s.slice(0, n);
}

async function postJson(url: string, path: string, body: unknown): Promise<any> {
  const r = await fetch(url + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const j = await r.json();
  if (r.status !== 200) throw new Error(`${path}: HTTP ${r.status} ${JSON.stringify(j)}`);
  return j;
}

/** A chain of `len - 1` stored turns; returns the last id ('' for len 1) and its messages as chat messages. */
async function buildChain(url: string, len: number): Promise<{ prev: string; messages: { role: string; content: string }[] }> {
  let prev = '';
  const messages: { role: string; content: string }[] = [];
  for (let i = 0; i < len - 1; i++) {
    const input = text(i, TURN_INPUT);
    const r = await postJson(url, '/v1/responses', { model: 'open-model', input, max_output_tokens: MAX_OUT, ...(prev ? { previous_response_id: prev } : {}) });
    prev = r.id;
    messages.push({ role: 'user', content: input }, { role: 'assistant', content: r.output[0].content[0].text });
  }
  messages.push({ role: 'user', content: text(len, TURN_INPUT) });
  return { prev, messages };
}

/** Closed loop: `concurrency` connections sending `body` to `path` for `seconds` (wrk when installed); returns requests done. */
async function loop(url: string, path: string, body: string, secs = seconds): Promise<number> {
  if (useWrk) {
    const r = await runWrk(url + path, body, { connections: concurrency, threads: 1, seconds: secs });
    if (r.non2xx > 0 || r.errors > 0) throw new Error(`${path}: ${r.non2xx} non-2xx answers, ${r.errors} errors`);
    return r.requests;
  }
  const end = performance.now() + secs * 1000;
  let n = 0;
  const worker = async () => {
    while (performance.now() < end) {
      const r = await fetch(url + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
      await r.arrayBuffer();
      if (r.status !== 200) throw new Error(`${path}: HTTP ${r.status}`);
      n++;
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return n;
}

interface Row {
  store: string;
  length: number;
  chatCpuUs: number;
  respCpuUs: number;
  addedCpuUs: number;
  ratio: number;
  chatRps: number;
  respRps: number;
}

async function measureRouter(store: string, url: string, router: Proc): Promise<Row[]> {
  const rows: Row[] = [];
  for (const len of LENGTHS) {
    const { prev, messages } = await buildChain(url, len);
    const chatBody = JSON.stringify({ model: 'open-model', messages, max_tokens: MAX_OUT });
    const respBody = JSON.stringify({ model: 'open-model', input: messages[messages.length - 1]!.content, max_output_tokens: MAX_OUT, ...(prev ? { previous_response_id: prev } : {}) });
    // warm-up
    await loop(url, '/v1/chat/completions', chatBody, 1);
    await loop(url, '/v1/responses', respBody, 1);
    const chat: number[] = [];
    const resp: number[] = [];
    const chatRps: number[] = [];
    const respRps: number[] = [];
    for (let r = 0; r < rounds; r++) {
      for (const [path, body, cpu, rps] of [
        ['/v1/chat/completions', chatBody, chat, chatRps],
        ['/v1/responses', respBody, resp, respRps],
      ] as const) {
        const c0 = cpuSeconds(router.child.pid);
        const n = await loop(url, path, body);
        cpu.push(((cpuSeconds(router.child.pid) - c0) / n) * 1e6);
        rps.push(n / seconds);
      }
    }
    const c = median(chat);
    const p = median(resp);
    rows.push({ store, length: len, chatCpuUs: c, respCpuUs: p, addedCpuUs: p - c, ratio: p / c, chatRps: median(chatRps), respRps: median(respRps) });
  }
  return rows;
}

/**
 * µs per get + put of a turn at each chain length (awaited one at a time), and how much of it the event
 * loop was busy (perfHooks.eventLoopUtilization: the time the loop ran code, not the time it waited
 * for a worker thread or a socket).
 */
async function storeOps(
  name: string,
  s: ResponseStore,
): Promise<{ store: string; length: number; getUs: number; putUs: number; getLoopUs: number; putLoopUs: number; recordBytes: number }[]> {
  const out = [];
  for (const len of LENGTHS) {
    const turn = `{"role":"user","content":${JSON.stringify(text(len, TURN_INPUT))}},{"role":"assistant","content":"word word word word word word word word"}`;
    const conv = Array.from({ length: len }, () => turn).join(',');
    const response = JSON.stringify({ id: 'x', object: 'response', output: [{ content: [{ text: 'word '.repeat(8) }] }], pad: 'p'.repeat(900) });
    const n = len === 100 ? 300 : 1000;
    const ids: string[] = [];
    let e0 = perfHooks.eventLoopUtilization();
    let t0 = performance.now();
    for (let i = 0; i < n; i++) {
      const id = `resp_bench_${name}_${len}_${i}`;
      ids.push(id);
      const rec: StoredResponse = { tenant: '', id, root: id, parent: '', createdAt: 0, conv, ids: 'msg_x,'.repeat(len * 2), response };
      const p = s.put(rec);
      if (p) await p;
    }
    const putUs = ((performance.now() - t0) * 1000) / n;
    const putLoopUs = (perfHooks.eventLoopUtilization(e0).active * 1000) / n;
    e0 = perfHooks.eventLoopUtilization();
    t0 = performance.now();
    for (const id of ids) {
      const g = s.get('', id);
      if (g && typeof (g as Promise<unknown>).then === 'function') await g;
    }
    const getUs = ((performance.now() - t0) * 1000) / n;
    const getLoopUs = (perfHooks.eventLoopUtilization(e0).active * 1000) / n;
    out.push({ store: name, length: len, getUs, putUs, getLoopUs, putLoopUs, recordBytes: conv.length + response.length });
  }
  return out;
}

async function startRedisServer(): Promise<{ url: string; stop(): void }> {
  const port = await freePort();
  const child = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--maxmemory', '256mb', '--maxmemory-policy', 'allkeys-lru'], { stdio: 'ignore' });
  await new Promise((r) => setTimeout(r, 300));
  return { url: `redis://127.0.0.1:${port}`, stop: () => child.kill('SIGKILL') };
}

async function main(): Promise<void> {
  const procs: Proc[] = [];
  useWrk = await hasWrk();
  const redis = await startRedisServer();
  const dir = mkdtempSync(join(tmpdir(), 'swy-resp-state-'));
  try {
    const ep = await freePort();
    procs.push(start('engine', process.execPath, [CLI, 'sim', '--port', String(ep), '--time-scale', '0', '--max-model-len', '131072']));
    await waitReady(`http://127.0.0.1:${ep}/health`);
    const stores: [string, string][] = [
      ['memory', '{ type: memory }'],
      ['sqlite', `{ type: sqlite, path: "${join(dir, 'r.db')}" }`],
      ['redis', `{ type: redis, url: "${redis.url}" }`],
    ];
    const rows: Row[] = [];
    // --ops-only: just the in-process store operations (seconds), not the routers' CPU per request
    for (const [name, storeYaml] of argv.includes('--ops-only') ? [] : stores) {
      const rp = await freePort();
      const cfg = join(dir, `${name}.yaml`);
      writeFileSync(
        cfg,
        `apiVersion: switchyard/v1\nkind: Router\nlisten: { host: 127.0.0.1, port: ${rp} }\nlogging: { level: warn }\nproxy: { client: native }\n` +
          // no background scrapes or health checks: their CPU would be charged to the requests
          `dataLayer: { scrapeIntervalMs: 0, healthIntervalMs: 0 }\n` +
          `pools:\n  - { name: p, models: [open-model], endpoints: [{ name: e0, url: "http://127.0.0.1:${ep}" }] }\n` +
          `responses: { store: ${storeYaml}, maxBytes: 104857600 }\n`,
      );
      const router = start(`router-${name}`, process.execPath, [CLI, 'serve', '--config', cfg]);
      procs.push(router);
      const url = `http://127.0.0.1:${rp}`;
      await waitReady(`${url}/readyz`);
      rows.push(...(await measureRouter(name, url, router)));
      await router.stop();
    }
    const cfg: ResponsesConfig = { ...RESPONSES_DEFAULTS, store: { ...RESPONSES_DEFAULTS.store, path: join(dir, 'ops.db'), url: redis.url } };
    const mem = new MemoryStore(cfg);
    const lite = await SqliteStore.open(cfg);
    const red = new RedisStore({ ...cfg, store: { ...cfg.store, keyPrefix: 'bench:' } });
    await red.waitReady(3000);
    // the baseline: the same file format with every statement on the event loop (the store before session 7)
    const sync = new SyncSqliteStore({ ...cfg, store: { ...cfg.store, path: join(dir, 'ops-sync.db') } });
    const ops = [
      ...(await storeOps('memory', mem)),
      ...(await storeOps('sqlite (on the loop, before)', sync)),
      ...(await storeOps('sqlite (worker)', lite)),
      ...(await storeOps('redis', red)),
    ];
    await Promise.all([mem.close(), sync.close(), lite.close(), red.close()]);
    if (argv.includes('--json')) {
      console.log(JSON.stringify({ rows, ops }));
      return;
    }
    console.log('router CPU per request (µs), Responses turn vs the equivalent chat completion');
    console.log('| store | chain length | chat completion | Responses turn | added | ratio | chat req/s | responses req/s |');
    console.log('|---|---:|---:|---:|---:|---:|---:|---:|');
    for (const r of rows) {
      console.log(
        `| ${r.store} | ${r.length} | ${r.chatCpuUs.toFixed(0)} | ${r.respCpuUs.toFixed(0)} | ${r.addedCpuUs.toFixed(0)} | ${r.ratio.toFixed(2)} | ${r.chatRps.toFixed(0)} | ${r.respRps.toFixed(0)} |`,
      );
    }
    console.log('\nstore operations (µs per op, awaited one at a time: memory on the event loop; sqlite a round trip to its worker thread; redis a network round trip)');
    console.log('| store | chain length | record bytes | put | get | event loop busy per put | per get |');
    console.log('|---|---:|---:|---:|---:|---:|---:|');
    for (const o of ops) {
      console.log(`| ${o.store} | ${o.length} | ${o.recordBytes} | ${o.putUs.toFixed(1)} | ${o.getUs.toFixed(1)} | ${o.putLoopUs.toFixed(1)} | ${o.getLoopUs.toFixed(1)} |`);
    }
  } finally {
    await Promise.all(procs.map((p) => p.stop()));
    redis.stop();
  }
}

runMain(main);
