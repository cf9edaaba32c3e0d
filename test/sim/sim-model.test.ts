// The latency, prefix-cache and batching model over loopback: cached_tokens and
// a shorter TTFT on a repeated prompt, FIFO waiting beyond max-num-seqs (seen
// in vllm:num_requests_waiting), LRU eviction, and disconnects freeing capacity.
import t from 'tap';
import { startEngine } from '../../src/sim/index.js';
import { metric, post, scrape, send, sleep, sseData, until } from '../support/sim-util.js';

t.test('a repeated prompt hits the prefix cache: cached_tokens = its full blocks, shorter TTFT', async (t) => {
  // 250 tokens uncached cost 1 + 250 × 1 = 251 model ms → 100 ms wall at time-scale 0.4;
  // cached, 10 tokens cost 11 model ms → 4.4 ms.
  const e = await startEngine({ timeScale: 0.4, prefillOverheadMs: 1, prefillUsPerToken: 1000, itlMs: 1, blockSize: 16 });
  t.teardown(() => e.close());
  const prompt = 'a'.repeat(1000); // 250 tokens: 15 full blocks of 16
  const body = { model: 'open-model', prompt, max_tokens: 2, stream: true, stream_options: { include_usage: true } };
  const first = await post(e.url, '/v1/completions', body);
  const second = await post(e.url, '/v1/completions', body);
  const usage = (r: { body: string }) => JSON.parse(sseData(r.body).at(-2)!).usage;
  t.equal(usage(first).prompt_tokens_details.cached_tokens, 0);
  t.equal(usage(second).prompt_tokens_details.cached_tokens, 15 * 16);
  t.ok(first.firstByteMs >= 95, `uncached TTFT ${first.firstByteMs.toFixed(1)} ms ≥ 95 ms`);
  t.ok(second.firstByteMs < first.firstByteMs / 2, `cached TTFT ${second.firstByteMs.toFixed(1)} ms < half of ${first.firstByteMs.toFixed(1)} ms`);
  // A prompt that shares only the first 5 blocks reuses exactly those.
  const partial = await post(e.url, '/v1/completions', { prompt: 'a'.repeat(5 * 64) + 'b'.repeat(700), max_tokens: 1 });
  t.equal(JSON.parse(partial.body).usage.prompt_tokens_details.cached_tokens, 5 * 16);
  // A prompt that is an exact multiple of the block size keeps its last block uncached (the engine computes the last token).
  await post(e.url, '/v1/completions', { prompt: 'c'.repeat(128), max_tokens: 1 });
  const exact = await post(e.url, '/v1/completions', { prompt: 'c'.repeat(128), max_tokens: 1 });
  t.equal(JSON.parse(exact.body).usage.prompt_tokens_details.cached_tokens, 16);
  const ex = await scrape(e.url);
  t.equal(metric(ex, 'vllm:prefix_cache_hits_total'), 15 * 16 + 5 * 16 + 16);
  t.equal(metric(ex, 'vllm:prefix_cache_queries_total'), 250 * 2 + 255 + 32 * 2);
  // The TTFT histogram recorded the model times: one uncached (0.251 s) between 0.25 and 0.5.
  t.equal(metric(ex, 'vllm:time_to_first_token_seconds_count'), 5);
  t.ok(metric(ex, 'vllm:time_to_first_token_seconds_bucket', { le: '0.5' }) - metric(ex, 'vllm:time_to_first_token_seconds_bucket', { le: '0.25' }) >= 1);
});

t.test('requests beyond max-num-seqs wait FIFO and show in vllm:num_requests_waiting', async (t) => {
  // Each request decodes 20 tokens × 50 model ms = 1 s model = 50 ms wall at time-scale 0.05.
  const e = await startEngine({ timeScale: 0.05, maxNumSeqs: 2, prefillOverheadMs: 0, prefillUsPerToken: 0, itlMs: 50, decodeSlowdown: 0 });
  t.teardown(() => e.close());
  const pending = [0, 1, 2, 3, 4].map((i) => send(e.url, 'POST', '/v1/completions', { prompt: `request ${i}`, max_tokens: 20, stream: true }));
  t.ok(await until(() => e.stats().running + e.stats().waiting === 5), 'all five arrived');
  const ex = await scrape(e.url);
  t.equal(metric(ex, 'vllm:num_requests_running'), 2);
  t.equal(metric(ex, 'vllm:num_requests_waiting'), 3);
  t.ok(metric(ex, 'vllm:kv_cache_usage_perc') > 0, 'running requests hold KV blocks');
  const done = await Promise.all(pending.map((p) => p.done));
  for (const r of done) t.equal(sseData(r.body).at(-1), '[DONE]');
  const ttft = done.map((r) => r.firstByteMs);
  // Requests 0,1 start at once; 2,3 after ~50 ms; 4 after ~100 ms (FIFO).
  t.ok(Math.max(ttft[0]!, ttft[1]!) < Math.min(ttft[2]!, ttft[3]!), `first two start first: ${ttft.map((x) => x.toFixed(0))}`);
  t.ok(ttft[2]! >= 40 && ttft[3]! >= 40, `next two wait: ${ttft.slice(2, 4).map((x) => x.toFixed(0))}`);
  t.ok(ttft[4]! >= 85, `last waits two rounds: ${ttft[4]!.toFixed(0)}`);
  const after = await scrape(e.url);
  t.equal(metric(after, 'vllm:num_requests_running'), 0);
  t.equal(metric(after, 'vllm:num_requests_waiting'), 0);
  t.equal(metric(after, 'vllm:kv_cache_usage_perc'), 0);
  t.ok(metric(after, 'vllm:request_queue_time_seconds_sum') >= 2.5, 'queue time recorded in model seconds');
});

t.test('decode slows down as the batch grows (documented factor)', async (t) => {
  const e = await startEngine({ timeScale: 0.02, maxNumSeqs: 8, prefillOverheadMs: 0, prefillUsPerToken: 0, itlMs: 100, decodeSlowdown: 0.5 });
  t.teardown(() => e.close());
  const alone = await post(e.url, '/v1/completions', { prompt: 'solo', max_tokens: 20 });
  const batch = await Promise.all([0, 1, 2, 3].map((i) => post(e.url, '/v1/completions', { prompt: `b${i}`, max_tokens: 20 })));
  // Alone: 19 × 100 ms model = 38 ms wall. Four at once: factor 1 + 0.5 × 3 = 2.5 → 95 ms.
  const slowest = Math.max(...batch.map((r) => r.totalMs));
  t.ok(alone.totalMs >= 36, `alone ${alone.totalMs.toFixed(0)} ms ≥ 36 ms`);
  t.ok(slowest >= 88, `batch of 4 ${slowest.toFixed(0)} ms ≥ 88 ms (alone ${alone.totalMs.toFixed(0)} ms)`);
  const ex = await scrape(e.url);
  // ITL histogram in model seconds: 19 tokens at 0.1 s, then 4 × 19 tokens mostly at 0.25 s
  // (the first steps of the batch may run before all four have arrived).
  t.equal(metric(ex, 'vllm:inter_token_latency_seconds_count'), 5 * 19);
  t.ok(metric(ex, 'vllm:inter_token_latency_seconds_bucket', { le: '0.1' }) >= 19);
  t.ok(5 * 19 - metric(ex, 'vllm:inter_token_latency_seconds_bucket', { le: '0.2' }) >= 4 * 15);
});

t.test('LRU eviction once the KV cache is full', async (t) => {
  // 8 blocks of 4 tokens (16 bytes). Each prompt has 3 full blocks + 1 token and
  // max_tokens 1, so it needs 4 blocks while it runs and leaves 3 cached blocks.
  const e = await startEngine({ timeScale: 0, kvCacheBlocks: 8, blockSize: 4 });
  t.teardown(() => e.close());
  const P = (c: string) => c.repeat(49);
  const cached = async (c: string) => JSON.parse((await post(e.url, '/v1/completions', { prompt: P(c), max_tokens: 1 })).body).usage.prompt_tokens_details.cached_tokens;
  t.equal(await cached('a'), 0);
  t.equal(await cached('b'), 0);
  t.equal(e.stats().kvCachedBlocks, 6);
  t.equal(await cached('c'), 0, 'c evicts the two least recently used blocks (the tail of a)');
  t.equal(e.stats().evictions, 2);
  t.equal(await cached('b'), 12, 'b, more recent, is still whole');
  t.equal(await cached('a'), 4, 'a lost its tail blocks, kept its first');
  t.equal(e.stats().kvUsedBlocks, 0);
  // A request that can never fit is refused instead of waiting forever.
  const r = await post(e.url, '/v1/completions', { prompt: 'z'.repeat(200), max_tokens: 1 });
  t.equal(r.status, 400);
  t.match(JSON.parse(r.body).error.message, /needs 13 KV blocks but the cache holds 8/);
});

t.test('a full KV cache makes the head of the queue wait even with free slots', async (t) => {
  // 10 blocks of 4 tokens; each request needs 6 blocks (20 tokens of prompt + 4 generated). a decodes for
  // 400 ms wall, so b arrives while it runs even on a loaded machine (at 20 ms, a could end before b came)
  const e = await startEngine({ timeScale: 1, kvCacheBlocks: 10, blockSize: 4, maxNumSeqs: 8, prefillOverheadMs: 0, prefillUsPerToken: 0, itlMs: 100 });
  t.teardown(() => e.close());
  const a = send(e.url, 'POST', '/v1/completions', { prompt: 'x'.repeat(80), max_tokens: 4 });
  const b = send(e.url, 'POST', '/v1/completions', { prompt: 'y'.repeat(80), max_tokens: 4 });
  t.ok(await until(() => e.stats().running === 1 && e.stats().waiting === 1), 'second waits for blocks');
  t.equal(e.stats().kvUsedBlocks, 6);
  const [ra, rb] = await Promise.all([a.done, b.done]);
  t.equal(ra.status, 200);
  t.equal(rb.status, 200);
  t.ok(rb.totalMs > ra.totalMs, 'b finished after a');
});

t.test('a client disconnect mid-stream frees its slot and pinned blocks at once', async (t) => {
  // One slot; the first request would decode for 100 × 100 model ms = 10 s model = 1 s wall.
  const e = await startEngine({ timeScale: 0.1, maxNumSeqs: 1, prefillOverheadMs: 0, prefillUsPerToken: 0, itlMs: 100 });
  t.teardown(() => e.close());
  const long = send(e.url, 'POST', '/v1/chat/completions', { messages: [{ role: 'user', content: 'x'.repeat(300) }], max_tokens: 100, stream: true });
  await long.first;
  t.equal(e.stats().running, 1);
  t.ok(e.stats().kvUsedBlocks > 0);
  const queued = send(e.url, 'POST', '/v1/completions', { prompt: 'next', max_tokens: 2, stream: true });
  const gone = send(e.url, 'POST', '/v1/completions', { prompt: 'gives up', max_tokens: 2 });
  t.ok(await until(() => e.stats().waiting === 2), 'two wait behind the long one');
  gone.destroy(); // a waiting request leaves the queue
  t.ok(await until(() => e.stats().waiting === 1), 'the abandoned waiting request left the queue');
  const t0 = performance.now();
  long.destroy();
  const r = await Promise.race([queued.done, sleep(3000).then(() => ({ status: -1 }))]);
  const waited = performance.now() - t0;
  t.equal(r.status, 200);
  t.ok(waited < 300, `queued request ran ${waited.toFixed(0)} ms after the disconnect, not after the 1 s decode`);
  t.ok(await until(() => e.stats().running === 0 && e.stats().waiting === 0));
  t.equal(e.stats().kvUsedBlocks, 0, 'no pinned blocks left');
  t.equal(e.stats().aborted, 2);
  t.equal(e.stats().open, 0);
  const ex = await scrape(e.url);
  t.equal(metric(ex, 'vllm:num_requests_running'), 0);
  t.equal(metric(ex, 'vllm:kv_cache_usage_perc'), 0);
});

t.test('time-scale 0 answers at once', async (t) => {
  const e = await startEngine({ timeScale: 0, prefillOverheadMs: 1e6, itlMs: 1e6 });
  t.teardown(() => e.close());
  const r = await post(e.url, '/v1/completions', { prompt: 'x', max_tokens: 50, stream: true });
  t.equal(sseData(r.body).length, 51);
  t.ok(r.totalMs < 500, `${r.totalMs.toFixed(1)} ms`);
  const ex = await scrape(e.url);
  // Histograms still record model time: 1e6 ms prefill = 1000 s.
  t.equal(metric(ex, 'vllm:time_to_first_token_seconds_bucket', { le: '640.0' }), 0);
  t.equal(metric(ex, 'vllm:time_to_first_token_seconds_bucket', { le: '2560.0' }), 1);
});

t.test('LoRA adapters: at most max-loras distinct adapters run; lora_requests_info; separate prefix cache', async (t) => {
  const e = await startEngine({ timeScale: 0.05, loras: ['ad1', 'ad2'], maxLoras: 1, maxNumSeqs: 8, prefillOverheadMs: 0, prefillUsPerToken: 0, itlMs: 40 });
  t.teardown(() => e.close());
  const models = JSON.parse((await send(e.url, 'GET', '/v1/models').done).body).data;
  t.same(models.map((m: { id: string; parent: string | null }) => [m.id, m.parent]), [['open-model', null], ['ad1', 'open-model'], ['ad2', 'open-model']]);
  const a = send(e.url, 'POST', '/v1/completions', { model: 'ad1', prompt: 'one', max_tokens: 200 }); // 400 ms wall
  t.ok(await until(() => e.stats().running === 1));
  const b = send(e.url, 'POST', '/v1/completions', { model: 'ad2', prompt: 'two', max_tokens: 2 });
  t.ok(await until(() => e.stats().waiting === 1), 'ad2 waits: one adapter slot');
  const ex = await scrape(e.url);
  const info = ex.samples.find((s) => s.name === 'vllm:lora_requests_info')!;
  t.same(
    { max: info.labels.max_lora, running: info.labels.running_lora_adapters, waiting: info.labels.waiting_lora_adapters },
    { max: '1', running: 'ad1', waiting: 'ad2' },
  );
  t.ok(Math.abs(info.value - Date.now() / 1000) < 60, 'value is a timestamp');
  const c = send(e.url, 'POST', '/v1/completions', { model: 'ad1', prompt: 'three', max_tokens: 2 });
  const end = (p: typeof a) => p.done.then((r) => ({ status: r.status, at: performance.now() }));
  const rc = await end(c);
  t.equal(e.stats().waiting, 1, 'a later ad1 request went ahead of the ad2 one waiting for a slot (vLLM skips it)');
  const [ra, rb] = await Promise.all([end(a), end(b)]);
  t.same([ra.status, rb.status, rc.status], [200, 200, 200]);
  t.ok(rb.at > ra.at, 'ad2 finished after the long ad1 request (it could not start before)');
  t.ok(rc.at < ra.at, 'the later ad1 request did not wait for ad2');
  // The adapter's KV blocks are its own.
  const prompt = 'k'.repeat(400);
  const cached = async (model: string) => JSON.parse((await post(e.url, '/v1/completions', { model, prompt, max_tokens: 1 })).body).usage.prompt_tokens_details.cached_tokens;
  t.equal(await cached('open-model'), 0);
  t.equal(await cached('ad1'), 0, 'no hit across base model and adapter');
  t.equal(await cached('ad1'), 96);
  t.equal(await cached('open-model'), 96);
});

t.test('serial prefill: concurrent prefills queue for compute and stall running decodes', async (t) => {
  const base = { timeScale: 0.1, prefillOverheadMs: 0, prefillUsPerToken: 1000, itlMs: 10, decodeSlowdown: 0 };
  const ttftSum = async (serialPrefill: boolean) => {
    const e = await startEngine({ ...base, serialPrefill });
    try {
      // Two distinct 1000-token prompts at once: 1 s of model prefill each.
      await Promise.all(['x', 'y'].map((c) => post(e.url, '/v1/completions', { prompt: c.repeat(4000), max_tokens: 1 })));
      return metric(await scrape(e.url), 'vllm:time_to_first_token_seconds_sum');
    } finally {
      await e.close();
    }
  };
  const serial = await ttftSum(true);
  const parallel = await ttftSum(false);
  t.ok(serial >= 2.5, `serial: the second prefill waits for the first (TTFT sum ${serial.toFixed(2)} s ≈ 1 + 2)`);
  t.ok(parallel >= 1.99 && parallel < 2.2, `independent prefills (TTFT sum ${parallel.toFixed(2)} s ≈ 1 + 1)`);

  const stalls = async (serialPrefill: boolean) => {
    const e = await startEngine({ ...base, serialPrefill });
    try {
      const a = send(e.url, 'POST', '/v1/completions', { prompt: 'short', max_tokens: 40, stream: true });
      await a.first; // decoding
      await post(e.url, '/v1/completions', { prompt: 'z'.repeat(2000), max_tokens: 1 }); // 500 model ms of prefill
      await a.done;
      const ex = await scrape(e.url);
      return metric(ex, 'vllm:inter_token_latency_seconds_count') - metric(ex, 'vllm:inter_token_latency_seconds_bucket', { le: '0.4' });
    } finally {
      await e.close();
    }
  };
  t.equal(await stalls(true), 1, 'one token of the decoding request took 10 + 500 model ms');
  t.equal(await stalls(false), 0, 'without serial prefill, decoding is not disturbed');
});
