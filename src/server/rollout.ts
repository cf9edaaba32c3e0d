// `switchyard rollout`: moves a pool from one revision to another through a
// running router's admin API, the sequence docs/operations.md describes:
//   1. add the new revision's endpoints (POST /admin/endpoints),
//   2. wait until the new revision is ready for every role it has (its
//      prefill and decode sides both, for a disaggregated pool),
//   3. drain and remove the old revision's endpoints, prefill first (no new
//      prefill leg starts on the old revision; its decode side finishes the
//      legs in flight), then decode and both,
// with the progress on one rewritten line on a terminal (a line per step otherwise).
import { parseArgs } from 'node:util';
import { ROLES, type Role } from '../config/schema.js';
import { SwitchyardError } from '../errors.js';

export interface RolloutEndpoint {
  name: string;
  url: string;
  role: Role;
  /** SGLang prefill endpoints: the engine's bootstrap port (absent: disaggregation.bootstrapPort). */
  bootstrapPort?: number;
}

export interface RolloutOptions {
  admin: string;
  token: string;
  pool: string;
  to: string;
  /** The revision to replace; absent: every endpoint of the pool not of `to`. */
  from?: string;
  endpoints: RolloutEndpoint[];
  graceMs?: number;
  readyTimeoutMs?: number;
  pollMs?: number;
}

export interface RolloutProgress {
  step: 'add' | 'wait-ready' | 'drain' | 'done';
  done: number;
  total: number;
  detail: string;
}

interface View {
  name: string;
  pool: string;
  role: string;
  revision: string | null;
  state: string;
  ready: boolean;
  inFlight: number;
}

interface RevStatus {
  pool: string;
  revision: string;
  servesAggregated: boolean;
  servesDisaggregated: boolean;
  roles: Record<string, { endpoints: number; ready: number }>;
}

export class RolloutError extends SwitchyardError {
  override readonly code = 'SWY_ERR_ROLLOUT';
}

async function call(o: RolloutOptions, method: string, path: string, body?: unknown): Promise<{ status: number; json: Record<string, unknown> }> {
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (o.token) headers.authorization = `Bearer ${o.token}`;
  let res: Response;
  try {
    res = await fetch(new URL(path, o.admin), { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (err) {
    throw new RolloutError(`cannot reach the admin API at ${o.admin}: ${(err as Error).message}`);
  }
  const text = await res.text();
  let json: Record<string, unknown> = {};
  try {
    json = text ? (JSON.parse(text) as Record<string, unknown>) : {};
  } catch {
    // not JSON: reported by status
  }
  return { status: res.status, json };
}

function errMessage(r: { status: number; json: Record<string, unknown> }): string {
  const e = r.json.error as { message?: string } | undefined;
  return `HTTP ${r.status}${e?.message ? `: ${e.message}` : ''}`;
}

/** Runs the rollout; resolves with its duration in ms. Throws RolloutError with what failed. */
export async function rollout(o: RolloutOptions, progress: (p: RolloutProgress) => void = () => {}): Promise<number> {
  const t0 = performance.now();
  const poll = o.pollMs ?? 200;
  const list = async (): Promise<{ endpoints: View[]; revisions: RevStatus[] }> => {
    const r = await call(o, 'GET', '/admin/endpoints');
    if (r.status !== 200) throw new RolloutError(`listing endpoints failed: ${errMessage(r)}`);
    return r.json as unknown as { endpoints: View[]; revisions: RevStatus[] };
  };
  const before = await list();
  const old = before.endpoints.filter((e) => e.pool === o.pool && e.state === 'active' && (o.from !== undefined ? e.revision === o.from : e.revision !== o.to));
  // 1. add
  let n = 0;
  for (const ep of o.endpoints) {
    progress({ step: 'add', done: n, total: o.endpoints.length, detail: `adding ${ep.name} (${ep.role}, revision ${o.to})` });
    const r = await call(o, 'POST', '/admin/endpoints', { pool: o.pool, name: ep.name, url: ep.url, role: ep.role, revision: o.to, ...(ep.bootstrapPort !== undefined ? { bootstrapPort: ep.bootstrapPort } : {}) });
    if (r.status !== 201) throw new RolloutError(`adding ${ep.name} failed: ${errMessage(r)}`);
    n++;
  }
  progress({ step: 'add', done: n, total: o.endpoints.length, detail: `added ${n} endpoint(s) of revision ${o.to}` });
  // 2. wait until the new revision serves every role it has
  const needsPd = o.endpoints.some((e) => e.role === 'prefill');
  const deadline = performance.now() + (o.readyTimeoutMs ?? 300_000);
  for (;;) {
    const now = await list();
    const rev = now.revisions.find((r) => r.pool === o.pool && r.revision === o.to);
    const ready = o.endpoints.filter((e) => now.endpoints.some((v) => v.name === e.name && v.ready)).length;
    progress({ step: 'wait-ready', done: ready, total: o.endpoints.length, detail: `revision ${o.to}: ${ready}/${o.endpoints.length} endpoints ready` });
    if (rev !== undefined && (needsPd ? rev.servesDisaggregated : rev.servesAggregated) && ready === o.endpoints.length) break;
    if (performance.now() > deadline) {
      // roll back: the endpoints this rollout added leave again; the old revision never stopped serving
      for (const ep of o.endpoints) await call(o, 'DELETE', `/admin/endpoints/${encodeURIComponent(ep.name)}?force=1&graceMs=0`);
      throw new RolloutError(`revision ${o.to} was not ready within ${o.readyTimeoutMs ?? 300_000} ms (${ready}/${o.endpoints.length} endpoints ready): its endpoints were removed again, the old revision keeps serving`);
    }
    await new Promise((r) => setTimeout(r, poll));
  }
  // 3. drain and remove the old revision: prefill first, then the rest
  const order = [...old.filter((e) => e.role === 'prefill'), ...old.filter((e) => e.role !== 'prefill')];
  n = 0;
  const grace = o.graceMs !== undefined ? `&graceMs=${o.graceMs}` : '';
  for (const ep of order) {
    progress({ step: 'drain', done: n, total: order.length, detail: `draining ${ep.name} (${ep.role}, revision ${ep.revision ?? '-'})` });
    const r = await call(o, 'DELETE', `/admin/endpoints/${encodeURIComponent(ep.name)}?wait=1${grace}`);
    if (r.status !== 200 && r.status !== 404) throw new RolloutError(`removing ${ep.name} failed: ${errMessage(r)}`);
    n++;
  }
  const ms = performance.now() - t0;
  progress({ step: 'done', done: order.length, total: order.length, detail: `pool ${o.pool} is on revision ${o.to} (${(ms / 1000).toFixed(1)} s)` });
  return ms;
}

const USAGE = `usage: switchyard rollout --admin URL --pool POOL --to REVISION --endpoint NAME=URL[,ROLE[,BOOTSTRAP_PORT]] ... [options]

Moves a pool to another revision through a running router's admin API: adds
the new endpoints, waits until the new revision is ready for every role it has
(prefill and decode for a disaggregated pool), then drains and removes the old
revision's endpoints (prefill first). Requests keep flowing throughout.

  --admin URL          the router's admin API (config admin block), e.g. http://127.0.0.1:8001
  --token-env VAR      environment variable holding the admin token (default SWITCHYARD_ADMIN_TOKEN)
  --pool POOL          the pool to move
  --to REVISION        the new revision label
  --from REVISION      the revision to replace (default: every other revision of the pool)
  --endpoint SPEC      NAME=URL[,ROLE[,BOOTSTRAP_PORT]] of the new revision (ROLE both|prefill|decode, default both;
                       BOOTSTRAP_PORT: an SGLang prefill engine's bootstrap port); repeat
  --grace-ms MS        drain grace period per old endpoint (default: the router's admin.drainGraceMs)
  --ready-timeout-ms MS  give up (nothing removed) if the new revision is not ready by then (default 300000)
  -h, --help           show this message

Exit codes: 0 done, 1 the rollout failed (the message says at which step), 2 bad options.`;

export async function runRolloutCli(argv: string[]): Promise<number> {
  let a;
  try {
    a = parseArgs({
      args: argv,
      options: {
        admin: { type: 'string' },
        'token-env': { type: 'string' },
        pool: { type: 'string' },
        to: { type: 'string' },
        from: { type: 'string' },
        endpoint: { type: 'string', multiple: true },
        'grace-ms': { type: 'string' },
        'ready-timeout-ms': { type: 'string' },
        help: { type: 'boolean', short: 'h' },
      },
      strict: true,
    }).values;
  } catch (err) {
    console.error(`switchyard rollout: ${(err as Error).message}\n\n${USAGE}`);
    return 2;
  }
  if (a.help) {
    console.log(USAGE);
    return 0;
  }
  const problems: string[] = [];
  if (!a.admin) problems.push('--admin is required');
  if (!a.pool) problems.push('--pool is required');
  if (!a.to) problems.push('--to is required');
  const endpoints: RolloutEndpoint[] = [];
  for (const spec of a.endpoint ?? []) {
    const m = /^([^=]+)=([^,]+)(?:,([^,]+)(?:,(\d+))?)?$/.exec(spec);
    const role = (m?.[3] ?? 'both') as Role;
    if (!m || !ROLES.includes(role)) problems.push(`--endpoint must be NAME=URL[,ROLE[,BOOTSTRAP_PORT]] with ROLE one of ${ROLES.join(', ')} (got ${spec})`);
    else endpoints.push({ name: m[1]!, url: m[2]!, role, ...(m[4] !== undefined ? { bootstrapPort: Number(m[4]) } : {}) });
  }
  if (endpoints.length === 0) problems.push('at least one --endpoint of the new revision is required');
  const num = (flag: string, v: string | undefined) => {
    if (v === undefined) return undefined;
    const n = Number(v);
    if (!Number.isInteger(n) || n < 0) problems.push(`${flag} must be a non-negative integer (got ${v})`);
    return n;
  };
  const graceMs = num('--grace-ms', a['grace-ms']);
  const readyTimeoutMs = num('--ready-timeout-ms', a['ready-timeout-ms']);
  if (problems.length > 0) {
    console.error(`switchyard rollout: ${problems.join('\n  ')}\n\nRun \`switchyard rollout --help\` for the options.`);
    return 2;
  }
  const tty = process.stdout.isTTY === true;
  let last = '';
  const show = (p: RolloutProgress) => {
    const bar = p.total > 0 ? `[${'#'.repeat(Math.round((p.done / p.total) * 20)).padEnd(20, '.')}]` : '';
    const line = `${p.step.padEnd(10)} ${bar} ${p.detail}`;
    if (tty) {
      process.stdout.write(`\r\x1b[2K${line}`);
      if (p.step === 'done') process.stdout.write('\n');
    } else if (line !== last) console.log(line);
    last = line;
  };
  try {
    await rollout(
      {
        admin: a.admin!,
        token: process.env[a['token-env'] ?? 'SWITCHYARD_ADMIN_TOKEN'] ?? '',
        pool: a.pool!,
        to: a.to!,
        from: a.from,
        endpoints,
        graceMs,
        readyTimeoutMs,
      },
      show,
    );
    // the admin API keeps changes in memory only: say what to do so the next reload or restart does not undo it
    console.log(`note: the router keeps this change in memory only; write pool ${a.pool}'s new endpoints (revision ${a.to}) into its config file, or a reload brings the file's endpoints back and a restart loses the rollout`);
    return 0;
  } catch (err) {
    if (tty) process.stdout.write('\n');
    console.error(`switchyard rollout: ${(err as Error).message}`);
    return 1;
  }
}
