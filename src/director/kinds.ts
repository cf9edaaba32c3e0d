// The request kinds the director serves, and their paths. Chat and completions
// are inference (prompt rendered for prefix matching, sessions); the rest pass
// through to the model's endpoints as they are, routed on load alone (no
// prompt, no prefix recorded, no session): the OpenAI embeddings API and
// vLLM's score, rerank, tokenize and detokenize routes, each on the path the
// engine serves it (vLLM serves score and rerank with and without /v1, and
// rerank also at /v2).
export const KIND_CHAT = 0;
export const KIND_COMPLETION = 1;
export const KIND_EMBEDDINGS = 2;
export const KIND_PATHS = [
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
export const FIRST_PASSTHROUGH = KIND_EMBEDDINGS;

/** True for a kind relayed as is, without a prompt to match. */
export function isPassthrough(kind: number): boolean {
  return kind >= FIRST_PASSTHROUGH;
}
