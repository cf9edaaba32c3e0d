// usageOf: the tokens a batch line's answer used, as the batch quota's correction reads them. An engine's
// usage is not trusted: only non-negative integers count, so a lying engine cannot refund a tenant's quota.
import t from 'tap';
import { usageOf } from '../../src/batch/quota.js';

t.test('usage read from chat, completions and Responses answers', async (t) => {
  t.equal(usageOf(200, JSON.stringify({ usage: { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 } })), 15);
  t.equal(usageOf(200, JSON.stringify({ usage: { prompt_tokens: 10, completion_tokens: 5 } })), 15, 'no total: prompt + completion');
  t.equal(usageOf(200, JSON.stringify({ usage: { input_tokens: 7, output_tokens: 3 } })), 10, 'a Responses answer');
  t.equal(usageOf(200, 'data: {"x":1}\n\n'), undefined, 'a streamed answer: no usage, the estimate stays');
  t.equal(usageOf(500, '{"error":{}}'), 0, 'an error answer without usage used none');
});

t.test('an engine that lies about usage does not refund the quota', async (t) => {
  for (const bad of [-1_000_000_000, -1, 1.5, Number.MAX_SAFE_INTEGER + 2, '15', null]) {
    const body = JSON.stringify({ usage: { total_tokens: bad, prompt_tokens: bad, completion_tokens: bad } });
    t.equal(usageOf(200, body), undefined, `total ${JSON.stringify(bad)}: not a count, the estimate stays`);
  }
  t.equal(usageOf(200, JSON.stringify({ usage: { total_tokens: -5, prompt_tokens: 4, completion_tokens: -3 } })), 4, 'a bad part counts as none, not as a refund');
});
