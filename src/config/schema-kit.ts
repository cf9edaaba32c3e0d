// The one schema library behind every config surface: the router config
// (schema.ts), its flowControl block (flow-control.ts), the simulator's options
// (src/sim/options.ts) and each scheduler plugin's params (src/scheduler/).
//
// Library: zod 4. Why zod over TypeBox 0.34: our configs need transforms as
// much as checks (durations like "2s" → ms, endpoint URLs → their origin,
// defaults that depend on other fields such as a flow's band or an endpoint's
// name), cross-field refinements that still run when a sibling field is wrong
// (so every problem is reported at once), and our own wording of each message.
// zod does all three in one declaration and infers the TS types from it;
// `z.toJSONSchema(..., { io: 'input' })` still gives the published JSON Schema
// of what a user writes (schema/switchyard-v1.schema.json). TypeBox schemas are
// JSON Schema first, but transforms, defaults and custom messages go through
// separate Value.* passes and an error-message map, i.e. three places to keep
// in step instead of one. zod has no install script and no dependencies.
//
// This file turns zod's issues into our ConfigIssue shape: a field path such
// as `pools[0].endpoints[1].url` and a message, one issue per problem.
import * as z from 'zod';
import type { ConfigIssue } from '../errors.js';

export { z };

/**
 * Refinements that must run even when a field inside already failed (cross-field checks report alongside).
 * Checks in these schemas never use `abort: true`: an explicitly aborted field would skip them.
 */
export const ALWAYS = { when: () => true } as const;

/**
 * A path segment written as is (no leading dot), for keys that must not be
 * echoed: `[key sk-a…]` instead of an API key.
 */
export function rawSegment(label: string): string {
  return `[${label}]`;
}

/** `prefix` + zod path → `a.b[0].c`. */
export function formatPath(prefix: string, path: readonly PropertyKey[]): string {
  let s = prefix;
  for (const seg of path) {
    if (typeof seg === 'number') s += `[${seg}]`;
    else {
      const k = String(seg);
      s += k.startsWith('[') || s === '' ? k : `.${k}`;
    }
  }
  return s;
}

type Issue = z.core.$ZodIssue;

/**
 * zod issues → ConfigIssues. An object's unknown keys become one issue per
 * key at the key's own path; a union whose input matched the type of exactly
 * one alternative reports that alternative's problems (e.g. a scorer given
 * as a mapping reports its bad `weight`, not "invalid input").
 */
export function toConfigIssues(issues: readonly Issue[], prefix = '', base: readonly PropertyKey[] = []): ConfigIssue[] {
  const out = collect(issues, prefix, base);
  // one issue per (path, message): 1.5 for an integer in [2, 9] breaks two checks that share a message
  const seen = new Set<string>();
  return out.filter((i) => {
    const k = `${i.path}\0${i.message}`;
    if (seen.has(k)) return false;
    seen.add(k);
    return true;
  });
}

function collect(issues: readonly Issue[], prefix: string, base: readonly PropertyKey[]): ConfigIssue[] {
  const out: ConfigIssue[] = [];
  for (const iss of issues) {
    const path = [...base, ...iss.path];
    if (iss.code === 'unrecognized_keys') {
      for (const k of iss.keys) out.push({ path: formatPath(prefix, [...path, k]), message: iss.message });
      continue;
    }
    if (iss.code === 'invalid_union') {
      const matching = iss.errors.filter((b) => !(b.length === 1 && b[0]!.code === 'invalid_type' && b[0]!.path.length === 0));
      if (matching.length === 1) {
        out.push(...collect(matching[0]!, prefix, path));
        continue;
      }
    }
    out.push({ path: formatPath(prefix, path), message: iss.message });
  }
  return out;
}

/** A strict mapping: unknown keys are errors naming the expected ones. */
export function strict<S extends z.core.$ZodLooseShape>(shape: S, notMapping: string, unknownLabel = 'unknown field'): z.ZodObject<S, z.core.$strict> {
  const keys = Object.keys(shape);
  return z.strictObject(shape, {
    error: (iss) =>
      iss.code === 'unrecognized_keys' ? `${unknownLabel} (expected one of: ${keys.join(', ')})` : iss.code === 'invalid_type' ? (iss.input === undefined ? 'is required' : notMapping) : undefined,
  });
}

/**
 * A field that no longer exists: absent is fine, present is an error saying
 * what to use instead (in the JSON Schema: `not: {}`, deprecated).
 */
export function removedField(message: string) {
  return z.never({ error: message }).optional().meta({ description: message, deprecated: true });
}

/** True for a plain mapping (not null, not a list). */
export function isMapping(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

// ---- field helpers shared by the config modules. Messages keep the router
// config's style: "must be ... (got <value>)", "is required".

export const got = (v: unknown) => JSON.stringify(v);
export const listError = (i: { input?: unknown }) => (i.input === undefined ? 'is required' : 'must be a list');

export const nonEmpty = () =>
  z.string({ error: (i) => (i.input === undefined ? 'is required' : 'must be a non-empty string') }).min(1, { error: 'must be a non-empty string' });

export function oneOf<const T extends readonly [string, ...string[]]>(allowed: T) {
  return z.enum(allowed, {
    error: (i) => (i.input === undefined ? `is required (one of: ${allowed.join(', ')})` : `must be one of: ${allowed.join(', ')} (got ${got(i.input)})`),
  });
}

export function int(min: number, max = Number.MAX_SAFE_INTEGER) {
  const error = (i: { input?: unknown }) => `must be an integer in [${min}, ${max}] (got ${got(i.input)})`;
  return z.int({ error }).gte(min, { error }).lte(max, { error });
}

export function num(min: number, max: number) {
  const error = (i: { input?: unknown }) => `must be a number in [${min}, ${max}] (got ${got(i.input)})`;
  return z.number({ error }).gte(min, { error }).lte(max, { error });
}
