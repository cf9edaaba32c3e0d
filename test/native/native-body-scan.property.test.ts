// The native body scan (native/body_scan.h, src/director/body-scan.ts) against
// the JavaScript path it replaces (parseRequestBody: jsonNestsDeeper,
// JSON.parse, PromptWriter): on generated bodies (escapes, surrogates lone and
// paired, invalid UTF-8, content parts, tools, token ids, duplicate keys,
// deep nesting, huge strings) and on random mutations of them, both accept
// the same bodies, render the same prompt bytes (so the same block hashes
// from PrefixIndex.hashPrompt) and give the same model and scalar fields; a
// body the scan falls back on is one the JavaScript path refuses. Runs under
// ASan+UBSan too (npm run test:asan), where hostile inputs must not read out
// of bounds.
import t from 'tap';
import { PrefixIndex } from '../../bindings/prefix-index.js';
import { scanRequestBody, SCAN_FALLBACK, SCAN_META_INTS, SCAN_OK } from '../../bindings/body-scan.js';
import { parseRequestBody, scalarFields } from '../../src/director/body.js';
import { BodyScanner } from '../../src/director/body-scan.js';
import { PromptWriter } from '../../src/director/prompt.js';

const asan = process.env.SWITCHYARD_UNDER_ASAN === '1';
const CHAT = 0;
const COMPLETION = 1;
const EMBEDDINGS = 2;

// a seeded generator (mulberry32): the same bodies every run
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let x = a;
    x = Math.imul(x ^ (x >>> 15), x | 1);
    x ^= x + Math.imul(x ^ (x >>> 7), x | 61);
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}

const index = new PrefixIndex({ blockSize: 16 } as never);
let hashes = new BigUint64Array(1 << 12);
function hashOf(p: Uint8Array): bigint[] {
  if (hashes.length < p.length / 16 + 1) hashes = new BigUint64Array(Math.ceil(p.length / 16) + 1);
  const n = index.hashPrompt(p, 7n, hashes);
  return Array.from(hashes.subarray(0, n));
}

const jsPw = new PromptWriter();
const nativePw = new PromptWriter();
const scanner = new BodyScanner();

/** What the JavaScript path answers, and what the scan answers. */
function both(raw: Buffer, kind: number, depth = 128) {
  const js = parseRequestBody(raw, kind, jsPw, depth);
  const jsPrompt = Buffer.from(jsPw.view());
  const nat = scanner.scan(raw, kind, nativePw, depth);
  const natPrompt = Buffer.from(nativePw.view());
  return { js, jsPrompt, nat, natPrompt };
}

function expected(body: Record<string, unknown>): Record<string, unknown> {
  const f = scalarFields(body);
  delete f['__proto__'];
  const so = body.stream_options;
  if (typeof so === 'object' && so !== null && !Array.isArray(so)) f.stream_options = (so as Record<string, unknown>).include_usage === true ? { include_usage: true } : {};
  return f;
}

let compared = 0;
let agreedValid = 0;
/** Asserts agreement; returns whether the body was valid. Reports only failures (the corpus is large). */
function agree(tt: Tap.Test, raw: Buffer, kind: number, what: string, depth = 128): boolean {
  compared++;
  const { js, jsPrompt, nat, natPrompt } = both(raw, kind, depth);
  if (!js.ok) {
    if (nat !== null) tt.fail(`${what}: the scan accepted a body the JavaScript path refuses (${js.message}): ${raw.subarray(0, 200).toString('latin1')}`);
    return false;
  }
  if (nat === null) {
    tt.fail(`${what}: the scan fell back on a body the JavaScript path accepts: ${raw.subarray(0, 200).toString('latin1')}`);
    return true;
  }
  if (nat.model !== js.model) tt.fail(`${what}: model ${JSON.stringify(nat.model)} vs ${JSON.stringify(js.model)}`);
  if (!natPrompt.equals(jsPrompt)) {
    tt.fail(`${what}: prompt bytes differ (${natPrompt.length} vs ${jsPrompt.length}): ${raw.subarray(0, 300).toString('latin1')}`);
    return true;
  }
  const a = hashOf(natPrompt);
  const b = hashOf(jsPrompt);
  if (a.length !== b.length || a.some((h, i) => h !== b[i])) tt.fail(`${what}: block hashes differ`);
  const ef = expected(js.body);
  const nf = nat.body;
  const ek = Object.keys(ef).sort();
  const nk = Object.keys(nf).sort();
  if (JSON.stringify(ek) !== JSON.stringify(nk)) tt.fail(`${what}: field names ${JSON.stringify(nk)} vs ${JSON.stringify(ek)}`);
  else
    for (const k of ek) {
      if (!Object.is(ef[k], nf[k]) && JSON.stringify(ef[k]) !== JSON.stringify(nf[k])) tt.fail(`${what}: field ${k}: ${String(nf[k])} vs ${String(ef[k])}`);
    }
  agreedValid++;
  return true;
}

// ---- generators: JSON text written by hand, so escapes and raw bytes are as chosen ----

const PIECES = [
  'hello',
  ' ',
  'world',
  '\\n',
  '\\t',
  '\\"',
  '\\\\',
  '\\/',
  '\\b',
  '\\f',
  '\\r',
  '\\u0041',
  '\\u00e9',
  '\\u20ac',
  '\\ud83d\\ude00', // a pair
  '\\ud83d', // lone high
  '\\ude00', // lone low
  '\\ud83d\\ud83d\\ude00', // lone high, then a pair
  '\\u0000',
  'é',
  '日本語',
  '😀',
  '{"not":"json"}',
  '<|im_start|>',
];
const RAW_BYTES = [
  [0x80],
  [0xff],
  [0xc3], // truncated 2-byte
  [0xe2, 0x82], // truncated 3-byte
  [0xed, 0xa0, 0x80], // an encoded surrogate
  [0xf0, 0x9f, 0x98], // truncated 4-byte
  [0xf4, 0x90, 0x80, 0x80], // above U+10FFFF
  [0xc0, 0xaf], // overlong
  [0xe0, 0x80, 0xaf], // overlong
  [0xf5, 0x80],
];

function jsonString(r: () => number, big = false): Buffer {
  const parts: Buffer[] = [Buffer.from('"')];
  const n = big ? 2000 + Math.floor(r() * 4000) : Math.floor(r() * 8);
  for (let i = 0; i < n; i++) {
    const x = r();
    if (x < 0.08) parts.push(Buffer.from(RAW_BYTES[Math.floor(r() * RAW_BYTES.length)]!));
    else parts.push(Buffer.from(PIECES[Math.floor(r() * PIECES.length)]!));
  }
  parts.push(Buffer.from('"'));
  return Buffer.concat(parts);
}

function ws(r: () => number): string {
  const x = r();
  return x < 0.7 ? '' : x < 0.8 ? ' ' : x < 0.9 ? '\n  ' : '\t\r\n';
}

function obj(r: () => number, members: [string, Buffer | string][]): Buffer {
  const out: Buffer[] = [Buffer.from('{' + ws(r))];
  members.forEach(([k, v], i) => {
    if (i > 0) out.push(Buffer.from(',' + ws(r)));
    out.push(Buffer.from(k), Buffer.from(ws(r) + ':' + ws(r)), typeof v === 'string' ? Buffer.from(v) : v);
  });
  out.push(Buffer.from(ws(r) + '}'));
  return Buffer.concat(out);
}

function arr(r: () => number, items: (Buffer | string)[]): Buffer {
  const out: Buffer[] = [Buffer.from('[' + ws(r))];
  items.forEach((v, i) => {
    if (i > 0) out.push(Buffer.from(',' + ws(r)));
    out.push(typeof v === 'string' ? Buffer.from(v) : v);
  });
  out.push(Buffer.from(ws(r) + ']'));
  return Buffer.concat(out);
}

function key(r: () => number, name: string): string {
  // sometimes spelled with an escape: the same key to JSON.parse
  if (r() < 0.1) return '"' + name.slice(0, 1) + '\\u00' + name.charCodeAt(1).toString(16) + name.slice(2) + '"';
  return JSON.stringify(name);
}

function tools(r: () => number, depth: number): Buffer {
  // a JSON schema nested `depth` levels
  let v: Buffer = Buffer.from('{"type":"string"}');
  for (let i = 0; i < depth; i++) v = obj(r, [['"type"', '"object"'], ['"properties"', obj(r, [['"p' + i + '"', v]])]]);
  return arr(r, [obj(r, [['"type"', '"function"'], ['"function"', obj(r, [['"name"', '"f"'], ['"parameters"', v]])]])]);
}

function part(r: () => number): Buffer {
  const x = r();
  if (x < 0.5) return obj(r, [['"type"', '"text"'], [key(r, 'text'), jsonString(r)]]);
  if (x < 0.7) return obj(r, [['"type"', '"image_url"'], [key(r, 'image_url'), obj(r, [[key(r, 'url'), jsonString(r)]])]]);
  if (x < 0.75) return obj(r, [['"text"', '5'], ['"image_url"', obj(r, [['"url"', jsonString(r)]])]]); // text not a string: the url
  if (x < 0.8) return obj(r, [['"image_url"', '"x"']]);
  if (x < 0.85) return Buffer.from(['"plain"', '1', 'null', '[]', 'true'][Math.floor(r() * 5)]!);
  if (x < 0.9) return obj(r, [['"text"', jsonString(r)], ['"text"', jsonString(r)]]); // duplicate: the last
  return obj(r, [['"text"', jsonString(r)], ['"image_url"', obj(r, [['"url"', jsonString(r)]])]]);
}

function message(r: () => number, big: boolean): Buffer {
  const members: [string, Buffer | string][] = [];
  const x = r();
  if (x < 0.9) members.push([key(r, 'role'), jsonString(r)]);
  else if (x < 0.95) members.push(['"role"', '7']);
  const y = r();
  if (y < 0.6) members.push([key(r, 'content'), jsonString(r, big && r() < 0.3)]);
  else if (y < 0.85)
    members.push([
      '"content"',
      arr(
        r,
        Array.from({ length: Math.floor(r() * 4) }, () => part(r)),
      ),
    ]);
  else if (y < 0.9) members.push(['"content"', 'null']);
  else if (y < 0.95) members.push(['"content"', jsonString(r)], ['"content"', jsonString(r)]);
  if (r() < 0.2) members.push(['"name"', jsonString(r)]);
  if (r() < 0.1) members.push(['"tool_calls"', arr(r, [obj(r, [['"id"', '"c1"'], ['"function"', obj(r, [['"name"', '"f"'], ['"arguments"', '"{\\"a\\":1}"']])]])])]);
  // members in a random order (role after content is still role first in the prompt)
  if (r() < 0.3) members.reverse();
  if (r() < 0.05) return arr(r, []); // an array as a message
  return obj(r, members);
}

function scalars(r: () => number): [string, string | Buffer][] {
  const out: [string, string | Buffer][] = [];
  if (r() < 0.5) out.push(['"stream"', r() < 0.5 ? 'true' : 'false']);
  if (r() < 0.5) out.push(['"max_tokens"', ['16', '1', '0', '-1', '1e3', '2.5', '1E400', '-0'][Math.floor(r() * 8)]!]);
  if (r() < 0.3) out.push(['"max_completion_tokens"', '32']);
  if (r() < 0.3) out.push(['"temperature"', '0.7']);
  if (r() < 0.3) out.push(['"user"', jsonString(r)]);
  if (r() < 0.3) out.push([key(r, 'prompt_cache_key'), jsonString(r)]);
  if (r() < 0.3) out.push(['"stream_options"', obj(r, [['"include_usage"', r() < 0.7 ? 'true' : '1']])]);
  if (r() < 0.1) out.push(['"seed"', 'null']);
  if (r() < 0.1) out.push(['"__proto__"', 'null']);
  if (r() < 0.1) out.push(['"stream"', '{"x":1}']); // a duplicate made an object: left out
  if (r() < 0.1) out.push(['"n\\u00e9"', '"k\\u00e9y"']); // an escaped key
  return out;
}

function chatBody(r: () => number, big = false): Buffer {
  const members: [string, Buffer | string][] = [];
  const model = r() < 0.95 ? (r() < 0.1 ? '"m\\u006fdel-\\u00e9"' : '"llama-3"') : r() < 0.5 ? '""' : '3';
  if (r() < 0.97) members.push([key(r, 'model'), model]);
  const n = Math.floor(r() * 5);
  if (r() < 0.97)
    members.push([
      key(r, 'messages'),
      arr(
        r,
        Array.from({ length: n }, () => message(r, big)),
      ),
    ]);
  if (r() < 0.2) members.push(['"tools"', tools(r, Math.floor(r() * 6))]);
  members.push(...scalars(r));
  for (let i = members.length - 1; i > 0; i--) {
    const j = Math.floor(r() * (i + 1));
    [members[i], members[j]] = [members[j]!, members[i]!];
  }
  return Buffer.concat([Buffer.from(ws(r)), obj(r, members), Buffer.from(ws(r))]);
}

function completionBody(r: () => number, big = false): Buffer {
  const members: [string, Buffer | string][] = [['"model"', '"m"']];
  const x = r();
  let prompt: Buffer | string;
  if (x < 0.4) prompt = jsonString(r, big);
  else if (x < 0.55) prompt = arr(r, [jsonString(r), jsonString(r)]);
  else if (x < 0.75) prompt = arr(r, Array.from({ length: 1 + Math.floor(r() * 6) }, () => ['0', '1', '50256', '4294967295', '4294967296', '1e2', '1.0', '-0', '9007199254740993', '1e300'][Math.floor(r() * 10)]!));
  else if (x < 0.85) prompt = arr(r, [arr(r, ['1', '2', '3']), arr(r, ['4'])]);
  else if (x < 0.9) prompt = arr(r, [['-1', '1.5', '"a"', 'null', '[]', '{}'][Math.floor(r() * 6)]!]);
  else if (x < 0.95) prompt = arr(r, []);
  else prompt = ['null', '5', '{}', '[[]]'][Math.floor(r() * 4)]!;
  members.push([key(r, 'prompt'), prompt], ...scalars(r));
  return obj(r, members);
}

function mutate(r: () => number, b: Buffer): Buffer {
  const x = r();
  const at = Math.floor(r() * (b.length + 1));
  const SET = [0x22, 0x5c, 0x7b, 0x7d, 0x5b, 0x5d, 0x2c, 0x3a, 0x20, 0x00, 0x0a, 0x80, 0xff, 0x75, 0x30, 0x2d, 0x65, 0x2e];
  const ch = SET[Math.floor(r() * SET.length)]!;
  if (x < 0.25) return Buffer.concat([b.subarray(0, at), b.subarray(at + 1)]); // delete a byte
  if (x < 0.5) return Buffer.concat([b.subarray(0, at), Buffer.from([ch]), b.subarray(at)]); // insert one
  if (x < 0.75) {
    const c = Buffer.from(b);
    if (at < c.length) c[at] = ch;
    return c;
  }
  if (x < 0.9) return b.subarray(0, at); // truncate
  const len = Math.floor(r() * 16);
  return Buffer.concat([b.subarray(0, at), b.subarray(at, at + len), b.subarray(at)]); // repeat a slice
}

t.test('generated chat and completions bodies: the same verdict, prompt bytes, hashes and fields', async (tt) => {
  const r = rng(37);
  const N = asan ? 600 : 3000;
  let valid = 0;
  for (let i = 0; i < N; i++) {
    if (agree(tt, chatBody(r), CHAT, `chat #${i}`)) valid++;
    if (agree(tt, completionBody(r), COMPLETION, `completion #${i}`)) valid++;
  }
  tt.ok(valid > N / 2, `most generated bodies are valid (${valid} of ${2 * N})`);
  tt.ok(agreedValid === valid, `every valid body agreed (${agreedValid})`);
});

t.test('passthrough kinds: model only, no prompt', async (tt) => {
  const r = rng(7);
  for (let i = 0; i < 300; i++) agree(tt, chatBody(r), EMBEDDINGS, `embeddings #${i}`);
  agree(tt, Buffer.from('{"input":"x"}'), EMBEDDINGS, 'no model');
  const s = scanner.scan(Buffer.from('{"input":"x"}'), EMBEDDINGS, nativePw, 128);
  tt.same(s && s.model, '', 'a passthrough body without a model: the empty model');
});

t.test('random mutations of valid bodies: the scan and JSON.parse agree on valid and invalid', async (tt) => {
  const r = rng(1234);
  const N = asan ? 1500 : 8000;
  let invalid = 0;
  for (let i = 0; i < N; i++) {
    const kind = r() < 0.7 ? CHAT : COMPLETION;
    let b = kind === CHAT ? chatBody(r) : completionBody(r);
    const k = 1 + Math.floor(r() * 3);
    for (let j = 0; j < k; j++) b = mutate(r, b);
    if (!agree(tt, b, kind, `mutation #${i}`)) invalid++;
  }
  tt.ok(invalid > N / 4, `mutations made invalid bodies (${invalid} of ${N})`);
});

t.test('huge strings, many messages, deep nesting at the bound', async (tt) => {
  const r = rng(99);
  for (let i = 0; i < (asan ? 10 : 40); i++) agree(tt, chatBody(r, true), CHAT, `big chat #${i}`);
  for (let i = 0; i < (asan ? 10 : 40); i++) agree(tt, completionBody(r, true), COMPLETION, `big completion #${i}`);
  // a 2 MB single string, ASCII and with escapes and multi-byte text throughout
  const big = 'x'.repeat(1 << 20) + '\\n\\u00e9é😀'.repeat(1 << 16);
  tt.ok(agree(tt, Buffer.from(`{"model":"m","messages":[{"role":"user","content":"${big}"}]}`), CHAT, '2 MB string'));
  // 10,000 messages
  const many = Array.from({ length: 10_000 }, (_, i) => `{"role":"user","content":"turn ${i}"}`).join(',');
  tt.ok(agree(tt, Buffer.from(`{"model":"m","messages":[${many}]}`), CHAT, '10k messages'));
  // nesting: exactly at the bound is accepted, one deeper is refused by both
  // the top-level object is one level and the messages three: `t` nesting k arrays makes 1 + k
  const nested = (k: number) => Buffer.from(`{"model":"m","messages":[{"role":"u","content":"x"}],"t":${'['.repeat(k) + ']'.repeat(k) || '1'}}`);
  for (const bound of [3, 5, 128]) {
    tt.equal(agree(tt, nested(bound - 1), CHAT, `depth ${bound}`, bound), true, `depth ${bound} within a bound of ${bound}: accepted`);
    tt.equal(agree(tt, nested(bound), CHAT, `depth ${bound + 1}`, bound), false, `depth ${bound + 1} over a bound of ${bound}: refused`);
  }
  tt.equal(agree(tt, nested(0), CHAT, 'messages over a bound of 2', 2), false, 'the messages themselves over the bound');
  // a million levels: refused quickly, and no C stack exhausted
  const deep = Buffer.from('{"model":"m","messages":' + '['.repeat(1_000_000) + ']'.repeat(1_000_000) + '}');
  tt.equal(agree(tt, deep, CHAT, 'a million levels', 128), false);
  tt.equal(agree(tt, deep, CHAT, 'a million levels within the bound', 10_000), false);
});

t.test('hostile inputs: truncations of every length, lone bytes, empty', async (tt) => {
  const meta = new Int32Array(SCAN_META_INTS);
  const out = new Uint8Array(1 << 16);
  const body = Buffer.from('{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a\\ud83d\\ude00b\\u00"},{"image_url":{"url":"\\"x"}}]}],"stream":true}');
  for (let n = 0; n <= body.length; n++) {
    // a truncated copy in a buffer of exactly its size: ASan sees any read past its end
    const cut = Buffer.from(body.subarray(0, n));
    agree(tt, cut, CHAT, `truncated to ${n}`);
    const st = scanRequestBody(new Uint8Array(cut), CHAT, 128, out, meta);
    if (n < body.length && st !== SCAN_FALLBACK) tt.fail(`a truncation to ${n} bytes was not refused`);
  }
  for (let b = 0; b < 256; b++) agree(tt, Buffer.from([b]), CHAT, `byte ${b}`);
  agree(tt, Buffer.alloc(0), CHAT, 'empty');
  tt.equal(scanRequestBody(new Uint8Array(0), CHAT, 128, out, meta), SCAN_FALLBACK);
  // out too small: asked again with the size it needs
  const small = new Uint8Array(4);
  const st = scanRequestBody(Buffer.from('{"model":"m","prompt":"0123456789"}'), COMPLETION, 128, small, meta);
  tt.equal(st, 2, 'too small: status 2');
  tt.equal(meta[0], 10, 'with the length needed');
  tt.equal(scanRequestBody(Buffer.from('{"model":"m","prompt":"0123456789"}'), COMPLETION, 128, new Uint8Array(10), meta), SCAN_OK);
  // token ids grow past the body's length: the scanner's second call
  const ids = Array.from({ length: 5000 }, () => '1').join(',');
  tt.ok(agree(tt, Buffer.from(`{"model":"m","prompt":[${ids}]}`), COMPLETION, '5000 one-digit ids'));
  // more members than the scanner lists: it falls back, the JavaScript path answers
  const wide = Buffer.from('{"model":"m","prompt":"x",' + Array.from({ length: 300 }, (_, i) => `"k${i}":${i}`).join(',') + '}');
  tt.equal(scanner.scan(wide, COMPLETION, nativePw, 128), null, '300 members: fall back');
  tt.throws(() => scanRequestBody(Buffer.from('{}'), CHAT, 128, out, new Int32Array(4)), /meta must be/);
});

t.test('the string table of the scanner and integer reading: repeated, colliding and changing keys and values, every number form', async (tt) => {
  // one scanner over many bodies: strings it has seen come from its table, so a value must never be an earlier one's
  const r = rng(99);
  const words = ['model', 'user', 'stream', 'max_tokens', 'a', 'b', 'é', 'x'.repeat(47), 'y'.repeat(48), 'z'.repeat(49), '\u20ac', ''];
  const numbers = ['0', '-0', '7', '-7', '123456789012345', '-123456789012345', '1234567890123456', '9007199254740993', '1.5', '-2.25', '1e3', '1E-2', '0.1', '-0.0', '12e+2'];
  for (let i = 0; i < 4000; i++) {
    const fields: string[] = [`"model":"m${Math.floor(r() * 200)}"`];
    const n = Math.floor(r() * 5);
    for (let j = 0; j < n; j++) {
      const key = r() < 0.5 ? words[Math.floor(r() * words.length)]! : `k${Math.floor(r() * 300)}`;
      const v =
        r() < 0.5
          ? numbers[Math.floor(r() * numbers.length)]!
          : JSON.stringify(r() < 0.5 ? words[Math.floor(r() * words.length)]! : `v${Math.floor(r() * 1000)}`);
      fields.push(`${JSON.stringify(key)}:${v}`);
    }
    fields.push('"prompt":"p"');
    agree(tt, Buffer.from(`{${fields.join(',')}}`), COMPLETION, `table #${i}`);
  }
  tt.pass('every body agreed (failures are reported one by one)');
});

t.test('summary', async (tt) => {
  tt.ok(compared > 10_000 || asan, `${compared} bodies compared, ${agreedValid} valid ones agreed`);
});
