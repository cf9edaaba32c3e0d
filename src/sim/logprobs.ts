// Log probabilities in vLLM's shapes, seeded like the text: chat's `logprobs.content` entries
// ({token, logprob, bytes, top_logprobs}) and completions' {text_offset, token_logprobs, tokens, top_logprobs}.

import { mix32, word, WORDS } from './text.js';

/** The most top_logprobs (chat) or logprobs (completions) a request may ask for (vLLM's default max_logprobs). */
export const MAX_LOGPROBS = 20;

/** The sampled token i's logprob: in (-2, 0], three decimals. */
function logprob(seed: number, i: number): number {
  return -(mix32((seed ^ 0x1096) + Math.imul(i + 1, 0x85ebca6b)) % 2000) / 1000;
}

/** Alternative j (1-based) at token i: a token other than the sampled one, less likely. */
function alternative(seed: number, i: number, j: number, sampled: string): string {
  let w = WORDS[mix32((seed ^ 0x2a1) + Math.imul(i + 1, 0x9e3779b9) + j) % WORDS.length]!;
  if (w === sampled) w = WORDS[(WORDS.indexOf(w) + j) % WORDS.length]!;
  return w;
}

function bytes(w: string): string {
  let s = '[';
  for (let k = 0; k < w.length; k++) s += (k === 0 ? '' : ',') + w.charCodeAt(k);
  return s + ']';
}

/** Chat: the logprobs.content entry of generated token i with k alternatives (the sampled token first). */
export function chatEntry(seed: number, i: number, k: number): string {
  const w = word(seed, i);
  const lp = logprob(seed, i);
  let top = '';
  for (let j = 0; j < k; j++) {
    const t = j === 0 ? w : alternative(seed, i, j, w);
    top += `${j === 0 ? '' : ','}{"token":"${t}","logprob":${j === 0 ? lp : lp - 0.5 * j - 0.25},"bytes":${bytes(t)}}`;
  }
  return `{"token":"${w}","logprob":${lp},"bytes":${bytes(w)},"top_logprobs":[${top}]}`;
}

/** Chat: the choice's logprobs for tokens [from, to). */
export function chatLogprobs(seed: number, from: number, to: number, k: number): string {
  let s = '{"content":[';
  for (let i = from; i < to; i++) s += (i === from ? '' : ',') + chatEntry(seed, i, k);
  return s + ']}';
}

/** Completions: the choice's logprobs for tokens [from, to); `offset`: the text's length before token `from`. */
export function completionLogprobs(seed: number, from: number, to: number, k: number, offset: number): string {
  let offs = '';
  let lps = '';
  let toks = '';
  let tops = '';
  for (let i = from; i < to; i++) {
    const w = word(seed, i);
    const lp = logprob(seed, i);
    const sep = i === from ? '' : ',';
    offs += sep + (offset + 4 * (i - from));
    lps += sep + lp;
    toks += `${sep}"${w}"`;
    let top = '';
    for (let j = 0; j < k; j++) top += `${j === 0 ? '' : ','}"${j === 0 ? w : alternative(seed, i, j, w)}":${j === 0 ? lp : lp - 0.5 * j - 0.25}`;
    tops += `${sep}{${top}}`;
  }
  return `{"text_offset":[${offs}],"token_logprobs":[${lps}],"tokens":[${toks}],"top_logprobs":[${tops}]}`;
}
