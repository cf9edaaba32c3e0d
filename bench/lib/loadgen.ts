// Load generator for bench/overhead.ts, run in its own process. Its HTTP/1.1
// client is minimal on purpose (keep-alive sockets, one request per socket at
// a time, content-length responses only): a cheap generator leaves more of
// the shared CPU to the processes under test.
//   node dist/bench/loadgen.js URL [URL2 ...] --rate R | --concurrency C --duration S [--warmup S] [--body JSON]
// Fixed rate: open loop, requests sent on schedule whatever the responses do,
// R per second to EACH target; with several targets every slot sends one
// request to each, alternating which goes first, so the targets are measured
// under the same conditions at the same moments. Latency is measured from the
// send time. Fixed concurrency (first target only): closed loop, C requests
// always in flight. Prints one JSON line: {targets: [{url, ok, errors, rps,
// p50us, p90us, p99us, maxus}]}.
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { connect, type Socket } from 'node:net';

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    rate: { type: 'string' },
    concurrency: { type: 'string' },
    duration: { type: 'string', default: '5' },
    warmup: { type: 'string', default: '1' },
    path: { type: 'string', default: '/v1/completions' },
    body: { type: 'string', default: '{"model":"open-model","prompt":"Say hello to the benchmark.","max_tokens":1}' },
  },
});
if (positionals.length === 0) throw new Error('usage: loadgen URL [URL2 ...] --rate R | --concurrency C');
const body = Buffer.from(values.body!);
const durationMs = Number(values.duration) * 1000;
const warmupMs = Number(values.warmup) * 1000;

const CRLFCRLF = Buffer.from('\r\n\r\n');

/** One keep-alive connection; resolves each request's promise with its status. */
class Conn {
  readonly socket: Socket;
  #buf: Buffer | null = null;
  #resolve: ((status: number) => void) | null = null;
  #reject: ((err: Error) => void) | null = null;
  dead = false;
  constructor(host: string, port: number, onFree: (c: Conn) => void, onDead: (c: Conn) => void) {
    this.socket = connect({ host, port, noDelay: true });
    this.socket.on('data', (b: Buffer) => {
      const buf = this.#buf ? Buffer.concat([this.#buf, b]) : b;
      const end = buf.indexOf(CRLFCRLF);
      if (end < 0) {
        this.#buf = buf;
        return;
      }
      const head = buf.toString('latin1', 0, end);
      const m = /\r\ncontent-length:\s*(\d+)/i.exec(head);
      if (!m) return this.#fail(new Error('loadgen: response without content-length'));
      const total = end + 4 + Number(m[1]);
      if (buf.length < total) {
        this.#buf = buf;
        return;
      }
      this.#buf = null;
      const r = this.#resolve!;
      this.#resolve = this.#reject = null;
      onFree(this);
      r(Number(head.slice(9, 12)));
    });
    const die = () => {
      if (this.dead) return;
      this.dead = true;
      onDead(this);
      this.#fail(new Error('loadgen: connection closed'));
    };
    this.socket.on('error', die);
    this.socket.on('close', die);
  }
  #fail(err: Error): void {
    const rj = this.#reject;
    this.#resolve = this.#reject = null;
    this.socket.destroy();
    rj?.(err);
  }
  send(req: Buffer): Promise<number> {
    return new Promise((resolve, reject) => {
      this.#resolve = resolve;
      this.#reject = reject;
      this.socket.write(req);
    });
  }
}

class MiniPool {
  readonly #idle: Conn[] = [];
  readonly #host: string;
  readonly #port: number;
  readonly #req: Buffer;
  constructor(url: string, path: string) {
    const u = new URL(url);
    this.#host = u.hostname;
    this.#port = Number(u.port);
    this.#req = Buffer.concat([
      Buffer.from(`POST ${path} HTTP/1.1\r\nhost: ${u.host}\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n`),
      body,
    ]);
  }
  request(): Promise<number> {
    let c = this.#idle.pop();
    while (c && c.dead) c = this.#idle.pop();
    c ??= new Conn(this.#host, this.#port, (x) => this.#idle.push(x), () => {});
    return c.send(this.#req);
  }
  close(): void {
    for (const c of this.#idle.splice(0)) c.socket.destroy();
  }
}

class Target {
  readonly url: string;
  readonly pool: MiniPool;
  lat: number[] = [];
  ok = 0;
  errors = 0;
  constructor(url: string) {
    this.url = url;
    this.pool = new MiniPool(url, values.path!);
  }
  reset(): void {
    this.lat = [];
    this.ok = 0;
    this.errors = 0;
  }
}
const targets = positionals.map((u) => new Target(u));
let measuring = false;

function once(tg: Target): Promise<void> {
  const sent = performance.now();
  return tg.pool.request().then(
    (status) => {
      if (measuring) {
        if (status === 200) {
          tg.ok++;
          tg.lat.push(performance.now() - sent);
        } else tg.errors++;
      }
    },
    () => {
      if (measuring) tg.errors++;
    },
  );
}

function pct(sorted: number[], p: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

function startMeasuring(now: number, start: number): void {
  if (!measuring && now >= start + warmupMs) {
    measuring = true;
    for (const tg of targets) tg.reset();
  }
}

async function fixedRate(rate: number): Promise<void> {
  // Timer-driven (no busy loop, so the generator does not steal a core from
  // the processes under test).
  const start = performance.now();
  const end = start + warmupMs + durationMs;
  let sent = 0;
  const inflight = new Set<Promise<void>>();
  await new Promise<void>((resolve) => {
    const tick = () => {
      const now = performance.now();
      startMeasuring(now, start);
      if (now >= end) {
        resolve();
        return;
      }
      const due = Math.floor(((now - start) / 1000) * rate);
      while (sent < due) {
        sent++;
        for (let k = 0; k < targets.length; k++) {
          const tg = targets[(sent + k) % targets.length];
          const p = once(tg);
          inflight.add(p);
          void p.finally(() => inflight.delete(p));
        }
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
  const tg = targets[0];
  const worker = async () => {
    for (;;) {
      const now = performance.now();
      if (now >= end) return;
      startMeasuring(now, start);
      await once(tg);
    }
  };
  await Promise.all(Array.from({ length: c }, worker));
  measuring = false;
}

if (values.rate) await fixedRate(Number(values.rate));
else await fixedConcurrency(Number(values.concurrency ?? '32'));
console.log(
  JSON.stringify({
    targets: targets.map((tg) => {
      tg.lat.sort((a, b) => a - b);
      return {
        url: tg.url,
        ok: tg.ok,
        errors: tg.errors,
        rps: tg.ok / (durationMs / 1000),
        p50us: pct(tg.lat, 50) * 1000,
        p90us: pct(tg.lat, 90) * 1000,
        p99us: pct(tg.lat, 99) * 1000,
        maxus: tg.lat.length ? tg.lat[tg.lat.length - 1] * 1000 : NaN,
      };
    }),
  }),
);
for (const tg of targets) tg.pool.close();
