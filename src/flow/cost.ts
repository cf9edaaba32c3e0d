// What a request costs in a band with `fairness: tokens` (docs/flow-control.md,
// "Cost fairness"). At admission the router knows the prompt's length and the
// request's max_tokens, not yet how much of the prompt the engine has cached
// (the prefix producer matches at pick time, after admission) nor how long
// the answer will be. So:
//
//   estimate = promptTokens + outputEstimate
//     promptTokens   = ceil(promptBytes / 4)   (the body's bytes when the prompt is empty or unknown)
//     outputEstimate = min(max_tokens, learnt)  when the flow's output is learnt and max_tokens is set
//                    = learnt                   when learnt and there is no max_tokens
//                    = max_tokens               when not learnt yet
//                    = defaultOutputTokens      when neither (256 unless configured)
//                    capped at OUTPUT_ESTIMATE_CAP
//   real     = round(promptTokens × uncached) + outputTokens
//     uncached       = 1 - matchedBlocks / promptBlocks of the pick (1 when unknown)
//     outputTokens   = the answer's usage.completion_tokens, else the SSE chunks
//                      relayed (a streamed answer), else ceil(answer bytes / 4)
//
// Both are at least 1, never 0. The flow is charged the estimate when its
// request is dispatched from the queue, and the difference (real - estimate)
// when the request ends; `learnt` is an exponentially weighted mean of the
// flow's real output tokens (weight 1/4 for the newest).

/** Bytes of prompt text per token (the simulator's tokenizer; about right for English with real tokenizers). */
export const BYTES_PER_TOKEN = 4;
/** Largest output estimate charged at admission (a max_tokens of a billion is not a billion tokens of work). */
export const OUTPUT_ESTIMATE_CAP = 32768;
/** Weight of the newest sample in the learnt output estimate. */
const LEARN_RATE = 0.25;

/** Prompt tokens from the prompt's bytes (falling back to the body's bytes). */
export function promptTokensOf(promptBytes: number, bodyBytes: number): number {
  const b = promptBytes > 0 ? promptBytes : bodyBytes > 0 ? bodyBytes : 0;
  return Math.ceil(b / BYTES_PER_TOKEN);
}

/** The request's output cap: `max_completion_tokens` (chat) or `max_tokens`; -1 when absent or not a positive number. */
export function maxTokensOf(body: Readonly<Record<string, unknown>> | undefined): number {
  if (body === undefined) return -1;
  let v = body.max_completion_tokens;
  if (typeof v !== 'number') v = body.max_tokens;
  return typeof v === 'number' && v >= 1 ? Math.min(Math.floor(v), 0x7fffffff) : -1;
}

/** Output tokens expected of a request (see the formula above). `learnt` < 0: nothing learnt yet. */
export function outputEstimate(maxTokens: number, learnt: number, defaultOutput: number): number {
  let out: number;
  if (learnt >= 0) out = maxTokens >= 1 && maxTokens < learnt ? maxTokens : learnt;
  else out = maxTokens >= 1 ? maxTokens : defaultOutput;
  return out > OUTPUT_ESTIMATE_CAP ? OUTPUT_ESTIMATE_CAP : Math.round(out);
}

/** Estimated cost, at least 1. */
export function estimateCost(promptTokens: number, maxTokens: number, learnt: number, defaultOutput: number): number {
  const c = promptTokens + outputEstimate(maxTokens, learnt, defaultOutput);
  return c >= 1 ? c : 1;
}

/** Real cost once the request ended, at least 1. `outputTokens` < 0: unknown (the estimate stands for it). */
export function realCost(promptTokens: number, uncached: number, outputTokens: number, estimatedOutput: number): number {
  const u = uncached >= 0 && uncached <= 1 ? uncached : 1;
  const c = Math.round(promptTokens * u) + (outputTokens >= 0 ? outputTokens : estimatedOutput);
  return c >= 1 ? c : 1;
}

/** The learnt output estimate after one more sample. */
export function learnOutput(learnt: number, outputTokens: number): number {
  return learnt < 0 ? outputTokens : learnt + LEARN_RATE * (outputTokens - learnt);
}
