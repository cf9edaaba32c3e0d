// Child processes for benchmarks: the router, simulated engines and proxies each
// run in their own process so that they do not share an event loop with the
// load generator.
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { createServer } from 'node:net';
import { readFileSync } from 'node:fs';

export const ROOT = fileURLToPath(new URL('../../..', import.meta.url)).replace(/\/$/, '');
export const CLI = `${ROOT}/bin/switchyard.js`;

export interface Proc {
  readonly child: ChildProcess;
  readonly name: string;
  stop(): Promise<void>;
}

const live = new Set<Proc>();
process.on('exit', () => {
  for (const p of live) p.child.kill('SIGKILL');
});
// An interrupted benchmark must not leave engines and routers behind.
for (const sig of ['SIGINT', 'SIGTERM'] as const) {
  process.once(sig, () => {
    for (const p of live) p.child.kill('SIGKILL');
    process.exit(130);
  });
}

/** Starts a command; its output goes to the parent's stderr when `verbose`. */
export function start(name: string, cmd: string, args: string[], opts: { verbose?: boolean; env?: Record<string, string> } = {}): Proc {
  const env = opts.env === undefined ? process.env : { ...process.env, ...opts.env };
  const child = spawn(cmd, args, { stdio: ['ignore', opts.verbose ? 'inherit' : 'ignore', 'pipe'], env });
  let err = '';
  child.stderr!.on('data', (b: Buffer) => {
    err += b.toString();
    if (err.length > 8192) err = err.slice(-8192);
    if (opts.verbose) process.stderr.write(b);
  });
  const proc: Proc = {
    child,
    name,
    stop: () =>
      new Promise<void>((resolve) => {
        live.delete(proc);
        if (child.exitCode !== null || child.signalCode !== null) return resolve();
        const t = setTimeout(() => child.kill('SIGKILL'), 3000);
        child.once('exit', () => {
          clearTimeout(t);
          resolve();
        });
        child.kill('SIGTERM');
      }),
  };
  child.once('exit', (code, sig) => {
    if (live.has(proc) && code !== 0 && sig !== 'SIGTERM') {
      process.stderr.write(`bench: ${name} exited (${code ?? sig}): ${err.slice(-2000)}\n`);
    }
  });
  live.add(proc);
  return proc;
}

/** Resolves when `url` answers 200, or rejects after `timeoutMs`. */
export async function waitReady(url: string, timeoutMs = 15000): Promise<void> {
  const until = Date.now() + timeoutMs;
  let last = '';
  while (Date.now() < until) {
    try {
      const r = await fetch(url);
      await r.arrayBuffer();
      if (r.status === 200) return;
      last = `status ${r.status}`;
    } catch (e) {
      last = (e as Error).message;
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${url} not ready after ${timeoutMs} ms (${last})`);
}

/** A free TCP port on loopback (the OS picks it). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

/** `count` consecutive free ports starting at a random base (checked one by one). */
export async function freePortRange(count: number): Promise<number> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const base = 20000 + Math.floor(Math.random() * 30000);
    let ok = true;
    for (let i = 0; i < count && ok; i++) ok = await isFree(base + i);
    if (ok) return base;
  }
  throw new Error(`no range of ${count} free ports found`);
}

function isFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = createServer();
    s.once('error', () => resolve(false));
    s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
  });
}

/**
 * CPU seconds a process has used so far, user + system (or `user` only), from
 * /proc/<pid>/stat (Linux; NaN elsewhere).
 */
export function cpuSeconds(pid: number | undefined, user = false): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // utime, stime: clock ticks of 10 ms (USER_HZ)
    return (Number(f[11]) + (user ? 0 : Number(f[12]))) / 100;
  } catch {
    return NaN;
  }
}

/**
 * cpuSeconds() of a process and its direct children (nginx's master forks its
 * worker, so the worker's time counts); children that exited are not counted.
 */
export function treeCpuSeconds(pid: number | undefined, user = false): number {
  let sum = cpuSeconds(pid, user);
  let kids: string[] = [];
  try {
    kids = readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(' ').filter(Boolean);
  } catch {
    return sum;
  }
  for (const k of kids) sum += cpuSeconds(Number(k), user);
  return sum;
}

/** Runs a benchmark's main() and exits with 0, or prints the error and exits with 1
 * (child processes it started are stopped by its own finally blocks first). */
export function runMain(main: () => Promise<void>): void {
  main().then(
    () => process.exit(0),
    (err) => {
      console.error(err);
      process.exit(1);
    },
  );
}

/** A benchmark option's value: `--name value` or `--name=value`; undefined when absent. */
export function option(argv: readonly string[], name: string): string | undefined {
  const i = argv.indexOf(name);
  if (i >= 0) return argv[i + 1];
  const eq = argv.find((a) => a.startsWith(name + '='));
  return eq?.slice(name.length + 1);
}

/** Stops every process given (absent ones skipped), all at once. */
export async function stopAll(...procs: readonly (Proc | null | undefined)[]): Promise<void> {
  await Promise.all(procs.map((p) => p?.stop()));
}

/** A whole-number benchmark option ≥ `min` (`dflt` when absent); anything else throws, naming the option. */
export function intOption(argv: readonly string[], name: string, dflt: number, min: number): number {
  const raw = option(argv, name);
  const v = Number(raw ?? dflt);
  if (!Number.isInteger(v) || v < min) throw new Error(`${name} must be an integer ≥ ${min} (got ${raw})`);
  return v;
}

/**
 * The head of a router config in front of a simulated fleet started with
 * `switchyard sim --fleet N --base-port base`: one vLLM pool `sim` serving
 * open-model, endpoints e0..e(N-1), warn-level logs. Scenarios append their
 * own blocks (flowControl, scheduling, ...) after it.
 */
export function simRouterYaml(port: number, base: number, engines: number): string {
  const endpoints = Array.from({ length: engines }, (_, i) => `      - { name: e${i}, url: "http://127.0.0.1:${base + i}" }`).join('\n');
  return `apiVersion: switchyard/v1
kind: Router
listen: { host: 127.0.0.1, port: ${port} }
logging: { level: warn }
pools:
  - name: sim
    engine: vllm
    models: [open-model]
    endpoints:
${endpoints}
`;
}
