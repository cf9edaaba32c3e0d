// A scheduling profile's plugin specs (`scheduling`, `disaggregation.prefill`
// and `.decode`): a filter or picker is a type name or {type, params}, a
// scorer {type, weight, params}. Types and their zod schemas; the plugin
// registry checks each type's params (src/config/rules.ts).
import { nonEmpty, num, strict, z } from './schema-kit.js';

export interface PluginSpec {
  type: string;
  /** Plugin-specific parameters; the registry's factory fills defaults. */
  params: Record<string, unknown>;
}

export interface ScorerSpec extends PluginSpec {
  weight: number;
}

/** The picker a profile uses when it names none. */
export const DEFAULT_PICKER = 'max-score';

const paramsSchema = z
  .record(z.string(), z.unknown(), { error: 'must be a mapping' })
  .prefault({})
  .describe("the plugin's parameters, checked by its factory");

function pluginSpecSchema(withWeight: boolean) {
  const message = withWeight ? 'must be a mapping {type, weight, params}' : 'must be a plugin type name or a mapping {type, params}';
  const byName = z
    .string({ error: message })
    .min(1, { error: message })
    .transform((type) => ({ type, weight: 1, params: {} as Record<string, unknown> }));
  const mapping = strict({ type: nonEmpty(), weight: num(0, 1e6).default(1), params: paramsSchema }, message);
  const full = withWeight ? mapping : strict({ type: nonEmpty(), params: paramsSchema }, message).transform((s) => ({ ...s, weight: 1 }));
  return z.union([byName, full], { error: message });
}

export const filterSpec = pluginSpecSchema(false).transform(({ type, params }): PluginSpec => ({ type, params }));
export const scorerSpec = pluginSpecSchema(true).transform(({ type, weight, params }): ScorerSpec => ({ type, weight, params }));
