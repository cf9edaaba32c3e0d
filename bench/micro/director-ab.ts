// `node dist/bench/micro/director-ab.js --base <dir>`: the director's CPU per
// request (parse, admit, pick, dispatch, relay, release: Director.begin to
// port.done), this build against another build (a copy with dist/ and
// build/Release/ built), both loaded in this one process and run in
// interleaved rounds (order flipped every round). No sockets: the upstream
// client answers inside send() (head, one body chunk, end) and the client
// port discards, so what is measured is the director, the scheduler's pick
// and the gate, isolated from the transport (router-ab.ts measures the whole
// router, which on a shared machine is noisier than the few per cent a
// refactor must resolve). CPU = process.cpuUsage over each round.
//   node dist/bench/micro/director-ab.js --base /tmp/swy-base [--requests 100000] [--rounds 7]
// --base takes a comma list of builds (a bisection in one run): all are loaded, each round runs every build
// once (the order rotated and flipped round by round) and the ratios are to the first. Besides the medians
// of all rounds it prints the quiet rounds' figures: the half of the rounds whose summed CPU (all builds)
// was lowest, i.e. the rounds least hit by host pauses and other processes' load.
//   node dist/bench/micro/director-ab.js --base /tmp/a,/tmp/b,/tmp/c [--names a,b,c]
import { existsSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { pino } from 'pino';
import { median } from '../lib/stats.js';
import { option, runMain, ROOT } from '../lib/proc.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const argv = process.argv.slice(2);
const base = option(argv, '--base') ?? '';
const names = (option(argv, '--names') ?? '').split(',').filter((n) => n !== '');
const requests = Number(option(argv, '--requests') ?? '100000');
const rounds = Number(option(argv, '--rounds') ?? '7');

const BODY = Buffer.from(JSON.stringify({ model: 'open-model', prompt: 'Say hello to the benchmark, please.', max_tokens: 1 }));
const ANSWER = Buffer.from(JSON.stringify({ id: 'cmpl-1', object: 'text_completion', choices: [{ index: 0, text: 'hi', finish_reason: 'length' }], usage: { prompt_tokens: 8, completion_tokens: 1, total_tokens: 9 } }));

interface Build {
  name: string;
  run(n: number): void;
}

/** Loads one build's director and scheduler from its dist/ and returns a loop of n requests through them. */
async function load(name: string, root: string): Promise<Build> {
  const lib = (await import(pathToFileURL(join(root, 'dist', 'src', 'index.js')).href)) as Record<string, any>;
  const scheduler = lib.createScheduler(
    {
      pools: [{ name: 'p', models: ['open-model'], endpoints: [{ name: 'e0', url: 'http://127.0.0.1:9' }, { name: 'e1', url: 'http://127.0.0.1:10' }] }],
    },
    { watch: false, random: () => 0.5 },
  );
  const gate = { headerNames: [], admit: () => ({ admitted: true, ticket: null }), release() {} };
  const ttft = scheduler.endpoints.all.map(() => ({ observe() {} }));
  const metrics = { decision: { observe() {} }, ttft, rejected: new Map(), retries: 0, promptBlocks: 0, matchedBlocks: 0, countRequest() {} };
  const upstream = {
    send(_ep: unknown, _req: unknown, sink: { onUpstreamHeaders(s: number, t: string, l: number): void; onUpstreamData(c: Buffer): void; onUpstreamEnd(): void }) {
      sink.onUpstreamHeaders(200, 'application/json', ANSWER.length);
      sink.onUpstreamData(ANSWER);
      sink.onUpstreamEnd();
      return { pause() {}, resume() {}, abort() {} };
    },
    async close() {},
  };
  const director = new lib.Director({ scheduler, upstream, gate, metrics, log: pino({ level: 'silent' }), maxRetries: 2 });
  let done = 0;
  let errors = 0;
  let lastError = '';
  const port = {
    head() {},
    write() {},
    end() {},
    fail() {},
    error(status: number, message: string) {
      errors++;
      lastError = `${status} ${message}`;
    },
    done: () => done++,
  };
  const kind = lib.KIND_COMPLETION ?? 1;
  // the caller: a Caller object since #29 (src/identity.ts ANONYMOUS), a tenant string before; a string given
  // to a build that wants a Caller sends every request down an error path (11x the CPU: not the director's cost)
  const identity = existsSync(join(root, 'dist', 'src', 'identity.js')) ? ((await import(pathToFileURL(join(root, 'dist', 'src', 'identity.js')).href)) as Record<string, any>) : {};
  const caller = identity.ANONYMOUS ?? '';
  return {
    name,
    run(n: number) {
      for (let i = 0; i < n; i++) director.begin(port, kind, `r${i}`, caller, {}, BODY);
      if (done < n) throw new Error(`${name}: ${n - done} requests did not end`);
      // every request must be a 200 through the whole path, or the figure is an error path's
      if (errors > 0) throw new Error(`${name}: ${errors} requests answered an error (${lastError})`);
      done = 0;
    },
  };
}

async function main(): Promise<void> {
  if (base === '') throw new Error('--base <dir of another Switchyard build>[,<dir>...] is required');
  const dirs = base.split(',').filter((d) => d !== '');
  const builds: Build[] = [];
  for (let i = 0; i < dirs.length; i++) builds.push(await load(names[i] ?? (dirs.length === 1 ? 'base' : basename(resolve(dirs[i]!))), resolve(dirs[i]!)));
  builds.push(await load(names[dirs.length] ?? 'this', ROOT));
  for (const b of builds) b.run(20_000); // warm-up (JIT)
  // us[r][b]: round r, build b
  const us: number[][] = [];
  for (let r = 0; r < rounds; r++) {
    const row = new Array<number>(builds.length).fill(0);
    const k = builds.length;
    for (let j = 0; j < k; j++) {
      const rot = (j + r) % k;
      const bi = r % 2 === 0 ? rot : k - 1 - rot;
      const t0 = process.cpuUsage();
      builds[bi]!.run(requests);
      const d = process.cpuUsage(t0);
      row[bi] = (d.user + d.system) / requests;
    }
    us.push(row);
  }
  const sum = (row: number[]) => row.reduce((a, x) => a + x, 0);
  const quiet = [...us].sort((a, b) => sum(a) - sum(b)).slice(0, Math.max(1, Math.ceil(rounds / 2)));
  const col = (rows: number[][], b: number) => rows.map((row) => row[b]!);
  const ratio = (rows: number[][], b: number) => median(rows.map((row) => row[b]! / row[0]!)) * 100;
  console.log(`director A/B: base = ${dirs[0]}, this = ${ROOT}; ${rounds} interleaved rounds of ${requests} requests (medians); quiet = the ${quiet.length} rounds of least summed CPU`);
  console.log('| build | director CPU µs/request | vs base | per-round ratio vs base | quiet rounds µs/request | quiet vs base (per-round ratio) |');
  console.log('|---|---:|---:|---:|---:|---:|');
  for (let b = 0; b < builds.length; b++) {
    const all = median(col(us, b));
    const q = median(col(quiet, b));
    console.log(
      `| ${builds[b]!.name} | ${all.toFixed(2)} | ${((all / median(col(us, 0))) * 100).toFixed(1)} % | ${ratio(us, b).toFixed(1)} % | ${q.toFixed(2)} | ${((q / median(col(quiet, 0))) * 100).toFixed(1)} % (${ratio(quiet, b).toFixed(1)} %) |`,
    );
  }
}

runMain(main);
