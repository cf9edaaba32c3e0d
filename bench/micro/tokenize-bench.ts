// Tokenization benchmark (`node dist/bench/micro/tokenize-bench.js`): what precise
// mode's tokenization adds to a request before the pick, per tokenizer, with
// the token cache warm (the prompt seen before) and cold, against the
// scheduler's own pick of the same request in the same run (the baseline the
// added time is compared to); and the tokens/s of the Hugging Face worker pool.
//
// Prompts: 8 KiB chat prompts (a shared 6 KiB system prompt + a unique question).
// Tokenizers: the simulator's (in process), the engine's POST /tokenize (a
// simulated engine over loopback), Hugging Face tokenizer.json in piscina
// workers (test/fixtures/hf-tiny: a tiny BPE, so its tokens/s is the pool's
// overhead, not a real vocabulary's cost).
import { fileURLToPath } from 'node:url';
import { API_VERSION, validateConfig } from '../../src/config/schema.js';
import { EndpointSet } from '../../src/endpoints/endpoint.js';
import { Scheduler } from '../../src/scheduler/scheduler.js';
import { startEngine } from '../../src/sim/index.js';
import { HfTokenizer } from '../../src/tokenize/hf-tokenizer.js';
import { TokenSource } from '../../src/tokenize/source.js';
import { EngineTokenizer, SimTokenizer, type Tokenizer } from '../../src/tokenize/tokenizer.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const QUICK = process.argv.includes('--quick');
const N = QUICK ? 300 : 2000;
const SYSTEM = 'You are a helpful assistant that answers briefly. '.repeat(120).slice(0, 6144);

function q(a: number[], p: number): number {
  const s = [...a].sort((x, y) => x - y);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))]!;
}

async function time(src: TokenSource, prompts: string[]): Promise<number[]> {
  const out: number[] = [];
  for (const p of prompts) {
    const messages = [
      { role: 'system', content: SYSTEM },
      { role: 'user', content: p },
    ];
    const bytes = Buffer.from(SYSTEM + p);
    const t0 = performance.now();
    const r = src.tokens({ model: 'm', messages }, bytes);
    if (r instanceof Promise) await r;
    out.push((performance.now() - t0) * 1000);
  }
  return out;
}

async function main(): Promise<void> {
  const engine = await startEngine({ timeScale: 0, models: ['m'] });
  const hfDir = fileURLToPath(new URL('../../../test/fixtures/hf-tiny', import.meta.url));
  const tokenizers: [string, Tokenizer][] = [
    ['simulator (in process)', new SimTokenizer()],
    ['engine POST /tokenize', new EngineTokenizer(() => engine.url)],
    ['Hugging Face (piscina)', new HfTokenizer(hfDir)],
  ];
  // baseline: the pick of the same request (precise producer off), in this run
  const cfg = validateConfig({ apiVersion: API_VERSION, kind: 'Router', pools: [{ name: 'p', models: ['m'], endpoints: [1, 2, 3, 4].map((i) => ({ url: `http://127.0.0.1:${i}` })) }] });
  const sched = new Scheduler(new EndpointSet(cfg.pools, cfg.dataLayer), cfg.scheduling);
  const pickUs: number[] = [];
  for (let i = 0; i < N; i++) {
    const prompt = Buffer.from(SYSTEM + `question ${i}`);
    const t0 = performance.now();
    const d = sched.pick({ model: 'm', prompt })!;
    pickUs.push((performance.now() - t0) * 1000);
    sched.complete(d, 'ok');
  }
  const rows: string[] = [`| (baseline) the pick itself | ${q(pickUs, 0.5).toFixed(1)} | ${q(pickUs, 0.99).toFixed(1)} | — | — |`];
  for (const [name, tok] of tokenizers) {
    const src = new TokenSource(new Map([['m', { tokenizer: tok, timeoutMs: 5000, cacheEntries: 100000 }]]));
    const prompts = Array.from({ length: N }, (_, i) => `question number ${i}?`);
    const cold = await time(src, prompts);
    const warm = await time(src, prompts);
    const line = `| ${name} | ${q(cold, 0.5).toFixed(1)} | ${q(cold, 0.99).toFixed(1)} | ${q(warm, 0.5).toFixed(1)} | ${q(warm, 0.99).toFixed(1)} |`;
    rows.push(line);
    console.log(line);
  }
  // pool throughput: many prompts in flight at once
  const hf = tokenizers[2]![1];
  const t0 = performance.now();
  let toks = 0;
  const batch = Array.from({ length: N }, (_, i) => hf.tokenize({ model: 'm', prompt: SYSTEM + ` question ${i}` }) as Promise<Uint8Array>);
  for (const b of await Promise.all(batch)) toks += b.length / 4;
  const tps = toks / ((performance.now() - t0) / 1000);
  for (const [, t] of tokenizers) await t.close?.();
  await engine.close();
  await sched.close();
  console.log(
    [
      '',
      'Command: `npm run build && node dist/bench/micro/tokenize-bench.js`',
      '',
      `${N} chat prompts of ~6 KiB (shared system prompt + unique question); time from asking the token source to having the tokens (what the request waits before its pick), µs. Warm = the same prompts again (token cache hit: one native hash of the prompt bytes + a Map lookup).`,
      '',
      '| tokenizer | cold p50 | cold p99 | warm p50 | warm p99 |',
      '|---|---|---|---|---|',
      ...rows,
      '',
      `Hugging Face worker pool (2 threads, tiny BPE fixture): ${(tps / 1e6).toFixed(2)} M tokens/s with ${N} prompts in flight.`,
    ].join('\n'),
  );
}

void main();
