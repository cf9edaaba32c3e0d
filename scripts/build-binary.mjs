#!/usr/bin/env node
// npm run build:binary: the standalone `switchyard` executable, a Node single executable application
// (SEA) of this install. Run it from a built checkout (`npm ci` done) with the Node to embed first on
// PATH: the binary is that Node plus one gzipped asset holding what `npm start` runs (package.json,
// binding.gyp, bin/, dist/src, dist/bindings, proto/, build/Release/switchyard_native.node and the
// production node_modules, without sources, type declarations, docs, and other platforms' binaries).
// scripts/sea-main.cjs, the SEA's entry, unpacks it once into a private folder and starts bin/switchyard.js.
//
//   node scripts/build-binary.mjs [--out out/switchyard]
//
// Steps: collect and pack the files, write the SEA config, `node --experimental-sea-config`, copy this
// node binary, inject the blob with postject (a dev dependency). Prints the timing of each step.
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';

const root = fileURLToPath(new URL('..', import.meta.url));
const argv = process.argv.slice(2);
const outAt = argv.indexOf('--out');
const out = resolve(root, outAt >= 0 ? argv[outAt + 1] : join('out', 'switchyard'));
const MAGIC = 'SWYPACK1';
const FUSE = 'NODE_SEA_FUSE_fce680ab2cc467b6e072b8b5df1996b2';
const t0 = Date.now();
let tStep = t0;
function step(what) {
  const now = Date.now();
  console.log(`build:binary: ${what} (${((now - tStep) / 1000).toFixed(1)} s)`);
  tStep = now;
}
function die(message) {
  console.error(`build:binary: ${message}`);
  process.exit(1);
}

const [major, minor] = process.versions.node.split('.').map(Number);
if (major < 20 || (major === 20 && minor < 12)) die(`Node ${process.version} cannot build a single executable with assets (20.12 or later)`);
for (const f of ['dist/src/cli.js', 'build/Release/switchyard_native.node']) {
  if (!existsSync(join(root, f))) die(`${f} is missing: run \`npm ci\` (or \`npm run build\`) first`);
}

// Files dropped from every package: not needed to run (sources, declarations, docs, build leftovers).
const DROP_EXT = /\.(md|markdown|d\.ts|d\.mts|d\.cts|map|ts|mts|cts|tsbuildinfo|c|cc|cpp|cxx|h|hh|hpp|gyp|gypi|o|a|mk|py|pyc|tgz|gz|zip)$/i;
const DROP_DIR = new Set(['node_modules', '.bin']);
// ... and at a package's top level only (deeper, such names can be code: yaml/dist/doc/)
const DROP_TOP = new Set(['.github', 'test', 'tests', '__tests__', 'docs', 'example', 'examples', 'benchmark', 'benchmarks']);
// Binaries for other systems and processors (prebuilds/<os>-<arch>, build/<os>/<arch>/...).
const ARCHS = ['x64', 'arm64', 'arm', 'ia32', 'x32', 'ppc64', 'ppc64le', 's390x', 'riscv64', 'loong64', 'mips64el'].filter((a) => a !== process.arch);
const OTHER_OS = new RegExp(
  `(^|[_-])(darwin|win32|windows|freebsd|openbsd|android|sunos|aix|macos|ios|${ARCHS.join('|')})([_.-]|$)`,
  'i',
);

let pkgTop = null;
/** Files under dir (relative to root), recursively, minus the drops. */
function walk(dir, native, files) {
  for (const ent of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, ent.name);
    if (ent.isDirectory()) {
      if (DROP_DIR.has(ent.name) || (dir === pkgTop && DROP_TOP.has(ent.name))) continue;
      // a native package's C/C++ sources and build intermediates
      if (native && dir === native && (ent.name === 'src' || ent.name === 'deps')) continue;
      if (native && (ent.name === 'obj.target' || ent.name === '.deps' || ent.name === 'obj')) continue;
      if (OTHER_OS.test(ent.name) && /[\\/](build|prebuilds|binaries|bin)([\\/]|$)/.test(p)) continue;
      walk(p, native, files);
    } else if (ent.isFile()) {
      if (DROP_EXT.test(ent.name) && !/^license/i.test(ent.name)) continue;
      files.push(relative(root, p));
    }
  }
}

const files = ['package.json', 'binding.gyp', 'build/Release/switchyard_native.node'];
for (const d of ['bin', 'dist/src', 'dist/bindings', 'proto']) {
  const list = [];
  walk(join(root, d), null, list);
  // proto/ is read at run time: keep it whole
  files.push(...(d === 'proto' ? list : list.filter((f) => f.endsWith('.js') || f.endsWith('.json') || f.endsWith('.cjs') || f.endsWith('.mjs'))));
}

// The production dependency tree, as npm sees it.
const lsOut = execFileSync(process.platform === 'win32' ? 'npm.cmd' : 'npm', ['ls', '--omit=dev', '--all', '--parseable'], { cwd: root, encoding: 'utf8', maxBuffer: 64 << 20 });
const pkgDirs = [...new Set(lsOut.split('\n').map((s) => s.trim()).filter((s) => s !== '' && s !== root.replace(/[\\/]$/, '')))];
const abi = process.versions.modules;
let uwsKept = 'none';
for (const dir of pkgDirs) {
  if (!dir.startsWith(join(root, 'node_modules') + sep)) continue;
  if (!existsSync(join(dir, 'package.json'))) continue;
  const rel = relative(root, dir);
  if (rel === join('node_modules', 'uWebSockets.js')) {
    // uWS (src/uws.ts loads the binary directly): its package.json, licence and the one binary for this Node's ABI (where there is one); the rest of its 100 MB stays out
    files.push(join(rel, 'package.json'), join(rel, 'LICENSE'));
    const bin = join(rel, 'binaries', `uws_${process.platform}_${process.arch}_${abi}.node`);
    if (existsSync(join(root, bin))) {
      files.push(bin);
      uwsKept = bin;
    }
    continue;
  }
  const native = existsSync(join(dir, 'binding.gyp')) || existsSync(join(dir, 'CMakeLists.txt')) ? dir : null;
  pkgTop = dir;
  walk(dir, native, files);
}
step(`collected ${files.length} files (${pkgDirs.length} packages; uWS binary: ${uwsKept})`);

// The pack: MAGIC, u32 index length, JSON [[path, mode, size], ...], then the files' bytes in order.
const index = [];
const bodies = [];
let total = 0;
for (const f of files) {
  const st = statSync(join(root, f));
  const bytes = readFileSync(join(root, f));
  index.push([f.split(sep).join('/'), st.mode & 0o777, bytes.length]);
  bodies.push(bytes);
  total += bytes.length;
}
// boot.cjs: a file-backed module, so its import() runs through the ordinary ESM loader (sea-main.cjs)
const boot = Buffer.from('module.exports = (url) => import(url);\n');
index.push(['boot.cjs', 0o644, boot.length]);
bodies.push(boot);
const indexBytes = Buffer.from(JSON.stringify(index));
const head = Buffer.alloc(MAGIC.length + 4);
head.write(MAGIC, 0, 'latin1');
head.writeUInt32LE(indexBytes.length, MAGIC.length);
const packed = gzipSync(Buffer.concat([head, indexBytes, ...bodies]), { level: 6 });
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
const id = `${pkg.version}-node${process.versions.node}-${createHash('sha256').update(packed).digest('hex').slice(0, 16)}`;
step(`packed ${(total / 1e6).toFixed(1)} MB into ${(packed.length / 1e6).toFixed(1)} MB (id ${id})`);

const work = mkdtempSync(join(tmpdir(), 'switchyard-sea-'));
try {
  writeFileSync(join(work, 'app.gz'), packed);
  writeFileSync(join(work, 'app.id'), id);
  copyFileSync(join(root, 'scripts', 'sea-main.cjs'), join(work, 'sea-main.cjs'));
  const config = {
    main: join(work, 'sea-main.cjs'),
    output: join(work, 'sea-prep.blob'),
    disableExperimentalSEAWarning: true,
    useSnapshot: false,
    useCodeCache: false,
    assets: { 'app.gz': join(work, 'app.gz'), 'app.id': join(work, 'app.id') },
  };
  writeFileSync(join(work, 'sea-config.json'), JSON.stringify(config, null, 2));
  execFileSync(process.execPath, ['--experimental-sea-config', join(work, 'sea-config.json')], { stdio: 'inherit' });
  step('SEA blob written');

  mkdirSync(dirname(out), { recursive: true });
  rmSync(out, { force: true });
  copyFileSync(process.execPath, out);
  chmodSync(out, 0o755);
  const postject = join(root, 'node_modules', 'postject', 'dist', 'cli.js');
  if (!existsSync(postject)) die('postject is missing (a dev dependency): run `npm ci` without --omit=dev');
  execFileSync(process.execPath, [postject, out, 'NODE_SEA_BLOB', join(work, 'sea-prep.blob'), '--sentinel-fuse', FUSE], { stdio: ['ignore', 'ignore', 'inherit'] });
  step(`injected into a copy of ${process.execPath}`);
} finally {
  rmSync(work, { recursive: true, force: true });
}
console.log(`build:binary: ${relative(process.cwd(), out) || out}: ${(statSync(out).size / 1e6).toFixed(1)} MB, node ${process.version}, ${((Date.now() - t0) / 1000).toFixed(1)} s in all`);
