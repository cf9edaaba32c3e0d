// The simulator's answers for the routes that generate nothing: embeddings,
// score, rerank and detokenize (tokenize lives in engine.ts beside the
// tokenizer it shares with generation). Deterministic and cheap: an embedding
// is a unit vector drawn from a seed hashed out of the input text (same text,
// same vector, on every engine), a score is the cosine of two such vectors
// mapped to [0, 1]. Shapes follow vLLM's OpenAI-compatible server; each
// function returns the JSON text of the answer or throws PoolingError.
import { BYTES_PER_TOKEN, countTokens } from './tokenizer.js';
import { SwitchyardError } from '../errors.js';

/** Dimension of a simulated embedding unless the request asks for `dimensions`. */
export const EMBEDDING_DIM = 64;
const MAX_DIM = 4096;
const MAX_INPUTS = 2048;

export class PoolingError extends SwitchyardError {
  constructor(
    message: string,
    readonly param: string | null,
  ) {
    super(message, { code: 'SWY_ERR_SIM_POOLING' });
  }
}

function fnv(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193);
  return h >>> 0;
}

/** A unit vector of `dim` values for `text` (xorshift32 from its hash). */
export function embed(text: string, dim: number): number[] {
  let x = fnv(text) || 1;
  const v = new Array<number>(dim);
  let norm = 0;
  for (let i = 0; i < dim; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    const u = ((x >>> 0) / 0xffffffff) * 2 - 1;
    v[i] = u;
    norm += u * u;
  }
  norm = Math.sqrt(norm) || 1;
  for (let i = 0; i < dim; i++) v[i] = Math.round((v[i]! / norm) * 1e6) / 1e6;
  return v;
}

function cosine01(a: string, b: string): number {
  const x = embed(a, EMBEDDING_DIM);
  const y = embed(b, EMBEDDING_DIM);
  let dot = 0;
  for (let i = 0; i < EMBEDDING_DIM; i++) dot += x[i]! * y[i]!;
  return Math.round(((dot + 1) / 2) * 1e6) / 1e6;
}

/** Token ids → text: the inverse of the simulator's byte tokenizer (4 UTF-8 bytes per id, little-endian). */
export function detokenizeIds(ids: readonly number[]): string {
  const bytes = Buffer.allocUnsafe(ids.length * BYTES_PER_TOKEN);
  let n = 0;
  for (const id of ids) {
    let v = id;
    for (let j = 0; j < BYTES_PER_TOKEN; j++) {
      bytes[n++] = v % 256;
      v = Math.floor(v / 256);
    }
  }
  while (n > 0 && bytes[n - 1] === 0) n--;
  return bytes.toString('utf8', 0, n);
}

function isTokenIds(v: unknown): v is number[] {
  return Array.isArray(v) && v.length > 0 && v.every((t) => Number.isInteger(t) && t >= 0);
}

/** The texts of an embeddings `input`: a string, strings, token ids, or lists of token ids. */
function inputs(input: unknown): string[] {
  if (typeof input === 'string') return [input];
  if (isTokenIds(input)) return [detokenizeIds(input)];
  if (Array.isArray(input) && input.length > 0 && input.length <= MAX_INPUTS) {
    if (input.every((s) => typeof s === 'string')) return input as string[];
    if (input.every(isTokenIds)) return (input as number[][]).map(detokenizeIds);
  }
  throw new PoolingError(`'input' must be a string, a list of strings, token ids or lists of token ids (at most ${MAX_INPUTS})`, 'input');
}

/** POST /v1/embeddings. */
export function embeddings(body: Record<string, unknown>, modelJson: string, id: string, created: number): string {
  const texts = inputs(body.input);
  let dim = EMBEDDING_DIM;
  const d = body.dimensions;
  if (d !== undefined && d !== null) {
    if (typeof d !== 'number' || !Number.isInteger(d) || d < 1 || d > MAX_DIM) throw new PoolingError(`'dimensions' must be an integer in [1, ${MAX_DIM}]`, 'dimensions');
    dim = d;
  }
  const fmt = body.encoding_format;
  if (fmt !== undefined && fmt !== null && fmt !== 'float') throw new PoolingError("the simulator answers only 'encoding_format': 'float'", 'encoding_format');
  let tokens = 0;
  const data = texts.map((t, index) => {
    tokens += countTokens(t);
    return `{"index":${index},"object":"embedding","embedding":[${embed(t, dim).join(',')}]}`;
  });
  return `{"id":"embd-${id}","object":"list","created":${created},"model":${modelJson},"data":[${data.join(',')}],"usage":{"prompt_tokens":${tokens},"total_tokens":${tokens},"completion_tokens":0,"prompt_tokens_details":null}}`;
}

function textList(v: unknown, field: string): string[] {
  if (typeof v === 'string') return [v];
  if (Array.isArray(v) && v.length > 0 && v.length <= MAX_INPUTS && v.every((s) => typeof s === 'string')) return v as string[];
  throw new PoolingError(`'${field}' must be a string or a non-empty list of strings`, field);
}

/** POST /score, /v1/score: `text_1` against each of `text_2` (or pairwise when both are lists of one length). */
export function score(body: Record<string, unknown>, modelJson: string, id: string, created: number): string {
  const a = textList(body.text_1, 'text_1');
  const b = textList(body.text_2, 'text_2');
  if (a.length !== 1 && a.length !== b.length) throw new PoolingError("'text_1' must hold one text or as many as 'text_2'", 'text_1');
  let tokens = 0;
  const data = b.map((t, index) => {
    const q = a.length === 1 ? a[0]! : a[index]!;
    tokens += countTokens(q) + countTokens(t);
    return `{"index":${index},"object":"score","score":${cosine01(q, t)}}`;
  });
  return `{"id":"score-${id}","object":"list","created":${created},"model":${modelJson},"data":[${data.join(',')}],"usage":{"prompt_tokens":${tokens},"total_tokens":${tokens},"completion_tokens":0,"prompt_tokens_details":null}}`;
}

/** POST /rerank, /v1/rerank, /v2/rerank: `documents` ordered by relevance to `query`, the first `top_n`. */
export function rerank(body: Record<string, unknown>, modelJson: string, id: string): string {
  const q = body.query;
  if (typeof q !== 'string') throw new PoolingError("'query' must be a string", 'query');
  const docs = textList(body.documents, 'documents');
  const topN = body.top_n;
  if (topN !== undefined && topN !== null && (typeof topN !== 'number' || !Number.isInteger(topN) || topN < 0)) {
    throw new PoolingError("'top_n' must be an integer >= 0", 'top_n');
  }
  let tokens = 0;
  const ranked = docs.map((text, index) => {
    tokens += countTokens(q) + countTokens(text);
    return { index, text, s: cosine01(q, text) };
  });
  ranked.sort((x, y) => y.s - x.s || x.index - y.index);
  const n = typeof topN === 'number' && topN > 0 ? Math.min(topN, ranked.length) : ranked.length;
  const results = ranked.slice(0, n).map((r) => `{"index":${r.index},"document":{"text":${JSON.stringify(r.text)}},"relevance_score":${r.s}}`);
  return `{"id":"rerank-${id}","model":${modelJson},"usage":{"total_tokens":${tokens}},"results":[${results.join(',')}]}`;
}

/** POST /detokenize: `tokens` (ids) → `prompt`. */
export function detokenize(body: Record<string, unknown>): string {
  const ids = body.tokens;
  if (!Array.isArray(ids) || !ids.every((t) => Number.isInteger(t) && t >= 0)) throw new PoolingError("'tokens' must be a list of token ids", 'tokens');
  return `{"prompt":${JSON.stringify(detokenizeIds(ids as number[]))}}`;
}
