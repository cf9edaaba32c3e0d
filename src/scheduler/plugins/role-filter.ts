// Filter `role`: for a plain (non-disaggregated) request keeps endpoints whose
// role is in `roles` (default both, decode: a decode endpoint prefills a
// request itself when it gets no transferred KV). With `preferBoth` (default
// true) decode-only endpoints are used only when no `both` endpoint passes.
import type { Role } from '../../config/schema.js';
import { ROLES } from '../../config/schema.js';
import type { Endpoint } from '../../endpoints/endpoint.js';
import { boolParam, pluginParams, type PluginFactory } from '../registry.js';
import { z } from '../../config/schema-kit.js';
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
  params: pluginParams({
    roles: z
      .array(z.enum(ROLES, { error: `must be a non-empty list of: ${ROLES.join(', ')}` }), { error: `must be a non-empty list of: ${ROLES.join(', ')}` })
      .min(1, { error: `must be a non-empty list of: ${ROLES.join(', ')}` })
      .optional(),
    preferBoth: boolParam().optional(),
  }),
  create: (p) => new RoleFilter((p.roles as Role[] | undefined) ?? ['both', 'decode'], (p.preferBoth as boolean | undefined) ?? true),
};
