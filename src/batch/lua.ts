// The Lua scripts of the Files and Batches API (each one step, atomic on the
// Redis holding the batch state) and the client type that carries them.
import type { Redis } from 'ioredis';

/**
 * Moves the batch's cursor over new result entries and counts them; KEYS[1]
 * batch hash, KEYS[2] result stream; ARGV[1] how many at most. Returns the
 * number of entries read.
 */
const ADVANCE = `
local cur = redis.call('HGET', KEYS[1], 'cursor')
if not cur then cur = '0-0' end
local es = redis.call('XRANGE', KEYS[2], '(' .. cur, '+', 'COUNT', tonumber(ARGV[1]))
local ok, bad, skip = 0, 0, 0
for _, e in ipairs(es) do
  local f = e[2]
  local st = 0
  for i = 1, #f, 2 do if f[i] == 'status' then st = tonumber(f[i + 1]) or 0 end end
  if st == 0 then skip = skip + 1 elseif st >= 200 and st < 300 then ok = ok + 1 else bad = bad + 1 end
  cur = e[1]
end
if #es > 0 then
  redis.call('HSET', KEYS[1], 'cursor', cur)
  redis.call('HINCRBY', KEYS[1], 'completed', ok)
  redis.call('HINCRBY', KEYS[1], 'failed', bad)
  redis.call('HINCRBY', KEYS[1], 'skipped', skip)
end
return #es`;

/**
 * A batch's finalisation lease (KEYS[1]), so one router at a time writes its
 * files: taken when free (or already ours) and renewed, but only while the
 * batch (KEYS[2]) is still `finalizing` (a router that read the status just
 * before another ended the batch never finalises it again); ARGV[1] the
 * holder's token, ARGV[2] its length in ms. Returns 1 while ours.
 */
const HOLD_LEASE = `
if redis.call('HGET', KEYS[2], 'status') ~= 'finalizing' then return 0 end
local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
return 1`;

/** Deletes the lease KEYS[1] if ARGV[1] still holds it. */
const DROP_LEASE = `
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`;

/**
 * A piece of a file written under a lease: pushed to the list KEYS[2] only
 * while ARGV[1] holds the lease KEYS[1] (a router that lost it, stalled past
 * its length, cannot add to the new holder's file); ARGV[2] '1' starts the
 * data over first; ARGV[3] the piece. Returns 0 when the lease is not ours.
 */
const FENCED_PUSH = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '1' then redis.call('DEL', KEYS[2]) end
redis.call('RPUSH', KEYS[2], ARGV[3])
return 1`;

/** Deletes a file's data (KEYS[2]) when it has no record (KEYS[1]): bytes a cut-short write left. Returns 1 when deleted. */
const DROP_ORPHAN_DATA = `
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
return redis.call('DEL', KEYS[2])`;

/**
 * The first pass of a batch's finalisation: result entries after ARGV[1]
 * ('-': from the start; else an entry id, exclusive), each entry's id, its
 * `id` field and its body's length in bytes, flat after a first element
 * that is 1 when the stream's end was reached (else 0); so the router learns
 * where every answer is and how large, without the bodies crossing the wire.
 * At most ARGV[2] entries, and the entries are read 8 at a time and the call
 * stops once their bodies pass ARGV[3] bytes, so Redis never holds more than
 * about that much of them inside the script whatever the answers' sizes.
 * KEYS[1] the result stream.
 */
const INDEX_RESULTS = `
local cur = ARGV[1]
local limit, budget = tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {0}
local n, bytes = 0, 0
while n < limit and bytes < budget do
  local start = cur
  if start ~= '-' then start = '(' .. start end
  local es = redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', math.min(8, limit - n))
  if #es == 0 then out[1] = 1 break end
  for _, e in ipairs(es) do
    local f = e[2]
    local rid, len = '', 0
    for i = 1, #f, 2 do
      if f[i] == 'id' then rid = f[i + 1] elseif f[i] == 'body' then len = #f[i + 1] end
    end
    out[#out + 1] = e[1]
    out[#out + 1] = rid
    out[#out + 1] = len
    n = n + 1
    bytes = bytes + len
    cur = e[1]
  end
  es = nil
end
return out`;

/** Sets field ARGV[1]..= only when the batch's status is still ARGV[n] (the last arg): KEYS[1] batch hash. Returns 1 when set. */
const SET_IF_STATUS = `
if redis.call('HGET', KEYS[1], 'status') ~= ARGV[#ARGV] then return 0 end
for i = 1, #ARGV - 1, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
return 1`;

/**
 * Appends one chunk of a batch's lines to the request stream and its count, only
 * while the batch is in progress and its count is still ARGV[1]: KEYS[1] batch
 * hash, KEYS[2] request stream; ARGV from, to, result, path, batch id, tenant,
 * then (request id, body) pairs. Returns 1 when appended.
 */
const ENQUEUE_CHUNK_LUA = `
if redis.call('HGET', KEYS[1], 'status') ~= 'in_progress' then return 0 end
if redis.call('HGET', KEYS[1], 'expiring') == '1' then return 0 end
if redis.call('HGET', KEYS[1], 'enqueued') ~= ARGV[1] then return 0 end
for i = 7, #ARGV, 2 do
  redis.call('XADD', KEYS[2], '*', 'id', ARGV[i], 'result', ARGV[3], 'path', ARGV[4], 'batch', ARGV[5], 'tenant', ARGV[6], 'body', ARGV[i + 1])
end
redis.call('HSET', KEYS[1], 'enqueued', ARGV[2])
return 1`;

/**
 * Charges one file of ARGV[3] bytes to a tenant's usage (KEYS[1], a hash of
 * files and bytes) if it stays within ARGV[1] files and ARGV[2] bytes, or
 * whatever it is when ARGV[4] is '0' (batch output). Returns 1 when charged.
 */
const CHARGE_FILE = `
local files = tonumber(redis.call('HGET', KEYS[1], 'files') or '0')
local bytes = tonumber(redis.call('HGET', KEYS[1], 'bytes') or '0')
local n = tonumber(ARGV[3])
if ARGV[4] == '1' and (files + 1 > tonumber(ARGV[1]) or bytes + n > tonumber(ARGV[2])) then return 0 end
redis.call('HINCRBY', KEYS[1], 'files', 1)
redis.call('HINCRBY', KEYS[1], 'bytes', n)
return 1`;

/**
 * Deletes a file's record (KEYS[1]) and data (KEYS[2]), takes it out of its
 * tenant's list (KEYS[3]) and usage (KEYS[4]); ARGV[1] the file id. Only the
 * call that deleted the record gives its bytes back. Returns 1 when deleted.
 */
const DELETE_FILE = `
local bytes = tonumber(redis.call('HGET', KEYS[1], 'bytes') or '0')
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HINCRBY', KEYS[4], 'files', -1)
redis.call('HINCRBY', KEYS[4], 'bytes', -bytes)
return 1`;

export type ScriptRedis = Redis & {
  advance(hash: string, stream: string, count: number): Promise<number>;
  setIfStatus(hash: string, ...args: string[]): Promise<number>;
  enqueueChunk(hash: string, stream: string, ...args: string[]): Promise<number>;
  chargeFile(usage: string, maxFiles: number, maxBytes: number, bytes: number, enforce: string): Promise<number>;
  deleteFile(meta: string, data: string, index: string, usage: string, id: string): Promise<number>;
  dropOrphanData(meta: string, data: string): Promise<number>;
  holdLease(key: string, batch: string, token: string, ms: number): Promise<number>;
  dropLease(key: string, token: string): Promise<number>;
  fencedPush(lease: string, data: string, token: string, fresh: string, piece: Buffer): Promise<number>;
  /** [ended (1/0), then entry id, its `id` field, its body's byte length per entry], flat. */
  indexResults(stream: string, after: string, count: number, budget: number): Promise<(string | number)[]>;
};

/** Defines the scripts on a client (ioredis loads each by its digest, once per connection). */
export function defineScripts(r: Redis): ScriptRedis {
  r.defineCommand('advance', { numberOfKeys: 2, lua: ADVANCE });
  r.defineCommand('setIfStatus', { numberOfKeys: 1, lua: SET_IF_STATUS });
  r.defineCommand('enqueueChunk', { numberOfKeys: 2, lua: ENQUEUE_CHUNK_LUA });
  r.defineCommand('chargeFile', { numberOfKeys: 1, lua: CHARGE_FILE });
  r.defineCommand('deleteFile', { numberOfKeys: 4, lua: DELETE_FILE });
  r.defineCommand('indexResults', { numberOfKeys: 1, lua: INDEX_RESULTS });
  r.defineCommand('dropOrphanData', { numberOfKeys: 2, lua: DROP_ORPHAN_DATA });
  r.defineCommand('holdLease', { numberOfKeys: 2, lua: HOLD_LEASE });
  r.defineCommand('dropLease', { numberOfKeys: 1, lua: DROP_LEASE });
  r.defineCommand('fencedPush', { numberOfKeys: 2, lua: FENCED_PUSH });
  return r as ScriptRedis;
}
