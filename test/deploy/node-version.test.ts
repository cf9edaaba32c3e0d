// The container's Node stays consistent with package.json: the Dockerfile's NODE_VERSION satisfies
// `engines.node`, both stages use it, and it is a Node LTS line still inside its support window.
// When a line's end of life passes, this fails: move the Dockerfile (and docs/portability.md) on.
import t from 'tap';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const dockerfile = readFileSync(join(ROOT, 'Dockerfile'), 'utf8');
const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { engines: { node: string } };

/** End of life of each Node LTS line (nodejs.org release schedule). */
const LTS_EOL: Record<number, string> = { 20: '2026-04-30', 22: '2027-04-30', 24: '2028-04-30', 26: '2029-04-30' };

function version(v: string): [number, number] {
  const m = /^(\d+)(?:\.(\d+))?(?:\.\d+)?$/.exec(v);
  if (!m) throw new Error(`not a Node version: ${v}`);
  return [Number(m[1]), Number(m[2] ?? 0)];
}

t.test("the Dockerfile's NODE_VERSION", async (t) => {
  const arg = /^ARG NODE_VERSION=(\S+)$/m.exec(dockerfile);
  t.ok(arg, 'ARG NODE_VERSION=<major.minor> is declared');
  const [major, minor] = version(arg![1]!);
  // every stage on a node image uses the one NODE_VERSION (the standalone stage has no Node image)
  const froms = [...dockerfile.matchAll(/^FROM\s+(\S+)/gm)].map((m) => m[1]!).filter((f) => /^node[:@]/.test(f));
  t.ok(froms.length >= 2, 'the build and runtime stages are node images');
  for (const f of froms) t.match(f, /^node:\$\{NODE_VERSION\}-/, `${f}: on the one NODE_VERSION`);

  // engines.node is ">=A.B" (the only form used here)
  const e = /^>=\s*(\d+)(?:\.(\d+))?(?:\.\d+)?$/.exec(pkg.engines.node);
  t.ok(e, `engines.node is a lower bound (${pkg.engines.node})`);
  const [emaj, emin] = [Number(e![1]), Number(e![2] ?? 0)];
  t.ok(major > emaj || (major === emaj && minor >= emin), `Node ${major}.${minor} satisfies engines ${pkg.engines.node}`);

  const eol = LTS_EOL[major];
  t.ok(eol, `Node ${major} is an LTS line (${Object.keys(LTS_EOL).join(', ')}); a new one: add its end-of-life date here`);
  t.ok(eol! > new Date().toISOString().slice(0, 10), `Node ${major} is supported until ${eol}`);
});
