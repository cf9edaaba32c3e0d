// Scenario `overhead` (comparative): the cost per request of Switchyard against
// the proxies users would otherwise put in front of an engine. One simulated
// engine at --time-scale 0 answers at once; wrk sends the same small
// non-streaming request at several fixed concurrency levels, directly and
// through Switchyard, nginx (proxy_pass, upstream keepalive) and HAProxy, in
// one run. Every proxy runs as one process with one worker thread. Switchyard
// runs twice, on each front end: `switchyard-native` (the default) and
// `switchyard-uws` (uWebSockets.js, where its binary loads on this Node).
//
// Beside them runs `uws-floor` (bench/lib/relay-floor.ts): a bare relay built
// from Switchyard's own HTTP parts (uWebSockets.js + the native upstream
// client, one JS thread) that does none of a router's work. Its figures are
// the floor of this stack: what Switchyard would cost if routing were free.
// Every proxy's CPU time per request (user + system, from /proc, the process
// and its children) is reported too: on a shared machine whose three busy
// processes (wrk, engine, proxy) contend for the cores, req/s follows from it.
//
// `--router-node-options '<flags>'` starts the routers with NODE_OPTIONS set to
// those flags (e.g. V8's young-generation size), the other processes as they are.
//
//   node dist/bench/system/overhead-proxies.js [--seconds 4] [--rounds 3] [--concurrency 8,32,256] [--no-floor] [--no-uws] [--pin]
//        [--router-node-options '--max-semi-space-size=64']
import { CLI, ROOT, freePort, start, treeCpuSeconds, waitReady, type Proc, option } from '../lib/proc.js';
import { pinned, startHaproxy, startNginx } from '../lib/proxies.js';
import { hasWrk, runWrk, type WrkResult } from '../lib/wrk.js';
import { fmt, quantile } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';
import { uwsProblem } from '../../src/uws.js';

exitOnHelp(import.meta.url);

const median = (xs: number[]) => quantile(xs, 0.5);

export interface OverheadRow {
  target: string;
  concurrency: number;
  rps: number;
  p50Us: number;
  p99Us: number;
  addedP50Us: number;
  addedP99Us: number;
  errors: number;
  /** The proxy process's CPU time per request (user + system), µs; NaN for direct. */
  cpuUs: number;
  /** Of which user mode, µs. */
  userUs: number;
  /** req/s of each round, in round order (the order of targets rotates per round). */
  roundRps: number[];
}

export const REQUEST_BODY = JSON.stringify({ model: 'open-model', prompt: 'Say hello to the router benchmark.', max_tokens: 8 });

export async function runProxyOverhead(argv: string[]): Promise<{ rows: OverheadRow[]; notes: string[] }> {
  const arg = (name: string) => option(argv, name);
  const seconds = Number(arg('--seconds') ?? 4);
  const levels = (arg('--concurrency') ?? '8,32,256').split(',').map(Number);
  const rounds = Number(arg('--rounds') ?? 3);
  const nodeOptions = arg('--router-node-options');
  const notes: string[] = [];
  if (nodeOptions !== undefined) notes.push(`routers started with NODE_OPTIONS=${nodeOptions}`);
  // --pin: every proxy on CPU 1, the engine and wrk on CPU 0 (taskset), so a proxy's
  // req/s is its own core's worth and the three busy processes stop trading places
  const pin = argv.includes('--pin');
  const proxyCpu = pin ? '1' : undefined;
  const loadCpu = pin ? '0' : undefined;
  if (!(await hasWrk())) throw new Error('wrk is not installed: `apt-get install -y wrk` (Debian) and run again');
  const enginePort = await freePort();
  const procs: Proc[] = [];
  const targets: Array<{ name: string; port: number; proc?: Proc }> = [{ name: 'direct', port: enginePort }];
  try {
    procs.push(start('sim', ...pinned(loadCpu, process.execPath, [CLI, 'sim', '--port', String(enginePort), '--time-scale', '0'])));
    await waitReady(`http://127.0.0.1:${enginePort}/health`);
    // the router on each front end (SWITCHYARD_FRONT_END chooses where the config does not)
    const fronts = uwsProblem() === null && !argv.includes('--no-uws') ? ['native', 'uws'] : ['native'];
    if (fronts.length === 1) notes.push(`switchyard-uws skipped (${argv.includes('--no-uws') ? '--no-uws' : uwsProblem()})`);
    for (const fe of fronts) {
      const swyPort = await freePort();
      const args = [CLI, 'serve', '--port', String(swyPort), '--upstream', `http://127.0.0.1:${enginePort}`, '--model', 'open-model'];
      const env: Record<string, string> = { SWITCHYARD_FRONT_END: fe };
      if (nodeOptions !== undefined) env.NODE_OPTIONS = nodeOptions;
      procs.push(start(`switchyard-${fe}`, ...pinned(proxyCpu, process.execPath, args), { env }));
      await waitReady(`http://127.0.0.1:${swyPort}/readyz`);
      // uWS names itself on every answer; the native front end does not: check the one asked for serves
      const served = (await fetch(`http://127.0.0.1:${swyPort}/healthz`)).headers.has('uwebsockets') ? 'uws' : 'native';
      if (served !== fe) throw new Error(`switchyard-${fe}: the router serves on ${served}`);
      targets.push({ name: `switchyard-${fe}`, port: swyPort, proc: procs.at(-1) });
    }
    if (!argv.includes('--no-floor')) {
      const floorPort = await freePort();
      procs.push(start('uws-floor', ...pinned(proxyCpu, process.execPath, [`${ROOT}/dist/bench/lib/relay-floor.js`, String(floorPort), String(enginePort)])));
      await waitReady(`http://127.0.0.1:${floorPort}/health`);
      targets.push({ name: 'uws-floor', port: floorPort, proc: procs.at(-1) });
    }
    const ngPort = await freePort();
    const ng = startNginx(ngPort, enginePort, proxyCpu);
    if (ng) {
      procs.push(ng);
      await waitReady(`http://127.0.0.1:${ngPort}/health`);
      targets.push({ name: 'nginx', port: ngPort, proc: ng });
    } else notes.push('nginx is not installed (`apt-get install -y nginx-light`): skipped');
    const haPort = await freePort();
    const ha = startHaproxy(haPort, enginePort, proxyCpu);
    if (ha) {
      procs.push(ha);
      await waitReady(`http://127.0.0.1:${haPort}/health`);
      targets.push({ name: 'haproxy', port: haPort, proc: ha });
    } else notes.push('haproxy is not installed (`apt-get install -y haproxy`): skipped');

    // The machine is shared and its speed drifts by up to 2x over seconds, so
    // every level runs `rounds` rounds, each visiting all targets in an order
    // rotated per round; a target's figures are the medians over its rounds.
    const rows: OverheadRow[] = [];
    for (const c of levels) {
      const runs = new Map<string, Array<WrkResult & { cpuUs: number; userUs: number }>>(targets.map((t) => [t.name, []]));
      for (let round = 0; round < rounds; round++) {
        for (let k = 0; k < targets.length; k++) {
          const t = targets[(k + round) % targets.length];
          const url = `http://127.0.0.1:${t.port}/v1/completions`;
          await runWrk(url, REQUEST_BODY, { connections: c, seconds: 1, cpus: loadCpu }); // warm-up
          const pid = t.proc?.child.pid;
          const c0 = treeCpuSeconds(pid);
          const u0 = treeCpuSeconds(pid, true);
          const w = await runWrk(url, REQUEST_BODY, { connections: c, seconds, cpus: loadCpu });
          const n = Math.max(1, w.requests);
          const r = { ...w, cpuUs: ((treeCpuSeconds(pid) - c0) / n) * 1e6, userUs: ((treeCpuSeconds(pid, true) - u0) / n) * 1e6 };
          runs.get(t.name)!.push(r);
          console.error(`overhead c=${c} round ${round + 1} ${t.name}: ${fmt(r.rps, 0)} req/s, p50 ${r.p50Us} µs, p99 ${r.p99Us} µs, errors ${r.errors + r.non2xx}`);
        }
      }
      const med = (name: string, f: (r: WrkResult & { cpuUs: number; userUs: number }) => number) => median(runs.get(name)!.map(f));
      const dP50 = med('direct', (r) => r.p50Us);
      const dP99 = med('direct', (r) => r.p99Us);
      for (const t of targets) {
        const rs = runs.get(t.name)!;
        const p50 = med(t.name, (r) => r.p50Us);
        const p99 = med(t.name, (r) => r.p99Us);
        rows.push({
          target: t.name,
          concurrency: c,
          rps: med(t.name, (r) => r.rps),
          p50Us: p50,
          p99Us: p99,
          addedP50Us: p50 - dP50,
          addedP99Us: p99 - dP99,
          errors: rs.reduce((a, r) => a + r.errors + r.non2xx, 0),
          cpuUs: t.proc ? med(t.name, (r) => r.cpuUs) : NaN,
          userUs: t.proc ? med(t.name, (r) => r.userUs) : NaN,
          roundRps: rs.map((r) => Math.round(r.rps)),
        });
      }
    }
    return { rows, notes };
  } finally {
    for (const p of procs.reverse()) await p.stop();
  }
}

export function overheadTable(rows: OverheadRow[]): string {
  let md =
    '| concurrency | target | req/s | vs nginx | p50 (µs) | p99 (µs) | added p50 (µs) | added p99 (µs) | proxy CPU µs/req (user) | CPU/req vs nginx | errors | req/s per round |\n' +
    '|---|---|---|---|---|---|---|---|---|---|---|---|\n';
  for (const r of rows) {
    const ng = rows.find((x) => x.target === 'nginx' && x.concurrency === r.concurrency);
    const direct = r.target === 'direct';
    const cpu = Number.isFinite(r.cpuUs) ? `${fmt(r.cpuUs, 1)} (${fmt(r.userUs, 1)})` : '—';
    const cpuVs = ng && Number.isFinite(r.cpuUs) && Number.isFinite(ng.cpuUs) ? fmt(r.cpuUs / ng.cpuUs, 2) + '×' : '—';
    md += `| ${r.concurrency} | ${r.target} | ${fmt(r.rps, 0)} | ${ng ? fmt(r.rps / ng.rps, 2) + '×' : '—'} | ${r.p50Us} | ${r.p99Us} | ${direct ? '—' : r.addedP50Us} | ${direct ? '—' : r.addedP99Us} | ${cpu} | ${cpuVs} | ${r.errors} | ${r.roundRps.join(' / ')} |\n`;
  }
  return md;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { rows, notes } = await runProxyOverhead(process.argv.slice(2));
  for (const n of notes) console.log(`note: ${n}`);
  console.log(overheadTable(rows));
}
