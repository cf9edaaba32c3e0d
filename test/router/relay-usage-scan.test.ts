// The usage scan of an answer (src/director/relay.ts): lastIndexOfTail, the
// search that finds `"completion_tokens":` / `"prompt_tokens":` near a
// chunk's end without a native call, against Buffer.lastIndexOf as the
// reference (occurrences anywhere, across the tail's edge, none, several,
// partial ones), and the counts it reads from a real answer's shape.
import t from 'tap';
import fc from 'fast-check';
import { lastIndexOfTail, needle, scanCompletionTokens, scanPromptTokens } from '../../src/director/relay.js';

const NEEDLES = ['"completion_tokens":', '"prompt_tokens":', 'aa', 'aab'];
const piece = fc.oneof(
  { weight: 3, arbitrary: fc.string({ unit: fc.constantFrom('a', 'b', '"', ':', 'c', 'p', '_', ' ', '1'), maxLength: 40 }) },
  { weight: 2, arbitrary: fc.constantFrom(...NEEDLES) },
  { weight: 1, arbitrary: fc.constantFrom('"completion_tokens', '"prompt_tokens"', 'completion_tokens":') },
  // filler that moves occurrences across the 512-byte tail's edge
  { weight: 1, arbitrary: fc.integer({ min: 1, max: 700 }).map((n) => 'x'.repeat(n)) },
);

t.test('lastIndexOfTail finds what Buffer.lastIndexOf finds', async (t) => {
  fc.assert(
    fc.property(fc.array(piece, { maxLength: 30 }), fc.constantFrom(...NEEDLES), (parts, n) => {
      const chunk = Buffer.from(parts.join(''), 'latin1');
      return lastIndexOfTail(chunk, needle(n)) === chunk.lastIndexOf(Buffer.from(n, 'latin1'));
    }),
    { numRuns: 5000 },
  );
  // every offset around the tail's edge, for a needle that ends past it and one that starts before it
  const n = '"completion_tokens":';
  for (let len = 500; len <= 560; len++) {
    for (let at = 470; at + n.length <= len; at++) {
      const chunk = Buffer.alloc(len, 'x');
      chunk.write(n, at, 'latin1');
      if (lastIndexOfTail(chunk, needle(n)) !== at) t.fail(`len ${len}, at ${at}`);
    }
  }
  t.equal(lastIndexOfTail(Buffer.alloc(0), needle(n)), -1, 'an empty chunk');
  t.equal(lastIndexOfTail(Buffer.from('"completion_tokens"'), needle(n)), -1, 'a chunk shorter than the needle');
});

t.test('the counts of an answer', async (t) => {
  const answer = Buffer.from(
    '{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" \\"completion_tokens\\": 99","finish_reason":"length"}],' +
      '"usage":{"prompt_tokens":3,"total_tokens":7,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":0}}}',
  );
  t.equal(scanCompletionTokens(answer), 4, "the usage's completion_tokens (the last occurrence)");
  t.equal(scanPromptTokens(answer), 3, "the usage's prompt_tokens, not prompt_tokens_details");
  const long = Buffer.concat([Buffer.from(`{"text":"${'y'.repeat(4000)}","usage":{"prompt_tokens": 12,`), Buffer.from(`${' '.repeat(600)}"completion_tokens": 345}}`)]);
  t.equal(scanCompletionTokens(long), 345);
  t.equal(scanPromptTokens(long), 12, 'prompt_tokens before the tail: found by Buffer.lastIndexOf');
  t.equal(scanCompletionTokens(Buffer.from('{"usage":{"completion_tokens":12')), -1, 'a count cut by the chunk end');
  t.equal(scanCompletionTokens(Buffer.from('{"choices":[]}')), -1, 'none');
});
