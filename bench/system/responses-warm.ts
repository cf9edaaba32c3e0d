// Issue 13, benchmark 1: warm vs cold turn through the Responses API.
// A conversation's first turn carries ~4,000 tokens; its second turn goes
// through `previous_response_id` (the router rebuilds the context and the
// prefix scorer sends it to the engine that holds turn 1's KV). The cold
// request carries the same full context (turn 1's input and output, turn 2's
// input, as input items, no previous_response_id) through an identical router
// to a fresh engine that never saw it. TTFT = time from sending the request
// to the first `response.output_text.delta` event, both streamed. Each side:
// one simulated engine (default timings: prefill 5 ms + 50 µs per uncached
// token, --time-scale 1) and one router (memory store), each in its own
// process; conversations alternate warm/cold so drift hits both.
//   node dist/bench/responses-warm.js [--conversations 12] [--tokens 4000] [--json]
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CLI, freePort, start, waitReady, runMain, option, type Proc } from '../lib/proc.js';
import { median } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const argv = process.argv.slice(2);
const conversations = Number(option(argv, '--conversations') ?? '12');
const tokens = Number(option(argv, '--tokens') ?? '4000');
const BYTES_PER_TOKEN = 4; // the simulator's tokenizer (src/sim/tokenizer.ts)

async function fleetAndRouter(name: string, procs: Proc[]): Promise<string> {
  const [ep, rp] = [await freePort(), await freePort()];
  procs.push(start(`${name}-engine`, process.execPath, [CLI, 'sim', '--port', String(ep), '--max-model-len', '32768']));
  const cfg = join(mkdtempSync(join(tmpdir(), 'swy-resp-warm-')), 'router.yaml');
  writeFileSync(
    cfg,
    `apiVersion: switchyard/v1\nkind: Router\nlisten: { host: 127.0.0.1, port: ${rp} }\nlogging: { level: warn }\n` +
      `pools:\n  - { name: p, models: [open-model], endpoints: [{ name: e0, url: "http://127.0.0.1:${ep}" }] }\n`,
  );
  procs.push(start(`${name}-router`, process.execPath, [CLI, 'serve', '--config', cfg]));
  await waitReady(`http://127.0.0.1:${ep}/health`);
  await waitReady(`http://127.0.0.1:${rp}/readyz`);
  return `http://127.0.0.1:${rp}`;
}

/** Streams a Responses request; resolves with TTFT (ms), the final response and the output text. */
async function streamed(url: string, body: Record<string, unknown>): Promise<{ ttftMs: number; response: any; text: string }> {
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/responses`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...body, stream: true }) });
  if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  const dec = new TextDecoder();
  let buf = '';
  let ttft = -1;
  let response: any = null;
  let text = '';
  for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
    buf += dec.decode(chunk, { stream: true });
    let at: number;
    while ((at = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, at);
      buf = buf.slice(at + 2);
      const data = ev.split('\n').find((l) => l.startsWith('data: '));
      if (!data) continue;
      const o = JSON.parse(data.slice(6));
      if (o.type === 'response.output_text.delta') {
        if (ttft < 0) ttft = performance.now() - t0;
        text += o.delta;
      } else if (o.type === 'response.completed' || o.type === 'response.incomplete' || o.type === 'response.failed') response = o.response;
    }
  }
  return { ttftMs: ttft, response, text };
}

function filler(seed: number, bytes: number): string {
  const words = ['router', 'engine', 'prefix', 'cache', 'token', 'agent', 'session', 'turn', 'block', 'queue'];
  let s = `Conversation ${seed}: `;
  let i = seed * 7919;
  while (s.length < bytes) {
    i = (i * 1103515245 + 12345) & 0x7fffffff;
    s += words[i % words.length] + ' ';
  }
  return s.slice(0, bytes);
}

async function main(): Promise<void> {
  const procs: Proc[] = [];
  try {
    const warmUrl = await fleetAndRouter('warm', procs);
    const coldUrl = await fleetAndRouter('cold', procs);
    const warm: number[] = [];
    const cold: number[] = [];
    const cached: number[] = [];
    const firstTtft: number[] = [];
    for (let c = 0; c < conversations + 1; c++) {
      const first = filler(c, tokens * BYTES_PER_TOKEN);
      const t1 = await streamed(warmUrl, { model: 'open-model', input: first, max_output_tokens: 16 });
      const next = `Now summarise conversation ${c} in one line.`;
      const doWarm = () => streamed(warmUrl, { model: 'open-model', input: next, previous_response_id: t1.response.id, max_output_tokens: 16 });
      const doCold = () =>
        streamed(coldUrl, {
          model: 'open-model',
          input: [
            { role: 'user', content: first },
            { role: 'assistant', content: [{ type: 'output_text', text: t1.text }] },
            { role: 'user', content: next },
          ],
          max_output_tokens: 16,
        });
      // alternate which goes first
      const [w, k] = c % 2 === 0 ? [await doWarm(), await doCold()] : await (async () => { const k = await doCold(); return [await doWarm(), k]; })();
      if (c === 0) continue; // warm-up conversation (JIT, connections)
      firstTtft.push(t1.ttftMs);
      warm.push(w.ttftMs);
      cold.push(k.ttftMs);
      cached.push(w.response.usage.input_tokens_details.cached_tokens / w.response.usage.input_tokens);
      if (k.response.usage.input_tokens !== w.response.usage.input_tokens) {
        throw new Error(`cold and warm prompts differ: ${k.response.usage.input_tokens} vs ${w.response.usage.input_tokens} tokens`);
      }
    }
    const out = {
      conversations,
      promptTokens: tokens,
      firstTurnTtftMsMedian: median(firstTtft),
      warmTtftMsMedian: median(warm),
      coldTtftMsMedian: median(cold),
      ratioColdOverWarm: median(cold) / median(warm),
      ratioPerConversationMin: Math.min(...cold.map((x, i) => x / warm[i]!)),
      warmCachedFractionMedian: median(cached),
      warm,
      cold,
    };
    if (argv.includes('--json')) console.log(JSON.stringify(out));
    else {
      console.log(`conversations: ${conversations}, first turn ≈ ${tokens} tokens`);
      console.log(`first turn TTFT median: ${out.firstTurnTtftMsMedian.toFixed(1)} ms`);
      console.log(`warm turn 2 (previous_response_id) TTFT median: ${out.warmTtftMsMedian.toFixed(1)} ms (cached ${(out.warmCachedFractionMedian * 100).toFixed(1)} % of prompt)`);
      console.log(`cold (same context, fresh engine) TTFT median: ${out.coldTtftMsMedian.toFixed(1)} ms`);
      console.log(`cold/warm: ${out.ratioColdOverWarm.toFixed(2)}x (worst conversation ${out.ratioPerConversationMin.toFixed(2)}x)`);
    }
  } finally {
    await Promise.all(procs.map((p) => p.stop()));
  }
}

runMain(main);
