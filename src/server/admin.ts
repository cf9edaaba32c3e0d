// The admin API: its own HTTP listener (node:http; never on the request
// path), loopback by default, a bearer token when configured (required by the
// config when it listens elsewhere). It lists the endpoints with role,
// revision, health and load, adds, drains and removes them, and reloads the
// config file. An endpoint source in its own right (origin 'admin').
//
//   GET    /admin/endpoints                       list (and per-revision readiness)
//   POST   /admin/endpoints                       add {pool, name, url, role?, revision?, capacity?}
//   POST   /admin/endpoints/{name}/drain          no new requests; ?wait=1 answers once drained
//   DELETE /admin/endpoints/{name}                drain then remove; ?force=1 for a model's last endpoint
//   POST   /admin/reload                          re-read the config file (as SIGHUP)
//   GET    /admin/tenants                         per-tenant usage and keys (by id: a digest prefix, never the key)
//   POST   /admin/keys/reload                     re-read the auth keys (keys file, keys variable) of the running config
//
// Errors use the OpenAI error shape; 400 for a bad body or a malformed %-escape
// in the path, 401 without the token, 404 for an unknown endpoint or pool, 409
// for a taken name or a model's last endpoint. Names given here are at most 253
// bytes of letters, digits, '-', '.', '_'; no field may hold a control character.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { timingSafeEqual } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { endpointConfigSchema, type AdminConfig } from '../config/schema.js';
import { toConfigIssues } from '../config/schema-kit.js';
import type { EndpointSpec, EndpointTarget } from '../endpoints/live.js';
import { ConfigError, EndpointError, SwitchyardError } from '../errors.js';
import { loadAuth } from '../auth/keys.js';
import { errorBody } from './http-errors.js';
import type { RouterCore } from './core.js';
import type { ConfigReloader } from './reload.js';
import { revisionStatus } from '../endpoints/revisions.js';

const MAX_BODY = 64 * 1024;

export interface AdminServer {
  readonly url: string;
  readonly port: number;
  close(): Promise<void>;
}

/** The token the admin API requires ('' = none), from the config or its environment variable. */
export function adminToken(cfg: AdminConfig, env: NodeJS.ProcessEnv = process.env): string {
  if (cfg.token !== undefined) return cfg.token;
  if (cfg.tokenEnv !== undefined) return env[cfg.tokenEnv] ?? '';
  return '';
}

class HttpError extends SwitchyardError {
  readonly status: number;
  readonly param: string | null;
  constructor(status: number, message: string, param: string | null = null) {
    super(message, { code: 'SWY_ERR_ADMIN_REQUEST' });
    this.status = status;
    this.param = param;
  }
}

/**
 * What every change through the admin API says of itself: it lives in this
 * process's memory only. A restart loses it; a reload (SIGHUP, POST
 * /admin/reload) re-applies the config file's endpoints (a drained or removed
 * file endpoint comes back; endpoints added here stay until a restart).
 * docs/operations.md, "Admin changes are not persisted".
 */
export const PERSISTENCE_NOTE = 'in memory only: a restart loses this change, and a reload re-applies the config file (its endpoints come back; endpoints added through the admin API stay until a restart)';

/** A change's answer: its body with `persisted: false` and the note, and the x-switchyard-persisted header. */
function sendChange(res: ServerResponse, status: number, body: Record<string, unknown>): void {
  res.setHeader('x-switchyard-persisted', 'false');
  send(res, status, { ...body, persisted: false, note: PERSISTENCE_NOTE });
}

function send(res: ServerResponse, status: number, body: unknown): void {
  const text = typeof body === 'string' ? body : JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

function readBody(req: IncomingMessage): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (c: Buffer) => {
      size += c.length;
      if (size > MAX_BODY) {
        reject(new HttpError(413, `admin request body exceeds ${MAX_BODY} bytes`));
        req.destroy();
        return;
      }
      chunks.push(c);
    });
    req.on('end', () => {
      if (size === 0) return resolve({});
      try {
        resolve(JSON.parse(Buffer.concat(chunks).toString('utf8')));
      } catch (err) {
        reject(new HttpError(400, `the body is not valid JSON: ${(err as Error).message}`));
      }
    });
    req.on('error', reject);
  });
}

function flag(u: URL, name: string): boolean {
  const v = u.searchParams.get(name);
  return v !== null && v !== '0' && v !== 'false';
}

function graceParam(u: URL, body: unknown): number | undefined {
  const raw = u.searchParams.get('graceMs') ?? (typeof body === 'object' && body !== null ? (body as Record<string, unknown>).graceMs : undefined);
  if (raw === undefined || raw === null) return undefined;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 0 || n > 86_400_000) throw new HttpError(400, `graceMs must be an integer in [0, 86400000] (got ${JSON.stringify(raw)})`, 'graceMs');
  return n;
}

/** Control characters: C0, DEL and C1 (U+0080–U+009F). */
const ANY_CONTROL = /[\u0000-\u001f\u007f-\u009f]/;
/** An endpoint name given to the admin API: DNS-label characters (plus '_'), at most 253 bytes. */
const NAME_CHARS = /^[A-Za-z0-9._-]+$/;
const MAX_NAME_BYTES = 253;

/** The admin API's own limits on an endpoint to add, beyond the config file's rules. */
function adminLimits(fields: Record<string, unknown>): void {
  for (const field of ['pool', 'name', 'url', 'revision']) {
    const v = fields[field];
    if (typeof v === 'string' && ANY_CONTROL.test(v)) throw new HttpError(400, `${field}: must not contain control characters (C0, DEL, C1 U+0080-U+009F)`, field);
  }
  const name = fields.name;
  if (typeof name === 'string' && name !== '') {
    const bytes = Buffer.byteLength(name);
    if (bytes > MAX_NAME_BYTES) throw new HttpError(400, `name: must be at most ${MAX_NAME_BYTES} bytes (got ${bytes})`, 'name');
    if (!NAME_CHARS.test(name)) throw new HttpError(400, "name: may contain only letters, digits, '-', '.' and '_'", 'name');
  }
  if (typeof fields.url === 'string') {
    let port: string | null = null;
    try {
      port = new URL(fields.url).port;
    } catch {
      // not a URL: the config rules below say so
    }
    if (port === '0') throw new HttpError(400, 'url: port 0 is not a port an engine listens on (use 1-65535)', 'url');
  }
}

/** Validates an endpoint to add: the same rules as a config file's endpoint, plus its pool and the admin API's limits. */
function endpointSpec(body: unknown): EndpointSpec {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new HttpError(400, 'the body must be a JSON object {pool, name, url, role?, revision?}');
  const { pool, ...rest } = body as Record<string, unknown>;
  adminLimits(body as Record<string, unknown>);
  if (typeof pool !== 'string' || pool === '') throw new HttpError(400, 'pool: must be the name of a configured pool', 'pool');
  const r = endpointConfigSchema.safeParse(rest);
  if (!r.success) {
    const issues = toConfigIssues(r.error.issues);
    throw new HttpError(400, issues.map((i) => `${i.path || '(body)'}: ${i.message}`).join('; '), issues[0]?.path || null);
  }
  return { pool, ...r.data };
}

/** A path segment, percent-decoded; a malformed escape is the client's error (400), not ours. */
function decodeSegment(p: string): string {
  try {
    return decodeURIComponent(p);
  } catch {
    throw new HttpError(400, `path: malformed %-escape in "${p.slice(0, 100)}"`, 'path');
  }
}

/**
 * GET /admin/tenants: each tenant's requests and in-flight counts, and its keys
 * by id (the first 16 hex digits of the key's SHA-256: names a key in logs and
 * dashboards without revealing it) with their models, band ceiling and counts.
 * The anonymous scope ('') is `anonymous`.
 */
function tenantsView(core: RouterCore) {
  const auth = core.auth;
  const u = core.usage;
  const zero = { requests: 0, inFlight: 0 };
  const byTenant = new Map<string, { id: string; models: string[] | null; maxBand: string | null; requests: number; inFlight: number }[]>();
  for (const c of auth?.callers ?? []) {
    const k = u.keys.get(c.keyId) ?? zero;
    let list = byTenant.get(c.tenant);
    if (list === undefined) byTenant.set(c.tenant, (list = []));
    list.push({ id: c.keyId, models: c.models === null ? null : [...c.models], maxBand: c.maxBand || null, requests: k.requests, inFlight: k.inFlight });
  }
  const names = new Set([...byTenant.keys(), ...u.tenants.keys()]);
  names.delete('');
  const tenants = [...names].sort().map((tenant) => {
    const c = u.tenants.get(tenant) ?? zero;
    return { tenant, requests: c.requests, inFlight: c.inFlight, keys: byTenant.get(tenant) ?? [] };
  });
  const anon = u.tenants.get('') ?? zero;
  return {
    auth: auth === null ? null : { required: auth.required, trustHeaders: auth.trustHeaders, keys: auth.size },
    tenants,
    anonymous: { requests: anon.requests, inFlight: anon.inFlight },
  };
}

/** Starts the admin listener of `core` (and of `reloader`, when the router has a config file). */
export function startAdmin(core: RouterCore, cfg: AdminConfig, reloader: ConfigReloader | null, target: EndpointTarget = core.live): Promise<AdminServer> {
  const token = adminToken(cfg);
  const expected = Buffer.from(`Bearer ${token}`);
  const log = core.log;

  const authorized = (req: IncomingMessage): boolean => {
    if (token === '') return true;
    const got = Buffer.from(req.headers.authorization ?? '');
    return got.length === expected.length && timingSafeEqual(got, expected);
  };

  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    if (!authorized(req)) {
      res.setHeader('www-authenticate', 'Bearer');
      throw new HttpError(401, 'the admin API needs "Authorization: Bearer <token>"');
    }
    const u = new URL(req.url ?? '/', 'http://admin');
    const parts = u.pathname.split('/').filter((p) => p !== '').map(decodeSegment);
    const method = req.method ?? 'GET';
    if (parts[0] !== 'admin') throw new HttpError(404, `no admin route ${method} ${u.pathname}`);
    if (parts[1] === 'endpoints' && parts.length === 2) {
      if (method === 'GET') return send(res, 200, { endpoints: target.list(), revisions: revisionStatus(core.endpoints) });
      if (method === 'POST') {
        const spec = endpointSpec(await readBody(req));
        const ep = target.add(spec, 'admin');
        log.info({ endpoint: ep.name, pool: ep.pool, url: ep.url, role: ep.role, revision: ep.revision }, 'admin: endpoint added');
        return sendChange(res, 201, { endpoint: target.list().find((v) => v.name === ep.name) });
      }
      throw new HttpError(405, `method ${method} is not allowed on /admin/endpoints (GET, POST)`);
    }
    if (parts[1] === 'endpoints' && parts.length >= 3) {
      const name = parts[2]!;
      const body = method === 'GET' ? {} : await readBody(req);
      const graceMs = graceParam(u, body);
      const wait = flag(u, 'wait');
      if (parts.length === 4 && parts[3] === 'drain' && method === 'POST') {
        const p = target.drain(name, { graceMs });
        if (wait) return sendChange(res, 200, { drained: await p });
        // not waiting: a rejection (unknown endpoint) still answers now
        await Promise.race([p, Promise.resolve()]);
        p.catch(() => {});
        log.info({ endpoint: name, graceMs }, 'admin: endpoint draining');
        return sendChange(res, 202, { endpoint: name, state: 'draining' });
      }
      if (parts.length === 3 && method === 'DELETE') {
        const force = flag(u, 'force') || (typeof body === 'object' && body !== null && (body as Record<string, unknown>).force === true);
        const p = target.remove(name, { graceMs, force });
        if (wait) return sendChange(res, 200, { removed: await p });
        await Promise.race([p, Promise.resolve()]);
        p.catch((err: Error) => log.warn({ err, endpoint: name }, 'admin: removal failed'));
        log.info({ endpoint: name, graceMs, force }, 'admin: endpoint removing (draining first)');
        return sendChange(res, 202, { endpoint: name, state: 'draining' });
      }
      if (parts.length === 3 && method === 'GET') {
        const v = target.list().find((e) => e.name === name);
        if (v === undefined) throw new HttpError(404, `no endpoint named "${name}"`);
        return send(res, 200, { endpoint: v });
      }
      throw new HttpError(405, `method ${method} is not allowed on ${u.pathname}`);
    }
    if (parts[1] === 'tenants' && parts.length === 2) {
      if (method !== 'GET') throw new HttpError(405, 'use GET /admin/tenants');
      return send(res, 200, tenantsView(core));
    }
    if (parts[1] === 'keys' && parts[2] === 'reload' && parts.length === 3) {
      if (method !== 'POST') throw new HttpError(405, 'use POST /admin/keys/reload');
      const cfg = reloader?.current ?? core.config;
      if (cfg.auth === undefined) throw new HttpError(409, 'this router has no auth block: no keys to reload');
      try {
        core.auth = await loadAuth(cfg);
      } catch (err) {
        if (!(err instanceof ConfigError)) throw err;
        log.error({ issues: err.issues }, 'admin: keys reload refused, the running keys keep serving');
        return send(res, 422, { ok: false, issues: err.issues, message: err.message });
      }
      log.info({ keys: core.auth!.size }, 'admin: keys reloaded');
      return send(res, 200, { ok: true, keys: core.auth!.size });
    }
    if (parts[1] === 'reload' && parts.length === 2) {
      if (method !== 'POST') throw new HttpError(405, 'use POST /admin/reload');
      if (reloader === null) throw new HttpError(409, 'this router was not started from a config file: nothing to reload');
      const r = await reloader.reload();
      return send(res, r.ok ? 200 : 422, r);
    }
    throw new HttpError(404, `no admin route ${method} ${u.pathname}`);
  };

  const server: Server = createServer((req, res) => {
    handle(req, res).catch((err: unknown) => {
      const status = err instanceof HttpError ? err.status : err instanceof EndpointError ? err.status : 500;
      const param = err instanceof HttpError ? err.param : null;
      if (status === 500) log.error({ err }, 'admin API: internal error');
      if (res.headersSent) return res.destroy();
      const body = JSON.parse(errorBody(status, (err as Error).message)) as { error: Record<string, unknown> };
      body.error.param = param;
      if (err instanceof EndpointError) body.error.code = err.code;
      send(res, status, body);
    });
  });
  server.requestTimeout = 10 * 60_000; // ?wait=1 on a long drain
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(cfg.port, cfg.host, () => {
      server.off('error', reject);
      const port = (server.address() as AddressInfo).port;
      const host = cfg.host.includes(':') ? `[${cfg.host}]` : cfg.host;
      resolve({
        url: `http://${host}:${port}`,
        port,
        close: () =>
          new Promise<void>((r) => {
            server.close(() => r());
            server.closeAllConnections();
          }),
      });
    });
  });
}
