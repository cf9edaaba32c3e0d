// The Files and Batches API on the uWS transport: reads the body (bounded by
// batch.maxFileBytes), hands it to src/batch/api.ts and writes its answer.
// Without a `batch:` block every route answers an OpenAI error saying so.
import type { ApiAnswer, BatchApi, FileStream } from '../batch/api.js';
import type { HttpRequest, HttpResponse, TemplatedApp } from '../uws.js';
import { isRefusal, type Caller, type Refusal } from '../identity.js';
import { answerUnauthorized, errorBody, statusLine } from './http-errors.js';

export interface BatchHost {
  /** Set by startRouter when `config.batch` is (null until then and without it). */
  readonly batchApi: BatchApi | null;
  readonly draining: boolean;
  readonly limits: { readonly maxBodyBytes: number };
  readonly metrics: { countRequest(model: string, endpoint: number, status: number): void };
  readonly log: { error(o: object, msg: string): void; warn(o: object, msg: string): void };
  /** Who a request is (its tenant: an API key's, or a trusted header's; '' for none), or a Refusal. */
  callerOf(get: (name: string) => string): Caller | Refusal;
}

export type Op = (api: BatchApi, param: string, query: string, contentType: string, body: Buffer | null, tenant: string) => Promise<ApiAnswer>;

const NOT_CONFIGURED = 'the Files and Batches API needs a `batch:` block (a Redis) in the router config (docs/batch.md)';

/**
 * Runs one Files/Batches call and writes its answer (either front end: `write` writes the status, body
 * and content type; `stream`, a download's pieces as the client takes them); store and internal errors
 * become OpenAI errors.
 */
export function runBatchOp(
  host: BatchHost,
  api: BatchApi,
  op: Op,
  param: string,
  query: string,
  contentType: string,
  body: Buffer | null,
  tenant: string,
  write: (status: number, body: string | Buffer, contentType?: string) => void,
  stream: (status: number, contentType: string, pieces: FileStream) => void,
): void {
  op(api, param, query, contentType, body, tenant).then(
    (a) => (a.stream !== undefined ? stream(a.status, a.contentType ?? 'application/octet-stream', a.stream) : write(a.status, a.body, a.contentType)),
    (err: unknown) => {
      const e = err as { status?: unknown; message?: string; param?: string | null; code?: string | null };
      if (typeof e?.status === 'number' && 'param' in (e as object)) write(e.status, errorBody(e.status, e.message ?? '', e.param ?? null, e.code ?? undefined));
      else if (/redis|connect|ECONNREFUSED|Connection is closed|max retries|timed out/i.test(String(e?.message)))
        write(503, errorBody(503, `the batch store (Redis) is unavailable: ${e?.message}`, null, 'store_unavailable'));
      else {
        host.log.error({ err }, 'batch api: internal error');
        write(500, errorBody(500, `internal error: ${e?.message ?? String(err)}`));
      }
    },
  );
}

/** The answer every Files/Batches route gives without a `batch:` block. */
export const BATCH_NOT_CONFIGURED = (): string => errorBody(404, NOT_CONFIGURED, null, 'batch_not_configured');

/**
 * The Files/Batches route of a request (the native front end's table; uWS mounts the same list):
 * its call, whether it reads a body, its path parameter; null when none matches.
 */
export function batchRoute(method: string, path: string): { op: Op; withBody: boolean; param: string } | null {
  for (const r of ROUTES) {
    if (r.method !== method) continue;
    const m = r.pattern.exec(path);
    if (m !== null) return { op: r.op, withBody: r.withBody, param: m[1] ?? '' };
  }
  return null;
}

/** True when a path is one of the Files/Batches routes' (any method): the 405s. */
export function isBatchPath(path: string): boolean {
  for (const r of ROUTES) if (r.pattern.test(path)) return true;
  return false;
}

function handle(host: BatchHost, res: HttpResponse, req: HttpRequest, withBody: boolean, op: Op): void {
  const param = req.getParameter(0) ?? '';
  const query = req.getQuery() ?? '';
  const contentType = req.getHeader('content-type');
  // every file and batch belongs to a tenant (the caller's flow-control tenant: an API key's, or a trusted header;
  // '' = the anonymous scope), and every call is scoped to the caller's: another tenant's objects answer 404.
  // The request is only readable inside this call, so the identity is taken now.
  const caller = host.callerOf((n) => req.getHeader(n));
  const declared = req.getHeader('content-length');
  if (isRefusal(caller)) return answerUnauthorized(host, res, caller.refused, declared);
  const tenant = caller.tenant;
  const bodyless = declared === '0' || (declared === '' && req.getHeader('transfer-encoding') === '');
  let gone = false;
  /** A download waiting for the client to take what was written (woken by onWritable, or by the abort). */
  let wake: (() => void) | null = null;
  res.onAborted(() => {
    gone = true;
    wake?.();
  });
  const write = (status: number, body: string | Buffer, contentType = 'application/json', close = false) => {
    host.metrics.countRequest('', -1, status);
    if (gone) return;
    gone = true;
    res.cork(() => {
      res.writeStatus(statusLine(status)).writeHeader('content-type', contentType).end(body, close || host.draining);
    });
  };
  // a download: chunked, a piece at a time, the next one read when uWS has sent the last (its backpressure)
  const stream = (status: number, type: string, pieces: FileStream) => {
    host.metrics.countRequest('', -1, status);
    if (gone) return;
    res.cork(() => {
      res.writeStatus(statusLine(status)).writeHeader('content-type', type);
      if (host.draining) res.writeHeader('connection', 'close');
    });
    void (async () => {
      try {
        for (;;) {
          const piece = await pieces.next();
          if (gone) return;
          if (piece === null) break;
          let ok = true;
          res.cork(() => {
            ok = res.write(piece);
          });
          if (!ok) {
            await new Promise<void>((resolve) => {
              wake = resolve;
              res.onWritable(() => {
                resolve();
                return true;
              });
            });
            wake = null;
            if (gone) return;
          }
        }
        gone = true;
        res.cork(() => res.end(undefined, host.draining));
      } catch (err) {
        // the data went away mid-download: the answer is cut (its chunked framing never ends), never passed off as whole
        host.log.warn({ err: (err as Error).message }, 'batch api: a download was cut');
        if (!gone) {
          gone = true;
          res.close();
        }
      }
    })();
  };
  const api = host.batchApi;
  if (api === null) {
    // the body (if any) is read and dropped by uWS: no onData
    write(404, errorBody(404, NOT_CONFIGURED, null, 'batch_not_configured'));
    return;
  }
  const run = (body: Buffer | null) => runBatchOp(host, api, op, param, query, contentType, body, tenant, write, stream);
  if (!withBody) return run(null);
  if (bodyless) return run(Buffer.alloc(0));
  const limit = api.maxFileBytes;
  const tooLarge = (n: number | string) =>
    // answered after uWS is done with this read, then the connection closes (the rest of the body is not worth reading)
    setImmediate(() => write(413, errorBody(413, `request body of ${n} bytes exceeds the limit of ${limit} bytes (batch.maxFileBytes)`, 'file', 'file_too_large'), 'application/json', true));
  if (declared !== '' && Number(declared) > limit) {
    tooLarge(declared);
    return;
  }
  // a declared length: one buffer of that size, each chunk copied in as it comes (no 64 MiB concatenation
  // on the loop at the end); otherwise the chunks, concatenated at the end
  const into = declared !== '' ? Buffer.allocUnsafeSlow(Number(declared)) : null;
  const chunks: Buffer[] = [];
  let size = 0;
  let over = false;
  res.onData((ab, last) => {
    if (over || gone) return;
    const n = ab.byteLength;
    if (size + n > limit || (into !== null && size + n > into.length)) {
      over = true;
      tooLarge(`more than ${into !== null && into.length < limit ? into.length : limit}`);
      return;
    }
    if (into !== null) into.set(new Uint8Array(ab), size); // uWS reuses the memory after this call
    else chunks.push(Buffer.from(ab.slice(0)));
    size += n;
    if (last) run(into !== null ? into.subarray(0, size) : Buffer.concat(chunks, size));
  });
}

// the body was concatenated for this call alone: its memory can move to the JSONL check's worker
const upload: Op = (api, _p, _q, ct, body, tenant) => api.uploadFile(ct, body!, tenant, true);
const listFiles: Op = (api, _p, query, _ct, _b, tenant) => api.listFiles(query, tenant);
const retrieveFile: Op = (api, id, _q, _ct, _b, tenant) => api.retrieveFile(id, tenant);
const fileContent: Op = (api, id, _q, _ct, _b, tenant) => api.fileContent(id, tenant);
const deleteFile: Op = (api, id, _q, _ct, _b, tenant) => api.deleteFile(id, tenant);
const create: Op = (api, _p, _q, _ct, body, tenant) => api.createBatch(body!, tenant);
const retrieve: Op = (api, id, _q, _ct, _b, tenant) => api.retrieveBatch(id, tenant);
const list: Op = (api, _p, query, _ct, _b, tenant) => api.listBatches(query, tenant);
const cancel: Op = (api, id, _q, _ct, _b, tenant) => api.cancelBatch(id, tenant);

interface Route {
  method: string;
  uws: 'post' | 'get' | 'del';
  path: string;
  pattern: RegExp;
  withBody: boolean;
  op: Op;
}
const route = (method: string, path: string, withBody: boolean, op: Op): Route => ({
  method,
  uws: method === 'POST' ? 'post' : method === 'GET' ? 'get' : 'del',
  path,
  pattern: new RegExp(`^${path.replace(':id', '([^/]+)')}$`),
  withBody,
  op,
});
const ROUTES: readonly Route[] = [
  route('POST', '/v1/files', true, upload),
  route('GET', '/v1/files', false, listFiles),
  route('GET', '/v1/files/:id', false, retrieveFile),
  route('GET', '/v1/files/:id/content', false, fileContent),
  route('DELETE', '/v1/files/:id', false, deleteFile),
  route('POST', '/v1/batches', true, create),
  route('GET', '/v1/batches', false, list),
  route('GET', '/v1/batches/:id', false, retrieve),
  route('POST', '/v1/batches/:id/cancel', false, cancel),
];

/** Mounts the routes (always: without `batch:` they answer that it is not configured). */
export function mountBatchRoutes(app: TemplatedApp, host: BatchHost): void {
  for (const r of ROUTES) app[r.uws](r.path, (res, req) => handle(host, res, req, r.withBody, r.op));
}
