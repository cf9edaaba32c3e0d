// The standalone binary (npm run build:binary, scripts/build-binary.mjs): built, then run from an empty
// folder with no node on PATH, it answers the README's requests; its unpack folder is private, and it
// refuses one that other users can write. Builds a 100+ MB file (about 10 s here): only with
// SWITCHYARD_TEST_BINARY=1.
import t from 'tap';
import { execFile, spawn } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const root = fileURLToPath(new URL('../..', import.meta.url));
const run = promisify(execFile);

t.test('build:binary, then serve with no node on PATH', { skip: process.env.SWITCHYARD_TEST_BINARY === '1' ? false : 'set SWITCHYARD_TEST_BINARY=1 to build and run the binary' }, async (t) => {
  const work = mkdtempSync(join(tmpdir(), 'switchyard-bin-test-'));
  t.teardown(() => rmSync(work, { recursive: true, force: true }));
  const out = join(work, 'switchyard');
  const t0 = Date.now();
  await run(process.execPath, [join(root, 'scripts', 'build-binary.mjs'), '--out', out], { cwd: root, maxBuffer: 16 << 20 });
  t.comment(`built in ${((Date.now() - t0) / 1000).toFixed(1)} s, ${(statSync(out).size / 1e6).toFixed(1)} MB`);

  const empty = join(work, 'empty');
  mkdirSync(empty);
  const extract = join(work, 'x');
  // no node anywhere on PATH, no HOME, no NODE_* variables
  const env = { PATH: '/nonexistent', SWITCHYARD_EXTRACT_DIR: extract };

  const v = await run(out, ['--version'], { cwd: empty, env });
  t.equal(v.stdout.trim(), `switchyard ${(await import('../../src/version.js')).VERSION} (node ${process.version})`, '--version names the embedded Node');
  t.equal(statSync(extract).mode & 0o777, 0o700, 'the unpack folder is private');
  const [id] = readdirSync(extract);
  t.ok(existsSync(join(extract, id!, '.complete')), 'unpacked once, marked complete');
  t.ok(existsSync(join(extract, id!, 'build', 'Release', 'switchyard_native.node')), 'the addon is there');

  // the smoke test against the binary: README's chat completion and Responses, a stream, /metrics, SIGTERM exit 0
  const smoke = await new Promise<{ code: number | null; out: string }>((resolve) => {
    const c = spawn(process.execPath, [join(root, 'scripts', 'smoke.mjs'), '--bin', out], { cwd: empty, env });
    let o = '';
    c.stdout.on('data', (b) => (o += b));
    c.stderr.on('data', (b) => (o += b));
    c.on('exit', (code) => resolve({ code, out: o }));
  });
  t.equal(smoke.code, 0, smoke.out);
  t.match(smoke.out, /smoke: \d+ checks passed/);

  // a folder other users can write is refused (they could plant code in it)
  const open = join(work, 'open');
  mkdirSync(open);
  chmodSync(open, 0o777);
  const bad = await run(out, ['--version'], { cwd: empty, env: { ...env, SWITCHYARD_EXTRACT_DIR: open } }).then(
    () => null,
    (err: { code: number; stderr: string }) => err,
  );
  t.ok(bad, 'exits non-zero');
  t.equal(bad?.code, 1);
  t.match(bad?.stderr, /is open to other users \(mode 777\)/);
  t.same(readdirSync(open), [], 'nothing unpacked there');
});
