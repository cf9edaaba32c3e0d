// The published JSON Schema (schema/switchyard-v1.schema.json): the checked-in
// file is what the code generates now (run `npm run schema` after changing a
// schema), and the docs' example configs validate against it and load.
import t from 'tap';
import { readFileSync } from 'node:fs';
import { parse } from 'yaml';
import { configJsonSchema, configJsonSchemaText } from '../../src/config/json-schema.js';
import { parseConfig } from '../../src/config/load.js';
import { registry } from '../../src/scheduler/plugins/index.js';
import { check } from '../support/json-schema-check.js';

const read = (f: string) => readFileSync(new URL(`../../${f}`, import.meta.url), 'utf8');
const validate = (kind: 'filter' | 'scorer' | 'picker', s: { type: string; params: Record<string, unknown> }) =>
  registry.validate(kind, s.type, s.params);

const checkedIn = read('schema/switchyard-v1.schema.json');
const schema = JSON.parse(checkedIn) as Record<string, unknown>;

t.test('the checked-in schema is what the code generates (else: npm run schema)', async (t) => {
  t.equal(checkedIn, configJsonSchemaText(registry.factories()), 'schema/switchyard-v1.schema.json is current');
});

/** Router configs shown in the docs: complete files, and the flowControl and sessions snippets inside a minimal file. */
function docExamples(): [string, string][] {
  const out: [string, string][] = [];
  const minimal = 'apiVersion: switchyard/v1\nkind: Router\npools:\n  - { name: p, models: [m], endpoints: [{ url: "http://10.0.0.5:8000" }] }\n';
  for (const doc of ['docs/config.md', 'docs/flow-control.md']) {
    for (const m of read(doc).matchAll(/```yaml\n([\s\S]*?)```/g)) {
      const text = m[1]!;
      if (/^apiVersion:/m.test(text)) out.push([`${doc}: complete config`, text]);
      else if (/^flowControl:/m.test(text)) out.push([`${doc}: flowControl block`, minimal + text]);
      else if (/^sessions:/m.test(text)) out.push([`${doc}: sessions block`, minimal + text]);
    }
  }
  return out;
}

t.test("the docs' example configs validate against the checked-in schema and load", async (t) => {
  const examples = docExamples();
  t.ok(examples.length >= 2, `found ${examples.length} examples`);
  for (const [name, text] of examples) {
    t.same(check(schema, parse(text)), [], `${name}: valid against the JSON Schema`);
    t.doesNotThrow(() => parseConfig(text, validate), `${name}: loads`);
  }
});

t.test('the schema rejects what the loader rejects (the checker is not vacuous)', async (t) => {
  const base = parse(docExamples()[0]![1]) as Record<string, unknown>;
  const bad: [string, (d: any) => void][] = [
    ['unknown top-level field', (d) => (d.loging = {})],
    ['missing pools', (d) => delete d.pools],
    ['port out of range', (d) => (d.listen = { port: 70000 })],
    ['unknown scorer', (d) => (d.scheduling = { scorers: [{ type: 'telepathy' }] })],
    ['bad plugin param', (d) => (d.scheduling = { picker: { type: 'max-score', params: { epsilon: 5 } } })],
    ['removed staleness field', (d) => (d.flowControl = { saturation: { staleAfter: '2s' } })],
    ['bad duration', (d) => (d.flowControl = { ttl: 'forever' })],
  ];
  for (const [name, mutate] of bad) {
    const d = structuredClone(base);
    mutate(d);
    t.not(check(schema, d).length, 0, name);
  }
});

t.test('the generated schema names what it is', async (t) => {
  const s = configJsonSchema();
  t.equal(s.$schema, 'https://json-schema.org/draft/2020-12/schema');
  t.match(s.title, /switchyard\/v1/);
});
