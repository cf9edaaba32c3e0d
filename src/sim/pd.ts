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
// SGLang (bootstrap): a prefill or decode server (disaggregation mode) needs bootstrap_room.
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { SwitchyardError } from '../errors.js';

export class PdRuleError extends SwitchyardError {
  readonly status: number;
  readonly param: string | null;
  constructor(status: number, message: string, param: string | null) {
    super(message, { code: 'SWY_ERR_SIM_PD_RULE' });
    this.status = status;
    this.param = param;
  }
}

/** Checks a request's disaggregation fields against the engine's role; throws PdRuleError. */
export function checkRole(engine: 'vllm' | 'sglang', role: 'both' | 'prefill' | 'decode', body: Record<string, unknown>, rid = ''): void {
  const kv = body.kv_transfer_params as Record<string, unknown> | null | undefined;
  if (engine === 'vllm' && kv !== undefined && kv !== null && typeof kv === 'object') {
    if (role === 'prefill' && kv.do_remote_prefill === true)
      throw new PdRuleError(400, 'kv_transfer_params.do_remote_prefill: this engine is a KV producer (kv_role=kv_producer) and cannot load remote KV', 'kv_transfer_params');
    if (role === 'decode' && kv.do_remote_decode === true)
      throw new PdRuleError(400, 'kv_transfer_params.do_remote_decode: this engine is a KV consumer (kv_role=kv_consumer) and cannot serve KV to a remote decode', 'kv_transfer_params');
  }
  // SGLang's scheduler aborts every generate request without a bootstrap room in prefill and in decode
  // disaggregation mode with HTTP 400 (scheduler.py handle_generate_request: "Invalid request:
  // Disaggregated request received without bootstrap room id. req.rid=..."; only its test-only fake
  // transfer backend lets one through): a disaggregation-mode server never serves a request alone.
  if (engine === 'sglang' && role !== 'both' && (body.bootstrap_room === undefined || body.bootstrap_room === null))
    throw new PdRuleError(400, `Invalid request: Disaggregated request received without bootstrap room id. req.rid='${rid !== '' ? rid : randomUUID().replace(/-/g, '')}'`, 'bootstrap_room');
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

// ---- SGLang bootstrap (both legs at once) -------------------------------------------------
//
// The router sends the same body to a prefill and a decode engine with
// bootstrap_host, bootstrap_port (the prefill engine's bootstrap server) and
// bootstrap_room. The decode engine asks that prefill engine for the room and
// waits until its prefill is done (the KV arrives), then decodes without
// prefilling. A room the prefill engine never sees within the wait, one whose
// prefill failed or was aborted, one already read or expired, or a prefill
// engine that cannot be reached: the decode fails with HTTP 500 and SGLang's
// message ("Decode transfer failed for request ... KVTransferError(...)").
// The simulator serves its bootstrap route on its HTTP port: configure the
// endpoint's bootstrapPort as that port.

/** The route a decode engine asks its prefill engine for a bootstrap room on (the simulator's bootstrap server). */
export const BOOTSTRAP_PATH = '/internal/bootstrap/room';

type RoomState = 'pending' | 'ready' | 'failed';

interface Room {
  state: RoomState;
  /** Date.now() after which a ready room is gone (the KV freed). */
  expires: number;
  waiters: ((problem: string | null) => void)[];
}

/** The bootstrap rooms a prefill engine has seen, until their decode side read them or they expired. */
export class RoomTable {
  readonly #ttlMs: number;
  readonly #rooms = new Map<string, Room>();
  /** Decode sides waiting for a room not seen yet (its prefill leg may still be on its way). */
  readonly #early = new Map<string, ((problem: string | null) => void)[]>();
  #sweeps = 0;

  constructor(ttlMs: number) {
    this.#ttlMs = ttlMs;
  }

  get size(): number {
    return this.#rooms.size;
  }

  /** A prefill request with this room arrived. */
  open(room: string, now = Date.now()): void {
    const r: Room = { state: 'pending', expires: Infinity, waiters: this.#early.get(room) ?? [] };
    this.#early.delete(room);
    this.#rooms.set(room, r);
    if (++this.#sweeps >= 1024) {
      this.#sweeps = 0;
      for (const [k, x] of this.#rooms) if (x.state !== 'pending' && x.expires <= now) this.#rooms.delete(k);
    }
  }

  /** Its prefill is done: the KV is there for the decode side (one waiter takes it). */
  ready(room: string, now = Date.now()): void {
    const r = this.#rooms.get(room);
    if (r === undefined || r.state !== 'pending') return;
    r.state = 'ready';
    r.expires = now + this.#ttlMs;
    const w = r.waiters.shift();
    if (w !== undefined) {
      this.#rooms.delete(room);
      w(null);
    }
    for (const x of r.waiters.splice(0)) x('the room was already taken by another decode request');
  }

  /** Its prefill failed or was aborted: the decode side fails. */
  fail(room: string, why: string): void {
    const r = this.#rooms.get(room);
    if (r === undefined || r.state !== 'pending') return;
    r.state = 'failed';
    r.expires = 0;
    for (const x of r.waiters.splice(0)) x(why);
  }

  /** The engine is going away: every waiting decode side fails. */
  clear(why: string): void {
    for (const r of this.#rooms.values()) for (const x of r.waiters.splice(0)) x(why);
    for (const list of this.#early.values()) for (const x of list.splice(0)) x(why);
    this.#rooms.clear();
    this.#early.clear();
  }

  /** The decode side asks for a room: resolves null once its KV is there, else why not. */
  wait(room: string, timeoutMs: number, now = Date.now()): Promise<string | null> {
    const r = this.#rooms.get(room);
    if (r !== undefined) {
      if (r.state === 'ready') {
        this.#rooms.delete(room);
        return Promise.resolve(r.expires > now ? null : 'the room expired (its KV was freed)');
      }
      if (r.state === 'failed') return Promise.resolve('the prefill of this room failed');
    }
    return new Promise((resolve) => {
      let done = false;
      const finish = (problem: string | null): void => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        resolve(problem);
      };
      const timer = setTimeout(() => {
        // the room may have opened since (its early waiters moved into it)
        const opened = this.#rooms.get(room);
        const list = opened !== undefined ? opened.waiters : this.#early.get(room);
        if (list !== undefined) {
          const i = list.indexOf(finish);
          if (i >= 0) list.splice(i, 1);
          if (opened === undefined && list.length === 0) this.#early.delete(room);
        }
        finish(opened !== undefined ? 'timed out waiting for the prefill of this room' : 'no prefill request with this bootstrap room arrived');
      }, timeoutMs);
      timer.unref();
      if (r !== undefined) r.waiters.push(finish);
      else {
        let list = this.#early.get(room);
        if (list === undefined) this.#early.set(room, (list = []));
        list.push(finish);
      }
    });
  }
}

export interface BootstrapTarget {
  host: string;
  port: number;
  /** The room as the request wrote it (a decimal integer). */
  room: string;
}

/** The room of a request's bootstrap_room as a map key, or a PdRuleError when it is not a non-negative integer. */
export function roomKey(v: unknown): string {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) throw new PdRuleError(400, 'bootstrap_room must be a non-negative integer', 'bootstrap_room');
  return String(v);
}

/** A decode request's bootstrap target, or null when it names none (no room, host or port). */
export function bootstrapTarget(body: Record<string, unknown>): BootstrapTarget | null {
  const { bootstrap_room: room, bootstrap_host: host, bootstrap_port: port } = body;
  if (room === undefined || room === null) return null;
  const key = roomKey(room);
  if (typeof host !== 'string' || host === '' || typeof port !== 'number' || !Number.isInteger(port) || port < 1 || port > 65535)
    throw new PdRuleError(400, 'bootstrap_room needs bootstrap_host (a string) and bootstrap_port (1-65535): the prefill server to pair with', 'bootstrap_host');
  return { host, port, room: key };
}

/** Asks the prefill engine's bootstrap server for a room and waits for its KV: null when it arrived, else why not. */
export function bootstrap(t: BootstrapTarget, timeoutMs: number): Promise<string | null> {
  return new Promise((resolve) => {
    const body = `{"bootstrap_room":${t.room},"timeout_ms":${Math.round(timeoutMs)}}`;
    const req = http.request(
      { host: t.host, port: t.port, path: BOOTSTRAP_PATH, method: 'POST', agent, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) }, timeout: timeoutMs + 5000 },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (text += c));
        res.on('end', () => {
          if (res.statusCode === 200) return resolve(null);
          let msg = text;
          try {
            msg = (JSON.parse(text) as { error: { message: string } }).error.message;
          } catch {
            // not the error shape
          }
          resolve(msg || `HTTP ${res.statusCode}`);
        });
        res.on('error', (e) => resolve(e.message));
      },
    );
    req.on('timeout', () => req.destroy(new Error('timed out')));
    req.on('error', (e) => resolve(`Failed to get prefill server info from ${t.host}:${t.port}: ${e.message}`));
    req.end(body);
  });
}

/** SGLang's decode-side error for a failed KV transfer (its decode scheduler's wording). */
export function decodeTransferError(rid: string, room: string, problem: string): string {
  return `Decode transfer failed for request rid=${JSON.stringify(rid)} bootstrap_room=${room} with exception KVTransferError(bootstrap_room=${room}): Failed to get kvcache from prefill instance, it might be dead (${problem})`;
}
