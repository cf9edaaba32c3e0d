// Reads the auth block's key sources (inline keys, the keys file, the keys
// environment variable) into one checked key list and builds the
// authenticator; checks that each pool's upstreamAuth variable is set. Run at
// start, on every reload and by `switchyard check`, so all three apply the
// same rules. Problems are a ConfigError: a malformed line with its line
// number, a duplicate digest naming both places, a maxBand that is no band.
import { readFile } from 'node:fs/promises';
import { checkKeys, parseKeyLines, type PlacedKey } from '../config/auth.js';
import { DEFAULT_BANDS } from '../config/flow-control.js';
import type { RouterConfig } from '../config/schema.js';
import { ConfigError, type ConfigIssue } from '../errors.js';
import { ApiKeyAuthenticator } from './authenticator.js';

/** The authenticator of a config (null without an `auth` block). Throws ConfigError. */
export async function loadAuth(cfg: RouterConfig, env: NodeJS.ProcessEnv = process.env): Promise<ApiKeyAuthenticator | null> {
  const issues: ConfigIssue[] = [];
  cfg.pools.forEach((p, i) => {
    if (p.upstreamAuth !== undefined && !env[p.upstreamAuth]) issues.push({ path: `pools[${i}].upstreamAuth`, message: `the environment variable ${p.upstreamAuth} is not set (or empty)` });
  });
  const a = cfg.auth;
  if (a === undefined) {
    if (issues.length > 0) throw new ConfigError(issues);
    return null;
  }
  const keys: PlacedKey[] = a.keys.map((k, i) => ({ ...k, at: `auth.keys[${i}]` }));
  if (a.keysFile !== undefined) {
    let text: string | null = null;
    try {
      text = await readFile(a.keysFile, 'utf8');
    } catch (err) {
      issues.push({ path: 'auth.keysFile', message: `cannot read ${a.keysFile}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}` });
    }
    if (text !== null) {
      const r = parseKeyLines(text, 'auth.keysFile');
      keys.push(...r.keys);
      issues.push(...r.issues);
    }
  }
  if (a.keysEnv !== undefined) {
    const text = env[a.keysEnv];
    if (text === undefined) issues.push({ path: 'auth.keysEnv', message: `the environment variable ${a.keysEnv} is not set` });
    else {
      const r = parseKeyLines(text, `auth.keysEnv (${a.keysEnv})`);
      keys.push(...r.keys);
      issues.push(...r.issues);
    }
  }
  issues.push(...checkKeys(keys, cfg.flowControl?.bands ?? DEFAULT_BANDS));
  if (issues.length > 0) throw new ConfigError(issues);
  return new ApiKeyAuthenticator(a, keys);
}
