// The import graph of src/ and bindings/: no circles, and the layering of docs/architecture.md
// (scripts/layering.ts). The second half proves the check can fail: a temp copy of src/ with a circle and
// with each kind of layering violation added.
import { cpSync, existsSync, mkdtempSync, rmSync, writeFileSync, appendFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { checkLayering, formatReport } from '../../scripts/layering.js';

const ROOT = join(import.meta.dirname, '..', '..');

t.test('src/ and bindings/ have no import circle and no layering violation', async (t) => {
  t.ok(existsSync(join(ROOT, 'src', 'index.ts')), 'the check reads the real tree');
  const r = checkLayering(ROOT);
  if (r.knownCircles.length > 0) t.comment(`known circles: ${r.knownCircles.map((c) => c.join(' ↔ ')).join('; ')}`);
  t.equal(formatReport(r), '', 'no findings');
  t.same(r.circles, []);
  t.same(r.violations, []);
});

t.test('the check fails on an added circle and on a layering violation', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'swy-layering-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  cpSync(join(ROOT, 'src'), join(dir, 'src'), { recursive: true });
  cpSync(join(ROOT, 'bindings'), join(dir, 'bindings'), { recursive: true });
  t.equal(formatReport(checkLayering(dir)), '', 'the copy is clean');

  // A circle: a.ts → b.ts → a.ts, in a folder no rule names.
  writeFileSync(join(dir, 'src/zz-a.ts'), "import { b } from './zz-b.js';\nexport const a = (): number => b + 1;\n");
  writeFileSync(join(dir, 'src/zz-b.ts'), "import type { a } from './zz-a.js';\nexport const b = 1;\nexport type A = typeof a;\n");
  let r = checkLayering(dir);
  t.same(r.circles, [['src/zz-a.ts', 'src/zz-b.ts']], 'the circle is found (a type-only back edge counts)');
  t.match(formatReport(r), /import circle: src\/zz-a\.ts ↔ src\/zz-b\.ts/);
  rmSync(join(dir, 'src/zz-a.ts'));
  rmSync(join(dir, 'src/zz-b.ts'));

  // A longer circle through existing modules: endpoints/ importing the scheduler that imports endpoints/.
  appendFileSync(join(dir, 'src/endpoints/endpoint.ts'), "\nexport { Scheduler as ZzScheduler } from '../scheduler/scheduler.js';\n");
  r = checkLayering(dir);
  t.ok(r.circles.some((c) => c.includes('src/endpoints/endpoint.ts') && c.includes('src/scheduler/scheduler.ts')), 'a re-export closing a circle is found');
  cpSync(join(ROOT, 'src/endpoints/endpoint.ts'), join(dir, 'src/endpoints/endpoint.ts'));

  // Layering: the director importing the server (no circle needed), k8s/ importing ha/, the scheduler HTTP.
  writeFileSync(join(dir, 'src/director/zz-bad.ts'), "export const load = () => import('../server/router.js');\n");
  writeFileSync(join(dir, 'src/k8s/zz-bad.ts'), "import type { Lease } from '../ha/lease.js';\nexport type L = Lease;\n");
  writeFileSync(join(dir, 'src/scheduler/zz-bad.ts'), "import { request } from 'node:http';\nexport const r = request;\n");
  r = checkLayering(dir);
  t.same(
    r.violations.map((v) => v.split(':')[0]),
    ['src/director/zz-bad.ts imports src/server/router.ts', 'src/k8s/zz-bad.ts imports src/ha/lease.ts', 'src/scheduler/zz-bad.ts imports node'],
  );
  t.match(formatReport(r), /layering: src\/director\/zz-bad\.ts imports src\/server\/router\.ts: the director never imports the server/);
});
