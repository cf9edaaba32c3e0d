// `node dist/bench/tracing-cost.js`: the CPU the tracing hooks add per
// request, isolated from the rest of the router (router-ab.ts measures the
// whole router, which on a shared machine is noisier than the 5 % it must
// resolve). Runs the director's tracing calls for N requests, in interleaved
// rounds, in three modes: tracing off (the null checks), on at --ratio (head
// sampling; the sampled ones record the full span set and are exported by the
// real OTLP/HTTP protobuf exporter to a sink in a child process), and on at
// ratio 1 (the per-sampled-request cost). CPU = this process's user + system
// time (process.cpuUsage), including export serialisation.
//   node dist/bench/tracing-cost.js [--requests 200000] [--rounds 5] [--ratio 0.01]
import { fork } from 'node:child_process';
import { createServer } from 'node:http';
import { TRACING_DEFAULTS } from '../../src/config/tracing.js';
import { createTracer, type RequestTracer } from '../../src/telemetry/tracing.js';
import { appendTraceHeaders } from '../../src/proxy/trace-context.js';
import { median } from '../lib/stats.js';
import { option, runMain } from '../lib/proc.js';
import { progress } from '../../src/progress.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const argv = process.argv.slice(2);
const requests = Number(option(argv, '--requests') ?? '200000');
const rounds = Number(option(argv, '--rounds') ?? '5');
const ratio = Number(option(argv, '--ratio') ?? '0.01');

const EMPTY: Readonly<Record<string, string>> = Object.freeze({});
const BODY = { model: 'open-model', max_tokens: 16, temperature: 0.2 };
const EP = { name: 'e0', url: 'http://127.0.0.1:8001', engine: 'vllm' };

/** The director's tracing calls for one request, as director.ts makes them (null checks when unsampled). */
function oneRequest(tracer: RequestTracer | null, i: number): number {
  const now = performance.now();
  const trace = tracer !== null ? tracer.start(EMPTY, 0, `r${i}`, now) : null;
  if (trace !== null) {
    trace.parsed('open-model', BODY);
    trace.admissionStart(now);
    trace.admissionEnd(now, true, '');
    trace.scheduled(now, now, EP, 4, 3.2, 10, 7);
  }
  const headers = ['content-type', 'application/json', 'x-request-id', 'r'];
  const h = trace !== null ? appendTraceHeaders(headers, EMPTY, trace.legStart(now, EP)) : headers;
  if (trace !== null) {
    trace.legFirstByte(now, 200);
    trace.end(now, 200, '');
  }
  return h.length;
}

async function sink(): Promise<{ url: string; stop(): void }> {
  // the collector runs in another process, so its CPU is not counted here
  const child = fork(new URL(import.meta.url), ['--sink'], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
  const port = await new Promise<number>((r) => child.once('message', (m) => r(m as number)));
  return { url: `http://127.0.0.1:${port}/v1/traces`, stop: () => child.kill() };
}

async function main(): Promise<void> {
  const s = await sink();
  const make = (r: number) => createTracer({ ...TRACING_DEFAULTS, enabled: true, endpoint: s.url, sampleRatio: r, exportIntervalMs: 200 });
  const modes: { name: string; tracer: RequestTracer | null }[] = [
    { name: 'off', tracer: null },
    { name: `on, ratio ${ratio}`, tracer: await make(ratio) },
    { name: 'on, ratio 1', tracer: await make(1) },
  ];
  const cpu = new Map<string, number[]>();
  const bar = progress('tracing cost', rounds * modes.length);
  let sink_ = 0;
  for (let round = 0; round < rounds; round++) {
    for (const m of round % 2 === 0 ? modes : [...modes].reverse()) {
      bar.tick(`round ${round + 1}, ${m.name}`);
      const n = m.name === 'on, ratio 1' ? Math.max(1000, Math.floor(requests / 20)) : requests;
      const c0 = process.cpuUsage();
      for (let i = 0; i < n; i++) {
        sink_ += oneRequest(m.tracer, i);
        // let exports run between bursts, as they do between a router's requests
        if (i % 200 === 199) await new Promise<void>((r) => setImmediate(r));
      }
      await m.tracer?.flush(); // the export's serialisation counts too
      const c = process.cpuUsage(c0);
      (cpu.get(m.name) ?? cpu.set(m.name, []).get(m.name)!).push(((c.user + c.system) / n) * 1000);
    }
  }
  bar.done();
  for (const m of modes) await m.tracer?.close();
  s.stop();
  console.log(`tracing cost per request (${requests} requests per round, ${rounds} interleaved rounds, medians; CPU of this process incl. OTLP/HTTP protobuf export to a sink in another process)`);
  console.log('| mode | CPU ns/request | exported spans |');
  console.log('|---|---:|---:|');
  for (const m of modes) {
    console.log(`| ${m.name} | ${median(cpu.get(m.name)!).toFixed(0)} | ${m.tracer?.stats.exported ?? 0} |`);
  }
  if (sink_ === 0) console.log('');
}

function startSink(): void {
  const srv = createServer((req, res) => {
    req.resume();
    req.on('end', () => res.writeHead(200, { 'content-type': 'application/x-protobuf' }).end());
  });
  srv.listen(0, '127.0.0.1', () => process.send!((srv.address() as { port: number }).port));
  process.on('disconnect', () => process.exit(0));
}

if (argv.includes('--sink')) startSink();
else runMain(main);
