// The Responses API on the uWS transport: POST /v1/responses reads its body
// like any inference request (HttpExchange) and hands it to the Responses
// service instead of the director; GET / DELETE /v1/responses/{id} and
// GET /v1/responses/{id}/input_items answer from the store.
import type { ResponsesService } from '../responses/service.js';
import { ResponsesError } from '../responses/request.js';
import { StoreUnavailableError } from '../responses/store.js';
import type { HttpRequest, HttpResponse, TemplatedApp } from '../uws.js';
import { isRefusal, type Caller, type Refusal } from '../identity.js';
import { answerUnauthorized, errorBody, statusLine } from './http-errors.js';
import { HttpExchange, type ExchangeFlight, type ExchangeHost } from './http-exchange.js';

/** The exchange kind of POST /v1/responses: a transport kind, never a director kind. */
export { KIND_RESPONSES } from '../director/kinds.js';

export interface ResponsesHost extends ExchangeHost {
  /** Who a request is (its tenant, '' = the anonymous scope, is the one place the Responses API learns who owns what), or a Refusal. */
  callerOf(get: (name: string) => string): Caller | Refusal;
  readonly responses: ResponsesService | null;
  readonly draining: boolean;
  readonly metrics: ExchangeHost['metrics'];
}

export class ResponsesExchange extends HttpExchange {
  override begin(raw: Buffer): ExchangeFlight {
    // every stored turn belongs to the caller's tenant
    return (this.core as ResponsesHost).responses!.begin(this, this.caller, this.requestId, this.headers, raw);
  }
}

export type Op = (svc: ResponsesService, tenant: string, id: string, query: string) => Promise<{ status: number; body: string }>;

/** Runs a read of the store and writes its answer (either front end: `write` writes the status and JSON body). */
export function runResponsesOp(host: ResponsesHost, op: Op, id: string, query: string, tenant: string, write: (status: number, body: string) => void): void {
  const svc = host.responses!;
  const out = (status: number, body: string) => {
    host.metrics.countRequest('', -1, status);
    write(status, body);
  };
  op(svc, tenant, id, query).then(
    (a) => out(a.status, a.body),
    (err: unknown) => {
      if (err instanceof ResponsesError) out(err.status, errorBody(err.status, err.message, err.param, err.code));
      else if (err instanceof StoreUnavailableError) out(503, errorBody(503, err.message, null, 'store_unavailable'));
      else {
        svc.log.error({ err }, 'internal error reading the Responses store');
        out(500, errorBody(500, `internal error: ${(err as Error)?.message ?? String(err)}`));
      }
    },
  );
}

function answer(host: ResponsesHost, res: HttpResponse, req: HttpRequest, op: Op): void {
  const id = req.getParameter(0) ?? '';
  const query = req.getQuery() ?? '';
  const caller = host.callerOf((n) => req.getHeader(n));
  if (isRefusal(caller)) return answerUnauthorized(host, res, caller.refused);
  const tenant = caller.tenant;
  let gone = false;
  res.onAborted(() => {
    gone = true;
  });
  runResponsesOp(host, op, id, query, tenant, (status, body) => {
    if (gone) return;
    res.cork(() => {
      res.writeStatus(statusLine(status)).writeHeader('content-type', 'application/json').end(body, host.draining);
    });
  });
}

export const retrieve: Op = (svc, tenant, id) => svc.retrieve(tenant, id);
export const remove: Op = (svc, tenant, id) => svc.remove(tenant, id);
export const inputItems: Op = (svc, tenant, id, query) => svc.inputItems(tenant, id, query);

/** GET / DELETE routes (POST is the router's inference route with KIND_RESPONSES). */
export function mountResponseReads(app: TemplatedApp, host: ResponsesHost): void {
  app.get('/v1/responses/:id', (res, req) => answer(host, res, req, retrieve));
  app.del('/v1/responses/:id', (res, req) => answer(host, res, req, remove));
  app.get('/v1/responses/:id/input_items', (res, req) => answer(host, res, req, inputItems));
}
