// The plugin registry: type name → factory. Each factory declares its
// parameters as a schema (zod, the library every config surface uses; see
// src/config/schema-kit.ts); the registry validates params with it, returning
// messages so config validation can list every problem at once, and hands the
// parsed params (defaults filled) to the factory. plugins/index.ts registers every
// built-in plugin.
import { PluginError } from '../errors.js';
import { formatPath, isMapping, z } from '../config/schema-kit.js';
import type { Filter, Picker, PluginEnv, Scorer } from './types.js';

export type PluginKind = 'filter' | 'scorer' | 'picker';
type Instance<K extends PluginKind> = K extends 'filter' ? Filter : K extends 'scorer' ? Scorer : Picker;

/** A plugin's params schema: a mapping whose unknown keys are errors (build it with `pluginParams`). */
export type ParamsSchema = z.ZodType<Record<string, unknown>, Record<string, unknown>>;

export interface PluginFactory<K extends PluginKind = PluginKind> {
  kind: K;
  type: string;
  /** The parameters this plugin takes; `create` receives them parsed (defaults filled). */
  params?: ParamsSchema;
  /** Further checks of `params` (or the only ones, for a factory without a schema): problems, empty when valid. */
  validate?(params: Record<string, unknown>): string[];
  create(params: Record<string, unknown>, env: PluginEnv): Instance<K>;
}

/** A plugin's params: a strict mapping of the given fields (`{}` for a plugin that takes none). */
export function pluginParams<S extends z.core.$ZodLooseShape>(shape: S) {
  return z.strictObject(shape, { error: 'must be a mapping' });
}

/** An integer parameter in [min, max]. */
export function intParam(min: number, max: number) {
  const error = (i: { input?: unknown }) => `must be an integer in [${min}, ${max}] (got ${JSON.stringify(i.input)})`;
  return z.int({ error }).gte(min, { error }).lte(max, { error });
}

/** A number parameter in [min, max]. */
export function numberParam(min: number, max: number) {
  const error = (i: { input?: unknown }) => `must be a number in [${min}, ${max}] (got ${JSON.stringify(i.input)})`;
  return z.number({ error }).gte(min, { error }).lte(max, { error });
}

/** A boolean parameter. */
export function boolParam() {
  return z.boolean({ error: 'must be true or false' });
}

export class PluginRegistry {
  readonly #factories = new Map<string, PluginFactory>();

  register<K extends PluginKind>(f: PluginFactory<K>): this {
    const key = `${f.kind}:${f.type}`;
    if (this.#factories.has(key)) throw new PluginError(`${f.kind} plugin type "${f.type}" is already registered`);
    this.#factories.set(key, f as unknown as PluginFactory);
    return this;
  }

  types(kind: PluginKind): string[] {
    return [...this.#factories.values()].filter((f) => f.kind === kind).map((f) => f.type);
  }

  /** The registered factories (the JSON Schema generator reads their params schemas). */
  factories(kind?: PluginKind): PluginFactory[] {
    return [...this.#factories.values()].filter((f) => kind === undefined || f.kind === kind);
  }

  /** Problems with a plugin's type and params (empty when valid), e.g. `params.epsilon must be a number in [0, 1] (got 5)`. */
  validate(kind: PluginKind, type: string, params: Record<string, unknown>): string[] {
    const f = this.#factories.get(`${kind}:${type}`);
    if (!f) return [`unknown ${kind} type "${type}" (known: ${this.types(kind).join(', ')})`];
    return this.#check(f, params).problems;
  }

  create<K extends PluginKind>(kind: K, type: string, params: Record<string, unknown>, env: PluginEnv): Instance<K> {
    const f = this.#factories.get(`${kind}:${type}`) as PluginFactory<K> | undefined;
    if (!f) throw new PluginError(`${kind} "${type}": ${this.validate(kind, type, params).join('; ')}`);
    const { problems, value } = this.#check(f, params);
    if (problems.length > 0) throw new PluginError(`${kind} "${type}": ${problems.join('; ')}`);
    return f.create(value, env);
  }

  #check(f: PluginFactory, params: Record<string, unknown>): { problems: string[]; value: Record<string, unknown> } {
    const problems: string[] = [];
    let value = params;
    if (f.params) {
      const r = f.params.safeParse(params ?? {});
      if (r.success) value = r.data;
      else {
        const known = isObjectSchema(f.params) ? Object.keys(f.params.shape) : [];
        for (const iss of r.error.issues) {
          if (iss.code === 'unrecognized_keys') {
            for (const k of iss.keys) problems.push(`unknown parameter "${k}"${known.length ? ` (known: ${known.join(', ')})` : ' (this plugin takes none)'}`);
          } else problems.push(`${formatPath('params', iss.path)} ${iss.message}`);
        }
      }
    }
    if (f.validate && isMapping(params)) problems.push(...f.validate(params));
    return { problems, value };
  }
}

function isObjectSchema(s: ParamsSchema): s is ParamsSchema & z.ZodObject {
  return s instanceof z.ZodObject;
}

/** @deprecated for factories without a params schema: checks a numeric parameter. Prefer `params: pluginParams({...})`. */
export function numParam(
  params: Record<string, unknown>,
  key: string,
  min: number,
  max: number,
  problems: string[],
  integer = false,
): void {
  const v = params[key];
  if (v === undefined) return;
  if (typeof v !== 'number' || !Number.isFinite(v) || v < min || v > max || (integer && !Number.isInteger(v))) {
    problems.push(`params.${key} must be ${integer ? 'an integer' : 'a number'} in [${min}, ${max}] (got ${JSON.stringify(v)})`);
  }
}

/** @deprecated for factories without a params schema: rejects unknown parameter names. Prefer `params: pluginParams({...})`. */
export function knownParams(params: Record<string, unknown>, keys: readonly string[], problems: string[]): void {
  for (const k of Object.keys(params)) {
    if (!keys.includes(k)) problems.push(`unknown parameter "${k}"${keys.length ? ` (known: ${keys.join(', ')})` : ' (this plugin takes none)'}`);
  }
}
