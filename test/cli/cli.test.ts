// The `switchyard` command's exit codes and output, from the real binary
// (bin/switchyard.js over dist/): --version, check, serve --print-config,
// --help for every command, shell-friendly errors.
import t from 'tap';

// every case spawns the real binary: slow on a loaded machine
t.setTimeout(600_000);
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse } from 'yaml';
import { progress, progressEnabled } from '../../src/progress.js';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const BIN = join(ROOT, 'bin', 'switchyard.js');
const FIX = join(ROOT, 'test', 'fixtures');
const pkg = JSON.parse(await import('node:fs').then((fs) => fs.readFileSync(join(ROOT, 'package.json'), 'utf8')));

function run(args: string[], env: Record<string, string> = {}) {
  const r = spawnSync(process.execPath, [BIN, ...args], { encoding: 'utf8', timeout: 60_000, env: { ...process.env, ...env } });
  return { code: r.status, out: r.stdout, err: r.stderr };
}

t.test('--version', async (t) => {
  for (const a of ['--version']) {
    const r = run([a]);
    t.equal(r.code, 0, a);
    t.equal(r.out.trim().split(' ')[1], pkg.version, `${a} prints the package version`);
  }
});

t.test('--help for every command, with examples; exit 0', async (t) => {
  for (const args of [['--help'], ['serve', '--help'], ['sim', '--help'], ['check', '--help']]) {
    const r = run(args);
    t.equal(r.code, 0, `${args.join(' ')}: exit 0`);
    t.match(r.out, /^usage: switchyard/, `${args.join(' ')}: usage`);
    t.match(r.out, /examples:\n\s+switchyard /, `${args.join(' ')}: examples`);
  }
  const none = run([]);
  t.equal(none.code, 2, 'no command: exit 2');
  t.match(none.err, /usage: switchyard/);
  const bad = run(['frobnicate']);
  t.equal(bad.code, 2, 'unknown command: exit 2');
  t.match(bad.err, /unknown command 'frobnicate'/);
});

t.test('--help examples: every line whole (a continuation backslash is printed, not swallowed)', async (t) => {
  const { main } = await import('../../src/cli.js');
  for (const args of [['--help'], ['serve', '--help'], ['sim', '--help'], ['check', '--help']]) {
    const printed: string[] = [];
    const log = console.log;
    console.log = (...a: unknown[]) => void printed.push(a.join(' '));
    try {
      t.equal(await main(args), 0, `${args.join(' ')}: exit 0`);
    } finally {
      console.log = log;
    }
    const text = printed.join('\n');
    const section = /\nexamples:\n([\s\S]*?)(?:\n\n|$)/.exec(text);
    t.ok(section, `${args.join(' ')}: an examples section`);
    const lines = section![1]!.split('\n');
    lines.forEach((line, i) => {
      const continued = i > 0 && lines[i - 1]!.endsWith(' \\');
      if (continued) t.match(line, /^\s{4,}\S/, `${args.join(' ')}: a continuation line is indented: ${line}`);
      else t.match(line, /^ {2}(switchyard|curl) /, `${args.join(' ')}: an example starts a line: ${line}`);
      // two commands run together on one line is a swallowed line break
      t.notMatch(line.trim().slice(1), /\s(switchyard (serve|sim|check)|curl) /, `${args.join(' ')}: one command per line: ${line}`);
      t.notMatch(line, /\S {4,}-/, `${args.join(' ')}: no joined continuation: ${line}`);
    });
  }
});

t.test('check: a valid config prints the resolved config with defaults, exit 0', async (t) => {
  const r = run(['check', '--config', join(FIX, 'router-valid.yaml')]);
  t.equal(r.code, 0, r.err);
  const cfg = parse(r.out);
  t.equal(cfg.apiVersion, 'switchyard/v1');
  t.equal(cfg.proxy.maxRetries, 2, 'defaults filled in');
  t.equal(cfg.tracing.enabled, false, 'tracing shown, off by default');
  t.equal(cfg.dataLayer.staleAfterMs, 2000);
  const j = run(['check', '--config', join(FIX, 'router-valid.yaml'), '--json']);
  t.equal(j.code, 0);
  t.same(JSON.parse(j.out), cfg, '--json prints the same config as JSON');
  // the printed config is itself a valid config (check it again)
  const dir = mkdtempSync(join(tmpdir(), 'swy-cli-'));
  writeFileSync(join(dir, 'resolved.yaml'), r.out);
  const again = run(['check', '-q', '--config', join(dir, 'resolved.yaml')]);
  t.equal(again.code, 0, `the printed config validates again ${again.err}`);
  t.equal(again.out, '', '-q prints nothing');
});

t.test('check: an invalid config, one line per problem, field path first, exit 2', async (t) => {
  const r = run(['check', '--config', join(FIX, 'router-invalid.yaml')]);
  t.equal(r.code, 2);
  t.equal(r.out, '', 'nothing on stdout');
  const lines = r.err.trim().split('\n');
  t.ok(lines.length >= 5, `${lines.length} problems`);
  for (const l of lines) t.match(l, /^(\(root\)|[A-Za-z][\w]*(\[\d+\]|\.\w+)*): \S/, `path first: ${l}`);
  t.ok(lines.includes('listen.port: must be an integer in [0, 65535] (got 70000)'));
  t.ok(lines.some((l) => l.startsWith('pools[0].endpoints[1].url: ')));

  const flow = run(['check', '--config', join(FIX, 'router-flow-invalid.yaml')]);
  t.equal(flow.code, 2, 'flow control rules are checked too');
  t.match(flow.err, /^flowControl\./m);
  const syntax = run(['check', '--config', join(FIX, 'router-syntax.yaml')]);
  t.equal(syntax.code, 2, 'YAML syntax error: exit 2');
  t.match(syntax.err, /^line \d+, column \d+: YAML syntax error/);
  const missing = run(['check', '--config', join(FIX, 'no-such-file.yaml')]);
  t.equal(missing.code, 2, 'unreadable file: exit 2');
  t.match(missing.err, /cannot read/);
  const dir = mkdtempSync(join(tmpdir(), 'swy-cli-'));
  const tr = join(dir, 'tracing.yaml');
  writeFileSync(tr, 'apiVersion: switchyard/v1\nkind: Router\npools: [{ name: p, models: [m], endpoints: [{ url: "http://127.0.0.1:9" }] }]\ntracing: { enabled: yes, sampleRatio: 2, protocol: thrift }\n');
  const t2 = run(['check', '--config', tr]);
  t.equal(t2.code, 2);
  t.match(t2.err, /^tracing\.sampleRatio: must be a number in \[0, 1\] \(got 2\)$/m);
  t.match(t2.err, /^tracing\.protocol: must be one of: http\/protobuf, grpc/m);
  t.match(t2.err, /^tracing\.enabled: must be true or false/m);
});

t.test('check: bad options, exit 2', async (t) => {
  const r = run(['check']);
  t.equal(r.code, 2, '--config is required');
  t.match(r.err, /^--config: is required/);
  t.equal(run(['check', '--config', 'x', '--frob']).code, 2, 'unknown option');
});

t.test('serve --print-config: the resolved config, nothing started, exit 0', async (t) => {
  const r = run(['serve', '--print-config', '--config', join(FIX, 'router-valid.yaml'), '--port', '9123', '--log-level', 'debug']);
  t.equal(r.code, 0, r.err);
  const cfg = parse(r.out);
  t.equal(cfg.listen.port, 9123, '--port applied');
  t.equal(cfg.logging.level, 'debug', '--log-level applied');
  const d = run(['serve', '--print-config']);
  t.equal(d.code, 0, 'the embedded default');
  t.equal(parse(d.out).pools[0].endpoints.length, 4);
  const bad = run(['serve', '--print-config', '--config', join(FIX, 'router-invalid.yaml')]);
  t.equal(bad.code, 2, 'an invalid config: exit 2');
  t.match(bad.err, /^listen\.port: /m);
});

t.test('serve: bad options, one line each, exit 2', async (t) => {
  const r = run(['serve', '--port', 'x', '--engine', 'tgi', '--log-level', 'loud']);
  t.equal(r.code, 2);
  t.same(r.err.trim().split('\n'), [
    '--port: must be an integer in [0, 65535] (got x)',
    '--engine: must be one of: vllm, sglang (got tgi)',
    '--log-level: must be one of fatal, error, warn, info, debug, trace, silent (got loud)',
  ]);
  const w = run(['serve', '--watch-settle-ms', '-5']);
  t.equal(w.code, 2);
  t.match(w.err, /^switchyard serve: /, 'a negative value is not an option value');
  const s = run(['serve', '--watch-settle-ms', '1.5', '--config', join(FIX, 'router-invalid.yaml'), '--watch-config']);
  t.equal(s.code, 2);
  t.same(s.err.trim().split('\n'), ['--watch-settle-ms: must be an integer in [0, 600000] (got 1.5)']);
  const alone = run(['serve', '--watch-settle-ms', '2000']);
  t.equal(alone.code, 2);
  t.same(alone.err.trim().split('\n'), ['--watch-settle-ms: applies with --watch-config only']);
});

t.test('sim: bad options, exit 2', async (t) => {
  const r = run(['sim', '--port', 'x']);
  t.equal(r.code, 2);
  t.match(r.err, /^switchyard sim: --port expects a number, got 'x'$/m);
});

t.test('progress: silent when not a TTY or in CI, drawn on a TTY', async (t) => {
  const fakeTty = (isTTY: boolean) => {
    const chunks: string[] = [];
    return { stream: { isTTY, columns: 60, write: (s: string) => (chunks.push(s), true) } as unknown as NodeJS.WriteStream, chunks };
  };
  t.notOk(progressEnabled(fakeTty(false).stream, {}), 'not a TTY');
  t.notOk(progressEnabled(fakeTty(true).stream, { CI: 'true' }), 'CI set');
  t.ok(progressEnabled(fakeTty(true).stream, {}), 'a TTY outside CI');
  const quiet = fakeTty(false);
  const p = progress('bench', 3, quiet.stream);
  p.tick('a');
  p.done();
  t.same(quiet.chunks, [], 'nothing written off a TTY');
  if (!process.env.CI) {
    const tty = fakeTty(true);
    const q = progress('bench', 2, tty.stream);
    q.tick('round 1');
    q.tick('round 2');
    q.done();
    t.ok(tty.chunks.some((c) => c.includes('bench [') && c.includes('2/2')), 'a progress line on a TTY');
    t.ok(tty.chunks.every((c) => c.length <= 80), 'within the terminal width');
  }
});
