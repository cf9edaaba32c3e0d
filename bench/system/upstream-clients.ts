// `node dist/bench/upstream-clients.js`: the router's CPU per proxied request
// and throughput with each upstream client, in one run. One simulated engine
// at --time-scale 0 and one router process per client (same config apart from
// `proxy.client`), loaded in turn by wrk (1 thread) at several connection
// counts, in interleaved rounds (native, undici, native, undici, ... with the order
// flipped every round) so the VM's drift hits every client alike. CPU per
// request comes from /proc/<pid>/stat (utime + stime) over each wrk run
// divided by the requests wrk completed: it depends little on contention from
// other jobs, unlike req/s.
//   node dist/bench/upstream-clients.js [--seconds 3] [--rounds 3] [--connections 16,64,256] [--clients native,undici] [--json]
// (`h1`, the retired TypeScript client, is now an older name of native)
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CLI, cpuSeconds, freePort, start, waitReady, type Proc, runMain, option } from '../lib/proc.js';
import { hasWrk, runWrk } from '../lib/wrk.js';
import { median } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const argv = process.argv.slice(2);
const arg = (name: string, def: string) => option(argv, name) ?? def;
const seconds = Number(arg('--seconds', '3'));
const rounds = Number(arg('--rounds', '3'));
const connections = arg('--connections', '16,64,256').split(',').map(Number);
const clients = arg('--clients', 'native,undici').split(',');
const BODY = JSON.stringify({ model: 'open-model', prompt: 'Say hello to the benchmark.', max_tokens: 1 });



interface Run {
  rps: number;
  cpuUs: number;
  p50us: number;
  p99us: number;
  errors: number;
}

async function main(): Promise<void> {
  if (!(await hasWrk())) throw new Error('wrk is required (apt-get install wrk)');
  const enginePort = await freePort();
  const engineUrl = `http://127.0.0.1:${enginePort}`;
  const engine = start('engine', process.execPath, [CLI, 'sim', '--port', String(enginePort), '--time-scale', '0']);
  const dir = mkdtempSync(join(tmpdir(), 'swy-clients-'));
  const routers: { client: string; url: string; proc: Proc }[] = [];
  try {
    await waitReady(`${engineUrl}/health`);
    for (const client of clients) {
      const port = await freePort();
      const file = join(dir, `${client}.yaml`);
      writeFileSync(
        file,
        `apiVersion: switchyard/v1\nkind: Router\nlisten: { host: 127.0.0.1, port: ${port} }\nproxy: { client: ${client} }\n` +
          `logging: { level: warn }\npools:\n  - { name: default, models: [open-model], endpoints: [{ name: e0, url: "${engineUrl}" }] }\n`,
      );
      const proc = start(`router-${client}`, process.execPath, [CLI, 'serve', '--config', file]);
      routers.push({ client, url: `http://127.0.0.1:${port}`, proc });
    }
    for (const r of routers) await waitReady(`${r.url}/readyz`);
    // warm-up (JIT, connection pools)
    for (const r of routers) await runWrk(`${r.url}/v1/completions`, BODY, { connections: 64, threads: 1, seconds: 1 });
    const runs = new Map<string, Run[]>();
    for (let round = 0; round < rounds; round++) {
      for (const c of connections) {
        const order = round % 2 === 0 ? routers : [...routers].reverse();
        for (const r of order) {
          const pid = r.proc.child.pid;
          const c0 = cpuSeconds(pid);
          const w = await runWrk(`${r.url}/v1/completions`, BODY, { connections: c, threads: 1, seconds });
          const used = cpuSeconds(pid) - c0;
          const n = w.rps * seconds;
          const key = `${r.client}@${c}`;
          if (!runs.has(key)) runs.set(key, []);
          runs.get(key)!.push({ rps: w.rps, cpuUs: (used / n) * 1e6, p50us: w.p50Us, p99us: w.p99Us, errors: w.errors + w.non2xx });
        }
      }
    }
    const table = connections.map((c) => {
      const row: Record<string, Run> = {};
      for (const client of clients) {
        const xs = runs.get(`${client}@${c}`)!;
        row[client] = {
          rps: median(xs.map((x) => x.rps)),
          cpuUs: median(xs.map((x) => x.cpuUs)),
          p50us: median(xs.map((x) => x.p50us)),
          p99us: median(xs.map((x) => x.p99us)),
          errors: xs.reduce((a, x) => a + x.errors, 0),
        };
      }
      return { connections: c, ...row };
    });
    if (argv.includes('--json')) {
      console.log(JSON.stringify({ seconds, rounds, clients, table }));
      return;
    }
    const f = (n: number) => (Number.isFinite(n) ? Math.round(n).toLocaleString('en-US') : 'n/a');
    const base = clients[0]!;
    console.log(`upstream clients: ${rounds} interleaved round(s) of ${seconds} s per client and connection count (medians); wrk -t1; engine = switchyard sim --time-scale 0`);
    console.log(`| connections | client | req/s | router CPU µs/req | p50 µs | p99 µs | errors | CPU/req vs ${base} | req/s vs ${base} |`);
    console.log('|---:|---|---:|---:|---:|---:|---:|---:|---:|');
    for (const row of table) {
      const b = (row as unknown as Record<string, Run>)[base]!;
      for (const client of clients) {
        const x = (row as unknown as Record<string, Run>)[client]!;
        console.log(
          `| ${row.connections} | ${client} | ${f(x.rps)} | ${x.cpuUs.toFixed(1)} | ${f(x.p50us)} | ${f(x.p99us)} | ${x.errors} | ${((x.cpuUs / b.cpuUs) * 100).toFixed(0)} % | ${((x.rps / b.rps) * 100).toFixed(0)} % |`,
        );
      }
    }
  } finally {
    for (const r of routers) await r.proc.stop();
    await engine.stop();
  }
}

runMain(main);
