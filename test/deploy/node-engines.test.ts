// Every production dependency, as installed, accepts every Node release package.json's `engines`
// promises: its lowest version and the first release of each later LTS line (22, 24, 26). A dependency
// that drops a line (or needs a later patch than engines says) fails here, naming it.
import t from 'tap';
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const require = createRequire(import.meta.url);
const semver = require('semver') as { satisfies(v: string, range: string): boolean; minVersion(range: string): { version: string } | null };
const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { engines: { node: string } };

t.test('production dependencies accept every Node release engines promises', async (t) => {
  const lowest = semver.minVersion(pkg.engines.node)?.version;
  t.ok(lowest, `engines.node ${pkg.engines.node} has a lowest version`);
  const releases = [lowest!, '22.0.0', '24.0.0', '26.0.0'].filter((v) => semver.satisfies(v, pkg.engines.node));
  t.equal(releases.length, 4, `engines ${pkg.engines.node} covers Node 20, 22, 24 and 26`);

  const ls = execFileSync('npm', ['ls', '--omit=dev', '--all', '--parseable'], { cwd: ROOT, encoding: 'utf8', maxBuffer: 64 << 20 });
  const dirs = [...new Set(ls.split('\n').map((s) => s.trim()))].filter((d) => d.includes(`${join('node_modules')}`) && existsSync(join(d, 'package.json')));
  t.ok(dirs.length > 50, `${dirs.length} installed production packages`);
  const refused: string[] = [];
  for (const d of dirs) {
    const p = JSON.parse(readFileSync(join(d, 'package.json'), 'utf8')) as { name: string; version: string; engines?: { node?: unknown } };
    const range = p.engines?.node;
    if (typeof range !== 'string') continue;
    for (const v of releases) {
      if (!semver.satisfies(v, range)) refused.push(`${p.name}@${p.version} (${relative(ROOT, d)}) needs node ${range}: not ${v}`);
    }
  }
  t.same(refused, [], 'no production dependency refuses one of them');
});
