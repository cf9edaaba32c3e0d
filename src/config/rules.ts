// The Router config's rules across fields (unique names, one prefix-cache
// scorer, the plugins' own parameter checks, what the upstream client can
// reach, P/D roles, the admin token, the precise pools' shared index). They run
// as a refinement of the whole schema on whatever parsed, so their problems are
// reported with every other one (field paths, one pass).
import { CONTROL_CHARS, httpOrigin, isLoopback, safeName } from './defaults.js';
import type { PluginSpec } from './plugin-spec.js';
import { preciseRules } from './prefix-mode.js';
import { modelRules } from './models.js';
import { isMapping, type z } from './schema-kit.js';

/** A plugin spec as far as it parsed (the raw value when its own checks failed), or null. */
function specOf(v: unknown): PluginSpec | null {
  if (typeof v === 'string') return v === '' ? null : { type: v, params: {} };
  if (!isMapping(v) || typeof v.type !== 'string' || v.type === '') return null;
  return { type: v.type, params: isMapping(v.params) ? v.params : {} };
}

/** The name an endpoint will have, from its raw or parsed value ('' when it has none). */
function endpointName(e: unknown): string {
  if (!isMapping(e)) return '';
  if (typeof e.name === 'string') return e.name;
  const origin = typeof e.url === 'string' ? httpOrigin(e.url) : null;
  return origin ? safeName(origin) : '';
}

/**
 * Rules across fields: unique pool and endpoint names, one prefix-cache
 * scorer, the plugins' own parameter checks, and what the upstream client can
 * reach. They run on whatever parsed, so they are reported with the rest.
 */
export function crossFieldRules<T>(validatePlugin?: PluginCheck) {
  return (input: T, ctx: z.core.$RefinementCtx<T>) => {
    const v = input as unknown as Record<string, unknown>;
    const add = (path: PropertyKey[], message: string) => ctx.addIssue({ code: 'custom', path, message, input: undefined });
    const pools: unknown[] = Array.isArray(v.pools) ? v.pools : [];
    const poolNames = new Set<string>();
    const epNames = new Set<string>();
    pools.forEach((pool, i) => {
      if (!isMapping(pool)) return;
      if (typeof pool.name === 'string' && pool.name !== '') {
        if (poolNames.has(pool.name)) add(['pools', i, 'name'], `duplicate pool name "${pool.name}"`);
        poolNames.add(pool.name);
      }
      if ((pool.endpoints === undefined || (Array.isArray(pool.endpoints) && pool.endpoints.length === 0)) && pool.discovery === undefined)
        add(['pools', i, 'endpoints'], 'is required: at least one endpoint (or give the pool discovery)');
      if (pool.discovery !== undefined && isMapping(pool.prefix) && pool.prefix.mode === 'precise')
        add(['pools', i, 'prefix', 'mode'], 'precise mode needs each endpoint\'s kvEvents publisher: not available for discovered endpoints (use approximate)');
      if (!Array.isArray(pool.endpoints)) return;
      pool.endpoints.forEach((e, j) => {
        const name = endpointName(e);
        if (name === '' || CONTROL_CHARS.test(name)) return;
        if (epNames.has(name)) add(['pools', i, 'endpoints', j, 'name'], `duplicate endpoint name "${name}" (names are unique across pools)`);
        epNames.add(name);
      });
    });

    modelRules(v, add);

    // the precise pools share one index and one subscription per publisher (what buildPrecise relies on)
    preciseRules(pools, add, endpointName);

    const s = isMapping(v.scheduling) ? v.scheduling : undefined;
    if (s) {
      const scorers: unknown[] = Array.isArray(s.scorers) ? s.scorers : [];
      // a decision carries one prefix-cache scorer's block counts (the request path uses them to
      // forget what a failed pick recorded): a second one would overwrite them
      const prefixAt = scorers.map((x, i) => (specOf(x)?.type === 'prefix-cache' ? i : -1)).filter((i) => i >= 0);
      if (prefixAt.length > 1) add(['scheduling', 'scorers', prefixAt[1]!], 'at most one prefix-cache scorer (give it a larger weight instead)');
      if (validatePlugin) {
        const check = (kind: 'filter' | 'scorer' | 'picker', x: unknown, path: PropertyKey[]) => {
          const spec = specOf(x);
          if (spec) for (const m of validatePlugin(kind, spec)) add(path, m);
        };
        if (Array.isArray(s.filters)) s.filters.forEach((x, i) => check('filter', x, ['scheduling', 'filters', i]));
        scorers.forEach((x, i) => check('scorer', x, ['scheduling', 'scorers', i]));
        check('picker', s.picker, ['scheduling', 'picker']);
      }
    }
    const pdp = isMapping(v.disaggregation) && isMapping(v.disaggregation.prefill) ? v.disaggregation.prefill : undefined;
    if (pdp && validatePlugin) {
      const check = (kind: 'filter' | 'scorer' | 'picker', x: unknown, path: PropertyKey[]) => {
        const spec = specOf(x);
        if (spec) for (const m of validatePlugin(kind, spec)) add(path, m);
      };
      const base = ['disaggregation', 'prefill'];
      if (Array.isArray(pdp.filters)) pdp.filters.forEach((x, i) => check('filter', x, [...base, 'filters', i]));
      if (Array.isArray(pdp.scorers)) pdp.scorers.forEach((x, i) => check('scorer', x, [...base, 'scorers', i]));
      check('picker', pdp.picker, [...base, 'picker']);
    }
    const pdd = isMapping(v.disaggregation) && isMapping(v.disaggregation.decode) ? v.disaggregation.decode : undefined;
    if (pdd && validatePlugin) {
      const check = (kind: 'scorer' | 'picker', x: unknown, path: PropertyKey[]) => {
        const spec = specOf(x);
        if (spec) for (const m of validatePlugin(kind, spec)) add(path, m);
      };
      const base = ['disaggregation', 'decode'];
      if (Array.isArray(pdd.scorers)) pdd.scorers.forEach((x, i) => check('scorer', x, [...base, 'scorers', i]));
      check('picker', pdd.picker, [...base, 'picker']);
    }

    // a revision of a pool that prefills must also decode (a prefill leg pairs only within its revision)
    pools.forEach((pool, i) => {
      if (!isMapping(pool) || !Array.isArray(pool.endpoints)) return;
      const roles = new Map<string, { prefill: number; decode: boolean }>();
      pool.endpoints.forEach((e, j) => {
        if (!isMapping(e)) return;
        const rev = typeof e.revision === 'string' ? e.revision : '';
        const r = roles.get(rev) ?? { prefill: -1, decode: false };
        if (e.role === 'prefill' && r.prefill < 0) r.prefill = j;
        if (e.role === 'decode' || e.role === 'both') r.decode = true;
        roles.set(rev, r);
      });
      for (const [rev, r] of roles) {
        if (r.prefill >= 0 && !r.decode)
          add(
            ['pools', i, 'endpoints', r.prefill, 'role'],
            `a disaggregated pool needs decode endpoints: this pool has prefill endpoints${rev ? ` of revision "${rev}"` : ''} but no endpoint of role decode (or both)${rev ? ' in that revision' : ''}`,
          );
      }
    });

    if (isMapping(v.admin) && typeof v.admin.host === 'string' && !isLoopback(v.admin.host) && v.admin.token === undefined && v.admin.tokenEnv === undefined)
      add(['admin', 'token'], `required when admin.host is not a loopback address (${v.admin.host}): set token or tokenEnv`);

    const client = isMapping(v.proxy) ? v.proxy.client : undefined;
    if (client === 'h1' || client === 'native') {
      pools.forEach((pool, i) => {
        if (!isMapping(pool) || !Array.isArray(pool.endpoints)) return;
        pool.endpoints.forEach((e, j) => {
          const url = isMapping(e) && typeof e.url === 'string' ? httpOrigin(e.url) : null;
          if (url === null) return; // reported by the url field
          if (url.startsWith('https:')) add(['pools', i, 'endpoints', j, 'url'], 'https endpoints need proxy.client: undici (or auto)');
        });
      });
    }
  };
}

export type PluginCheck = (kind: 'filter' | 'scorer' | 'picker', spec: PluginSpec) => string[];
