// What a stored conversation costs in each Responses store when a
// continuation is kept as what its turn added (linked to its parent's part)
// against the same records kept whole (every record its whole conversation:
// the layout before parts, which every store still writes for a record
// without addedConv): the same run, the same records, two ways.
//
// Two shapes: a first turn of --root-bytes (60 KB) with --branches (40)
// continuations of it, and one chain of --chain (100) turns of ~300 bytes.
// Reported per store and layout: bytes held (memory, SQLite: the store's own
// count; Redis: MEMORY USAGE of its keys), and µs per get + put of a turn at
// the chain's end (awaited one at a time).
//   node dist/bench/micro/responses-branches.js [--root-bytes 60000] [--branches 40] [--chain 100] [--rounds 200] [--repeats 5]
import { spawn } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { MemoryStore } from '../../src/responses/memory-store.js';
import { SqliteStore } from '../../src/responses/sqlite-store.js';
import { RedisStore } from '../../src/responses/redis-store.js';
import type { ResponseStore, StoredResponse } from '../../src/responses/store.js';
import { RESPONSES_DEFAULTS, type ResponsesConfig } from '../../src/config/responses.js';
import { exitOnHelp } from '../lib/help.js';
import { freePort, option } from '../lib/proc.js';

exitOnHelp(import.meta.url);
const argv = process.argv.slice(2);
const rootBytes = Number(option(argv, '--root-bytes') ?? '60000');
const nBranches = Number(option(argv, '--branches') ?? '40');
const chainLen = Number(option(argv, '--chain') ?? '100');
const rounds = Number(option(argv, '--rounds') ?? '200');
const repeats = Number(option(argv, '--repeats') ?? '5');

let seq = 0;
const newId = () => `resp_${(++seq).toString(16).padStart(48, '0')}`;
const msgId = () => `msg_${(++seq).toString(16).padStart(48, '0')}`;
const response = (id: string) => JSON.stringify({ id, object: 'response', status: 'completed', output: [{ type: 'message', content: [{ type: 'output_text', text: 'x'.repeat(200) }] }] });

/** A turn on top of `parent` (null: a first turn), linked or whole. */
function turn(tenant: string, parent: StoredResponse | null, input: string, linked: boolean): StoredResponse {
  const id = newId();
  const added = `{"role":"user","content":${JSON.stringify(input)}},{"role":"assistant","content":"an answer of some forty characters here"}`;
  const addedIds = `${msgId()},${msgId()}`;
  return {
    tenant,
    id,
    root: parent === null ? id : parent.root,
    parent: parent === null ? '' : parent.id,
    createdAt: 1,
    conv: parent === null ? added : `${parent.conv},${added}`,
    ids: parent === null ? addedIds : `${parent.ids},${addedIds}`,
    response: response(id),
    addedConv: linked && parent !== null ? added : undefined,
    addedIds: linked && parent !== null ? addedIds : undefined,
  };
}

async function put(s: ResponseStore, r: StoredResponse): Promise<StoredResponse> {
  await s.put(r);
  return r;
}

let measured = 0;

interface Row {
  store: string;
  layout: string;
  branchBytes: number;
  chainBytes: number;
  turnUs: number;
}

async function measure(name: string, s: ResponseStore, bytes: (tenant: string) => Promise<number>, linked: boolean): Promise<Row> {
  const tag = `${name}-${linked ? 'l' : 'w'}-${++measured}`;
  // branches of one large first turn
  const tb = `${tag}-b`;
  const root = await put(s, turn(tb, null, 'x'.repeat(rootBytes), linked));
  for (let i = 0; i < nBranches; i++) await put(s, turn(tb, root, `branch ${i}`, linked));
  const branchBytes = await bytes(tb);
  // one long chain of ~300-byte turns
  const tc = `${tag}-c`;
  let last: StoredResponse | null = null;
  for (let i = 0; i < chainLen; i++) last = await put(s, turn(tc, last, `turn ${i} ${'y'.repeat(150)}`, linked));
  const chainBytes = await bytes(tc);
  // a turn at the chain's end: read the last record, store a branch of it (each round a new branch)
  const t0 = performance.now();
  for (let i = 0; i < rounds; i++) {
    const p = await s.get(tc, last!.id);
    if (p === null) throw new Error(`${name}: the chain's last record is gone`);
    await s.put(turn(tc, p, `round ${i}`, linked));
  }
  const turnUs = ((performance.now() - t0) * 1000) / rounds;
  return { store: name, layout: linked ? 'linked (parts)' : 'whole (baseline)', branchBytes, chainBytes, turnUs };
}

async function main(): Promise<void> {
  const cfg: ResponsesConfig = { ...RESPONSES_DEFAULTS, maxBytes: 1 << 30, maxResponses: 1_000_000 };
  const dir = mkdtempSync(join(tmpdir(), 'swy-branches-'));
  const port = await freePort();
  const redisProc = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
  await new Promise((r) => setTimeout(r, 300));
  const url = `redis://127.0.0.1:${port}`;
  const rows: Row[] = [];
  try {
    const mem = new MemoryStore(cfg);
    const lite = await SqliteStore.open({ ...cfg, store: { ...cfg.store, type: 'sqlite', path: join(dir, 'b.db') } });
    const red = new RedisStore({ ...cfg, store: { ...cfg.store, type: 'redis', url, keyPrefix: 'bench:' } });
    await red.waitReady(5000);
    const probe = new Redis(url);
    const redisBytes = async (tenant: string) => {
      let n = 0;
      for (const k of await probe.keys(`bench:*${tenant.length}:${tenant}:*`)) n += (await probe.memory('USAGE', k)) ?? 0;
      return n;
    };
    // SQLite's count is the whole file's: the difference a tenant's records made
    let liteBase = 0;
    // the layouts alternate, `repeats` times: drift hits both; the table gives medians
    for (let k = 0; k < repeats * 2; k++) {
      const linked = k % 2 === 1;
      rows.push(await measure('memory', mem, async (t) => mem.bytesOf(t), linked));
      liteBase = lite.bytes;
      let mark = liteBase;
      rows.push(
        await measure(
          'sqlite',
          lite,
          async () => {
            await lite.get('-', '-'); // the worker's totals arrive with an answer
            const b = lite.bytes - mark;
            mark = lite.bytes;
            return b;
          },
          linked,
        ),
      );
      rows.push(await measure('redis', red, redisBytes, linked));
    }
    probe.disconnect();
    await Promise.all([mem.close(), lite.close(), red.close()]);
  } finally {
    redisProc.kill('SIGKILL');
  }
  console.log(`Responses stores: ${nBranches} branches of a ${rootBytes}-byte first turn, a ${chainLen}-turn chain of ~300-byte turns, a turn (get + put) at its end (${rounds} rounds)`);
  console.log(`(medians of ${repeats} alternating repeats; every repeat's turn time in brackets)`);
  console.log('| store | layout | bytes held: branches | bytes held: chain | µs per turn at the chain end |');
  console.log('|---|---|---:|---:|---:|');
  const med = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1]!;
  const summary: Row[] = [];
  for (const layout of ['whole (baseline)', 'linked (parts)']) {
    for (const name of ['memory', 'sqlite', 'redis']) {
      const rs = rows.filter((r) => r.store === name && r.layout === layout);
      const m: Row = { store: name, layout, branchBytes: med(rs.map((r) => r.branchBytes)), chainBytes: med(rs.map((r) => r.chainBytes)), turnUs: med(rs.map((r) => r.turnUs)) };
      summary.push(m);
      console.log(`| ${name} | ${layout} | ${m.branchBytes.toLocaleString('en-US')} | ${m.chainBytes.toLocaleString('en-US')} | ${m.turnUs.toFixed(1)} [${rs.map((r) => r.turnUs.toFixed(0)).join(', ')}] |`);
    }
  }
  console.log('\nlinked ÷ whole, same run (medians):');
  for (const name of ['memory', 'sqlite', 'redis']) {
    const w = summary.find((r) => r.store === name && r.layout.startsWith('whole'))!;
    const l = summary.find((r) => r.store === name && r.layout.startsWith('linked'))!;
    console.log(`  ${name}: branches ${(l.branchBytes / w.branchBytes).toFixed(3)}×, chain ${(l.chainBytes / w.chainBytes).toFixed(3)}×, turn time ${(l.turnUs / w.turnUs).toFixed(2)}×`);
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
