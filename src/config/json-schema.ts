// The published JSON Schema of the config file (schema/switchyard-v1.schema.json),
// generated from the zod schema in schema.ts: what a user may write, for
// editors (yaml-language-server) and manifests. `npm run schema` regenerates
// the file; test/config-json-schema.test.ts fails when it is out of date.
import { routerConfigSchema } from './schema.js';
import { z } from './schema-kit.js';

/** What the generator needs to know about a plugin: its kind, type name and params schema. */
export interface PluginDescription {
  kind: 'filter' | 'scorer' | 'picker';
  type: string;
  params?: z.ZodType;
}

type Json = Record<string, unknown>;

/**
 * The JSON Schema (draft 2020-12) of a switchyard/v1 Router config. With
 * `plugins` (the built-in registry's factories), each scheduling entry is
 * checked against its plugin's own params.
 */
export function configJsonSchema(plugins: readonly PluginDescription[] = []): Json {
  const schema = z.toJSONSchema(routerConfigSchema, { io: 'input', target: 'draft-2020-12' }) as Json;
  const out: Json = {
    $schema: schema.$schema,
    title: 'Switchyard router config (apiVersion switchyard/v1, kind Router)',
    description: 'See docs/config.md and docs/flow-control.md. Generated from src/config/schema.ts by `npm run schema`; do not edit.',
    ...Object.fromEntries(Object.entries(schema).filter(([k]) => k !== '$schema')),
  };
  if (plugins.length > 0) {
    const sched = ((out.properties as Json).scheduling as Json).properties as Json;
    for (const [key, kind] of [['filters', 'filter'], ['scorers', 'scorer'], ['picker', 'picker']] as const) {
      const own = plugins.filter((p) => p.kind === kind);
      if (own.length === 0) continue;
      const entry = pluginEntry(own, kind === 'scorer');
      const field = sched[key] as Json;
      if (key === 'picker') sched[key] = { ...keep(field), ...entry };
      else sched[key] = { ...field, items: entry };
    }
  }
  return out;
}

/** The annotations of a field (description, default) without its type. */
function keep(field: Json): Json {
  return Object.fromEntries(Object.entries(field).filter(([k]) => k === 'description' || k === 'default'));
}

function pluginEntry(plugins: readonly PluginDescription[], withWeight: boolean): Json {
  const byName = z.enum(plugins.map((p) => p.type) as [string, ...string[]]).describe('a plugin type, with default params' + (withWeight ? ' and weight 1' : ''));
  const mappings = plugins.map((p) =>
    z.strictObject({
      type: z.literal(p.type),
      ...(withWeight ? { weight: z.number().gte(0).lte(1e6).default(1) } : {}),
      params: (p.params ?? z.record(z.string(), z.unknown())).optional(),
    }),
  );
  const json = z.toJSONSchema(z.union([byName, ...mappings]), { io: 'input', target: 'draft-2020-12' }) as Json;
  delete json.$schema;
  return json;
}

/** The file's text: stable key order as generated, two-space indent, trailing newline. */
export function configJsonSchemaText(plugins: readonly PluginDescription[] = []): string {
  return JSON.stringify(configJsonSchema(plugins), null, 2) + '\n';
}
