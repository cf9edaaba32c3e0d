// Every benchmark script answers --help with its usage and exit 0, starting
// nothing (`npm run bench -- --help` started the whole suite; `bench:sim --
// --help` crashed with a stack trace). Runs the built scripts (needs dist/).
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
// ~55 node start-ups one after another: on a loaded CI machine (2 cores, two tap jobs and more) each takes
// seconds, so the file gets its own budget and each script 30 s (one that ran its benchmark takes far longer
// and prints no usage)
t.setTimeout(900_000);
const scripts = ['bench/run.ts', ...['system', 'micro'].flatMap((d) => readdirSync(join(ROOT, 'bench', d)).filter((f) => f.endsWith('.ts')).map((f) => `bench/${d}/${f}`))];

t.test('every bench script: --help prints its usage and exits 0 at once', async (t) => {
  t.ok(scripts.length >= 25, `${scripts.length} scripts`);
  for (const s of scripts) {
    const js = join(ROOT, 'dist', s.replace(/\.ts$/, '.js'));
    const t0 = Date.now();
    const r = spawnSync(process.execPath, [js, '--help'], { cwd: ROOT, encoding: 'utf8', timeout: 60_000 });
    t.equal(r.status, 0, `${s}: exit 0 (${r.stderr.slice(0, 300)})`);
    t.match(r.stdout, /^usage: node dist\/bench\/\S+\.js \[options\]\n\n\S/, `${s}: a usage line and its description`);
    t.notMatch(r.stdout + r.stderr, /\n\s+at .*\(.*:\d+:\d+\)/, `${s}: no stack trace`);
    t.ok(Date.now() - t0 < 30_000, `${s}: answered without running (${Date.now() - t0} ms)`);
  }
});
