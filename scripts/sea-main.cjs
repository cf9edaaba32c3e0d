// The entry of the standalone `switchyard` binary (a Node single executable application, built by
// scripts/build-binary.mjs). The binary carries the installed package (dist/, bin/, proto/, the
// addon's .node and the production node_modules) as one gzipped asset; this unpacks it once into a
// private per-user folder, keyed by the asset's hash, and runs bin/switchyard.js from there with the
// ordinary module loader (native addons load with process.dlopen as from any install).
//
// Folder: $SWITCHYARD_EXTRACT_DIR, else $XDG_RUNTIME_DIR/switchyard, else <tmpdir>/switchyard-<uid>;
// it must be a directory (not a symlink) owned by this user with no group/other access, else the
// binary refuses to start (another user could have planted code there). A version already unpacked
// (its `.complete` marker present) is used as it is; a new one is unpacked into a temporary sibling
// and renamed into place, so two binaries starting at once never see half a tree.
'use strict';
const sea = require('node:sea');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const zlib = require('node:zlib');
const { createRequire } = require('node:module');
const { pathToFileURL } = require('node:url');

const MAGIC = 'SWYPACK1';

function fail(message) {
  process.stderr.write(`switchyard: ${message}\n`);
  process.exit(1);
}

function privateBase() {
  const uid = typeof process.getuid === 'function' ? process.getuid() : -1;
  const base =
    process.env.SWITCHYARD_EXTRACT_DIR ||
    (process.env.XDG_RUNTIME_DIR ? path.join(process.env.XDG_RUNTIME_DIR, 'switchyard') : path.join(os.tmpdir(), `switchyard-${uid}`));
  try {
    fs.mkdirSync(base, { recursive: true, mode: 0o700 });
  } catch (err) {
    fail(`cannot create ${base} to unpack into (${err.message}); set SWITCHYARD_EXTRACT_DIR to a private folder`);
  }
  const st = fs.lstatSync(base);
  if (!st.isDirectory() || st.isSymbolicLink()) fail(`${base} is not a directory; set SWITCHYARD_EXTRACT_DIR to a private folder`);
  if (uid >= 0 && st.uid !== uid) fail(`${base} belongs to uid ${st.uid}, not to this user (${uid}); set SWITCHYARD_EXTRACT_DIR to a private folder`);
  if ((st.mode & 0o077) !== 0) fail(`${base} is open to other users (mode ${(st.mode & 0o777).toString(8)}); chmod 700 it or set SWITCHYARD_EXTRACT_DIR`);
  return base;
}

/** Writes the pack's files under dir: MAGIC, u32 index length, JSON [[path, mode, size], ...], the bytes. */
function unpack(packed, dir) {
  const buf = zlib.gunzipSync(packed);
  if (buf.toString('latin1', 0, MAGIC.length) !== MAGIC) fail('the embedded package is damaged (bad magic)');
  const indexLen = buf.readUInt32LE(MAGIC.length);
  let at = MAGIC.length + 4;
  const index = JSON.parse(buf.toString('utf8', at, at + indexLen));
  at += indexLen;
  const made = new Set();
  for (const [rel, mode, size] of index) {
    if (rel.startsWith('/') || rel.split('/').includes('..')) fail(`the embedded package is damaged (path ${rel})`);
    const file = path.join(dir, rel);
    const parent = path.dirname(file);
    if (!made.has(parent)) {
      fs.mkdirSync(parent, { recursive: true, mode: 0o700 });
      made.add(parent);
    }
    fs.writeFileSync(file, buf.subarray(at, at + size), { mode: mode & 0o700, flag: 'wx' });
    at += size;
  }
  if (at !== buf.length) fail('the embedded package is damaged (length)');
}

function unpacked() {
  const id = Buffer.from(sea.getAsset('app.id')).toString('utf8').trim();
  const base = privateBase();
  const dir = path.join(base, id);
  if (fs.existsSync(path.join(dir, '.complete'))) return dir;
  const tmp = fs.mkdtempSync(path.join(base, `${id}.tmp-`));
  try {
    unpack(Buffer.from(sea.getAsset('app.gz')), tmp);
    fs.writeFileSync(path.join(tmp, '.complete'), '');
    try {
      fs.renameSync(tmp, dir);
    } catch (err) {
      // another start won the race: use its tree
      if (!fs.existsSync(path.join(dir, '.complete'))) throw err;
      fs.rmSync(tmp, { recursive: true, force: true });
    }
  } catch (err) {
    fs.rmSync(tmp, { recursive: true, force: true });
    fail(`cannot unpack into ${base}: ${err.message}`);
  }
  return dir;
}

const dir = unpacked();
// The SEA's own require loads built-in modules only: boot.cjs is an ordinary file, so its import()
// goes through the normal ESM loader.
const boot = createRequire(path.join(dir, 'boot.cjs'))('./boot.cjs');
boot(pathToFileURL(path.join(dir, 'bin', 'switchyard.js')).href).catch((err) => fail(err && err.stack ? err.stack : String(err)));
