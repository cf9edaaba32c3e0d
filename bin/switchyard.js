#!/usr/bin/env node
// Entry point of the `switchyard` command. The TypeScript is compiled to dist/.
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const cli = new URL('../dist/src/cli.js', import.meta.url);
if (!existsSync(fileURLToPath(cli))) {
  console.error('switchyard: dist/ is missing; run `npm run build` (or `npm ci`) in the package folder first');
  process.exit(1);
}
const { main } = await import(cli.href);
process.exitCode = await main(process.argv.slice(2));
