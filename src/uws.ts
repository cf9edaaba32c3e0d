// Loads the real uWebSockets.js binary, on first use. The npm package falls back
// to a slow pure-JS implementation when its binary does not load; Switchyard
// refuses to run on that fallback silently, so it requires the binary itself.
// The package (a 2023 rebuild of uWS 20.30) carries binaries for Node 16, 18
// and 20 only (ABIs 93, 108, 115): on Node 22 and later it installs but does
// not load, so nothing here runs at import time; `uwsProblem()` tells whether
// it loads, and `uws` throws the reason on its first use.
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import type * as UWS from 'uWebSockets.js';

const require = createRequire(import.meta.url);

let loaded: typeof UWS | null = null;
let problem: Error | null = null;

function loadUws(): typeof UWS {
  if (loaded !== null) return loaded;
  if (problem !== null) throw problem;
  const name = `uws_${process.platform}_${process.arch}_${process.versions.modules}.node`;
  let file = `uWebSockets.js/binaries/${name}`;
  try {
    file = join(dirname(require.resolve('uWebSockets.js/package.json')), 'binaries', name);
    loaded = require(file) as typeof UWS;
    return loaded;
  } catch (err) {
    problem = new Error(
      `uWebSockets.js has no native binary for ${process.platform}-${process.arch} with Node ABI ${process.versions.modules} ` +
        `(${file}): its binaries serve Node.js 16, 18 and 20 on Linux x64 (${(err as Error).message.split('\n')[0]})`,
      { cause: err },
    );
    throw problem;
  }
}

/** Null when the uWS binary loads on this Node; else why not (one line). */
export function uwsProblem(): string | null {
  try {
    loadUws();
    return null;
  } catch (err) {
    return (err as Error).message;
  }
}

/**
 * The uWS module. Loaded on the first property read, which throws (every time, the same
 * error) where the binary does not load: check uwsProblem() first where there is a fallback.
 */
export const uws: typeof UWS = new Proxy({} as typeof UWS, {
  get: (_, key) => (loadUws() as unknown as Record<string | symbol, unknown>)[key],
  has: (_, key) => key in loadUws(),
});
export type { HttpRequest, HttpResponse, TemplatedApp, us_listen_socket } from 'uWebSockets.js';
