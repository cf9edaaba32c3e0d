// Scenario `quality`: what prefix- and load-aware routing buys over the
// baselines, on a fleet of simulated engines with limited KV capacity and
// realistic times. For each policy and request rate, a fresh fleet and a fresh
// router are started (so no policy inherits another's warm caches), then one
// workload is replayed with Poisson arrivals over streaming requests.
//
// Workloads:
//   shared-prefix: groups × prompts per group, a long system prompt per group,
//                  a unique question per prompt, a fixed output length;
//   multi-turn:    agent sessions that resend their growing history each turn.
// Reported per run: TTFT p50/p90, end-to-end p50, output tokens/s, prefix-cache
// hit rate from the engines' own usage.prompt_tokens_details.cached_tokens, and
// the hit-rate bound of a perfect router (every full block already seen by any
// earlier request counts as a hit: an infinite cache; the report states whether
// the workload's distinct blocks fit in the fleet's capacity).
//
//   node dist/bench/quality.js [--quick] [--rates 5,10,20] [--workloads shared-prefix,multi-turn]
//                              [--policies round-robin,least-request,switchyard] [--json out.json]
import { writeFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Pool } from 'undici';
import { CLI, freePort, freePortRange, start, waitReady } from './lib/proc.js';
import { expGap, fmt, quantile, rng } from './lib/stats.js';

export const POLICIES: Record<string, string> = {
  'round-robin': 'scheduling:\n  scorers: []\n  picker: round-robin\n',
  'least-request': 'scheduling:\n  scorers: []\n  picker: least-request\n',
  switchyard: '', // the router's defaults: prefix-cache 3, queue 2, kv-cache-utilization 2, max-score
};

export interface FleetShape {
  engines: number;
  kvCacheBlocks: number;
  blockSize: number; // tokens
  maxNumSeqs: number;
  prefillUsPerToken: number;
  prefillOverheadMs: number;
  itlMs: number;
}

export const FLEET: FleetShape = {
  engines: 8,
  kvCacheBlocks: 1216,
  blockSize: 16,
  maxNumSeqs: 16,
  prefillUsPerToken: 50,
  prefillOverheadMs: 5,
  itlMs: 20,
};

const BYTES_PER_TOKEN = 4; // the simulator's tokenizer (src/sim/tokenizer.ts)

/** One request of a workload: a prompt (completions) or messages (chat). */
interface Turn {
  session: number;
  prompt?: string;
  user?: string;
  maxTokens: number;
}

interface Result {
  ttft: number[];
  e2e: number[];
  promptTokens: number;
  cachedTokens: number;
  outputTokens: number;
  errors: number;
  wallS: number;
  prompts: string[]; // rendered prompts in send order, for the bound
}

function text(rand: () => number, bytes: number): string {
  const words = ['alpha', 'bravo', 'cargo', 'delta', 'ember', 'forge', 'gamma', 'harbor', 'ionic', 'jolt', 'kernel', 'lumen'];
  let s = '';
  while (s.length < bytes) s += words[Math.floor(rand() * words.length)] + ' ';
  return s.slice(0, bytes);
}

export interface SharedPrefixShape {
  groups: number;
  systemTokens: number;
  questionTokens: number;
  outputTokens: number;
}

function sharedPrefixTurns(shape: SharedPrefixShape, n: number, seed: number): Turn[] {
  const rand = rng(seed);
  const systems = Array.from({ length: shape.groups }, (_, g) => `[group ${g}] ` + text(rand, shape.systemTokens * BYTES_PER_TOKEN));
  const turns: Turn[] = [];
  for (let i = 0; i < n; i++) {
    const g = Math.floor(rand() * shape.groups);
    turns.push({ session: i, prompt: systems[g] + '\nQ' + i + ': ' + text(rand, shape.questionTokens * BYTES_PER_TOKEN), maxTokens: shape.outputTokens });
  }
  return turns;
}

export interface MultiTurnShape {
  turns: number;
  systemTokens: number;
  userTokens: number;
  outputTokens: number;
}

/** Chat template of the simulator: `<|role|>\ncontent\n` per message, then `<|assistant|>\n`. */
function render(messages: Array<{ role: string; content: string }>): string {
  let s = '';
  for (const m of messages) s += `<|${m.role}|>\n${m.content}\n`;
  return s + '<|assistant|>\n';
}

async function sendStream(pool: Pool, path: string, body: string, res: Result): Promise<{ text: string } | null> {
  const t0 = performance.now();
  let first = 0;
  let text = '';
  let tail = '';
  try {
    const r = await pool.request({ method: 'POST', path, headers: { 'content-type': 'application/json' }, body });
    if (r.statusCode !== 200) {
      await r.body.dump();
      res.errors++;
      return null;
    }
    for await (const chunk of r.body) {
      if (!first) first = performance.now();
      tail += (chunk as Buffer).toString('utf8');
      let nl: number;
      while ((nl = tail.indexOf('\n\n')) >= 0) {
        const ev = tail.slice(0, nl);
        tail = tail.slice(nl + 2);
        if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
        const j = JSON.parse(ev.slice(6));
        if (j.error) {
          res.errors++;
          return null;
        }
        const c = j.choices?.[0];
        if (c) text += c.delta?.content ?? c.text ?? '';
        if (j.usage) {
          res.promptTokens += j.usage.prompt_tokens;
          res.outputTokens += j.usage.completion_tokens;
          res.cachedTokens += j.usage.prompt_tokens_details?.cached_tokens ?? 0;
        }
      }
    }
  } catch {
    res.errors++;
    return null;
  }
  const t1 = performance.now();
  res.ttft.push(first - t0);
  res.e2e.push(t1 - t0);
  return { text };
}

export async function runLoad(url: string, workload: string, rate: number, n: number, seed: number): Promise<Result> {
  const pool = new Pool(url, { connections: 1024, pipelining: 1 });
  const res: Result = { ttft: [], e2e: [], promptTokens: 0, cachedTokens: 0, outputTokens: 0, errors: 0, wallS: 0, prompts: [] };
  const rand = rng(seed ^ 0x9e3779b9);
  const pending: Promise<unknown>[] = [];
  const t0 = performance.now();
  let at = 0;
  const sleepUntil = async (ms: number) => {
    const d = ms - (performance.now() - t0);
    if (d > 0) await new Promise((r) => setTimeout(r, d));
  };
  if (workload === 'shared-prefix') {
    for (const turn of sharedPrefixTurns(SHARED, n, seed)) {
      at += expGap(rand, rate) * 1000;
      await sleepUntil(at);
      res.prompts.push(turn.prompt!);
      const body = JSON.stringify({ model: 'open-model', prompt: turn.prompt, max_tokens: turn.maxTokens, stream: true, stream_options: { include_usage: true } });
      pending.push(sendStream(pool, '/v1/completions', body, res));
    }
  } else {
    // Sessions arrive as a Poisson process of rate / turns, so requests arrive at about `rate`.
    const sessions = Math.max(1, Math.round(n / MULTI.turns));
    const trand = rng(seed);
    for (let s = 0; s < sessions; s++) {
      at += expGap(rand, rate / MULTI.turns) * 1000;
      await sleepUntil(at);
      const messages = [{ role: 'system', content: `[agent ${s}] ` + text(trand, MULTI.systemTokens * BYTES_PER_TOKEN) }];
      const userTexts = Array.from({ length: MULTI.turns }, (_, t) => `turn ${t}: ` + text(trand, MULTI.userTokens * BYTES_PER_TOKEN));
      pending.push(
        (async () => {
          for (let t = 0; t < MULTI.turns; t++) {
            messages.push({ role: 'user', content: userTexts[t]! });
            res.prompts.push(render(messages));
            const body = JSON.stringify({ model: 'open-model', messages, max_tokens: MULTI.outputTokens, stream: true, stream_options: { include_usage: true } });
            const r = await sendStream(pool, '/v1/chat/completions', body, res);
            if (!r) return;
            messages.push({ role: 'assistant', content: r.text });
          }
        })(),
      );
    }
  }
  await Promise.all(pending);
  res.wallS = (performance.now() - t0) / 1000;
  await pool.close();
  return res;
}

/** Hit-rate bound of a perfect router with an infinite cache: leading full blocks seen before / prompt tokens. */
export function hitBound(prompts: string[], blockTokens: number): { rate: number; distinctBlocks: number } {
  const seen = new Set<string>();
  const blockBytes = blockTokens * BYTES_PER_TOKEN;
  let hit = 0;
  let total = 0;
  for (const p of prompts) {
    const bytes = Buffer.byteLength(p);
    const tokens = Math.ceil(bytes / BYTES_PER_TOKEN);
    total += tokens;
    const full = Math.floor(tokens / blockTokens);
    let leading = true;
    for (let b = 0; b < full; b++) {
      const key = p.slice(0, (b + 1) * blockBytes); // ASCII workloads: chars = bytes
      if (leading && seen.has(key)) hit += blockTokens;
      else leading = false;
      seen.add(key);
    }
  }
  return { rate: total ? hit / total : 0, distinctBlocks: seen.size };
}

let SHARED: SharedPrefixShape = { groups: 16, systemTokens: 2048, questionTokens: 256, outputTokens: 128 };
let MULTI: MultiTurnShape = { turns: 6, systemTokens: 1024, userTokens: 128, outputTokens: 64 };

export interface Row {
  workload: string;
  policy: string;
  rate: number;
  requests: number;
  ttftP50: number;
  ttftP90: number;
  e2eP50: number;
  outTokS: number;
  hitRate: number;
  bound: number;
  errors: number;
}

export async function runQuality(argv: string[]): Promise<{ rows: Row[]; config: string }> {
  const arg = (name: string) => {
    const i = argv.indexOf(name);
    return i >= 0 ? argv[i + 1] : undefined;
  };
  const quick = argv.includes('--quick');
  if (quick) {
    SHARED = { groups: 16, systemTokens: 1024, questionTokens: 128, outputTokens: 32 };
    MULTI = { turns: 4, systemTokens: 512, userTokens: 64, outputTokens: 32 };
  }
  const rates = (arg('--rates') ?? (quick ? '10,40' : '5,10,20,30,40,60')).split(',').map(Number);
  const workloads = (arg('--workloads') ?? 'shared-prefix,multi-turn').split(',');
  const policies = (arg('--policies') ?? 'round-robin,least-request,switchyard').split(',');
  const seconds = Number(arg('--seconds') ?? (quick ? 4 : 12));
  const fleet = { ...FLEET, kvCacheBlocks: quick ? 600 : FLEET.kvCacheBlocks };
  const dir = mkdtempSync(join(tmpdir(), 'swy-quality-'));
  const rows: Row[] = [];
  for (const workload of workloads) {
    for (const rate of rates) {
      const n = Math.max(48, Math.round(rate * seconds));
      for (const policy of policies) {
        if (!(policy in POLICIES)) throw new Error(`unknown policy ${policy}`);
        const base = await freePortRange(fleet.engines);
        const sim = start('sim', process.execPath, [
          CLI, 'sim', '--fleet', String(fleet.engines), '--base-port', String(base),
          '--max-num-seqs', String(fleet.maxNumSeqs), '--kv-cache-blocks', String(fleet.kvCacheBlocks),
          '--block-size', String(fleet.blockSize), '--prefill-us-per-token', String(fleet.prefillUsPerToken),
          '--prefill-overhead-ms', String(fleet.prefillOverheadMs), '--itl-ms', String(fleet.itlMs), '--default-max-tokens', '16',
        ]);
        for (let i = 0; i < fleet.engines; i++) await waitReady(`http://127.0.0.1:${base + i}/health`);
        const port = await freePort();
        const cfg = join(dir, `${policy}.yaml`);
        const endpoints = Array.from({ length: fleet.engines }, (_, i) => `        - { name: e${i}, url: "http://127.0.0.1:${base + i}" }`).join('\n');
        writeFileSync(
          cfg,
          `apiVersion: switchyard/v1\nkind: Router\nlisten: { host: 127.0.0.1, port: ${port} }\n` +
            `pools:\n  - name: sim\n    engine: vllm\n    models: [open-model]\n    endpoints:\n${endpoints}\n` +
            POLICIES[policy],
        );
        const router = start('router', process.execPath, [CLI, 'serve', '--config', cfg]);
        try {
          await waitReady(`http://127.0.0.1:${port}/readyz`);
          const r = await runLoad(`http://127.0.0.1:${port}`, workload, rate, n, 1234 + rate);
          const bound = hitBound(r.prompts, fleet.blockSize);
          const row: Row = {
            workload, policy, rate, requests: r.prompts.length,
            ttftP50: quantile(r.ttft, 0.5), ttftP90: quantile(r.ttft, 0.9), e2eP50: quantile(r.e2e, 0.5),
            outTokS: r.outputTokens / r.wallS, hitRate: r.promptTokens ? r.cachedTokens / r.promptTokens : 0,
            bound: bound.rate, errors: r.errors,
          };
          rows.push(row);
          console.error(
            `${workload} rate=${rate}/s ${policy}: ttft p50 ${fmt(row.ttftP50)} ms p90 ${fmt(row.ttftP90)} ms, e2e p50 ${fmt(row.e2eP50)} ms, ` +
              `${fmt(row.outTokS)} out tok/s, hit ${fmt(row.hitRate * 100)}% (bound ${fmt(row.bound * 100)}%, ${bound.distinctBlocks} distinct blocks vs fleet ${fleet.engines * fleet.kvCacheBlocks}), errors ${r.errors}`,
          );
        } finally {
          await router.stop();
          await sim.stop();
        }
      }
    }
  }
  const config =
    `fleet: ${fleet.engines} simulated vLLM engines, kv-cache-blocks ${fleet.kvCacheBlocks} × ${fleet.blockSize} tokens, max-num-seqs ${fleet.maxNumSeqs}, ` +
    `prefill ${fleet.prefillOverheadMs} ms + ${fleet.prefillUsPerToken} µs/uncached token, ITL ${fleet.itlMs} ms; ` +
    `shared-prefix: ${SHARED.groups} groups, ${SHARED.systemTokens}-token system prompt, ${SHARED.questionTokens}-token question, ${SHARED.outputTokens} output tokens; ` +
    `multi-turn: ${MULTI.turns} turns, ${MULTI.systemTokens}-token system prompt, ${MULTI.userTokens}-token user turns, ${MULTI.outputTokens} output tokens; ` +
    `~${seconds} s of Poisson arrivals per rate (at least 48 requests)`;
  const json = arg('--json');
  if (json) writeFileSync(json, JSON.stringify({ config, rows }, null, 2));
  return { rows, config };
}

export function qualityTable(rows: Row[]): string {
  let md = '| workload | rate (req/s) | policy | requests | TTFT p50 (ms) | TTFT p90 (ms) | e2e p50 (ms) | output tok/s | hit rate | bound | errors |\n';
  md += '|---|---|---|---|---|---|---|---|---|---|---|\n';
  for (const r of rows) {
    md += `| ${r.workload} | ${r.rate} | ${r.policy} | ${r.requests} | ${fmt(r.ttftP50)} | ${fmt(r.ttftP90)} | ${fmt(r.e2eP50)} | ${fmt(r.outTokS)} | ${fmt(r.hitRate * 100)}% | ${fmt(r.bound * 100)}% | ${r.errors} |\n`;
  }
  return md;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { rows, config } = await runQuality(process.argv.slice(2));
  console.log(config + '\n');
  console.log(qualityTable(rows));
}
