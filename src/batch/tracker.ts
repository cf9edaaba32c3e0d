// The tracker: every router with a `batch:` block runs it over the active
// batches (validates, enqueues the rest, counts results, finalizes), so a
// batch outlives the router that accepted it. One pass (`step`) per batch at
// a time in this router; every status change is a compare-and-set on the
// batch's status (SET_IF_STATUS) along TRANSITIONS, so two routers tracking
// the same batch never both move it.
import { randomBytes } from 'node:crypto';
import { cancelKey } from './processor.js';
import { batchBodiesOffLoop, resultLinesOffLoop, validateBatchOffLoop } from './jsonl-check.js';
import { bodyAt, forEachLine, type BatchLineError, type ResultLinesJob } from './jsonl.js';
import { BatchApiError, failedReply, json, LeaseLost, now, type BatchHash, type BatchStore, type Fence } from './store.js';

export type Status = 'validating' | 'failed' | 'in_progress' | 'finalizing' | 'completed' | 'expired' | 'cancelling' | 'cancelled';

/**
 * Which status may follow which (docs/batch.md). `finalizing` writes the
 * files, then ends in the status the batch was heading for (its `final`
 * field: completed, expired or cancelled).
 */
export const TRANSITIONS: Readonly<Record<Status, readonly Status[]>> = {
  validating: ['in_progress', 'failed', 'cancelling'],
  // → failed from here on: a step that fails MAX_FAILURES times (the batch cannot go on: its input lost, a file not writable)
  in_progress: ['finalizing', 'cancelling', 'failed'],
  cancelling: ['finalizing', 'failed'],
  finalizing: ['completed', 'expired', 'cancelled', 'failed'],
  completed: [],
  failed: [],
  expired: [],
  cancelled: [],
};

export const TERMINAL: ReadonlySet<string> = new Set(Object.entries(TRANSITIONS).filter(([, to]) => to.length === 0).map(([s]) => s));

/**
 * Moves a batch from one status to the next (with the given fields) only if
 * it is still in `from`; the pair must be in TRANSITIONS. Resolves 1 when moved.
 */
export function move(s: BatchStore, id: string, from: Status, to: Status, ...fields: string[]): Promise<number> {
  if (!TRANSITIONS[from].includes(to)) throw new Error(`batch ${id}: no transition ${from} -> ${to}`);
  return s.redis.setIfStatus(s.batchKey(id), 'status', to, ...fields, from);
}

const ENQUEUE_CHUNK = 500;
const READ_CHUNK = 1000;
/** Lines of the output and error files built per hand-off to the JSONL worker, at most. */
const LINES_CHUNK = 1000;
/**
 * Answer bytes a finalisation step handles at most (one fetch, one hand-off
 * to the JSONL worker, one run of lines): a batch of large answers goes in
 * more, smaller steps, never one reply or string near the size of the batch.
 */
const FINAL_BYTES = 8 * 1024 * 1024;
/**
 * A finalisation's lease on its batch, renewed at every step: a router that
 * dies while writing the files hands the batch to another after this (which
 * writes them again from the start), and two routers never write them at once.
 */
const FINAL_LEASE_MS = 60_000;
/** Bound on a result's line number (a batch holds far fewer lines; an entry claiming more is not ours). */
const MAX_LINE = 10_000_000;
/** A batch whose step fails this many times (not for Redis being away) ends `failed`, saying why. */
export const MAX_FAILURES = 3;
/** Errors of Redis being away or slow: retried on the next tick for as long as it takes, never counted. */
const TRANSIENT = /Connection is closed|timed out|max retries|ECONNREFUSED|ECONNRESET|Stream isn't writeable|LOADING|BUSY/i;

export class Tracker {
  readonly #s: BatchStore;
  readonly #pollMs: number;
  /** Batches this router is working on now (one step at a time each). */
  readonly #working = new Set<string>();
  /** This tracker's token in finalisation leases. */
  readonly #token = randomBytes(9).toString('base64url');
  #timer: NodeJS.Timeout | null = null;
  #closed = false;

  constructor(s: BatchStore, pollMs: number) {
    this.#s = s;
    this.#pollMs = pollMs;
  }

  start(): void {
    this.#timer = setInterval(() => void this.#tick(), this.#pollMs);
    this.#timer.unref();
    void this.#tick(); // batches a previous router left active
  }

  async close(): Promise<void> {
    this.#closed = true;
    if (this.#timer !== null) clearInterval(this.#timer);
    const until = Date.now() + 2000;
    while (this.#working.size > 0 && Date.now() < until) await new Promise((r) => setTimeout(r, 10));
  }

  /** A pass over one batch now (creation, cancel). */
  kick(id: string): void {
    void this.#step(id);
  }

  async #tick(): Promise<void> {
    if (this.#closed) return;
    let ids: string[];
    try {
      ids = await this.#s.redis.smembers(this.#s.active);
    } catch {
      return; // Redis away: the next tick
    }
    for (const id of ids) if (!this.#working.has(id)) void this.#step(id);
    // files past their expires_at go (one tick's worth at a time)
    await this.#s.expireFiles().catch((err: Error) => this.#s.log.debug({ err: err.message }, 'batch api: expiring files failed; the next tick'));
  }

  /** One pass over a batch: whatever its status asks for next. */
  async #step(id: string): Promise<void> {
    if (this.#working.has(id) || this.#closed) return;
    this.#working.add(id);
    try {
      let h = await this.#s.redis.hgetall(this.#s.batchKey(id));
      if (h.status === 'validating') {
        await this.#validate(id, h);
        h = await this.#s.redis.hgetall(this.#s.batchKey(id));
      }
      if (h.status === 'in_progress' && h.expiring !== '1' && now() >= Number(h.created_at) + this.#s.cfg.expireAfterSeconds) {
        // past its window: what is not dispatched yet is skipped (as a cancel does), what runs finishes, then it ends expired
        await this.#s.redis.set(cancelKey(this.#s.prefix, id), '1', 'EX', this.#s.cfg.doneTtlSeconds);
        await this.#s.redis.setIfStatus(this.#s.batchKey(id), 'expiring', '1', 'in_progress');
        h = await this.#s.redis.hgetall(this.#s.batchKey(id));
      }
      if (h.status === 'in_progress') {
        const expiring = h.expiring === '1';
        if (!expiring && Number(h.enqueued) < Number(h.total)) await this.#enqueue(id, h);
        h = await this.#count(id);
        if (h.status === 'in_progress' && answered(h) >= Number(expiring ? h.enqueued : h.total)) {
          if ((await move(this.#s, id, 'in_progress', 'finalizing', 'finalizing_at', String(now()), 'final', expiring ? 'expired' : 'completed')) === 1) h.status = 'finalizing';
        }
      }
      if (h.status === 'cancelling') {
        h = await this.#count(id);
        if (answered(h) >= Number(h.enqueued)) {
          if ((await move(this.#s, id, 'cancelling', 'finalizing', 'finalizing_at', String(now()), 'final', 'cancelled')) === 1) h.status = 'finalizing';
        }
      }
      if (h.status === 'finalizing') await this.#finalize(id);
      else if (h.status === undefined || h.status === 'completed' || h.status === 'failed' || h.status === 'cancelled' || h.status === 'expired') await this.#s.redis.srem(this.#s.active, id);
    } catch (err) {
      if (!this.#closed) await this.#failed(id, err as Error).catch(() => undefined);
    } finally {
      this.#working.delete(id);
    }
  }

  /**
   * A step threw: retried on the next tick, unless it is the MAX_FAILURES-th
   * failure that is not Redis being away; then the batch ends `failed` with
   * the reason in `errors` and in an error file, and leaves the active set
   * (no retry loop that re-reads its results forever).
   */
  async #failed(id: string, err: Error): Promise<void> {
    const msg = err.message ?? String(err);
    if (TRANSIENT.test(msg)) {
      this.#s.log.warn({ err: msg, batch: id }, 'batch api: step failed (Redis); retried on the next tick');
      return;
    }
    const n = await this.#s.redis.hincrby(this.#s.batchKey(id), 'failures', 1);
    this.#s.log.warn({ err: msg, batch: id, failures: n }, 'batch api: step failed');
    if (n < MAX_FAILURES) return;
    const h = await this.#s.redis.hgetall(this.#s.batchKey(id));
    const st = h.status as Status;
    if (!TRANSITIONS[st]?.includes('failed')) return;
    const why = `the batch could not go on (${st}): ${msg.slice(0, 500)} (${n} attempts)`;
    const tag = id.slice('batch_'.length);
    // a finalizing batch's files have one writer at a time: this one writes the failure's error file only
    // while it holds the lease (another router finalising it now goes on; a later failure decides)
    const lease = this.#s.finalizer(id);
    let fence: Fence | undefined;
    if (st === 'finalizing') {
      if ((await this.#s.redis.holdLease(lease, this.#s.batchKey(id), this.#token, FINAL_LEASE_MS)) !== 1) return;
      fence = { lease, token: this.#token };
    }
    let errId = '';
    try {
      const f = this.#s.chunkedFile(`file-${tag}-errors`, `${id}_error.jsonl`, h.tenant ?? '', Number(h.output_expires_after || 0), fence);
      await f.add(json({ id: `batch_req_${tag}_failed`, custom_id: null, response: null, error: { code: 'batch_failed', message: why } }));
      errId = await f.close();
    } catch {
      // the error file cannot be written either: the reason stays in `errors`
    }
    const errors = json([{ code: 'batch_failed', message: why, param: null, line: null }]);
    if ((await move(this.#s, id, st, 'failed', 'failed_at', String(now()), 'errors', errors, 'error_file_id', errId)) === 1) {
      await this.#s.redis.multi().srem(this.#s.active, id).del(this.#s.outStream(id)).del(this.#s.batchIds(id)).exec();
      // a finalisation cut short leaves file bytes that no record points to (nothing would ever delete them)
      for (const f of [`file-${tag}-output`, `file-${tag}-errors`]) await this.#s.redis.dropOrphanData(this.#s.fileKey(f), this.#s.fileData(f));
    }
    // the batch has ended (or another router moved it): the lease, if this router took it, goes
    if (fence !== undefined) await this.#s.redis.dropLease(lease, this.#token);
  }

  async #count(id: string): Promise<BatchHash> {
    while ((await this.#s.redis.advance(this.#s.batchKey(id), this.#s.outStream(id), READ_CHUNK)) === READ_CHUNK);
    return this.#s.redis.hgetall(this.#s.batchKey(id));
  }

  async #lines(h: BatchHash): Promise<Buffer> {
    const data = await this.#s.readChunked(this.#s.fileData(h.input_file_id));
    if (data === null) throw new BatchApiError(400, `input file ${h.input_file_id} was deleted`, 'input_file_id', 'file_not_found');
    return data;
  }

  async #validate(id: string, h: BatchHash): Promise<void> {
    let data: Buffer;
    try {
      data = await this.#lines(h);
    } catch (err) {
      if (!(err instanceof BatchApiError)) throw err;
      await this.#fail(id, [{ code: err.code, message: err.message, param: err.param, line: null }]);
      return;
    }
    // every line parsed in the JSONL worker (a large file would hold the loop for seconds); the reply's buffer
    // is this call's own when it came in one piece
    const owned = data.byteOffset === 0 && data.byteLength === data.buffer.byteLength;
    const v = await validateBatchOffLoop(data, h.endpoint, owned);
    if (v.errors.length > 0) {
      await this.#fail(id, v.errors);
      return;
    }
    // the custom_ids, kept for the output and error files: the input is not needed after the run. Written
    // beside its place and renamed into it (atomic), so two routers validating at once never interleave pieces;
    // the copy expires in an hour should this router die before the rename
    const ids = this.#s.batchIds(id);
    const tmp = `${ids}:${this.#token}`;
    await this.#s.putChunked(tmp, v.ids, 3_600_000);
    failedReply(await this.#s.redis.multi().rename(tmp, ids).persist(ids).exec());
    await move(this.#s, id, 'validating', 'in_progress', 'in_progress_at', String(now()), 'total', String(v.total));
  }

  async #fail(id: string, errors: BatchLineError[]): Promise<void> {
    await move(this.#s, id, 'validating', 'failed', 'failed_at', String(now()), 'errors', json(errors));
    await this.#s.redis.multi().srem(this.#s.active, id).del(this.#s.batchIds(id)).exec();
  }

  /** Enqueues the lines not enqueued yet, a chunk per script call (the chunk and the count together); stops when the batch is cancelled. */
  async #enqueue(id: string, h: BatchHash): Promise<void> {
    const data = await this.#lines(h);
    const c = this.#s.cfg;
    const result = `stream:${this.#s.outStream(id)}`;
    let from = Number(h.enqueued);
    // every line parsed in the JSONL worker, not here
    const bodies = await batchBodiesOffLoop(data, data.byteOffset === 0 && data.byteLength === data.buffer.byteLength);
    const n = bodies.ends.length;
    while (from < n && !this.#closed) {
      const to = Math.min(from + ENQUEUE_CHUNK, n);
      const args: string[] = [String(from), String(to), result, h.endpoint, id, h.tenant ?? ''];
      for (let i = from; i < to; i++) args.push(`${id}.${i}`, bodyAt(bodies, i));
      // the chunk goes in only while the batch is in progress and nobody enqueued it before (another router, a cancel)
      if ((await this.#s.redis.enqueueChunk(this.#s.batchKey(id), c.stream, ...args)) === 0) return;
      from = to;
    }
  }

  /** The custom_ids in line order as JSON text: the snapshot taken at validation (a batch from before it: the input file). */
  async #customIds(id: string, h: BatchHash, needed: boolean): Promise<string[]> {
    const snap = await this.#s.readChunked(this.#s.batchIds(id));
    const ids: string[] = [];
    if (snap !== null) {
      let at = 0;
      while (at < snap.length) {
        let end = snap.indexOf(10, at);
        if (end < 0) end = snap.length;
        if (end > at) ids.push(snap.toString('utf8', at, end));
        at = end + 1;
      }
      return ids;
    }
    // no snapshot: cancelled while validating (nothing ran: no line needs one), or a batch validated before snapshots
    const data = await this.#s.readChunked(this.#s.fileData(h.input_file_id));
    if (data === null) {
      if (!needed) return ids;
      throw new BatchApiError(400, `input file ${h.input_file_id} was deleted`, 'input_file_id', 'file_not_found');
    }
    forEachLine(data, (line) => {
      ids.push(JSON.stringify((JSON.parse(line) as { custom_id: string }).custom_id));
    });
    return ids;
  }

  /**
   * Writes the output and error files from the result stream (ordered by line) and ends the batch. Repeatable: the file ids come from the batch id.
   * Two passes, so memory holds one step of answers, not the batch: the first (INDEX_RESULTS, inside Redis) learns
   * per line where its (last) answer sits in the stream and how large it is; the second fetches the answers back
   * in line order, at most LINES_CHUNK lines and FINAL_BYTES of answers per pipelined round trip, and writes them
   * out. Under the batch's finalisation lease, renewed at every step; the files' pieces are fenced by it.
   */
  async #finalize(id: string): Promise<void> {
    // one writer of the files: another router finalising this batch now keeps it (and an ended batch is never
    // finalised again: the lease is only taken while the batch is `finalizing`)
    const lease = this.#s.finalizer(id);
    const fence = { lease, token: this.#token };
    const hold = async () => !this.#closed && (await this.#s.redis.holdLease(lease, this.#s.batchKey(id), this.#token, FINAL_LEASE_MS)) === 1;
    if (!(await hold())) return;
    try {
      await this.#finalizeHeld(id, hold, fence);
    } catch (err) {
      if (!(err instanceof LeaseLost)) throw err;
      // another router holds the batch now (this one stalled past the lease): it writes the files
    } finally {
      await this.#s.redis.dropLease(lease, this.#token).catch(() => undefined);
    }
  }

  async #finalizeHeld(id: string, hold: () => Promise<boolean>, fence: Fence): Promise<void> {
    const h = await this.#s.redis.hgetall(this.#s.batchKey(id));
    if (h.status !== 'finalizing') return;
    const stream = this.#s.outStream(id);
    // per line: where its (last) answer sits in the stream and its body's size, learnt without the bodies
    const at: (string | undefined)[] = [];
    const size: number[] = [];
    let answers = 0;
    let cur = '-';
    for (;;) {
      if (cur !== '-' && !(await hold())) return;
      // at most READ_CHUNK entries and about FINAL_BYTES of their bodies inside Redis per call
      const flat = await this.#s.redis.indexResults(stream, cur, READ_CHUNK, FINAL_BYTES);
      for (let k = 1; k + 2 < flat.length; k += 3) {
        const len = Number(flat[k + 2]);
        const line = lineOfId(String(flat[k + 1]), id);
        cur = String(flat[k]);
        if (line < 0) continue;
        if (at[line] === undefined) answers++;
        at[line] = cur;
        size[line] = len;
      }
      if (Number(flat[0]) === 1 || flat.length === 1) break;
    }
    const expired = h.final === 'expired';
    const customIds = await this.#customIds(id, h, answers > 0 || expired);
    const tag = id.slice('batch_'.length);
    const tenant = h.tenant ?? '';
    const keep = Number(h.output_expires_after || 0);
    const out = this.#s.chunkedFile(`file-${tag}-output`, `${id}_output.jsonl`, tenant, keep, fence);
    const errs = this.#s.chunkedFile(`file-${tag}-errors`, `${id}_error.jsonl`, tenant, keep, fence);
    // the lines are built LINES_CHUNK at a time in the JSONL worker (each answer's body parsed and written out again)
    const j: ResultLinesJob = { tag, batchId: id, expired, lines: [], statuses: [], bodies: [], ids: [] };
    let bytes = 0;
    const flush = async () => {
      if (j.lines.length === 0) return;
      const r = await resultLinesOffLoop(j, bytes);
      j.lines = [];
      j.statuses = [];
      j.bodies = [];
      j.ids = [];
      bytes = 0;
      if (r.out !== '') await out.add(r.out);
      if (r.err !== '') await errs.add(r.err);
    };
    for (let from = 0, to = 0; from < customIds.length; from = to) {
      // the next lines, up to LINES_CHUNK of them and FINAL_BYTES of answers (at least one line)
      let step = 0;
      to = from;
      while (to < customIds.length && to - from < LINES_CHUNK) {
        const n = (at[to] !== undefined ? size[to]! : 0) + customIds[to]!.length;
        if (to > from && step + n > FINAL_BYTES) break;
        step += n;
        to++;
      }
      if (!(await hold())) return; // lost (this router stalled past the lease): the new holder writes the files
      const p = this.#s.redis.pipeline();
      const asked: number[] = [];
      for (let i = from; i < to; i++) {
        const eid = at[i];
        if (eid !== undefined) {
          p.xrange(stream, eid, eid);
          asked.push(i);
        }
      }
      const got = asked.length === 0 ? [] : ((await p.exec()) ?? []);
      let k = 0;
      for (let i = from; i < to; i++) {
        let status = 0;
        let body = '';
        if (asked[k] === i) {
          const [err, es] = got[k++] as [Error | null, [string, string[]][]];
          if (err) throw err;
          const f = es[0]?.[1];
          if (f !== undefined) ({ status, body } = answerOf(f));
        }
        // not run: left out of a cancelled batch's files; in an expired batch's error file, as OpenAI does
        if (status === 0 && !expired) continue;
        j.lines.push(i);
        j.statuses.push(status);
        j.bodies.push(body);
        j.ids.push(customIds[i]!);
        bytes += body.length + customIds[i]!.length;
      }
      at.fill(undefined, from, to); // its memory goes as its lines are written
      size.fill(0, from, to);
      await flush();
    }
    await flush();
    if (!(await hold())) return;
    const outId = await out.close();
    const errId = await errs.close();
    // read again: a cancel while the files were written makes it end cancelled (with the files of what ran)
    const last = await this.#s.redis.hget(this.#s.batchKey(id), 'final');
    const final = last === 'cancelled' || last === 'expired' ? last : h.final === 'cancelled' || h.final === 'expired' ? h.final : 'completed';
    await move(this.#s, id, 'finalizing', final, `${final}_at`, String(now()), 'output_file_id', outId, 'error_file_id', errId);
    await this.#s.redis.multi().srem(this.#s.active, id).del(this.#s.outStream(id)).del(this.#s.batchIds(id)).exec();
  }
}

/** The input line a result-stream entry answers (its `id` field `v` is `<batch id>.<line>`), or -1. */
function lineOfId(v: string, id: string): number {
  if (!v.startsWith(id) || v.charCodeAt(id.length) !== 46 /* . */) return -1;
  const line = Number(v.slice(id.length + 1));
  return Number.isInteger(line) && line >= 0 && line < MAX_LINE ? line : -1;
}

function answerOf(f: string[]): { status: number; body: string } {
  let status = 0;
  let body = '';
  for (let i = 0; i + 1 < f.length; i += 2) {
    if (f[i] === 'status') status = Number(f[i + 1]);
    else if (f[i] === 'body') body = f[i + 1]!;
  }
  return { status: Number.isFinite(status) ? status : 0, body };
}

function answered(h: BatchHash): number {
  return Number(h.completed) + Number(h.failed) + Number(h.skipped);
}
