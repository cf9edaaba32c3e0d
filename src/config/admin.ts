// The `admin` block of the router config: the admin API on its own listener
// and bearer token (docs/operations.md). Type, defaults and zod schema;
// schema.ts adds it to the Router config, rules.ts requires a token off
// loopback.
import { int, nonEmpty, strict } from './schema-kit.js';

export interface AdminConfig {
  host: string;
  port: number;
  /** Bearer token the admin API requires (required when host is not a loopback address). */
  token?: string;
  /** Environment variable holding the token (instead of `token`). */
  tokenEnv?: string;
  /** How long a drain (admin API, reload) lets in-flight requests finish before the endpoint is removed anyway. */
  drainGraceMs: number;
}

export const ADMIN_DEFAULTS = { host: '127.0.0.1', port: 8001, drainGraceMs: 30_000 };

export const adminSchema = strict(
  {
    host: nonEmpty().default(ADMIN_DEFAULTS.host).describe('listen address of the admin API (loopback by default)'),
    port: int(0, 65535).default(ADMIN_DEFAULTS.port),
    token: nonEmpty().optional().describe('bearer token the admin API requires; required when host is not loopback'),
    tokenEnv: nonEmpty().optional().describe('name of an environment variable holding the token'),
    drainGraceMs: int(0, 86_400_000).default(ADMIN_DEFAULTS.drainGraceMs).describe('how long a drain lets in-flight requests finish'),
  },
  'must be a mapping',
);
