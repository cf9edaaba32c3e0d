// The native KV-event decoder (PrefixIndex.applyPayloads, native/kv_decode.h)
// against the TS reference (EventBatchEncoder in src/kv-events/decode.ts,
// msgpackr, then applyEvents): random event batches of both layouts with every
// field in every msgpack width the format allows, then the same batches
// corrupted (bytes flipped, inserted, deleted, truncated, spliced). Both paths
// must agree on every counter, on which payloads are malformed, and on the
// resulting index (tiers, blocks, engine-hash map, matches). Also hand-built
// fixtures for the edges (deep nesting, huge claimed lengths, trailing bytes)
// and the bounded engine-hash map. Run by scripts/asan.js under ASan+UBSan
// (KV_DECODE_RUNS scales it).
import fc from 'fast-check';
import t from 'tap';
import { Unpackr } from 'msgpackr';
import { APPLY_STATUS, MatchResult, PAYLOAD_TOTALS as T, PAYLOAD_TOTALS_LENGTH, PrefixIndex } from '../../bindings/prefix-index.js';
import { EventBatchEncoder, KvDecodeError, type DecodeCounts } from '../../src/kv-events/decode.js';

const RUNS = Number(process.env.KV_DECODE_RUNS ?? 300);
// a failing run prints its seed and path; KV_DECODE_SEED replays it (the generators draw only from fast-check)
const SEED = process.env.KV_DECODE_SEED === undefined ? {} : { seed: Number(process.env.KV_DECODE_SEED), path: process.env.KV_DECODE_PATH };
const BT = 4; // tokens per block
const MAX_EPS = 4;
const MODEL = ['m0', 'm1'];

// ---- a msgpack writer that can pick any width (the spec: github.com/msgpack/msgpack/blob/master/spec.md)

type IntW = 'min' | 'u8' | 'u16' | 'u32' | 'u64' | 'i8' | 'i16' | 'i32' | 'i64';
type V =
  | null
  | boolean
  | string
  | Uint8Array
  | V[]
  | { int: bigint; w: IntW }
  | { f: number; w: 32 | 64 }
  | { map: [V, V][] }
  | { raw: number[] };

function fits(v: bigint, w: IntW): boolean {
  const r: Record<IntW, [bigint, bigint]> = {
    min: [-(1n << 63n), (1n << 64n) - 1n],
    u8: [0n, 255n],
    u16: [0n, 65535n],
    u32: [0n, 0xffffffffn],
    u64: [0n, (1n << 64n) - 1n],
    i8: [-128n, 127n],
    i16: [-32768n, 32767n],
    i32: [-(1n << 31n), (1n << 31n) - 1n],
    i64: [-(1n << 63n), (1n << 63n) - 1n],
  };
  const [lo, hi] = r[w];
  return v >= lo && v <= hi;
}

function be(v: bigint, bytes: number): number[] {
  const out: number[] = [];
  const u = BigInt.asUintN(bytes * 8, v);
  for (let i = bytes - 1; i >= 0; i--) out.push(Number((u >> BigInt(i * 8)) & 0xffn));
  return out;
}

function encInt(v: bigint, w: IntW, out: number[]): void {
  if (!fits(v, w)) w = 'min';
  if (w === 'min') {
    if (v >= 0n && v < 128n) return void out.push(Number(v));
    if (v < 0n && v >= -32n) return void out.push(Number(BigInt.asUintN(8, v)));
    w = v >= 0n ? (v < 256n ? 'u8' : v < 65536n ? 'u16' : v <= 0xffffffffn ? 'u32' : 'u64') : v >= -128n ? 'i8' : v >= -32768n ? 'i16' : v >= -(1n << 31n) ? 'i32' : 'i64';
  }
  const head: Record<Exclude<IntW, 'min'>, [number, number]> = {
    u8: [0xcc, 1], u16: [0xcd, 2], u32: [0xce, 4], u64: [0xcf, 8], i8: [0xd0, 1], i16: [0xd1, 2], i32: [0xd2, 4], i64: [0xd3, 8],
  };
  const [h, n] = head[w];
  out.push(h, ...be(v, n));
}

function encLen(n: number, fix: number | null, fixMax: number, heads: [number, number, number], out: number[]): void {
  if (fix !== null && n <= fixMax) out.push(fix | n);
  else if (heads[0] !== 0 && n < 256) out.push(heads[0], n);
  else if (n < 65536) out.push(heads[1], ...be(BigInt(n), 2));
  else out.push(heads[2], ...be(BigInt(n), 4));
}

function enc(v: V, out: number[] = []): number[] {
  if (v === null) out.push(0xc0);
  else if (typeof v === 'boolean') out.push(v ? 0xc3 : 0xc2);
  else if (typeof v === 'number') encInt(BigInt(v), 'min', out);
  else if (typeof v === 'string') {
    const b = Buffer.from(v, 'utf8');
    encLen(b.length, 0xa0, 31, [0xd9, 0xda, 0xdb], out);
    out.push(...b);
  } else if (v instanceof Uint8Array) {
    encLen(v.length, null, 0, [0xc4, 0xc5, 0xc6], out);
    out.push(...v);
  } else if (Array.isArray(v)) {
    encLen(v.length, 0x90, 15, [0, 0xdc, 0xdd], out);
    for (const x of v) enc(x, out);
  } else if ('int' in v) encInt(v.int, v.w, out);
  else if ('f' in v) {
    const b = Buffer.alloc(v.w / 8);
    if (v.w === 32) b.writeFloatBE(v.f);
    else b.writeDoubleBE(v.f);
    out.push(v.w === 32 ? 0xca : 0xcb, ...b);
  } else if ('map' in v) {
    encLen(v.map.length, 0x80, 15, [0, 0xde, 0xdf], out);
    for (const [k, x] of v.map) {
      enc(k, out);
      enc(x, out);
    }
  } else out.push(...v.raw);
  return out;
}

// ---- generators

const intW = fc.constantFrom<IntW>('min', 'min', 'u8', 'u16', 'u32', 'u64', 'i8', 'i16', 'i32', 'i64');
const int = (a: fc.Arbitrary<bigint>) => fc.tuple(a, intW).map(([i, w]): V => ({ int: i, w }));

// engine hashes: a small universe (so removes and parents hit stored blocks) with the extremes
const HASHES = [1n, 2n, 3n, 4n, 5n, 6n, 7n, 8n, 200n, 70000n, 1n << 53n, (1n << 64n) - 1n, 1n << 63n, -1n, -(1n << 53n)];
const hashBits = fc.constantFrom(...HASHES);
const hashV: fc.Arbitrary<V> = fc.oneof(
  { weight: 8, arbitrary: int(hashBits) },
  { weight: 2, arbitrary: fc.tuple(hashBits, fc.constantFrom(8, 8, 32, 12)).map(([h, n]) => { const b = new Uint8Array(n); b.set(be(h, 8), n - 8); return b as V; }) },
  { weight: 1, arbitrary: fc.constantFrom<V>({ f: 5, w: 64 }, { f: 6, w: 32 }, { f: 2.5, w: 64 }, new Uint8Array(4), 'h', null, [], { f: 2 ** 60, w: 64 }) },
);
const tokenV: fc.Arbitrary<V> = fc.oneof(
  { weight: 20, arbitrary: int(fc.bigInt({ min: 0n, max: 40n })) },
  { weight: 3, arbitrary: int(fc.constantFrom(127n, 128n, 255n, 256n, 65535n, 65536n, 0xffffffffn)) },
  { weight: 1, arbitrary: fc.constantFrom<V>({ int: -1n, w: 'min' }, { int: 1n << 32n, w: 'u64' }, { f: 3, w: 64 }, { f: 3, w: 32 }, { f: 0.5, w: 64 }, 'x', null) },
);
const mediumV = fc.constantFrom<V | undefined>(undefined, undefined, null, 'GPU', 'gpu', 'CPU', 'cpu_tier1', 'HOST', 'disk', 'LocalDisk', 7);
const loraV = fc.constantFrom<V | undefined>(undefined, undefined, null, '', 'ad-a', 'ad-b', 3);
const bsV = fc.oneof(
  { weight: 12, arbitrary: int(fc.constant(BigInt(BT))) },
  { weight: 1, arbitrary: fc.constantFrom<V>({ f: BT, w: 64 }, { f: BT, w: 32 }, { int: 8n, w: 'min' }, { int: 0n, w: 'min' }, { f: 4.5, w: 64 }, 'x', { int: (1n << 53n) + 2n, w: 'u64' }) },
);

interface Gen {
  events: V[];
  probes: { tokens: number[]; lora: string | null }[];
}

const storedArb = fc
  .record({
    map: fc.boolean(),
    hashes: fc.array(hashV, { maxLength: 4 }),
    parent: fc.option(hashV, { nil: undefined }),
    tokenSlack: fc.constantFrom(0, 0, 0, 0, 0, 0, 1, -1),
    tokens: fc.array(tokenV, { minLength: 20, maxLength: 20 }),
    bs: bsV,
    medium: mediumV,
    lora: loraV,
    extra: fc.boolean(),
    trim: fc.integer({ min: 4, max: 12 }),
  })
  .map((r) => {
    const nTok = Math.max(0, r.hashes.length * BT + r.tokenSlack);
    const toks = Array.from({ length: nTok }, (_, i) => r.tokens[i % r.tokens.length]!);
    const fields: [string, V | undefined][] = [
      ['block_hashes', r.hashes],
      ['parent_block_hash', r.parent],
      ['token_ids', toks],
      ['block_size', r.bs],
      ['lora_id', r.extra ? { int: 3n, w: 'min' } : null],
      ['medium', r.medium],
      ['lora_name', r.lora],
      ['extra_keys', r.extra ? [[{ map: [['k', 1 as unknown as V]] } as V]] : null],
      ['group_idx', { int: 0n, w: 'min' }],
      ['kv_cache_spec_kind', r.extra ? 'full_attention' : null],
      ['kv_cache_spec_sliding_window', null],
    ];
    let ev: V;
    if (r.map) ev = { map: [['type', 'BlockStored'], ...fields.filter(([, v]) => v !== undefined).map(([k, v]) => [k, v!] as [V, V])] };
    else ev = ['BlockStored', ...fields.slice(0, r.trim - 1).map(([, v]) => (v === undefined ? null : v))];
    return { ev, toks, lora: typeof r.lora === 'string' && r.lora !== '' ? r.lora : null };
  });

const removedArb = fc
  .record({ map: fc.boolean(), hashes: fc.oneof(fc.array(hashV, { maxLength: 4 }), fc.constant<V>('x')), medium: mediumV, trim: fc.integer({ min: 2, max: 4 }) })
  .map((r): V => {
    if (r.map) return { map: [['type', 'BlockRemoved'], ['block_hashes', r.hashes as V], ...(r.medium !== undefined ? [['medium', r.medium] as [V, V]] : [])] };
    return ['BlockRemoved', r.hashes as V, r.medium === undefined ? null : r.medium, { int: 0n, w: 'min' }].slice(0, r.trim);
  });

const otherArb = fc.constantFrom<V>(
  ['AllBlocksCleared'],
  { map: [['type', 'AllBlocksCleared']] },
  ['Mystery', 1],
  { map: [['type', 'Mystery']] },
  { map: [['nottype', 1]] },
  { map: [[{ int: 1n, w: 'min' }, 2 as unknown as V], [null, 'x'], [true, 1 as unknown as V], [{ f: 1.5, w: 64 }, null]] },
  [],
  [5],
  'BlockStored',
  { int: 3n, w: 'min' },
  null,
  new Uint8Array(3),
  { raw: [0xc1] },
);

const batchArb = fc
  .record({
    events: fc.array(fc.oneof({ weight: 6, arbitrary: storedArb.map((s) => s as unknown) }, { weight: 3, arbitrary: removedArb }, { weight: 1, arbitrary: otherArb }), { maxLength: 6 }),
    ts: fc.constantFrom<V>({ f: 1.5, w: 64 }, { f: 2, w: 32 }, { int: 17n, w: 'u32' }, { int: 1n << 60n, w: 'u64' }, 'x'),
    dp: fc.constantFrom<V | undefined>(undefined, undefined, null, null, { int: 0n, w: 'min' }, { int: 1n, w: 'min' }, { int: 2n, w: 'u8' }, { int: -1n, w: 'min' }, { f: 1, w: 64 }, { f: 1.5, w: 64 }, 'r'),
    shape: fc.constantFrom('ok', 'ok', 'ok', 'ok', 'ok', 'ok', 'ok', 'ok', 'short', 'notArray', 'eventsNotArray', 'long'),
  })
  .map((r): Gen => {
    const events: V[] = [];
    const probes: Gen['probes'] = [];
    for (const e of r.events) {
      if (e !== null && typeof e === 'object' && 'ev' in (e as object)) {
        const s = e as { ev: V; toks: V[]; lora: string | null };
        events.push(s.ev);
        const nums = s.toks.map((x) => (x !== null && typeof x === 'object' && 'int' in x ? Number(x.int) : 0));
        probes.push({ tokens: nums, lora: s.lora });
      } else events.push(e as V);
    }
    return { ...r, events, probes } as Gen & typeof r;
  });

function batchBytes(g: Gen & { ts: V; dp: V | undefined; shape: string }): Uint8Array {
  let v: V;
  if (g.shape === 'short') v = [g.ts];
  else if (g.shape === 'notArray') v = { map: [['ts', g.ts]] };
  else if (g.shape === 'eventsNotArray') v = [g.ts, 'events', null];
  else {
    v = g.dp === undefined ? [g.ts, g.events] : [g.ts, g.events, g.dp];
    if (g.shape === 'long') v.push('extra', { map: [] });
  }
  return Uint8Array.from(enc(v));
}

// corruptions of a payload's bytes
type Mut = { k: 'flip' | 'insert' | 'delete' | 'truncate' | 'splice'; at: number; b: number; len: number };
const mutArb = fc.record({
  k: fc.constantFrom<Mut['k']>('flip', 'flip', 'flip', 'insert', 'delete', 'truncate', 'splice'),
  at: fc.nat(),
  b: fc.oneof(fc.integer({ min: 0, max: 255 }), fc.constantFrom(0xc1, 0xdd, 0xdf, 0xc6, 0xdb, 0xcf, 0xd3, 0x9f, 0x8f, 0xff, 0x00)),
  len: fc.integer({ min: 1, max: 12 }),
});

function mutate(p: Uint8Array, muts: Mut[]): Uint8Array {
  let a = Array.from(p);
  for (const m of muts) {
    if (a.length === 0) break;
    const at = m.at % a.length;
    if (m.k === 'flip') a[at] = m.b;
    else if (m.k === 'insert') a.splice(at, 0, m.b);
    else if (m.k === 'delete') a.splice(at, m.len);
    else if (m.k === 'truncate') a = a.slice(0, at);
    else {
      const from = (at * 7 + m.b) % a.length;
      a.splice(at, 0, ...a.slice(from, from + m.len));
    }
  }
  return Uint8Array.from(a);
}

// ---- the two paths

interface FeedSpec {
  id: number;
  model: string;
  ranks: Record<number, number>;
}
// endpoint 0 with data-parallel rank 1 held by endpoint 2; endpoint 1 alone; endpoint 3 holds rank 0 of feed 2
const FEEDS: FeedSpec[] = [
  { id: 0, model: MODEL[0]!, ranks: { 1: 2 } },
  { id: 1, model: MODEL[1]!, ranks: {} },
];
function holdersOf(f: FeedSpec): number[] {
  return [f.id, ...Object.values(f.ranks).filter((h) => h !== f.id)];
}
function rankTable(): { ranks: Int32Array; off: number[]; len: number[] } {
  const all: number[] = [];
  const off: number[] = [];
  const len: number[] = [];
  for (const f of FEEDS) {
    const n = Math.max(1, ...Object.keys(f.ranks).map((k) => Number(k) + 1));
    off.push(all.length);
    len.push(n);
    for (let r = 0; r < n; r++) all.push(f.ranks[r] ?? (r === 0 ? f.id : -1));
  }
  return { ranks: Int32Array.from(all), off, len };
}
const seedPair = (name: string): [number, number] => {
  const s = PrefixIndex.seedFor(name);
  return [Number(s >> 32n), Number(s & 0xffffffffn)];
};

type Item = { feed: number; payload: Uint8Array | null };

interface Outcome {
  totals: number[];
  malformed: boolean[];
  index: PrefixIndex;
}

function newIndex(): PrefixIndex {
  return new PrefixIndex({ blockSize: BT * 4, maxEndpoints: MAX_EPS, defaultCapacity: [0xffffffff, 0xffffffff, 0xffffffff] });
}

function runNative(items: Item[], limit?: number): Outcome {
  const index = newIndex();
  if (limit !== undefined) index.setEventMapLimit(limit);
  const { ranks, off, len } = rankTable();
  const chunks = items.map((i) => i.payload ?? new Uint8Array(0));
  const data = Buffer.concat(chunks);
  const rec = new Uint32Array(8 * items.length);
  let at = 0;
  items.forEach((it, i) => {
    const f = FEEDS[it.feed]!;
    const [hi, lo] = seedPair(f.model);
    rec.set([it.payload === null ? 2 : 1, at, at + chunks[i]!.length, f.id, off[it.feed]!, len[it.feed]!, hi, lo], i * 8);
    at += chunks[i]!.length;
  });
  const status = new Uint8Array(items.length);
  const totals = new Float64Array(PAYLOAD_TOTALS_LENGTH);
  // split the drain in two calls half of the time: state carries across calls
  index.applyPayloads(data, rec, items.length, ranks, status, totals);
  return { totals: Array.from(totals), malformed: items.map((it, i) => it.payload !== null && status[i] === APPLY_STATUS.malformed), index };
}

const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: 'auto' } as unknown as ConstructorParameters<typeof Unpackr>[0]);

// ext types msgpackr gives a meaning of its own (bigint, bundled strings, error, references, record definitions,
// set, typed array, RegExp): some read further values from the stream rather than the ext's own bytes, so
// msgpackr's view of everything after one is not the format's
const MSGPACKR_EXTS = new Set([0x42, 0x62, 0x65, 0x69, 0x70, 0x72, 0x73, 0x74, 0x78]);

/** Whether the payload, read as plain msgpack from the start, holds an ext of a type msgpackr interprets
 * before it ends or goes wrong. */
function hasMsgpackrExt(p: Uint8Array): boolean {
  let at = 0;
  const u = (n: number): number => {
    if (at + n > p.length) throw new RangeError('short');
    let v = 0;
    for (let i = 0; i < n; i++) v = v * 256 + p[at + i]!;
    at += n;
    return v;
  };
  const skip = (n: number) => {
    if (at + n > p.length) throw new RangeError('short');
    at += n;
  };
  const value = (depth: number): boolean => {
    if (depth > 4096) throw new RangeError('deep');
    const b = u(1);
    let items = 0;
    if (b <= 0x7f || b >= 0xe0 || b === 0xc0 || b === 0xc1 || b === 0xc2 || b === 0xc3) return false;
    if (b >= 0xa0 && b <= 0xbf) return skip(b & 0x1f), false;
    if (b >= 0x90 && b <= 0x9f) items = b & 0x0f;
    else if (b >= 0x80 && b <= 0x8f) items = (b & 0x0f) * 2;
    else if (b >= 0xd4 && b <= 0xd8) {
      const type = u(1);
      skip(1 << (b - 0xd4));
      return MSGPACKR_EXTS.has(type);
    } else if (b >= 0xc7 && b <= 0xc9) {
      const n = u(1 << (b - 0xc7));
      const type = u(1);
      skip(n);
      return MSGPACKR_EXTS.has(type);
    } else if (b >= 0xc4 && b <= 0xc6) return skip(u(1 << (b - 0xc4))), false;
    else if (b >= 0xd9 && b <= 0xdb) return skip(u(1 << (b - 0xd9))), false;
    else if (b === 0xca || b === 0xce || b === 0xd2) return skip(4), false;
    else if (b === 0xcb || b === 0xcf || b === 0xd3) return skip(8), false;
    else if (b === 0xcc || b === 0xd0) return skip(1), false;
    else if (b === 0xcd || b === 0xd1) return skip(2), false;
    else if (b === 0xdc || b === 0xdd) items = u(b === 0xdc ? 2 : 4);
    else if (b === 0xde || b === 0xdf) items = u(b === 0xde ? 2 : 4) * 2;
    for (let i = 0; i < items; i++) if (value(depth + 1)) return true;
    return false;
  };
  try {
    return value(0);
  } catch {
    return false;
  }
}

/** Whether msgpackr's view of the payload is one the native decoder deliberately reads differently (docs/kv-events.md). */
function knownDifference(p: Uint8Array, err: unknown): boolean {
  if (err instanceof KvDecodeError && /Unknown extension|Expected string/.test(err.message)) {
    if (process.env.KV_DECODE_DEBUG) console.error('diff: msgpackr', err.message);
    return true;
  }
  if (hasMsgpackrExt(p)) {
    if (process.env.KV_DECODE_DEBUG) console.error('diff: an ext msgpackr interprets');
    return true;
  }
  let v: unknown;
  try {
    v = unpackr.unpack(p);
  } catch {
    return false;
  }
  // an ext msgpackr turned into something other than a Date (the native decoder reads every ext, and 0xc1, as
  // an opaque value, as msgpackr reads ext -1 and 0xc1: an object without fields)
  const walk = (x: unknown, depth: number): boolean => {
    if (depth > 50 || x instanceof Uint8Array || x instanceof Date || x === null || typeof x !== 'object') return false;
    if (!Array.isArray(x) && Object.getPrototypeOf(x) !== Object.prototype) {
      if (process.env.KV_DECODE_DEBUG) console.error('diff: object', x.constructor?.name);
      return x.constructor?.name !== 'C1Type';
    }
    return Object.values(x as object).some((y) => walk(y, depth + 1));
  };
  if (walk(v, 0)) return true;
  // a LoRA name that is not valid UTF-8: msgpackr replaces the bad bytes, the native seed hashes them as sent
  const events = Array.isArray(v) && Array.isArray(v[1]) ? (v[1] as unknown[]) : [];
  return events.some((e) => {
    const lora = Array.isArray(e) ? e[7] : e !== null && typeof e === 'object' ? (e as Record<string, unknown>).lora_name : undefined;
    return typeof lora === 'string' && lora.includes('\uFFFD');
  });
}

function runReference(items: Item[]): Outcome & { divergent: boolean } {
  const index = newIndex();
  const enc = new EventBatchEncoder(BT);
  const counts: DecodeCounts = { unknownEvents: 0, badEvents: 0, blockSizeMismatch: 0 };
  let dropped = 0;
  let malformedN = 0;
  let batches = 0;
  let divergent = false;
  const malformed: boolean[] = [];
  for (const it of items) {
    const f = FEEDS[it.feed]!;
    if (it.payload === null) {
      for (const h of holdersOf(f)) enc.clear(h);
      malformed.push(false);
      continue;
    }
    const holder = (rank: number | null): number => {
      if (rank === null || (rank === 0 && f.ranks[0] === undefined)) return f.id;
      const h = f.ranks[rank];
      if (h === undefined) {
        dropped++;
        return -1;
      }
      return h;
    };
    const seed = (lora: string | null) => seedPair(lora ?? f.model);
    try {
      enc.add(it.payload, holder, seed, counts);
      batches++;
      malformed.push(false);
      if (knownDifference(it.payload, null)) divergent = true;
    } catch (err) {
      if (!(err instanceof KvDecodeError)) throw err;
      if (knownDifference(it.payload, err)) divergent = true;
      malformedN++;
      malformed.push(true);
      for (const h of holdersOf(f)) enc.clear(h);
    }
  }
  const totals = new Float64Array(5);
  index.applyEvents(enc.ops, enc.nOps, enc.words, enc.tokens, totals);
  const out = new Array<number>(PAYLOAD_TOTALS_LENGTH).fill(NaN);
  out[T.stored] = totals[0]!;
  out[T.removed] = totals[1]!;
  out[T.orphans] = totals[2]!;
  out[T.unknownRemovals] = totals[3]!;
  out[T.forgotten] = totals[4]!;
  out[T.unknownEvents] = counts.unknownEvents;
  out[T.badEvents] = counts.badEvents;
  out[T.blockSizeMismatch] = counts.blockSizeMismatch;
  out[T.droppedRanks] = dropped;
  out[T.malformed] = malformedN;
  out[T.batches] = batches;
  return { totals: out, malformed, index, divergent };
}

const COMPARED = [T.stored, T.removed, T.orphans, T.unknownRemovals, T.forgotten, T.unknownEvents, T.badEvents, T.blockSizeMismatch, T.droppedRanks, T.malformed, T.batches];
const res = new MatchResult();
const cands = Int32Array.from({ length: MAX_EPS }, (_, i) => i);

function snapshot(index: PrefixIndex, probes: Gen['probes'], models: string[]): unknown {
  const matches: number[][] = [];
  for (const p of probes) {
    for (const m of p.lora !== null ? [p.lora] : models) {
      const bytes = new Uint8Array(Uint32Array.from(p.tokens.map((x) => x >>> 0)).buffer);
      index.matchPrompt(bytes, PrefixIndex.seedFor(m), cands, res);
      matches.push(Array.from(res.matched.subarray(0, MAX_EPS)), Array.from(res.tiers.subarray(0, MAX_EPS * 3)));
    }
  }
  return { stats: index.stats(), mapped: Array.from({ length: MAX_EPS }, (_, e) => index.mappedBlocks(e)), matches };
}

function compare(tt: Tap.Test, items: Item[], probes: Gen['probes']): 'same' | 'divergent' {
  const n = runNative(items);
  const r = runReference(items);
  if (r.divergent) return 'divergent';
  const pick = (x: number[]) => COMPARED.map((i) => x[i]);
  const nt = pick(n.totals);
  const rt = pick(r.totals);
  const ns = snapshot(n.index, probes, MODEL);
  const rs = snapshot(r.index, probes, MODEL);
  const ok = JSON.stringify(nt) === JSON.stringify(rt) && JSON.stringify(n.malformed) === JSON.stringify(r.malformed) && JSON.stringify(ns) === JSON.stringify(rs);
  if (!ok) {
    tt.same({ totals: nt, malformed: n.malformed }, { totals: rt, malformed: r.malformed }, 'counters');
    tt.same(ns, rs, 'index');
    throw new Error(`native and reference differ on ${items.map((i) => (i.payload ? Buffer.from(i.payload).toString('hex') : 'clear')).join(' | ')}`);
  }
  return 'same';
}

const itemsArb = fc.array(
  fc.record({ feed: fc.integer({ min: 0, max: FEEDS.length - 1 }), clear: fc.integer({ min: 0, max: 9 }).map((n) => n === 0), g: batchArb }),
  { minLength: 1, maxLength: 8 },
);

t.test('well-formed random batches: native and reference agree', (tt) => {
  let divergent = 0;
  fc.assert(
    fc.property(itemsArb, (xs) => {
      const items: Item[] = xs.map((x) => ({ feed: x.feed, payload: x.clear ? null : batchBytes(x.g as Gen & { ts: V; dp: V | undefined; shape: string }) }));
      const probes = xs.flatMap((x) => x.g.probes);
      if (compare(tt, items, probes) === 'divergent') divergent++;
    }),
    { numRuns: RUNS, interruptAfterTimeLimit: 60_000, markInterruptAsFailure: true, ...SEED },
  );
  tt.ok(divergent <= RUNS / 20, `runs with a known, documented difference: ${divergent} of ${RUNS}`);
  tt.end();
});

t.test('corrupted batches: never a crash, and the same outcome as the reference', (tt) => {
  let divergent = 0;
  let malformed = 0;
  fc.assert(
    fc.property(itemsArb, fc.array(fc.array(mutArb, { minLength: 1, maxLength: 3 }), { minLength: 1, maxLength: 8 }), (xs, muts) => {
      const items: Item[] = xs.map((x, i) => {
        if (x.clear) return { feed: x.feed, payload: null };
        const p = batchBytes(x.g as Gen & { ts: V; dp: V | undefined; shape: string });
        return { feed: x.feed, payload: i < muts.length ? mutate(p, muts[i]!) : p };
      });
      const probes = xs.flatMap((x) => x.g.probes);
      if (compare(tt, items, probes) === 'divergent') divergent++;
      malformed += runNative(items).totals[T.malformed]!;
    }),
    { numRuns: RUNS, interruptAfterTimeLimit: 90_000, markInterruptAsFailure: true, ...SEED },
  );
  tt.ok(malformed > 0, `corruptions made malformed payloads (${malformed})`);
  tt.ok(divergent <= RUNS / 10, `runs with a known, documented difference: ${divergent} of ${RUNS}`);
  tt.end();
});

t.test('random bytes never crash the decoder', (tt) => {
  fc.assert(
    fc.property(fc.array(fc.uint8Array({ maxLength: 64 }), { minLength: 1, maxLength: 6 }), (ps) => {
      const out = runNative(ps.map((p) => ({ feed: 0, payload: p })));
      return out.totals[T.malformed]! + out.totals[T.batches]! === ps.length;
    }),
    { numRuns: RUNS * 3 },
  );
  tt.end();
});

t.test('edges: nesting, claimed lengths, trailing bytes, widths', (tt) => {
  const one = (bytes: number[]) => runNative([{ feed: 1, payload: Uint8Array.from(bytes) }]);
  // 100 000 nested arrays inside a batch: malformed (depth limit), no stack overflow
  const deep = [0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, ...new Array(100000).fill(0x91), 0xc0, 0xc0];
  tt.equal(one(deep).totals[T.malformed], 1, 'deep nesting is malformed');
  // an array32 claiming 4 billion elements in 10 bytes: malformed at once
  tt.equal(one([0x92, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff, 0x90]).totals[T.malformed], 1, 'huge claimed array');
  tt.equal(one([0x92, 0x01, 0xdf, 0x7f, 0xff, 0xff, 0xff, 0x90]).totals[T.malformed], 1, 'huge claimed map');
  tt.equal(one([0x92, 0x01, 0x91, 0xc6, 0xff, 0xff, 0xff, 0xf0, 0x00]).totals[T.malformed], 1, 'huge claimed bin');
  tt.equal(one([0x92, 0x01, 0x90, 0x00]).totals[T.malformed], 1, 'a byte after the batch');
  tt.equal(one([0x92, 0x01, 0x90]).totals[T.batches], 1, 'an empty batch is fine');
  tt.equal(one([]).totals[T.malformed], 1, 'an empty payload');
  tt.equal(one([0x92, 0x01, 0x91, 0x81, 0xc4, 0x01, 0x41, 0x01]).totals[T.malformed], 1, 'a bin map key is malformed (as in msgpackr)');
  // a 32-byte digest hash and an int8 / uint64 / float64 encoding of the same values store the same blocks
  const stored = (hash: V, tok: (i: number) => V, bs: V) =>
    enc([{ f: 1, w: 64 }, [['BlockStored', [hash], null, Array.from({ length: BT }, (_, i) => tok(i)), bs, null, 'GPU', null]], null]);
  const digest = new Uint8Array(32);
  digest.set(be(9n, 8), 24);
  const a = runNative([{ feed: 1, payload: Uint8Array.from(stored({ int: 9n, w: 'min' }, (i) => ({ int: BigInt(i + 1), w: 'min' }), { int: BigInt(BT), w: 'min' })) }]);
  const b = runNative([{ feed: 1, payload: Uint8Array.from(stored(digest, (i) => ({ int: BigInt(i + 1), w: 'i64' }), { f: BT, w: 32 })) }]);
  const c = runNative([{ feed: 1, payload: Uint8Array.from(stored({ int: 9n, w: 'u64' }, (i) => ({ f: i + 1, w: 64 }), { int: BigInt(BT), w: 'u16' })) }]);
  for (const x of [a, b, c]) tt.equal(x.totals[T.stored], 1);
  const probe = [{ tokens: [1, 2, 3, 4], lora: null }];
  tt.same(snapshot(b.index, probe, [MODEL[1]!]), snapshot(a.index, probe, [MODEL[1]!]), 'digest bytes and float fields: the same block');
  tt.same(snapshot(c.index, probe, [MODEL[1]!]), snapshot(a.index, probe, [MODEL[1]!]), 'uint64 and float64 encodings: the same block');
  tt.same((snapshot(a.index, probe, [MODEL[1]!]) as { matches: number[][] }).matches[0], [0, 1, 0, 0], 'the block matches the prompt with the same tokens on endpoint 1');
  const short = runNative([{ feed: 1, payload: Uint8Array.from(stored(new Uint8Array(7), (i) => ({ int: BigInt(i), w: 'min' }), { int: BigInt(BT), w: 'min' })) }]);
  tt.equal(short.totals[T.badHashes], 1, 'a 7-byte digest is a bad hash');
  tt.equal(short.totals[T.badEvents], 1, 'and a bad event');
  tt.end();
});

t.test('argument checks throw before anything is applied', (tt) => {
  const index = newIndex();
  const totals = new Float64Array(PAYLOAD_TOTALS_LENGTH);
  const st = new Uint8Array(4);
  const ranks = Int32Array.of(0);
  const data = new Uint8Array(4);
  tt.throws(() => index.applyPayloads(data, Uint32Array.of(1, 0, 5, 0, 0, 1, 0, 0), 1, ranks, st, totals), RangeError, 'range past data');
  tt.throws(() => index.applyPayloads(data, Uint32Array.of(1, 3, 2, 0, 0, 1, 0, 0), 1, ranks, st, totals), RangeError, 'start after end');
  tt.throws(() => index.applyPayloads(data, Uint32Array.of(1, 0, 4, MAX_EPS, 0, 1, 0, 0), 1, ranks, st, totals), RangeError, 'holder out of range');
  tt.throws(() => index.applyPayloads(data, Uint32Array.of(1, 0, 4, 0, 0, 2, 0, 0), 1, ranks, st, totals), RangeError, 'rank table past ranks');
  tt.throws(() => index.applyPayloads(data, Uint32Array.of(1, 0, 4, 0, 0, 1, 0, 0), 1, Int32Array.of(MAX_EPS), st, totals), RangeError, 'rank holder out of range');
  tt.throws(() => index.applyPayloads(data, Uint32Array.of(7, 0, 4, 0, 0, 1, 0, 0), 1, ranks, st, totals), RangeError, 'unknown item kind');
  tt.throws(() => index.applyPayloads(data, Uint32Array.of(1, 0, 4, 0, 0, 1, 0, 0), 2, ranks, st, totals), RangeError, 'nItems past items');
  tt.throws(() => index.applyPayloads(data, Uint32Array.of(1, 0, 4, 0, 0, 1, 0, 0), 1, ranks, st, new Float64Array(4)), RangeError, 'short totals');
  tt.throws(() => index.applyPayloads([] as unknown as Uint8Array, Uint32Array.of(), 0, ranks, st, totals), TypeError, 'data not a Uint8Array');
  tt.same(Array.from(totals), new Array(PAYLOAD_TOTALS_LENGTH).fill(0), 'nothing counted');
  tt.throws(() => index.setEventMapLimit(0), RangeError);
  tt.end();
});

t.test('the engine-hash map is bounded: forgetting a hash removes its key (never a stale claim)', (tt) => {
  // a chain of 10 blocks on endpoint 1 with a limit of 4 entries
  const hashes: V[] = Array.from({ length: 10 }, (_, i) => ({ int: BigInt(100 + i), w: 'min' }));
  const tokens: V[] = Array.from({ length: 10 * BT }, (_, i) => ({ int: BigInt(i), w: 'min' }));
  const p = Uint8Array.from(enc([{ f: 1, w: 64 }, [['BlockStored', hashes, null, tokens, { int: BigInt(BT), w: 'min' }]], null]));
  const out = runNative([{ feed: 1, payload: p }], 4);
  tt.equal(out.totals[T.stored], 10);
  tt.equal(out.totals[T.forgotten], 6, 'six forgotten');
  tt.equal(out.index.mappedBlocks(1), 4, 'the map holds the limit');
  tt.equal(out.index.stats().blocks, 4, 'the index holds only blocks whose removal it can still recognise');
  // the newest four survive: the prompt's first block was forgotten, so nothing matches from the start
  const bytes = new Uint8Array(Uint32Array.from({ length: 10 * BT }, (_, i) => i).buffer);
  out.index.matchPrompt(bytes, PrefixIndex.seedFor(MODEL[1]!), cands, res);
  tt.equal(res.matched[1], 0, 'no claim for a chain whose head was forgotten');
  // a parent that is used stays: store 4 more under a parent refreshed by each store
  const idx = newIndex();
  idx.setEventMapLimit(3);
  const totals = new Float64Array(PAYLOAD_TOTALS_LENGTH);
  const [hi, lo] = seedPair(MODEL[1]!);
  const { ranks, off, len } = rankTable();
  const root = enc([{ f: 1, w: 64 }, [['BlockStored', [{ int: 1n, w: 'min' }], null, tokens.slice(0, BT), { int: BigInt(BT), w: 'min' }]], null]);
  idx.applyPayloads(Uint8Array.from(root), Uint32Array.of(1, 0, root.length, 1, off[1]!, len[1]!, hi, lo), 1, ranks, new Uint8Array(1), totals);
  for (let i = 0; i < 4; i++) {
    const child = enc([{ f: 1, w: 64 }, [['BlockStored', [{ int: BigInt(10 + i), w: 'min' }], { int: 1n, w: 'min' }, tokens.slice(BT * (i + 1), BT * (i + 2)), { int: BigInt(BT), w: 'min' }]], null]);
    idx.applyPayloads(Uint8Array.from(child), Uint32Array.of(1, 0, child.length, 1, off[1]!, len[1]!, hi, lo), 1, ranks, new Uint8Array(1), totals);
  }
  tt.equal(totals[T.orphans], 0, 'the parent, used by every store, was never forgotten');
  tt.equal(totals[T.forgotten], 2, 'the two oldest children were');
  tt.end();
});
