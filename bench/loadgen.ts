// Load generator for bench/overhead.ts, run in its own process:
//   node dist/bench/loadgen.js URL --rate R | --concurrency C --duration S [--warmup S] [--body JSON]
// Fixed rate: open loop, requests sent on schedule whatever the responses do;
// latency measured from the send time. Fixed concurrency: closed
// loop, C requests always in flight. Prints one JSON line with the figures.
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { Pool } from 'undici';

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    rate: { type: 'string' },
    concurrency: { type: 'string' },
    duration: { type: 'string', default: '5' },
    warmup: { type: 'string', default: '1' },
    path: { type: 'string', default: '/v1/completions' },
    body: { type: 'string', default: '{"model":"open-model","prompt":"Say hello to the benchmark.","max_tokens":1}' },
    connections: { type: 'string', default: '64' },
  },
});
const url = positionals[0];
if (!url) throw new Error('usage: loadgen URL --rate R | --concurrency C');
const body = Buffer.from(values.body!);
const pool = new Pool(url, { connections: Number(values.connections), pipelining: 1, keepAliveTimeout: 60_000 });
const headers = ['content-type', 'application/json'];
const durationMs = Number(values.duration) * 1000;
const warmupMs = Number(values.warmup) * 1000;

let lat: number[] = [];
let ok = 0;
let errors = 0;
let measuring = false;

function once(scheduled: number): Promise<void> {
  return pool.request({ path: values.path!, method: 'POST', headers, body }).then(
    async (res) => {
      await res.body.dump();
      if (measuring) {
        if (res.statusCode === 200) {
          ok++;
          lat.push(performance.now() - scheduled);
        } else errors++;
      }
    },
    () => {
      if (measuring) errors++;
    },
  );
}

function pct(sorted: number[], p: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

async function fixedRate(rate: number): Promise<void> {
  // Timer-driven (no busy loop, so the generator does not steal a core from
  // the processes under test); latency is measured from the actual send time.
  const start = performance.now();
  const end = start + warmupMs + durationMs;
  let sent = 0;
  const inflight = new Set<Promise<void>>();
  await new Promise<void>((resolve) => {
    const tick = () => {
      const now = performance.now();
      if (!measuring && now >= start + warmupMs) {
        measuring = true;
        lat = [];
        ok = 0;
        errors = 0;
      }
      if (now >= end) {
        resolve();
        return;
      }
      const due = Math.floor(((now - start) / 1000) * rate);
      while (sent < due) {
        sent++;
        const p = once(performance.now());
        inflight.add(p);
        void p.finally(() => inflight.delete(p));
      }
      const next = start + ((sent + 1) * 1000) / rate;
      setTimeout(tick, Math.max(0, next - performance.now()));
    };
    tick();
  });
  measuring = false;
  await Promise.all(inflight);
}

async function fixedConcurrency(c: number): Promise<void> {
  const start = performance.now();
  const end = start + warmupMs + durationMs;
  const worker = async () => {
    for (;;) {
      const now = performance.now();
      if (now >= end) return;
      if (!measuring && now >= start + warmupMs) {
        measuring = true;
        lat = [];
        ok = 0;
        errors = 0;
      }
      await once(now);
    }
  };
  await Promise.all(Array.from({ length: c }, worker));
  measuring = false;
}

const t0 = performance.now();
if (values.rate) await fixedRate(Number(values.rate));
else await fixedConcurrency(Number(values.concurrency ?? '32'));
void t0;
lat.sort((a, b) => a - b);
console.log(
  JSON.stringify({
    ok,
    errors,
    rps: ok / (durationMs / 1000),
    p50us: pct(lat, 50) * 1000,
    p90us: pct(lat, 90) * 1000,
    p99us: pct(lat, 99) * 1000,
    maxus: lat.length ? lat[lat.length - 1] * 1000 : NaN,
  }),
);
await pool.close();
