#!/usr/bin/env node
// Sanitizer run (`npm run test:asan`): builds the native addon with
// AddressSanitizer + UndefinedBehaviorSanitizer (SWITCHYARD_SANITIZE=1) into
// build-asan/, leaving build/Release untouched, then runs the native property
// and thread tests against that build with the ASan runtime preloaded into
// node. Exits non-zero if the build or any test fails (a sanitizer report
// aborts the test process, which fails its tap file).
//
//   node scripts/asan.js [test files...]
//   env SWITCHYARD_ASAN_DIR=<dir>   build directory (default build-asan)
//   env SWITCHYARD_ASAN_SKIP_BUILD=1  reuse the existing sanitizer build
//   env SWITCHYARD_ASAN_ALL=1         also run the slow thread tests listed in SLOW
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const dir = resolve(root, process.env.SWITCHYARD_ASAN_DIR ?? 'build-asan');
const started = Date.now();

function log(msg) {
  process.stdout.write(`[asan] ${msg}\n`);
}

function run(cmd, args, opts) {
  const r = spawnSync(cmd, args, { stdio: 'inherit', ...opts });
  if (r.error) throw r.error;
  return r.status ?? 1;
}

if (process.platform !== 'linux') {
  log(`sanitizer run supports linux only (this is ${process.platform}); skipping`);
  process.exit(0);
}

// 1. Mirror binding.gyp and native/ into the sanitizer build directory, copying
//    only changed files so an unchanged tree is not recompiled.
function sync(src, dst) {
  if (existsSync(dst) && readFileSync(src).equals(readFileSync(dst))) return false;
  copyFileSync(src, dst);
  return true;
}
mkdirSync(join(dir, 'native'), { recursive: true });
let changed = sync(join(root, 'binding.gyp'), join(dir, 'binding.gyp'));
const sources = new Set(readdirSync(join(root, 'native')));
for (const f of sources) changed = sync(join(root, 'native', f), join(dir, 'native', f)) || changed;
for (const f of readdirSync(join(dir, 'native'))) {
  if (!sources.has(f)) rmSync(join(dir, 'native', f));
}

const nodeFile = join(dir, 'build', 'Release', 'switchyard_native.node');
const nodeGyp = join(root, 'node_modules', 'node-gyp', 'bin', 'node-gyp.js');
// npm passes its nodedir setting (where node's headers are) to scripts it
// runs; when this file is run directly, ask npm for it.
function nodeDirArgs() {
  let d = process.env.npm_config_nodedir;
  if (d === undefined) {
    const r = spawnSync('npm', ['config', 'get', 'nodedir'], { encoding: 'utf8' });
    d = (r.stdout ?? '').trim();
  }
  return d && d !== 'undefined' && d !== 'null' ? [`--nodedir=${d}`] : [];
}
if (process.env.SWITCHYARD_ASAN_SKIP_BUILD !== '1') {
  const fresh = !existsSync(join(dir, 'build', 'Makefile'));
  if (fresh || changed || !existsSync(nodeFile)) {
    log(`building the addon with ASan+UBSan in ${dir}`);
    const env = { ...process.env, SWITCHYARD_SANITIZE: '1' };
    const status = fresh
      ? run(process.execPath, [nodeGyp, 'rebuild', '--directory', dir, ...nodeDirArgs()], { cwd: dir, env })
      : run(process.execPath, [nodeGyp, 'build', '--directory', dir, ...nodeDirArgs()], { cwd: dir, env });
    if (status !== 0) {
      log('sanitizer build failed');
      process.exit(status);
    }
  } else {
    log('sanitizer build is up to date');
  }
}
if (!existsSync(nodeFile)) {
  log(`missing ${nodeFile}`);
  process.exit(1);
}

// 2. Run the native tests against it.
function libPath(name) {
  const r = spawnSync(process.env.CXX ?? 'g++', [`-print-file-name=${name}`], { encoding: 'utf8' });
  const p = (r.stdout ?? '').trim();
  return p && p !== name && existsSync(p) ? p : null;
}
const libasan = libPath('libasan.so');
if (!libasan) {
  log('cannot find libasan.so (g++ -print-file-name=libasan.so); install the compiler runtime');
  process.exit(1);
}

// Files that take minutes under the sanitizer (workers that start the
// TypeScript loader) run only with SWITCHYARD_ASAN_ALL=1, keeping the CI run
// well under 3 minutes.
const SLOW = new Set(['flow-queues-threads.test.ts']);
// the native tests, wherever they sit under test/ (test/<subject>/)
const defaults = readdirSync(join(root, 'test'), { recursive: true })
  .map((f) => String(f))
  .filter((f) => /^(prefix-index|native-|flow-queues).*\.test\.ts$/.test(f.split('/').pop()))
  .filter((f) => process.env.SWITCHYARD_ASAN_ALL === '1' || !SLOW.has(f.split('/').pop()))
  .map((f) => join('test', f))
  .sort();
const files = process.argv.length > 2 ? process.argv.slice(2) : defaults;
log(`running ${files.length} test files under ASan+UBSan: ${files.join(' ')}`);
const env = {
  ...process.env,
  LD_PRELOAD: [libasan, process.env.LD_PRELOAD].filter(Boolean).join(' '),
  ASAN_OPTIONS: 'detect_leaks=0:abort_on_error=1:' + (process.env.ASAN_OPTIONS ?? ''),
  UBSAN_OPTIONS: 'print_stacktrace=1:halt_on_error=1:' + (process.env.UBSAN_OPTIONS ?? ''),
  SWITCHYARD_NATIVE_PATH: nodeFile,
  SWITCHYARD_UNDER_ASAN: '1',
};
const tap = join(root, 'node_modules', '.bin', 'tap');
// per file: native-upstream-client.test.ts alone takes ~2.5 min under the sanitizer on a loaded 2-core machine
const status = run(tap, ['--timeout', '420', ...files], { cwd: root, env });
log(`${status === 0 ? 'passed' : 'FAILED'} in ${((Date.now() - started) / 1000).toFixed(1)} s`);
process.exit(status);
