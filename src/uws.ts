// Loads the real uWebSockets.js binary. The npm package falls back to a slow
// pure-JS implementation when its binary does not load; Switchyard refuses to
// run on that fallback silently, so it requires the binary itself.
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import type * as UWS from 'uWebSockets.js';

const require = createRequire(import.meta.url);

function loadUws(): typeof UWS {
  const pkgDir = dirname(require.resolve('uWebSockets.js/package.json'));
  const file = join(pkgDir, 'binaries', `uws_${process.platform}_${process.arch}_${process.versions.modules}.node`);
  try {
    return require(file) as typeof UWS;
  } catch (err) {
    throw new Error(
      `uWebSockets.js has no native binary for ${process.platform}-${process.arch} with Node ABI ${process.versions.modules} ` +
        `(${file}): use Node.js 16, 18 or 20 on Linux x64 (${(err as Error).message})`,
      { cause: err },
    );
  }
}

export const uws: typeof UWS = loadUws();
export type { HttpRequest, HttpResponse, TemplatedApp, us_listen_socket } from 'uWebSockets.js';
