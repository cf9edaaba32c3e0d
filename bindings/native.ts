// The one place that loads the compiled addon. Everything else imports the
// typed classes from bindings/index.ts.
import { createRequire } from 'node:module';
import { existsSync, readdirSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { SwitchyardError } from '../src/errors.js';

/** Bumped whenever the native API changes shape; must equal native/addon.cc. */
export const NATIVE_ABI_VERSION = 8;

export class NativeLoadError extends SwitchyardError {
  override readonly code = 'SWY_ERR_NATIVE_LOAD';
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'NativeLoadError';
  }
}

function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 5; i++) {
    if (existsSync(join(dir, 'binding.gyp'))) return dir;
    dir = dirname(dir);
  }
  throw new NativeLoadError('cannot find the switchyard package root (binding.gyp) above ' + fileURLToPath(import.meta.url));
}

function newestSourceMtime(root: string): number {
  const dir = join(root, 'native');
  let newest = 0;
  try {
    for (const f of readdirSync(dir)) {
      if (/\.(cc|h|hpp|cpp)$/.test(f)) newest = Math.max(newest, statSync(join(dir, f)).mtimeMs);
    }
  } catch {
    // An installed package may ship without native sources: nothing to compare.
  }
  return newest;
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any
function load(): any {
  const root = packageRoot();
  const override = process.env.SWITCHYARD_NATIVE_PATH;
  const file = override ?? join(root, 'build', 'Release', 'switchyard_native.node');
  if (!existsSync(file)) {
    throw new NativeLoadError(
      `the native addon is not built (${file} is missing): run \`npm run build:native\` (or \`npm ci\`) in ${root}`,
    );
  }
  if (!override && newestSourceMtime(root) > statSync(file).mtimeMs) {
    throw new NativeLoadError(
      `the native addon is stale (sources in native/ are newer than ${file}): run \`npm run build:native\` in ${root}`,
    );
  }
  const require = createRequire(import.meta.url);
  let mod;
  try {
    mod = require(file);
  } catch (err) {
    throw new NativeLoadError(
      `the native addon at ${file} failed to load (${(err as Error).message}): run \`npm run build:native\` in ${root}`,
      { cause: err },
    );
  }
  if (mod.abiVersion !== NATIVE_ABI_VERSION) {
    throw new NativeLoadError(
      `the native addon at ${file} has ABI ${mod.abiVersion}, expected ${NATIVE_ABI_VERSION}: run \`npm run build:native\` in ${root}`,
    );
  }
  return mod;
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any
export const native: any = load();
