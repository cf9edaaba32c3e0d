// Helpers for the simulator tests: a small HTTP client over node:http with
// timing, an SSE splitter and a Prometheus text parser (written here, on
// purpose independent of the router's parser, so each checks the other).
import http from 'node:http';
import { performance } from 'node:perf_hooks';

export interface Resp {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
  /** Milliseconds from sending to the first body byte (or the headers if there is no body). */
  firstByteMs: number;
  totalMs: number;
  /** Set when the connection broke before the response ended. */
  error?: string;
}

export interface Pending {
  /** Resolves with the first body chunk. */
  first: Promise<string>;
  done: Promise<Resp>;
  /** Destroys the client socket (a client disconnect). */
  destroy(): void;
}

const agent = new http.Agent({ keepAlive: false });

export function send(base: string, method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Pending {
  const u = new URL(path, base);
  const payload = body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body);
  const t0 = performance.now();
  let firstByteMs = -1;
  let resolveFirst!: (s: string) => void;
  let rejectFirst!: (e: Error) => void;
  const first = new Promise<string>((res, rej) => {
    resolveFirst = res;
    rejectFirst = rej;
  });
  first.catch(() => {});
  let req!: http.ClientRequest;
  let destroyed = false;
  const done = new Promise<Resp>((resolve, reject) => {
    req = http.request(
      {
        host: u.hostname,
        port: u.port,
        path: u.pathname + u.search,
        method,
        agent,
        headers: { ...(payload !== undefined ? { 'content-type': 'application/json' } : {}), ...headers },
      },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => {
          if (firstByteMs < 0) {
            firstByteMs = performance.now() - t0;
            resolveFirst(c);
          }
          text += c;
        });
        const finish = (error?: string) => {
          if (firstByteMs < 0) firstByteMs = performance.now() - t0;
          resolveFirst(text);
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: text, firstByteMs, totalMs: performance.now() - t0, error });
        };
        res.on('end', () => finish());
        res.on('aborted', () => finish('aborted'));
        res.on('error', (e) => finish(e.message));
      },
    );
    req.on('error', (e) => {
      rejectFirst(e);
      if (destroyed) resolve({ status: 0, headers: {}, body: '', firstByteMs, totalMs: performance.now() - t0, error: 'destroyed' });
      else reject(e);
    });
    if (payload !== undefined) req.end(payload);
    else req.end();
  });
  return {
    first,
    done,
    destroy: () => {
      destroyed = true;
      req.destroy();
    },
  };
}

export function post(base: string, path: string, body: unknown, headers?: Record<string, string>): Promise<Resp> {
  return send(base, 'POST', path, body, headers).done;
}

export function get(base: string, path: string): Promise<Resp> {
  return send(base, 'GET', path).done;
}

/** The `data:` payloads of an SSE body, in order. */
export function sseData(body: string): string[] {
  const out: string[] = [];
  for (const ev of body.split('\n\n')) {
    if (ev === '') continue;
    if (!ev.startsWith('data: ')) throw new Error(`not an SSE data event: ${JSON.stringify(ev)}`);
    out.push(ev.slice(6));
  }
  return out;
}

export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

export interface Exposition {
  samples: Sample[];
  types: Map<string, string>;
  helps: Map<string, string>;
}

const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;

/** Parses Prometheus text format 0.0.4; throws on a malformed line. */
export function parseProm(text: string): Exposition {
  const samples: Sample[] = [];
  const types = new Map<string, string>();
  const helps = new Map<string, string>();
  const lines = text.split('\n');
  for (let ln = 0; ln < lines.length; ln++) {
    const line = lines[ln]!;
    if (line.trim() === '') continue;
    const bad = (why: string) => new Error(`metrics line ${ln + 1}: ${why}: ${line}`);
    if (line.startsWith('#')) {
      const m = /^# (HELP|TYPE) (\S+) ?(.*)$/.exec(line);
      if (m === null) continue; // a comment
      if (!NAME.test(m[2]!)) throw bad('bad metric name');
      if (m[1] === 'TYPE') {
        if (!['counter', 'gauge', 'histogram', 'summary', 'untyped'].includes(m[3]!)) throw bad('bad type');
        if (types.has(m[2]!)) throw bad('duplicate TYPE');
        types.set(m[2]!, m[3]!);
      } else helps.set(m[2]!, m[3]!);
      continue;
    }
    let i = 0;
    while (i < line.length && line[i] !== '{' && line[i] !== ' ') i++;
    const name = line.slice(0, i);
    if (!NAME.test(name)) throw bad('bad metric name');
    const labels: Record<string, string> = {};
    if (line[i] === '{') {
      i++;
      while (line[i] !== '}') {
        const eq = line.indexOf('=', i);
        if (eq < 0) throw bad('label without =');
        const key = line.slice(i, eq);
        if (!/^[a-zA-Z_][a-zA-Z0-9_]*$/.test(key)) throw bad('bad label name');
        if (line[eq + 1] !== '"') throw bad('label value not quoted');
        let j = eq + 2;
        let v = '';
        for (;;) {
          const c = line[j];
          if (c === undefined) throw bad('unterminated label value');
          if (c === '"') break;
          if (c === '\\') {
            const n = line[j + 1];
            v += n === 'n' ? '\n' : n;
            j += 2;
          } else {
            v += c;
            j++;
          }
        }
        if (key in labels) throw bad('duplicate label');
        labels[key] = v;
        i = j + 1;
        if (line[i] === ',') i++;
        else if (line[i] !== '}') throw bad('expected , or }');
      }
      i++;
    }
    if (line[i] !== ' ') throw bad('expected a space before the value');
    const rest = line.slice(i + 1).trim().split(/\s+/);
    const raw = rest[0]!;
    // NaN in any case, as Prometheus reads it (Go's ParseFloat): prom-client writes `Nan`
    const isNaNText = raw.toLowerCase() === 'nan';
    const value = raw === '+Inf' ? Infinity : raw === '-Inf' ? -Infinity : isNaNText ? NaN : Number(raw);
    if (raw === '' || (Number.isNaN(value) && !isNaNText)) throw bad('bad value');
    samples.push({ name, labels, value });
  }
  return { samples, types, helps };
}

/** The value of the one sample named `name` whose labels include `match`; throws if not exactly one. */
export function metric(e: Exposition, name: string, match: Record<string, string> = {}): number {
  const hits = e.samples.filter((s) => s.name === name && Object.entries(match).every(([k, v]) => s.labels[k] === v));
  if (hits.length !== 1) throw new Error(`expected one sample ${name} ${JSON.stringify(match)}, found ${hits.length}`);
  return hits[0]!.value;
}

export async function scrape(base: string): Promise<Exposition> {
  const r = await get(base, '/metrics');
  if (r.status !== 200) throw new Error(`/metrics answered ${r.status}`);
  return parseProm(r.body);
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Polls `cond` every 5 ms until it holds or `ms` pass. */
export async function until(cond: () => boolean | Promise<boolean>, ms = 3000): Promise<boolean> {
  const end = performance.now() + ms;
  while (performance.now() < end) {
    if (await cond()) return true;
    await sleep(5);
  }
  return cond();
}
