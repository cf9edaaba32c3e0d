// `--help` for every benchmark script: `exitOnHelp(import.meta.url)` right after
// a script's imports prints its usage (the script's path, its leading comment,
// the options its source reads) and exits 0 when the script is the one node
// was started with and `--help` or `-h` is among its arguments. An imported
// scenario (bench/run.ts imports several) never answers for its importer.
import { readFileSync } from 'node:fs';
import { relative } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

/** The script's help text: `usage: node <path> [options]`, its header comment, the `--flags` its source names. */
export function helpText(moduleUrl: string): string {
  const file = fileURLToPath(moduleUrl);
  const src = readFileSync(file, 'utf8');
  const header: string[] = [];
  for (const line of src.split('\n')) {
    if (!line.startsWith('//')) break;
    header.push(line.replace(/^\/\/ ?/, ''));
  }
  const flags = [...new Set([...src.matchAll(/['"`](--[a-z][a-z0-9-]*)/g)].map((m) => m[1]!))].filter((f) => f !== '--help').sort();
  const path = relative(process.cwd(), file) || file;
  return (
    `usage: node ${path} [options]\n\n${header.join('\n')}\n` +
    (flags.length > 0 ? `\noptions it reads: ${flags.join(' ')}\n` : '') +
    `\nRun it under the machine-wide lock on a shared machine: flock /tmp/switchyard-bench.lock node ${path} ...\n`
  );
}

/** Prints the help and exits 0 when this module is the entry point and `--help`/`-h` was given. */
export function exitOnHelp(moduleUrl: string, argv: readonly string[] = process.argv): void {
  const entry = argv[1];
  if (entry === undefined || pathToFileURL(entry).href !== moduleUrl) return;
  if (!argv.slice(2).some((a) => a === '--help' || a === '-h')) return;
  process.stdout.write(helpText(moduleUrl));
  process.exit(0);
}
