// Scenario `fleet-shares` (issue 32, item 1's last bullet): do a tenant's
// share and premium's priority hold across active-active replicas, when the
// requests of a tenant or a band do not reach every replica alike?
//
// Two router processes with flow control in front of one fleet that the load
// saturates (every engine's batch limit set: `pools[].batchLimit` = the
// engines' own), in three modes in the same run, each on a fresh fleet:
// `single` (one router gets every client: the reference, one scheduler that
// sees everything), `off` (two replicas, ha active-active with
// `shareFlows: false`: load and prefix records shared, flows not) and `on`
// (the default, `shareFlows: true`). Two workloads, each closed-loop clients
// for `--seconds`:
//
// - tenants: tenant a's clients on both replicas, tenant b's (as many as a's
//   on one replica) on the second only. Fair: b gets half of the fleet's
//   answers; each replica alone gives b half of the second replica's.
// - bands: a standard tenant's clients on the first replica, fewer premium
//   clients (a declared premium flow, as many as half the fleet's slots) on
//   the second; `admission.maxUtilisation: 1`, so no slot is kept for premium
//   and it must win each freed slot. Premium's share of the answers and its latency p50 / p90,
//   against the single router's.
//
// --engine sim|model|sim,model: the simulator (`switchyard sim`), the
// independent reference engine model (testkit/reference/engine-model.ts), or
// both in turn.
//
//   flock /tmp/switchyard-bench.lock node dist/bench/system/fleet-shares.js
//        [--engine sim,model] [--seconds 8] [--clients 12] [--engines 2] [--slots 4] [--max-tokens 12]
//        [--itl-ms 10] [--hold-ms 60] [--modes single,off,on] [--json out.json]
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Pool } from 'undici';
import { CLI, freePort, freePortRange, intOption, option, start, stopAll, waitReady } from '../lib/proc.js';
import { fmt, quantile } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';
import { fleetKinds, startEngineFleet, startRedisServer, type FleetKind } from '../lib/fleet.js';

exitOnHelp(import.meta.url);


type Mode = 'single' | 'off' | 'on';
type Workload = 'tenants' | 'bands';

interface Opts {
  seconds: number;
  clients: number;
  engines: number;
  slots: number;
  maxTokens: number;
  itlMs: number;
  holdMs: number;
}

interface Row {
  engine: string;
  workload: Workload;
  mode: Mode;
  /** Answers 200 by class (tenants: a, b; bands: standard, premium). */
  ok: Record<string, number>;
  /** Latency p50 / p90 by class, ms. */
  p50: Record<string, number>;
  p90: Record<string, number>;
  errors: number;
  holds: number;
  expired: number;
}

function startEngines(kind: FleetKind, o: Opts, base: number): ReturnType<typeof start> {
  return startEngineFleet(kind === 'model' ? 'engine-model' : 'sim', kind, { engines: o.engines, basePort: base, slots: o.slots, prefillOverheadMs: 2, itlMs: o.itlMs });
}

function sum(text: string, name: string, match: string): number {
  let n = 0;
  for (const line of text.split('\n')) if (line.startsWith(name + '{') && line.includes(match)) n += Number(line.slice(line.lastIndexOf(' ') + 1)) || 0;
  return n;
}

async function runMode(kind: FleetKind, workload: Workload, mode: Mode, o: Opts, dir: string): Promise<Row> {
  const base = await freePortRange(o.engines);
  const engines = startEngines(kind, o, base);
  const engineUrls = Array.from({ length: o.engines }, (_, i) => `http://127.0.0.1:${base + i}`);
  let redis: ReturnType<typeof start> | null = null;
  const procs: ReturnType<typeof start>[] = [];
  try {
    for (const u of engineUrls) await waitReady(`${u}/health`, 60_000);
    let ha = '';
    if (mode !== 'single') {
      const r = await startRedisServer('fleet-shares');
      redis = r.proc;
      ha = `ha: { redis: "${r.url}", shareFlows: ${mode === 'on'}, flowHoldMs: ${o.holdMs} }\n`;
    }
    const n = mode === 'single' ? 1 : 2;
    const ports: number[] = [];
    for (let k = 0; k < n; k++) ports.push(await freePort());
    const endpoints = engineUrls.map((u, i) => `      - { name: e${i}, url: "${u}" }`).join('\n');
    for (let k = 0; k < n; k++) {
      const cfg = join(dir, `${kind}-${workload}-${mode}-${k}.yaml`);
      writeFileSync(
        cfg,
        `apiVersion: switchyard/v1\nkind: Router\nlisten: { host: 127.0.0.1, port: ${ports[k]} }\nlogging: { level: warn }\n` +
          `dataLayer: { healthTimeoutMs: 10000 }\n` +
          `pools:\n  - name: p\n    engine: vllm\n    models: [open-model]\n    batchLimit: ${o.slots}\n    endpoints:\n${endpoints}\n` +
          `flowControl:\n  ttl: 60s\n  admission: { mode: "off", maxUtilisation: 1 }\n  flows:\n    - { id: "tenant:p", priority: premium }\n` +
          ha,
      );
      procs.push(start(`router-${mode}-${k}`, process.execPath, [CLI, 'serve', '--config', cfg]));
    }
    for (const p of ports) await waitReady(`http://127.0.0.1:${p}/readyz`, 60_000);
    const pools = ports.map((p) => new Pool(`http://127.0.0.1:${p}`, { connections: 128 }));
    // the clients: [router index in the two-replica layout, class, tenant]
    const clients: Array<[number, string, string]> = [];
    if (workload === 'tenants') {
      for (let i = 0; i < o.clients; i++) clients.push([0, 'a', 'a'], [1, 'a', 'a'], [1, 'b', 'b']);
    } else {
      for (let i = 0; i < 2 * o.clients; i++) clients.push([0, 'standard', 's']);
      for (let i = 0; i < Math.max(1, (o.engines * o.slots) / 2); i++) clients.push([1, 'premium', 'p']);
    }
    const lat = new Map<string, number[]>();
    let errors = 0;
    let measuring = false;
    let stop = false;
    const loop = async (pool: Pool, cls: string, tenant: string, k: number) => {
      for (let q = 0; !stop; q++) {
        const t0 = performance.now();
        try {
          const r = await pool.request({
            method: 'POST',
            path: '/v1/chat/completions',
            headers: { 'content-type': 'application/json', 'x-tenant-id': tenant },
            body: JSON.stringify({ model: 'open-model', messages: [{ role: 'user', content: `client ${k} of ${tenant}, request ${q}` }], max_tokens: o.maxTokens }),
          });
          await r.body.text();
          if (!measuring) continue;
          if (r.statusCode !== 200) errors++;
          else {
            let a = lat.get(cls);
            if (a === undefined) lat.set(cls, (a = []));
            a.push(performance.now() - t0);
          }
        } catch {
          if (measuring) errors++;
        }
      }
    };
    const runs = clients.map(([ri, cls, tenant], k) => loop(pools[mode === 'single' ? 0 : ri]!, cls, tenant, k));
    // a second to fill the queues, then the measured window
    await new Promise((r) => setTimeout(r, 1000));
    const before = await Promise.all(ports.map(async (p) => (await fetch(`http://127.0.0.1:${p}/metrics`)).text()));
    measuring = true;
    await new Promise((r) => setTimeout(r, o.seconds * 1000));
    measuring = false;
    const after = await Promise.all(ports.map(async (p) => (await fetch(`http://127.0.0.1:${p}/metrics`)).text()));
    stop = true;
    await Promise.all(runs);
    await Promise.all(pools.map((p) => p.close()));
    const row: Row = { engine: kind, workload, mode, ok: {}, p50: {}, p90: {}, errors, holds: 0, expired: 0 };
    for (const [cls, a] of lat) {
      row.ok[cls] = a.length;
      row.p50[cls] = quantile(a, 0.5);
      row.p90[cls] = quantile(a, 0.9);
    }
    for (let k = 0; k < n; k++) {
      row.holds += sum(after[k]!, 'switchyard_flow_fleet_holds_total', '') - sum(before[k]!, 'switchyard_flow_fleet_holds_total', '');
      row.expired += sum(after[k]!, 'switchyard_flow_fleet_holds_total', 'outcome="expired"') - sum(before[k]!, 'switchyard_flow_fleet_holds_total', 'outcome="expired"');
    }
    console.error(`${kind} ${workload} ${mode}: ${JSON.stringify(row.ok)} p90 ${JSON.stringify(Object.fromEntries(Object.entries(row.p90).map(([k, v]) => [k, Math.round(v)])))} errors ${errors} holds ${row.holds} (expired ${row.expired})`);
    return row;
  } finally {
    // the routers first (they drain to the engines and say goodbye on Redis), then what they used
    await stopAll(...procs);
    await stopAll(engines, redis);
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const argv = process.argv.slice(2);
  const arg = (name: string) => option(argv, name);
  const kinds = fleetKinds(arg('--engine'));
  const int = (name: string, dflt: number, min: number) => intOption(argv, name, dflt, min);
  const o: Opts = { seconds: int('--seconds', 8, 1), clients: int('--clients', 12, 1), engines: int('--engines', 2, 1), slots: int('--slots', 4, 1), maxTokens: int('--max-tokens', 12, 1), itlMs: int('--itl-ms', 10, 1), holdMs: int('--hold-ms', 60, 1) };
  const modes = (arg('--modes') ?? 'single,off,on').split(',') as Mode[];
  for (const m of modes) if (m !== 'single' && m !== 'off' && m !== 'on') throw new Error(`--modes takes single, off, on (got ${m})`);
  const dir = mkdtempSync(join(tmpdir(), 'swy-fleet-shares-'));
  const rows: Row[] = [];
  for (const kind of kinds) for (const w of ['tenants', 'bands'] as const) for (const m of modes) rows.push(await runMode(kind, w, m, o, dir));
  console.log(
    `fleet: ${o.engines} engines × ${o.slots} slots (batchLimit set), ITL ${o.itlMs} ms, ${o.maxTokens} output tokens a request; ${o.seconds} s measured after 1 s; ` +
      `tenants: ${o.clients} clients of a on each replica, ${o.clients} of b on the second; bands: ${2 * o.clients} standard on the first, ${Math.max(1, (o.engines * o.slots) / 2)} premium on the second (premium's demand: half the slots; admission.maxUtilisation 1, so standard may take every slot); ha.flowHoldMs ${o.holdMs}\n`,
  );
  console.log('| engine | workload | mode | answers | share of b / premium | p50 ms (a or standard / b or premium) | p90 ms | errors | holds (expired) |');
  console.log('|---|---|---|---|---:|---|---|---:|---:|');
  for (const r of rows) {
    const [x, y] = r.workload === 'tenants' ? ['a', 'b'] : ['standard', 'premium'];
    const nx = r.ok[x] ?? 0;
    const ny = r.ok[y] ?? 0;
    console.log(
      `| ${r.engine} | ${r.workload} | ${r.mode} | ${nx} / ${ny} | ${fmt((100 * ny) / Math.max(1, nx + ny))} % | ${fmt(r.p50[x] ?? NaN)} / ${fmt(r.p50[y] ?? NaN)} | ${fmt(r.p90[x] ?? NaN)} / ${fmt(r.p90[y] ?? NaN)} | ${r.errors} | ${r.holds} (${r.expired}) |`,
    );
  }
  const json = arg('--json');
  if (json) writeFileSync(json, JSON.stringify({ opts: o, rows }, null, 2));
}
