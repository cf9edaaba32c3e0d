// The plugin registry: type name → factory. Factories fill parameter defaults
// and validate parameters (returning messages, so config validation can list
// every problem at once). builtins.ts registers every built-in plugin.
import { PluginError } from '../errors.js';
import type { Filter, Picker, PluginEnv, Scorer } from './types.js';

export type PluginKind = 'filter' | 'scorer' | 'picker';
type Instance<K extends PluginKind> = K extends 'filter' ? Filter : K extends 'scorer' ? Scorer : Picker;

export interface PluginFactory<K extends PluginKind = PluginKind> {
  kind: K;
  type: string;
  /** Problems with `params` (empty when valid). */
  validate(params: Record<string, unknown>): string[];
  create(params: Record<string, unknown>, env: PluginEnv): Instance<K>;
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

  validate(kind: PluginKind, type: string, params: Record<string, unknown>): string[] {
    const f = this.#factories.get(`${kind}:${type}`);
    if (!f) return [`unknown ${kind} type "${type}" (known: ${this.types(kind).join(', ')})`];
    return f.validate(params);
  }

  create<K extends PluginKind>(kind: K, type: string, params: Record<string, unknown>, env: PluginEnv): Instance<K> {
    const problems = this.validate(kind, type, params);
    if (problems.length > 0) throw new PluginError(`${kind} "${type}": ${problems.join('; ')}`);
    return (this.#factories.get(`${kind}:${type}`) as PluginFactory<K>).create(params, env);
  }
}

/** Helper for factories: checks a numeric parameter. */
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

/** Helper for factories: rejects unknown parameter names. */
export function knownParams(params: Record<string, unknown>, keys: readonly string[], problems: string[]): void {
  for (const k of Object.keys(params)) {
    if (!keys.includes(k)) problems.push(`unknown parameter "${k}"${keys.length ? ` (known: ${keys.join(', ')})` : ' (this plugin takes none)'}`);
  }
}
