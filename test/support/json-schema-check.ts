// A tiny JSON Schema (draft 2020-12) checker for the keywords our generated
// schema uses, so tests can validate documents against the checked-in file
// itself. An unknown keyword throws (nothing is silently ignored).
type Schema = Record<string, unknown> | boolean;

const ANNOTATIONS = new Set(['$schema', '$id', 'title', 'description', 'default', 'deprecated']);
const HANDLED = new Set([
  'type', 'enum', 'const', 'properties', 'required', 'additionalProperties', 'propertyNames', 'items', 'minItems', 'minLength',
  'minimum', 'maximum', 'exclusiveMinimum', 'pattern', 'anyOf', 'not',
]);

function typeOk(t: string, v: unknown): boolean {
  switch (t) {
    case 'string': return typeof v === 'string';
    case 'number': return typeof v === 'number' && Number.isFinite(v);
    case 'integer': return Number.isInteger(v);
    case 'boolean': return typeof v === 'boolean';
    case 'null': return v === null;
    case 'array': return Array.isArray(v);
    case 'object': return typeof v === 'object' && v !== null && !Array.isArray(v);
    default: throw new Error(`json-schema-check: unknown type ${t}`);
  }
}

/** Problems of `v` against `s`, as `path: reason`; empty when valid. */
export function check(s: Schema, v: unknown, path = ''): string[] {
  if (s === true) return [];
  if (s === false) return [`${path}: not allowed`];
  for (const k of Object.keys(s)) if (!ANNOTATIONS.has(k) && !HANDLED.has(k)) throw new Error(`json-schema-check: unsupported keyword ${k}`);
  const out: string[] = [];
  const types = s.type === undefined ? undefined : Array.isArray(s.type) ? (s.type as string[]) : [s.type as string];
  if (types && !types.some((t) => typeOk(t, v))) return [`${path}: expected ${types.join(' or ')}`];
  if (s.enum && !(s.enum as unknown[]).includes(v)) out.push(`${path}: not one of ${JSON.stringify(s.enum)}`);
  if ('const' in s && s.const !== v) out.push(`${path}: must be ${JSON.stringify(s.const)}`);
  if (typeof v === 'string') {
    if (typeof s.minLength === 'number' && v.length < s.minLength) out.push(`${path}: too short`);
    if (typeof s.pattern === 'string' && !new RegExp(s.pattern, 'u').test(v)) out.push(`${path}: does not match ${s.pattern}`);
  }
  if (typeof v === 'number') {
    if (typeof s.minimum === 'number' && v < s.minimum) out.push(`${path}: below ${s.minimum}`);
    if (typeof s.maximum === 'number' && v > s.maximum) out.push(`${path}: above ${s.maximum}`);
    if (typeof s.exclusiveMinimum === 'number' && v <= s.exclusiveMinimum) out.push(`${path}: not above ${s.exclusiveMinimum}`);
  }
  if (Array.isArray(v)) {
    if (typeof s.minItems === 'number' && v.length < s.minItems) out.push(`${path}: fewer than ${s.minItems} items`);
    if (s.items !== undefined) v.forEach((x, i) => out.push(...check(s.items as Schema, x, `${path}[${i}]`)));
  }
  if (typeof v === 'object' && v !== null && !Array.isArray(v)) {
    const o = v as Record<string, unknown>;
    const props = (s.properties ?? {}) as Record<string, Schema>;
    for (const r of (s.required ?? []) as string[]) if (!(r in o)) out.push(`${path}.${r}: required`);
    for (const [k, x] of Object.entries(o)) {
      if (s.propertyNames !== undefined) out.push(...check(s.propertyNames as Schema, k, `${path}.${k} (name)`));
      if (k in props) out.push(...check(props[k]!, x, `${path}.${k}`));
      else if (s.additionalProperties !== undefined) out.push(...check(s.additionalProperties as Schema, x, `${path}.${k}`));
    }
  }
  if (s.anyOf && !(s.anyOf as Schema[]).some((a) => check(a, v, path).length === 0)) out.push(`${path}: matches none of anyOf`);
  if (s.not !== undefined && check(s.not as Schema, v, path).length === 0) out.push(`${path}: not allowed`);
  return out;
}
