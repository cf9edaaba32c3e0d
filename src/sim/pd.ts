// The simulator's prefill/decode rules, kept apart from the engine's request
// handling: what a role accepts, the transfers a prefill engine holds for its
// decode side, and the decode side's pull of them.
//
// vLLM (NIXL connector): a KV producer (--role prefill) cannot load remote KV
// (do_remote_prefill), a KV consumer (--role decode) cannot offer its KV to a
// remote decode (do_remote_decode); `both` takes either. A prefill with
// do_remote_decode keeps its blocks for the decode side until it reads them or
// the transfer expires (vLLM frees them after VLLM_NIXL_ABORT_REQUEST_TIMEOUT,
// 480 s by default); a decode leg whose kv_transfer_params name a transfer its
// prefill engine does not hold (unknown, expired, already read, or the engine
// gone) fails as vLLM's does when the KV cannot be loaded.
// SGLang (bootstrap): a prefill server needs bootstrap_room.
import http from 'node:http';

export class PdRuleError extends Error {
  readonly status: number;
  readonly param: string | null;
  constructor(status: number, message: string, param: string | null) {
    super(message);
    this.status = status;
    this.param = param;
  }
}

/** Checks a request's disaggregation fields against the engine's role; throws PdRuleError. */
export function checkRole(engine: 'vllm' | 'sglang', role: 'both' | 'prefill' | 'decode', body: Record<string, unknown>): void {
  const kv = body.kv_transfer_params as Record<string, unknown> | null | undefined;
  if (engine === 'vllm' && kv !== undefined && kv !== null && typeof kv === 'object') {
    if (role === 'prefill' && kv.do_remote_prefill === true)
      throw new PdRuleError(400, 'kv_transfer_params.do_remote_prefill: this engine is a KV producer (kv_role=kv_producer) and cannot load remote KV', 'kv_transfer_params');
    if (role === 'decode' && kv.do_remote_decode === true)
      throw new PdRuleError(400, 'kv_transfer_params.do_remote_decode: this engine is a KV consumer (kv_role=kv_consumer) and cannot serve KV to a remote decode', 'kv_transfer_params');
  }
  if (engine === 'sglang' && role === 'prefill' && (body.bootstrap_room === undefined || body.bootstrap_room === null))
    throw new PdRuleError(400, 'bootstrap_room is required by a server in prefill disaggregation mode', 'bootstrap_room');
}

/** The transfers a prefill engine holds for decode engines, by request id, until read or expired. */
export class TransferTable {
  readonly #ttlMs: number;
  readonly #held = new Map<string, number>();
  #sweeps = 0;

  constructor(ttlMs: number) {
    this.#ttlMs = ttlMs;
  }

  get size(): number {
    return this.#held.size;
  }

  add(id: string, now = Date.now()): void {
    this.#held.set(id, now + this.#ttlMs);
    if (++this.#sweeps >= 1024) {
      this.#sweeps = 0;
      for (const [k, exp] of this.#held) if (exp <= now) this.#held.delete(k);
    }
  }

  /** Reads (and frees) a transfer: false when unknown, expired or already read. */
  take(id: string, now = Date.now()): boolean {
    const exp = this.#held.get(id);
    if (exp === undefined) return false;
    this.#held.delete(id);
    return exp > now;
  }
}

/** The internal route a decode engine pulls a transfer from (the simulator's stand-in for the NIXL read). */
export const PULL_PATH = '/internal/kv_transfer/pull';

export interface PullTarget {
  host: string;
  port: number;
  requestId: string;
  engineId: string;
}

/** The decode side's kv_transfer_params as a pull target, or a PdRuleError for unusable ones. */
export function pullTarget(kv: Record<string, unknown>): PullTarget {
  const { remote_host: host, remote_port: port, remote_request_id: rid, remote_engine_id: eid } = kv;
  if (typeof host !== 'string' || typeof port !== 'number' || typeof rid !== 'string' || typeof eid !== 'string')
    throw new PdRuleError(400, 'kv_transfer_params: do_remote_prefill needs remote_host, remote_port, remote_request_id and remote_engine_id', 'kv_transfer_params');
  return { host, port, requestId: rid, engineId: eid };
}

const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });

/** Pulls a transfer from its prefill engine: resolves null when read, else the reason it failed. */
export function pull(t: PullTarget, timeoutMs = 5000): Promise<string | null> {
  return new Promise((resolve) => {
    const body = JSON.stringify({ remote_request_id: t.requestId, remote_engine_id: t.engineId });
    const req = http.request(
      { host: t.host, port: t.port, path: PULL_PATH, method: 'POST', agent, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) }, timeout: timeoutMs },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (text += c));
        res.on('end', () => resolve(res.statusCode === 200 ? null : text || `HTTP ${res.statusCode}`));
        res.on('error', (e) => resolve(e.message));
      },
    );
    req.on('timeout', () => req.destroy(new Error('timed out')));
    req.on('error', (e) => resolve(`cannot reach the prefill engine at ${t.host}:${t.port}: ${e.message}`));
    req.end(body);
  });
}
