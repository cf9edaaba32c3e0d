// Filter `role`: for a plain (non-disaggregated) request keeps endpoints whose
// role is in `roles` (default both, decode: a decode endpoint prefills a
// request itself when it gets no transferred KV). With `preferBoth` (default
// true) decode-only endpoints are used only when no `both` endpoint passes.
import type { Role } from '../../config/schema.js';
import { ROLES } from '../../config/schema.js';
import type { Endpoint } from '../../endpoints/endpoint.js';
import { knownParams, type PluginFactory } from '../registry.js';
import type { CycleContext, Filter } from '../types.js';
import { keepIf } from './filter-base.js';

export class RoleFilter implements Filter {
  readonly type = 'role';
  readonly name = 'role';
  readonly #roles: readonly Role[];
  readonly #preferBoth: boolean;
  readonly #scratch: Endpoint[] = [];
  readonly #scratch2: Endpoint[] = [];
  readonly #pass = (ep: Endpoint): boolean => this.#roles.includes(ep.role);
  readonly #isBoth = (ep: Endpoint): boolean => ep.role === 'both';

  constructor(roles: readonly Role[], preferBoth: boolean) {
    this.#roles = roles;
    this.#preferBoth = preferBoth;
  }

  filter(_ctx: CycleContext, eps: readonly Endpoint[]): readonly Endpoint[] {
    const kept = keepIf(eps, this.#scratch, this.#pass);
    if (!this.#preferBoth) return kept;
    const both = keepIf(kept, this.#scratch2, this.#isBoth);
    return both.length > 0 ? both : kept;
  }
}

export const roleFilter: PluginFactory<'filter'> = {
  kind: 'filter',
  type: 'role',
  validate: (p) => {
    const out: string[] = [];
    knownParams(p, ['roles', 'preferBoth'], out);
    if (p.roles !== undefined && (!Array.isArray(p.roles) || p.roles.length === 0 || p.roles.some((r) => !ROLES.includes(r as Role)))) {
      out.push(`params.roles must be a non-empty list of: ${ROLES.join(', ')}`);
    }
    if (p.preferBoth !== undefined && typeof p.preferBoth !== 'boolean') out.push('params.preferBoth must be true or false');
    return out;
  },
  create: (p) => new RoleFilter((p.roles as Role[] | undefined) ?? ['both', 'decode'], (p.preferBoth as boolean | undefined) ?? true),
};
