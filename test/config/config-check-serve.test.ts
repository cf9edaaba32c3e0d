// `switchyard check` refuses every config `serve` refuses, with the same field
// paths and exit 2: the real binary (bin/switchyard.js over dist/) runs both
// over one list of bad configs. The precise-pool rules used to be enforced only
// when serve built the index (src/server/precise.ts), so check accepted them.
import t from 'tap';

// every case spawns the real binary twice: slow on a loaded machine
t.setTimeout(600_000);
import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { stringify } from 'yaml';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const BIN = join(ROOT, 'bin', 'switchyard.js');
const dir = mkdtempSync(join(tmpdir(), 'swy-check-serve-'));

/** Runs the binary; a serve that starts (the config passed) is stopped and reported as 'started'. */
function run(args: string[]): Promise<{ code: number | 'started'; err: string }> {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [BIN, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    let started = false;
    p.stdout.on('data', (d) => {
      out += String(d);
      if (!started && /listening on/.test(out)) {
        started = true;
        p.kill('SIGTERM');
      }
    });
    p.stderr.on('data', (d) => (err += String(d)));
    const timer = setTimeout(() => p.kill('SIGKILL'), 60_000);
    p.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code: started ? 'started' : (code ?? -1), err });
    });
  });
}

/** The field paths of a ConfigError's lines on stderr (`path: message`), sorted. */
const pathsOf = (stderr: string) =>
  stderr
    .split('\n')
    .map((l) => /^([A-Za-z(][\w.[\]()]*): /.exec(l)?.[1])
    .filter((p): p is string => p !== undefined)
    .sort();

const ep = (name: string, port: number, kvEvents?: Record<string, unknown>) => ({ name, url: `http://127.0.0.1:${port}`, ...(kvEvents ? { kvEvents } : {}) });
const doc = (pools: unknown[], extra: Record<string, unknown> = {}) => ({ apiVersion: 'switchyard/v1', kind: 'Router', listen: { host: '127.0.0.1', port: 0 }, pools, ...extra });
const precise = (name: string, models: string[], endpoints: unknown[], prefix: Record<string, unknown> = {}) => ({ name, models, endpoints, prefix: { mode: 'precise', ...prefix } });

const BAD: { name: string; config: unknown; paths: string[] }[] = [
  {
    name: 'precise pools with different blockTokens',
    config: doc([precise('a', ['m1'], [ep('a0', 1, { endpoint: 'tcp://127.0.0.1:5601' })], { blockTokens: 16 }), precise('b', ['m2'], [ep('b0', 2, { endpoint: 'tcp://127.0.0.1:5602' })], { blockTokens: 32 })]),
    paths: ['pools[1].prefix.blockTokens'],
  },
  {
    name: 'precise pools with different speculativeMs',
    config: doc([precise('a', ['m1'], [ep('a0', 1, { endpoint: 'tcp://127.0.0.1:5601' })]), precise('b', ['m2'], [ep('b0', 2, { endpoint: 'tcp://127.0.0.1:5602' })], { speculativeMs: 1234 })]),
    paths: ['pools[1].prefix.speculativeMs'],
  },
  {
    name: 'two endpoints share a publisher without ranks',
    config: doc([precise('a', ['m1'], [ep('a0', 1, { endpoint: 'tcp://127.0.0.1:5601' }), ep('a1', 2, { endpoint: 'tcp://127.0.0.1:5601' })])]),
    paths: ['pools[0].endpoints[1].kvEvents.endpoint'],
  },
  {
    name: 'two endpoints claim one rank of a publisher',
    config: doc([precise('a', ['m1'], [ep('a0', 1, { endpoint: 'tcp://127.0.0.1:5601', dataParallelRank: 2 }), ep('a1', 2, { endpoint: 'tcp://127.0.0.1:5601', dataParallelRank: 2 })])]),
    paths: ['pools[0].endpoints[1].kvEvents.dataParallelRank'],
  },
  {
    name: 'a precise-pool rule reported with a schema problem and a cross-field rule',
    config: doc(
      [
        precise('a', ['m1'], [ep('a0', 1, { endpoint: 'tcp://127.0.0.1:5601' })], { blockTokens: 16 }),
        precise('a', ['m2'], [ep('b0', 2, { endpoint: 'tcp://127.0.0.1:5602' })], { blockTokens: 32 }),
      ],
      { limits: { maxBodyBytes: -1 } },
    ),
    paths: ['limits.maxBodyBytes', 'pools[1].name', 'pools[1].prefix.blockTokens'],
  },
  {
    name: 'precise mode on a discovered pool',
    config: doc([{ name: 'a', models: ['m1'], prefix: { mode: 'precise' }, discovery: { kubernetes: { inferencePool: 'engines', targetPort: 8000 } } }]),
    paths: ['pools[0].prefix.mode'],
  },
  {
    name: 'a prefill-only revision',
    config: doc([{ name: 'a', models: ['m1'], endpoints: [{ ...ep('p0', 1), role: 'prefill' }] }]),
    paths: ['pools[0].endpoints[0].role'],
  },
  {
    name: 'an admin listener off loopback without a token',
    config: doc([{ name: 'a', models: ['m1'], endpoints: [ep('a0', 1)] }], { admin: { host: '0.0.0.0', port: 0 } }),
    paths: ['admin.token'],
  },
  {
    name: 'a bad flowControl block',
    config: doc([{ name: 'a', models: ['m1'], endpoints: [ep('a0', 1)] }], { flowControl: { bands: 'nope' } }),
    paths: [],
  },
];

for (const c of BAD) {
  t.test(c.name, async (t) => {
    const file = join(dir, `${c.name.replace(/\W+/g, '-')}.yaml`);
    writeFileSync(file, stringify(c.config));
    const [check, serve] = await Promise.all([run(['check', '-q', '--config', file]), run(['serve', '--config', file, '--port', '0'])]);
    t.equal(check.code, 2, `check exits 2\n${check.err}`);
    t.equal(serve.code, 2, `serve exits 2\n${serve.err}`);
    const paths = pathsOf(check.err);
    t.ok(paths.length > 0, 'check names field paths');
    t.same(pathsOf(serve.err), paths, 'serve names the same field paths');
    if (c.paths.length > 0) t.same(paths, [...c.paths].sort(), 'the expected field paths');
  });
}

t.test('the good twin of each precise case passes both', async (t) => {
  const file = join(dir, 'good.yaml');
  writeFileSync(
    file,
    stringify(
      doc([
        precise('a', ['m1'], [ep('a0', 1, { endpoint: 'tcp://127.0.0.1:5601', dataParallelRank: 0 }), ep('a1', 2, { endpoint: 'tcp://127.0.0.1:5601', dataParallelRank: 1 })], { blockTokens: 16 }),
        precise('b', ['m2'], [ep('b0', 3, { endpoint: 'tcp://127.0.0.1:5602' })], { blockTokens: 16 }),
      ]),
    ),
  );
  const [check, serve] = await Promise.all([run(['check', '-q', '--config', file]), run(['serve', '--config', file, '--port', '0'])]);
  t.equal(check.code, 0, `check exits 0\n${check.err}`);
  t.equal(serve.code, 'started', `serve starts\n${serve.err}`);
});
