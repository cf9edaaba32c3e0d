// The request kinds the director serves, and their paths. Chat and completions
// are inference (prompt rendered for prefix matching, sessions); the rest pass
// through to the model's endpoints as they are, routed on load alone (no
// prompt, no prefix recorded, no session): the OpenAI embeddings API and
// vLLM's score, rerank, tokenize and detokenize routes, each on the path the
// engine serves it (vLLM serves score and rerank with and without /v1, and
// rerank also at /v2).
//
// `Kind` is a const enum: every use compiles to the number, no lookup. Its
// non-negative members index KIND_PATHS; Responses (-1) is served by the
// Responses API (src/responses/), which calls the director with Chat.
export const enum Kind {
  Responses = -1,
  Chat = 0,
  Completion = 1,
  Embeddings = 2,
  Score = 3,
  ScoreBare = 4,
  Rerank = 5,
  RerankBare = 6,
  RerankV2 = 7,
  Tokenize = 8,
  Detokenize = 9,
}
/** The names other areas import (the same numbers as Kind). */
export const KIND_RESPONSES = Kind.Responses;
export const KIND_CHAT = Kind.Chat;
export const KIND_COMPLETION = Kind.Completion;
export const KIND_EMBEDDINGS = Kind.Embeddings;
/** The path of each kind, indexed by its number (Kind.Chat … Kind.Detokenize). */
export const KIND_PATHS: readonly string[] = [
  '/v1/chat/completions',
  '/v1/completions',
  '/v1/embeddings',
  '/v1/score',
  '/score',
  '/v1/rerank',
  '/rerank',
  '/v2/rerank',
  '/tokenize',
  '/detokenize',
];
/** Kinds from here on pass through (load-aware routing only). */
export const FIRST_PASSTHROUGH = Kind.Embeddings;

/** True for a kind relayed as is, without a prompt to match. */
export function isPassthrough(kind: Kind): boolean {
  return kind >= FIRST_PASSTHROUGH;
}
