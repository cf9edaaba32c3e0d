// bench/lib/parallel-engine.ts: its prefill runs in parallel up to its slots
// (unlike the simulator's serial prefill), its cost factor slows everything by
// that factor, and it answers like an OpenAI/vLLM engine over real sockets.
import t from 'tap';
import { ParallelEngine } from '../../bench/lib/parallel-engine.js';

const prompt = 'x'.repeat(4 * 2000); // 2000 tokens: 5 + 500 ms of prefill at factor 1

async function ttft(url: string, stream = true): Promise<{ ms: number; status: number; text: string }> {
  const t0 = performance.now();
  const r = await fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'open-model', prompt, max_tokens: 2, stream }) });
  const reader = r.body!.getReader();
  const first = await reader.read();
  const ms = performance.now() - t0;
  let text = new TextDecoder().decode(first.value ?? new Uint8Array());
  for (;;) {
    const n = await reader.read();
    if (n.done) break;
    text += new TextDecoder().decode(n.value);
  }
  return { ms, status: r.status, text };
}

t.test('four prompts at once prefill together: each takes well under the serial sum', async (t) => {
  const e = new ParallelEngine({ port: 0, contention: 0, timeScale: 0.2 });
  const url = await e.listen();
  t.teardown(() => e.close());
  const alone = (await ttft(url)).ms;
  const four = await Promise.all([ttft(url), ttft(url), ttft(url), ttft(url)]);
  t.equal(e.maxConcurrentPrefills, 4);
  const worst = Math.max(...four.map((x) => x.ms));
  // serial would be ~4× alone; perfect parallelism ~1×
  t.ok(worst < alone * 2.5, `worst of four ${worst.toFixed(0)} ms vs alone ${alone.toFixed(0)} ms`);
  t.match(four[0]!.text, /data: \[DONE\]/);
});

t.test('cost factor 3 takes about 3× as long; metrics and errors look like vLLM', async (t) => {
  const fast = new ParallelEngine({ port: 0, timeScale: 0.6 });
  const slow = new ParallelEngine({ port: 0, timeScale: 0.6, costFactor: 3 });
  const [fu, su] = [await fast.listen(), await slow.listen()];
  t.teardown(() => Promise.all([fast.close(), slow.close()]));
  const f = (await ttft(fu, false)).ms;
  const s = (await ttft(su, false)).ms;
  t.ok(s / f > 1.8 && s / f < 4.5, `slow/fast ${(s / f).toFixed(2)}`);
  const m = await (await fetch(`${fu}/metrics`)).text();
  t.match(m, /vllm:num_requests_waiting\{model_name="open-model"\} 0/);
  t.match(m, /vllm:num_requests_running\{model_name="open-model"\} 0/);
  t.match(m, /vllm:kv_cache_usage_perc\{model_name="open-model"\} 0/);
  t.equal((await fetch(`${fu}/health`)).status, 200);
  t.match(await (await fetch(`${fu}/v1/models`)).json(), { data: [{ id: 'open-model' }] });
  const bad = await fetch(`${fu}/v1/chat/completions`, { method: 'POST', body: '{"model":"open-model"}' });
  t.equal(bad.status, 400);
  t.match(await bad.json(), { error: { message: /messages/, type: 'invalid_request_error' } });
  const chat = await fetch(`${fu}/v1/chat/completions`, { method: 'POST', body: JSON.stringify({ model: 'open-model', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 }) });
  t.match(await chat.json(), { object: 'chat.completion', choices: [{ message: { content: 't0 t1 t2 ' } }], usage: { completion_tokens: 3 } });
});
