// Scenario `overhead` (comparative): the cost per request of Switchyard against
// the proxies users would otherwise put in front of an engine. One simulated
// engine at --time-scale 0 answers at once; wrk sends the same small
// non-streaming request at several fixed concurrency levels, directly and
// through Switchyard, nginx (proxy_pass, upstream keepalive) and HAProxy, in
// one run. Every proxy runs as one process with one worker thread.
//
//   node dist/bench/overhead-proxies.js [--seconds 5] [--concurrency 16,64,256]
import { CLI, freePort, start, waitReady, type Proc } from './lib/proc.js';
import { startHaproxy, startNginx } from './lib/proxies.js';
import { hasWrk, runWrk, type WrkResult } from './lib/wrk.js';
import { fmt } from './lib/stats.js';

export interface OverheadRow {
  target: string;
  concurrency: number;
  rps: number;
  p50Us: number;
  p99Us: number;
  addedP50Us: number;
  addedP99Us: number;
  errors: number;
}

export const REQUEST_BODY = JSON.stringify({ model: 'open-model', prompt: 'Say hello to the router benchmark.', max_tokens: 8 });

export async function runProxyOverhead(argv: string[]): Promise<{ rows: OverheadRow[]; notes: string[] }> {
  const arg = (name: string) => {
    const i = argv.indexOf(name);
    return i >= 0 ? argv[i + 1] : undefined;
  };
  const seconds = Number(arg('--seconds') ?? 5);
  const levels = (arg('--concurrency') ?? '16,64,256').split(',').map(Number);
  const notes: string[] = [];
  if (!(await hasWrk())) throw new Error('wrk is not installed: `apt-get install -y wrk` (Debian) and run again');
  const enginePort = await freePort();
  const procs: Proc[] = [];
  const targets: Array<{ name: string; port: number }> = [{ name: 'direct', port: enginePort }];
  try {
    procs.push(start('sim', process.execPath, [CLI, 'sim', '--port', String(enginePort), '--time-scale', '0']));
    await waitReady(`http://127.0.0.1:${enginePort}/health`);
    const swyPort = await freePort();
    procs.push(start('switchyard', process.execPath, [CLI, 'serve', '--port', String(swyPort), '--upstream', `http://127.0.0.1:${enginePort}`, '--model', 'open-model']));
    await waitReady(`http://127.0.0.1:${swyPort}/readyz`);
    targets.push({ name: 'switchyard', port: swyPort });
    const ngPort = await freePort();
    const ng = startNginx(ngPort, enginePort);
    if (ng) {
      procs.push(ng);
      await waitReady(`http://127.0.0.1:${ngPort}/health`);
      targets.push({ name: 'nginx', port: ngPort });
    } else notes.push('nginx is not installed (`apt-get install -y nginx-light`): skipped');
    const haPort = await freePort();
    const ha = startHaproxy(haPort, enginePort);
    if (ha) {
      procs.push(ha);
      await waitReady(`http://127.0.0.1:${haPort}/health`);
      targets.push({ name: 'haproxy', port: haPort });
    } else notes.push('haproxy is not installed (`apt-get install -y haproxy`): skipped');

    const rows: OverheadRow[] = [];
    for (const c of levels) {
      const results = new Map<string, WrkResult>();
      for (const t of targets) {
        const url = `http://127.0.0.1:${t.port}/v1/completions`;
        await runWrk(url, REQUEST_BODY, { connections: c, seconds: 1 }); // warm-up
        results.set(t.name, await runWrk(url, REQUEST_BODY, { connections: c, seconds }));
      }
      const d = results.get('direct')!;
      for (const t of targets) {
        const r = results.get(t.name)!;
        rows.push({
          target: t.name,
          concurrency: c,
          rps: r.rps,
          p50Us: r.p50Us,
          p99Us: r.p99Us,
          addedP50Us: r.p50Us - d.p50Us,
          addedP99Us: r.p99Us - d.p99Us,
          errors: r.errors + r.non2xx,
        });
        console.error(`overhead c=${c} ${t.name}: ${fmt(r.rps, 0)} req/s, p50 ${r.p50Us} µs, p99 ${r.p99Us} µs, errors ${r.errors + r.non2xx}`);
      }
    }
    return { rows, notes };
  } finally {
    for (const p of procs.reverse()) await p.stop();
  }
}

export function overheadTable(rows: OverheadRow[]): string {
  let md = '| concurrency | target | req/s | vs nginx | p50 (µs) | p99 (µs) | added p50 (µs) | added p99 (µs) | errors |\n|---|---|---|---|---|---|---|---|---|\n';
  for (const r of rows) {
    const ng = rows.find((x) => x.target === 'nginx' && x.concurrency === r.concurrency);
    md += `| ${r.concurrency} | ${r.target} | ${fmt(r.rps, 0)} | ${ng ? fmt(r.rps / ng.rps, 2) + '×' : '—'} | ${r.p50Us} | ${r.p99Us} | ${r.target === 'direct' ? '—' : r.addedP50Us} | ${r.target === 'direct' ? '—' : r.addedP99Us} | ${r.errors} |\n`;
  }
  return md;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { rows, notes } = await runProxyOverhead(process.argv.slice(2));
  for (const n of notes) console.log(`note: ${n}`);
  console.log(overheadTable(rows));
}
