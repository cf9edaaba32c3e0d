// Every YAML block in docs/*.md parses, and every router config in them is
// one `switchyard check` accepts: a complete file (apiVersion switchyard/v1)
// as it stands, a fragment whose keys are all top-level router fields wrapped
// in a minimal router (apiVersion, kind and, when it has none, one pool). The
// check is the CLI's own (parseConfig with the plugin registry, as
// `switchyard check` and `serve` run it); one block per doc also goes through
// the real `switchyard check` process. Blocks of other formats (Kubernetes
// manifests, HAProxy, Prometheus) only need to parse.
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseAllDocuments } from 'yaml';
import { issueLines, parseConfig } from '../../src/config/load.js';
import { routerConfigSchema } from '../../src/config/schema.js';
import { ConfigError } from '../../src/errors.js';
import { validatePlugin } from '../support/router-util.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const TOP = new Set(Object.keys(routerConfigSchema.shape));
const HEAD = 'apiVersion: switchyard/v1\nkind: Router\n';
const POOL = 'pools:\n  - { name: p, models: [m], endpoints: [{ url: "http://10.0.0.5:8000" }] }\n';

interface Block {
  where: string;
  text: string;
}

/** ```yaml fences, also indented ones (inside lists), dedented. */
function blocks(): Block[] {
  const out: Block[] = [];
  for (const f of readdirSync(join(ROOT, 'docs')).filter((x) => x.endsWith('.md')).sort()) {
    const md = readFileSync(join(ROOT, 'docs', f), 'utf8');
    for (const m of md.matchAll(/^( *)```ya?ml[^\n]*\n([\s\S]*?)^\1```/gm)) {
      const indent = m[1]!.length;
      const text = m[2]!
        .split('\n')
        .map((l) => l.slice(Math.min(indent, l.length - l.trimStart().length)))
        .join('\n');
      out.push({ where: `docs/${f}:${md.slice(0, m.index).split('\n').length}`, text });
    }
  }
  return out;
}

/** The router config a block is (complete, or a fragment wrapped), or null when it is YAML of another kind. */
function routerConfig(text: string, doc: unknown): string | null {
  if (typeof doc !== 'object' || doc === null || Array.isArray(doc)) return null;
  const o = doc as Record<string, unknown>;
  if (o.apiVersion === 'switchyard/v1') return text;
  if (o.apiVersion !== undefined || o.kind !== undefined) return null;
  const keys = Object.keys(o);
  if (keys.length === 0 || !keys.every((k) => TOP.has(k))) return null;
  return HEAD + (keys.includes('pools') ? '' : POOL) + text;
}

const all = blocks();

t.test('the docs hold YAML blocks, router configs among them', async (t) => {
  t.ok(all.length >= 15, `${all.length} YAML blocks`);
  const configs = all.filter((b) => routerConfig(b.text, parseAllDocuments(b.text)[0]?.toJS()) !== null);
  t.ok(configs.length >= 10, `${configs.length} of them router configs or fragments`);
});

t.test('every YAML block parses; every router config or fragment passes the check', async (t) => {
  for (const b of all) {
    const docs = parseAllDocuments(b.text);
    const errors = docs.flatMap((d) => d.errors);
    t.same(errors.map((e) => e.message.split('\n')[0]), [], `${b.where}: parses`);
    if (errors.length > 0) continue;
    const cfg = routerConfig(b.text, docs[0]?.toJS());
    if (cfg === null) continue;
    let problems: string[] = [];
    try {
      parseConfig(cfg, validatePlugin, b.where);
    } catch (err) {
      problems = err instanceof ConfigError ? issueLines(err) : [`${(err as Error).name}: ${(err as Error).message}`];
    }
    t.same(problems, [], `${b.where}: passes switchyard check`);
  }
});

t.test('the real `switchyard check` accepts the first router config of each doc (needs dist/)', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'swy-docs-'));
  const bin = join(ROOT, 'bin', 'switchyard.js');
  const seen = new Set<string>();
  for (const b of all) {
    const doc = b.where.split(':')[0]!;
    if (seen.has(doc)) continue;
    const cfg = routerConfig(b.text, parseAllDocuments(b.text)[0]?.toJS());
    if (cfg === null) continue;
    seen.add(doc);
    const file = join(dir, `${seen.size}.yaml`);
    writeFileSync(file, cfg);
    const r = spawnSync(process.execPath, [bin, 'check', '--config', file], { encoding: 'utf8' });
    t.equal(r.status, 0, `${b.where}: switchyard check exits 0 (${r.stderr.trim()})`);
  }
  t.ok(seen.size >= 5, `${seen.size} docs with a router config`);
});

t.test("docs/config.md's sample validation output is what serve prints for test/fixtures/router-docs-sample.yaml (needs dist/)", async (t) => {
  const md = readFileSync(join(ROOT, 'docs', 'config.md'), 'utf8');
  const m = /```\n\$ switchyard serve --config router\.yaml\n([\s\S]*?)```/.exec(md);
  t.ok(m, 'the sample is in docs/config.md');
  const dir = mkdtempSync(join(tmpdir(), 'swy-docs-'));
  writeFileSync(join(dir, 'router.yaml'), readFileSync(join(ROOT, 'test', 'fixtures', 'router-docs-sample.yaml')));
  const r = spawnSync(process.execPath, [join(ROOT, 'bin', 'switchyard.js'), 'serve', '--config', 'router.yaml'], { cwd: dir, encoding: 'utf8' });
  t.equal(r.status, 2, 'exit 2');
  t.equal(m?.[1], r.stderr, 'docs/config.md shows the current output (paste the actual stderr there when it changes)');
});
