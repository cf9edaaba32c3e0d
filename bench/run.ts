// `npm run bench [-- <scenario>... [options]]`: runs the comparative scenarios
// (overhead against nginx/HAProxy, routing quality against the baselines, and
// flow-control fairness when present), writes bench/report/REPORT.md with the
// figures, the machine and the exact command, and SVG plots beside it.
import { mkdirSync, writeFileSync, existsSync, readFileSync } from 'node:fs';
import { cpus, totalmem } from 'node:os';
import { join } from 'node:path';
import { ROOT } from './lib/proc.js';
import { barChart, lineChart, type Series } from './lib/svg.js';
import { overheadTable, runProxyOverhead } from './system/overhead-proxies.js';
import { floorLines, qualityTable, runQuality, type Row } from './system/quality.js';
import { exitOnHelp } from './lib/help.js';

exitOnHelp(import.meta.url);

const SCENARIOS = ['overhead', 'quality', 'fairness'];

async function main(argv: string[]): Promise<number> {
  const chosen = argv.filter((a) => SCENARIOS.includes(a));
  const opts = argv.filter((a) => !SCENARIOS.includes(a));
  const run = chosen.length ? chosen : SCENARIOS;
  const out = join(ROOT, 'bench', 'report');
  mkdirSync(out, { recursive: true });
  const cpu = cpus()[0]?.model ?? 'unknown CPU';
  const stamp = `Run: ${new Date().toISOString()}; machine: ${cpus().length} × ${cpu}, ${Math.round(totalmem() / 2 ** 30)} GiB, ` +
    `Node ${process.version}; command: \`npm run bench -- ${argv.join(' ')}\`\n\n`;
  // Each scenario writes its own section file, so running one scenario updates its part of the report.
  const section = (name: string, text: string) => writeFileSync(join(out, `${name}.md`), text.replace(/\n\n/, `\n\n${stamp}`));
  let md = '';

  if (run.includes('overhead')) {
    const { rows, notes } = await runProxyOverhead(opts);
    md += `## Overhead: direct vs Switchyard vs nginx vs HAProxy\n\nOne simulated engine at --time-scale 0; wrk (1 thread) ` +
      `POSTs the same small /v1/completions body; every proxy is one process with one worker (nginx worker_processes 1 with ` +
      `upstream keepalive 256; HAProxy nbthread 1 with http-reuse always; Switchyard one process).\n\n` +
      `\`uws-floor\` is a bare relay built from Switchyard's own HTTP parts (uWebSockets.js for clients, the addon's native ` +
      `upstream client, one JS thread) that does none of a router's work (bench/lib/relay-floor.ts): the floor of the stack, ` +
      `so the gap between it and Switchyard is the router's own work per request. "Proxy CPU" is the proxy process's user + ` +
      `system time (its children included: nginx's worker) over each wrk run divided by the requests completed, median over ` +
      `rounds, user part in brackets; with wrk, the engine and the proxy busy on two shared cores, req/s follows from it.\n\n`;
    for (const n of notes) md += `Note: ${n}\n\n`;
    md += overheadTable(rows) + '\n![throughput per proxy](overhead-rps.svg)\n![added p99 per proxy](overhead-p99.svg)\n\n';
    const levels = [...new Set(rows.map((r) => r.concurrency))];
    const targets = [...new Set(rows.map((r) => r.target))];
    const series = (key: 'rps' | 'addedP99Us', skipDirect: boolean): Series[] =>
      targets
        .filter((t) => !(skipDirect && t === 'direct'))
        .map((t) => ({ name: t, points: levels.map((c, i) => [i, rows.find((r) => r.target === t && r.concurrency === c)![key]] as [number, number]) }));
    const cats = levels.map((c) => `${c} connections`);
    writeFileSync(join(out, 'overhead-rps.svg'), barChart('Throughput (req/s)', cats, 'requests/s', series('rps', false)));
    writeFileSync(join(out, 'overhead-p99.svg'), barChart('Added p99 latency over direct (µs)', cats, 'µs', series('addedP99Us', true)));
    section('overhead', md);
    md = '';
  }

  if (run.includes('quality')) {
    const { rows, config } = await runQuality(opts);
    md +=
      `## Routing quality: round-robin vs least-request vs Switchyard\n\n${config}.\n\n` +
      'Output tokens/s: "steady state" counts the streamed tokens the client received between 25% of the arrival window and ' +
      'the last arrival (ramp-up and drain excluded), per second; "overall" is all output tokens over the wall time of the whole ' +
      'run, drain included (below saturation both equal the offered rate; past it the overall figure is diluted by the drain). ' +
      'The throughput floor uses the steady-state figure, which measures what the fleet delivers under each policy. ' +
      'Running / waiting / KV usage: means of the engines\' own /metrics (sampled every 200 ms) over the same window; ' +
      'min–max is the spread of the per-engine means.\n\n' +
      qualityTable(rows) + '\n' + floorLines(rows) + '\n';
    for (const w of [...new Set(rows.map((r) => r.workload))]) {
      const sub = rows.filter((r) => r.workload === w);
      const pol = [...new Set(sub.map((r) => r.policy))];
      const ser = (key: (r: Row) => number, suffix = '', dashed = false): Series[] =>
        pol.map((p, i) => ({ name: p + suffix, color: i, dashed, points: sub.filter((r) => r.policy === p).map((r) => [r.rate, key(r)] as [number, number]) }));
      writeFileSync(join(out, `quality-${w}-ttft.svg`), lineChart(`${w}: TTFT p50 vs request rate`, 'requests/s', 'TTFT p50 (ms)', ser((r) => r.ttftP50)));
      writeFileSync(
        join(out, `quality-${w}-throughput.svg`),
        lineChart(`${w}: output tokens/s vs request rate`, 'requests/s', 'output tokens/s', [
          ...ser((r) => r.steadyTokS, ' steady'),
          ...ser((r) => r.outTokS, ' overall', true),
        ]),
      );
      writeFileSync(
        join(out, `quality-${w}-running.svg`),
        lineChart(`${w}: running requests per engine vs rate`, 'requests/s', 'mean running per engine', ser((r) => r.load.running)),
      );
      md += `![${w} TTFT](quality-${w}-ttft.svg)\n![${w} throughput](quality-${w}-throughput.svg)\n![${w} running per engine](quality-${w}-running.svg)\n\n`;
    }
    section('quality', md);
    md = '';
  }

  if (run.includes('fairness')) {
    const file = join(ROOT, 'dist', 'bench', 'system', 'fairness.js');
    if (existsSync(file)) {
      const mod = await import(file);
      if (typeof mod.runFairness === 'function') section('fairness', await mod.runFairness(opts));
    } else console.error('fairness: not run, dist/bench/system/fairness.js is not built');
  }

  let report = '# Switchyard benchmark report\n\nEach section names the run and the command that produced it.\n\n';
  for (const name of SCENARIOS) {
    const f = join(out, `${name}.md`);
    if (existsSync(f)) report += readFileSync(f, 'utf8');
  }
  writeFileSync(join(out, 'REPORT.md'), report);
  console.log(report);
  return 0;
}

process.exitCode = await main(process.argv.slice(2));
