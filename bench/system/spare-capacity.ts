// Scenario `spare-capacity`: does the async processor fill only the capacity
// interactive traffic leaves free?
//
// One run, one set of processes: 2 simulated engines (one process each), a
// redis-server, a router with a `batch:` block. Three phases:
//
//  1. capacity: a closed loop of non-streamed requests through the router at
//     as many at once as the fleet has slots (2 × --max-num-seqs): the fleet's
//     max throughput C (req/s) for this request shape, measured now.
//  2. baseline: the interactive load alone: streamed completions, Poisson
//     arrivals whose rate follows one diurnal-like period (low → peak → low,
//     λ(t) = lo + (hi − lo)(1 − cos 2πt/P)/2), client-measured TTFT.
//  3. with the batch: the same arrival schedule (same seed) and, at its start,
//     a batch of --batch requests submitted through the Files and Batches API
//     (POST /v1/files, POST /v1/batches; polled with GET /v1/batches/{id}).
//
// Batch and interactive requests have the same shape (a unique ~200-byte
// prompt, --tokens output tokens (4); the batch ones non-streamed), so C is in the same
// unit as both rates. Reported:
//  - interactive TTFT p95 of the requests sent while the batch ran, against
//    the same requests (same schedule indices) of the baseline: floor ≤ 1.2×;
//  - batch throughput (its requests ÷ the time from create to completed)
//    against the free capacity over that window, C − interactive rate in the
//    window: floor ≥ 80 %.
//
// Engines: --serial-prefill false (prefills do not share compute: TTFT is
// prefill overhead + queueing for a slot, which is what the ceiling governs),
// 20 ms prefill overhead, 50 µs per prompt token, --itl-ms (100) ITL (+1 % per
// extra running request), --slots (32) each. Few output tokens with a long ITL
// keep the simulators' per-token timers (CPU on a shared machine) low for the
// same request time (~0.55 s).
//
//   node dist/bench/spare-capacity.js [--batch 10000] [--period 150] [--lo 10] [--hi 50] [--ceiling 0.85] [--slots 32] [--tokens 4] [--itl-ms 100] [--capacity-seconds 15]
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Pool } from 'undici';
import { connect } from 'node:net';
import { CLI, freePort, freePortRange, start, waitReady, option, runMain, type Proc } from '../lib/proc.js';
import { expGap, fmt, quantile, rng } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const argv = process.argv.slice(2);
const BATCH = Number(option(argv, '--batch') ?? '10000');
const PERIOD = Number(option(argv, '--period') ?? '150');
const LO = Number(option(argv, '--lo') ?? '10');
const HI = Number(option(argv, '--hi') ?? '50');
const CEILING = Number(option(argv, '--ceiling') ?? '0.85');
const SLOTS = Number(option(argv, '--slots') ?? '32');
const CAPACITY_SECONDS = Number(option(argv, '--capacity-seconds') ?? '15');
const OUTPUT_TOKENS = Number(option(argv, '--tokens') ?? '4');
const ITL_MS = Number(option(argv, '--itl-ms') ?? '100');
const ENGINE = ['--time-scale', '1', '--serial-prefill', 'false', '--prefill-overhead-ms', '20', '--prefill-us-per-token', '50', '--itl-ms', String(ITL_MS), '--decode-slowdown', '0.01', '--max-num-seqs', String(SLOTS), '--kv-cache-blocks', '65536'];

function prompt(tag: string): string {
  const head = `${tag} ${Math.random().toString(36).slice(2)} `;
  return (head + 'lorem ipsum dolor sit amet '.repeat(8)).slice(0, 200);
}

const rateAt = (t: number) => LO + ((HI - LO) * (1 - Math.cos((2 * Math.PI * t) / PERIOD))) / 2;

/** The arrival schedule (seconds from the start), the same for both phases. */
function schedule(): number[] {
  const rand = rng(4242);
  const at: number[] = [];
  let t = 0;
  for (;;) {
    t += expGap(rand, rateAt(t));
    if (t >= PERIOD) return at;
    at.push(t);
  }
}

/** Sends the interactive schedule; resolves with each request's send time (ms, performance.now) and TTFT (ms; Infinity on error). */
async function interactive(pool: Pool, at: number[], t0: number): Promise<{ sent: Float64Array; ttft: Float64Array; errors: number }> {
  const sent = new Float64Array(at.length);
  const ttft = new Float64Array(at.length).fill(Infinity);
  let errors = 0;
  const pending: Promise<void>[] = [];
  for (let i = 0; i < at.length; i++) {
    const wait = t0 + at[i]! * 1000 - performance.now();
    if (wait > 1) await new Promise((r) => setTimeout(r, wait));
    const body = JSON.stringify({ model: 'open-model', prompt: prompt(`i${i}`), max_tokens: OUTPUT_TOKENS, stream: true });
    const s = (sent[i] = performance.now());
    pending.push(
      (async () => {
        try {
          const r = await pool.request({ method: 'POST', path: '/v1/completions', headers: { 'content-type': 'application/json' }, body });
          if (r.statusCode !== 200) {
            await r.body.dump();
            errors++;
            return;
          }
          let first = 0;
          for await (const _ of r.body) if (first === 0) first = performance.now();
          if (first > 0) ttft[i] = first - s;
        } catch {
          errors++;
        }
      })(),
    );
  }
  await Promise.all(pending);
  return { sent, ttft, errors };
}

/** Closed loop at `conc` requests at once for `seconds`: completed requests per second. */
async function capacity(pool: Pool, conc: number, seconds: number): Promise<number> {
  const end = performance.now() + seconds * 1000;
  const warm = performance.now() + 2000; // counted after the slots are full
  let done = 0;
  let n = 0;
  const worker = async () => {
    while (performance.now() < end) {
      const r = await pool.request({ method: 'POST', path: '/v1/completions', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'open-model', prompt: prompt(`c${n++}`), max_tokens: OUTPUT_TOKENS }) });
      await r.body.dump();
      if (r.statusCode === 200 && performance.now() > warm && performance.now() <= end) done++;
    }
  };
  await Promise.all(Array.from({ length: conc }, worker));
  return done / (seconds - 2);
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'swy-spare-'));
  const procs: Proc[] = [];
  try {
    const redisPort = await freePort();
    procs.push(start('redis', 'redis-server', ['--port', String(redisPort), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no']));
    for (let i = 0; ; i++) {
      const up = await new Promise<boolean>((r) => {
        const s = connect(redisPort, '127.0.0.1', () => {
          s.destroy();
          r(true);
        });
        s.on('error', () => r(false));
      });
      if (up) break;
      if (i > 100) throw new Error('redis-server did not start');
      await new Promise((r) => setTimeout(r, 100));
    }
    const base = await freePortRange(2);
    const urls = [base, base + 1].map((p) => `http://127.0.0.1:${p}`);
    [base, base + 1].forEach((p, i) => procs.push(start(`engine${i}`, process.execPath, [CLI, 'sim', ...ENGINE, '--port', String(p)])));
    for (const u of urls) await waitReady(`${u}/health`, 60000);
    const port = await freePort();
    const file = join(dir, 'router.yaml');
    writeFileSync(
      file,
      `apiVersion: switchyard/v1\nkind: Router\nlisten: { host: 127.0.0.1, port: ${port} }\nlogging: { level: warn }\n` +
        `pools:\n  - { name: p, batchLimit: ${SLOTS}, models: [open-model], endpoints: [{ name: e0, url: "${urls[0]}" }, { name: e1, url: "${urls[1]}" }] }\n` +
        `batch: { redis: "redis://127.0.0.1:${redisPort}", utilisationCeiling: ${CEILING}, maxInFlight: ${2 * SLOTS}, checkIntervalMs: 10 }\n`,
    );
    procs.push(start('router', process.execPath, [CLI, 'serve', '--config', file]));
    const url = `http://127.0.0.1:${port}`;
    await waitReady(`${url}/readyz`, 60000);
    const pool = new Pool(url, { connections: 512, pipelining: 1 });

    console.log(
      `spare-capacity: 2 engines × ${SLOTS} slots (20 ms prefill overhead, ${ITL_MS} ms ITL, parallel prefill), requests of a ~200-byte unique prompt and ${OUTPUT_TOKENS} output tokens; ` +
        `interactive: Poisson, rate ${LO} → ${HI} → ${LO} req/s over ${PERIOD} s (one cosine period); batch: ${BATCH} requests via /v1/files + /v1/batches, utilisationCeiling ${CEILING}`,
    );
    const C = await capacity(pool, 2 * SLOTS, CAPACITY_SECONDS);
    console.log(`capacity C (closed loop, ${2 * SLOTS} at once, ${CAPACITY_SECONDS} s): ${fmt(C)} req/s`);

    const at = schedule();
    const base0 = await interactive(pool, at, performance.now() + 500);
    console.log(`baseline: ${at.length} interactive requests, ${base0.errors} errors, TTFT p50 ${fmt(quantile(base0.ttft, 0.5))} ms, p95 ${fmt(quantile(base0.ttft, 0.95))} ms`);

    // the batch file, uploaded before the phase starts
    const lines: string[] = [];
    for (let i = 0; i < BATCH; i++) lines.push(JSON.stringify({ custom_id: `b${i}`, method: 'POST', url: '/v1/completions', body: { model: 'open-model', prompt: prompt(`b${i}`), max_tokens: OUTPUT_TOKENS } }));
    const form = new FormData();
    form.append('purpose', 'batch');
    form.append('file', new Blob([lines.join('\n') + '\n']), 'spare.jsonl');
    const up = await fetch(`${url}/v1/files`, { method: 'POST', body: form });
    const f = (await up.json()) as { id: string };
    if (up.status !== 200) throw new Error(`upload: ${up.status} ${JSON.stringify(f)}`);

    const t0 = performance.now() + 500;
    await new Promise((r) => setTimeout(r, 500));
    const created = performance.now();
    const cr = await fetch(`${url}/v1/batches`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ input_file_id: f.id, endpoint: '/v1/completions', completion_window: '24h' }) });
    const b = (await cr.json()) as { id: string };
    if (cr.status !== 200) throw new Error(`batch: ${cr.status} ${JSON.stringify(b)}`);
    let finished = NaN;
    let last = { status: '', request_counts: { total: 0, completed: 0, failed: 0 } };
    const poll = (async () => {
      while (Number.isNaN(finished)) {
        const r = await fetch(`${url}/v1/batches/${b.id}`);
        last = (await r.json()) as typeof last;
        const n = last.request_counts.completed + last.request_counts.failed;
        if (n >= BATCH || last.status === 'completed' || last.status === 'failed') finished = performance.now();
        else await new Promise((r) => setTimeout(r, 250));
      }
    })();
    const withB = await interactive(pool, at, t0);
    const periodEnd = performance.now();
    await Promise.race([poll, new Promise((r) => setTimeout(r, 1000))]);
    const batchEnd = Number.isNaN(finished) ? periodEnd : finished;
    const window = (batchEnd - created) / 1000;
    const done = last.request_counts.completed + last.request_counts.failed;
    // interactive requests sent while the batch ran, and the same indices in the baseline
    const idx: number[] = [];
    for (let i = 0; i < at.length; i++) if (withB.sent[i]! >= created && withB.sent[i]! <= batchEnd) idx.push(i);
    const p95With = quantile(idx.map((i) => withB.ttft[i]!), 0.95);
    const p95Without = quantile(idx.map((i) => base0.ttft[i]!), 0.95);
    const p50With = quantile(idx.map((i) => withB.ttft[i]!), 0.5);
    const p50Without = quantile(idx.map((i) => base0.ttft[i]!), 0.5);
    // the same comparison split by the interactive rate at send time: contention for slots would show at the peak
    const mid = (LO + HI) / 2;
    const peak = idx.filter((i) => rateAt(at[i]!) >= mid);
    const off = idx.filter((i) => rateAt(at[i]!) < mid);
    const p95 = (xs: number[], a: Float64Array) => quantile(xs.map((i) => a[i]!), 0.95);
    const interactiveRate = idx.length / window;
    const free = C - interactiveRate;
    const batchRate = done / window;
    console.log(`with batch: ${withB.errors} interactive errors; batch ${b.id} ${last.status}, ${last.request_counts.completed} completed, ${last.request_counts.failed} failed, in ${fmt(window)} s${Number.isNaN(finished) ? ' (NOT finished within the period: counted up to its end)' : ''}`);
    console.log('');
    console.log('| measure | without batch | with batch | ratio | floor |');
    console.log('|---|---:|---:|---:|---|');
    console.log(`| interactive TTFT p50, the ${idx.length} requests sent while the batch ran (ms) | ${fmt(p50Without)} | ${fmt(p50With)} | ${fmt(p50With / p50Without, 2)}× | – |`);
    console.log(`| interactive TTFT p95, same requests (ms) | ${fmt(p95Without)} | ${fmt(p95With)} | ${fmt(p95With / p95Without, 2)}× | ≤ 1.2× |`);
    console.log(`| … sent at rates ≥ ${mid} req/s (${peak.length}) | ${fmt(p95(peak, base0.ttft))} | ${fmt(p95(peak, withB.ttft))} | ${fmt(p95(peak, withB.ttft) / p95(peak, base0.ttft), 2)}× | – |`);
    console.log(`| … sent at rates < ${mid} req/s (${off.length}) | ${fmt(p95(off, base0.ttft))} | ${fmt(p95(off, withB.ttft))} | ${fmt(p95(off, withB.ttft) / p95(off, base0.ttft), 2)}× | – |`);
    console.log(`| batch throughput vs free capacity (C ${fmt(C)} − interactive ${fmt(interactiveRate)} = ${fmt(free)} req/s) | – | ${fmt(batchRate)} req/s | ${fmt((batchRate / free) * 100)} % | ≥ 80 % |`);
    await pool.close();
  } finally {
    await Promise.all(procs.map((p) => p.stop()));
  }
}

runMain(main);
