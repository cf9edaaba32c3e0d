// Scenario `agent`: an agent workload on a KV-bound fleet. 64 conversations ×
// 8 turns, short outputs, a context that grows every turn, through the
// Responses API (each turn a streamed POST /v1/responses with the agent's
// system prompt as `instructions` and `previous_response_id` naming the
// previous turn: the router rebuilds the conversation), on simulated engines whose KV cache holds
// only a few conversations each. By default every conversation is the same
// agent (one system prompt: instructions and tools) on its own task (in the
// first turn); --distinct-system gives each conversation its own system
// prompt instead (every first turn then a cold prefill). Conversations start as a Poisson process at
// each rate (conversation starts per second; the highest rates have all 64
// running at once); each turn follows the previous one's answer after a short
// tool-call pause. Policies, each on a fresh fleet and a fresh router process:
//
//   round-robin   no scorers, round-robin picker, no session filter;
//   prefix-only   the default scorers (prefix-cache 3, queue 2,
//                 kv-cache-utilization 2, max-score) without the
//                 session-affinity filter;
//   session       the router's defaults: the same scorers plus the
//                 session-affinity filter (the conversation is the
//                 Responses chain: its root id is the session key);
//   session+turn-priority
//                 session, plus flow control (admission off: nothing shed)
//                 holding requests in the router while the engines are
//                 saturated, with turn priority (on by default) dispatching a
//                 conversation's next turn ahead of cold first turns. The
//                 saturation detector's defaults, so its prefill-backlog term
//                 (saturation.prefillBacklogTokens, 2048) is on: requests are
//                 held while every engine has that much prefill queued.
//   session+turn-priority-no-backlog
//                 the same with the prefill-backlog term off
//                 (prefillBacklogTokens: 0): the policy as it was before the
//                 term existed (an ablation).
//   prefix-only+flow
//                 prefix-only (no session filter) with the same flow-control
//                 block as session+turn-priority (prefill-backlog term on):
//                 what the hold does without pins (an attribution run).
//
// --workload tools makes every conversation an agent's tool loop: each turn
// declares a function tool, the model calls it (tool_choice "required"; the
// last turn "none": the answer), and the next turn sends the tool's output
// back as a function_call_output item chained by previous_response_id, so
// the context grows by a call and its output every turn. TTFT is then the
// first output event of any kind (function_call_arguments.delta or text).
// --engine model runs the fleet on the reference engine model
// (testkit/reference/engine-model.ts: its own prefix cache, compute queue and
// decode loop, sharing no code with the simulator) instead of the simulator.
//
// Reported per run: per-turn TTFT p50/p90 (all turns, and turns 2..8),
// conversation completion time p50/p90 (first request sent → last answer
// read), the engines' prefix-cache hit rate (usage.input_tokens_details),
// errors. The floors: session TTFT p90 ≥ 2× lower than round-robin's, and
// lower than prefix-only's at the saturating rate.
//
//   node dist/bench/agent.js [--quick] [--rates 2,4,8,16,32] [--policies round-robin,prefix-only,session]
//                            [--conversations 64] [--turns 8] [--engines 8] [--kv-cache-blocks 1400] [--time-scale 3]
//                            [--distinct-system] [--task-tokens 256] [--workload chat|tools] [--engine sim|model] [--json out.json]
import { writeFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Pool } from 'undici';
import { CLI, freePort, freePortRange, start, waitReady, option, runMain } from '../lib/proc.js';
import { startEngineFleet } from '../lib/fleet.js';
import { expGap, fmt, quantile, rng } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const NO_SESSION_FILTERS = '  filters: [model, healthy, role]\n';
export const AGENT_POLICIES: Record<string, string> = {
  'round-robin': `scheduling:\n${NO_SESSION_FILTERS}  scorers: []\n  picker: round-robin\n`,
  'prefix-only': `scheduling:\n${NO_SESSION_FILTERS}`,
  session: '', // the defaults: session-affinity filter + prefix-cache 3, queue 2, kv-cache-utilization 2
  'session+turn-priority': 'flowControl:\n  admission: { mode: "off" }\n',
  'prefix-only+flow': `scheduling:\n${NO_SESSION_FILTERS}flowControl:\n  admission: { mode: "off" }\n`,
  'session+turn-priority-no-backlog': 'flowControl:\n  admission: { mode: "off" }\n  saturation: { prefillBacklogTokens: 0 }\n',
  // session+turn-priority with first turns balanced over the endpoints by pinned sessions
  'session+balance': 'flowControl:\n  admission: { mode: "off" }\nscheduling:\n  filters: [model, healthy, role, { type: session-affinity, params: { balanceSlack: 0 } }]\n',
};

interface Shape {
  conversations: number;
  turns: number;
  /** The agent's system prompt (instructions, tool definitions): one for every conversation, or one per conversation with --distinct-system. */
  systemTokens: number;
  sharedSystem: boolean;
  /** The conversation's own task, in its first user message. */
  taskTokens: number;
  userTokens: number;
  outputTokens: number;
  /** Pause between an answer and the next turn (the agent's tool call), ms. */
  thinkMs: number;
  /** tools: each turn a function call, its output the next turn's input (function_call_output). */
  tools: boolean;
}

interface Fleet {
  engines: number;
  kvCacheBlocks: number;
  blockSize: number;
  maxNumSeqs: number;
  prefillUsPerToken: number;
  prefillOverheadMs: number;
  itlMs: number;
  /** Wall time per model time: above 1 the simulated costs stand out of the CPU noise of a shared machine. */
  timeScale: number;
}

const BYTES_PER_TOKEN = 4; // the simulator's tokenizer (src/sim/tokenizer.ts)

function text(rand: () => number, bytes: number): string {
  const words = ['alpha', 'bravo', 'cargo', 'delta', 'ember', 'forge', 'gamma', 'harbor', 'ionic', 'jolt', 'kernel', 'lumen'];
  let s = '';
  while (s.length < bytes) s += words[Math.floor(rand() * words.length)] + ' ';
  return s.slice(0, bytes);
}

interface RunResult {
  ttft: number[];
  /** TTFT of turns 2.. (the ones a pin can keep warm). */
  ttftLater: number[];
  convMs: number[];
  promptTokens: number;
  cachedTokens: number;
  errors: number;
  errorSamples: string[];
  wallS: number;
}

/** One streamed turn through POST /v1/responses (the chain continued by `previous_response_id`). */
async function turn(pool: Pool, body: string, r: RunResult): Promise<{ id: string; ttft: number; callId: string } | null> {
  const t0 = performance.now();
  let first = 0;
  let id = '';
  let callId = '';
  let tail = '';
  try {
    const res = await pool.request({ method: 'POST', path: '/v1/responses', headers: { 'content-type': 'application/json' }, body });
    if (res.statusCode !== 200) {
      const b = await res.body.text();
      r.errors++;
      if (r.errorSamples.length < 3) r.errorSamples.push(`HTTP ${res.statusCode}: ${b.slice(0, 160)}`);
      return null;
    }
    for await (const chunk of res.body) {
      tail += (chunk as Buffer).toString('utf8');
      let nl: number;
      while ((nl = tail.indexOf('\n\n')) >= 0) {
        const ev = tail.slice(0, nl);
        tail = tail.slice(nl + 2);
        const at = ev.indexOf('\ndata: ');
        if (at < 0) continue;
        const type = ev.slice(ev.startsWith('event: ') ? 7 : 0, at);
        if (type === 'response.output_text.delta' || type === 'response.function_call_arguments.delta' || type === 'response.reasoning_text.delta') {
          if (first === 0) first = performance.now();
          continue;
        }
        if (type === 'response.completed' || type === 'response.incomplete') {
          const j = JSON.parse(ev.slice(at + 7));
          id = j.response.id;
          for (const o of j.response.output) if (o.type === 'function_call') callId = o.call_id;
          const u = j.response.usage;
          if (u) {
            r.promptTokens += u.input_tokens;
            r.cachedTokens += u.input_tokens_details?.cached_tokens ?? 0;
          }
        } else if (type === 'response.failed' || type === 'error') {
          throw new Error(`stream error: ${ev.slice(at + 7, at + 167)}`);
        }
      }
    }
    if (id === '') throw new Error('the stream ended without response.completed');
  } catch (e) {
    r.errors++;
    if (r.errorSamples.length < 3) r.errorSamples.push(`client: ${(e as Error).message}`);
    return null;
  }
  return { id, ttft: first - t0, callId };
}

/** The tool every turn of the tools workload declares. */
const LOOKUP_TOOL = [{ type: 'function', name: 'lookup', description: 'look something up', parameters: { type: 'object', properties: { q: { type: 'string' } }, required: ['q'] } }];

async function runLoad(url: string, shape: Shape, rate: number, seed: number): Promise<RunResult> {
  const pool = new Pool(url, { connections: 1024, pipelining: 1 });
  const r: RunResult = { ttft: [], ttftLater: [], convMs: [], promptTokens: 0, cachedTokens: 0, errors: 0, errorSamples: [], wallS: 0 };
  const rand = rng(seed ^ 0x9e3779b9);
  const trand = rng(seed);
  const system = '[agent] ' + text(rng(7), shape.systemTokens * BYTES_PER_TOKEN);
  const t0 = performance.now();
  let at = 0;
  const pending: Promise<void>[] = [];
  for (let c = 0; c < shape.conversations; c++) {
    if (c > 0) at += expGap(rand, rate) * 1000;
    const d = at - (performance.now() - t0);
    if (d > 0) await new Promise((res) => setTimeout(res, d));
    // the agent's system prompt goes as `instructions` on every turn (a Response keeps only the current
    // request's instructions); the router rebuilds the rest of the conversation from its store
    const instructions = shape.sharedSystem ? system : `[agent ${c}] ` + text(trand, shape.systemTokens * BYTES_PER_TOKEN);
    const task = shape.taskTokens > 0 ? `[task ${c}] ` + text(trand, shape.taskTokens * BYTES_PER_TOKEN) + '\n' : '';
    const users = Array.from({ length: shape.turns }, (_, i) => (i === 0 ? task : '') + `turn ${i}: ` + text(trand, shape.userTokens * BYTES_PER_TOKEN));
    pending.push(
      (async () => {
        const c0 = performance.now();
        let previous: string | null = null;
        let callId = '';
        for (let i = 0; i < shape.turns; i++) {
          // tools: turn i > 0 answers the previous turn's call with the tool's output (the user text stands for it)
          const input = shape.tools && i > 0 ? [{ type: 'function_call_output', call_id: callId, output: users[i]! }] : users[i]!;
          const tools = shape.tools ? { tools: LOOKUP_TOOL, tool_choice: i + 1 < shape.turns ? 'required' : 'none' } : {};
          const body = JSON.stringify({
            model: 'open-model', instructions, input, max_output_tokens: shape.outputTokens, stream: true, ...tools,
            ...(previous === null ? {} : { previous_response_id: previous }),
          });
          const a = await turn(pool, body, r);
          if (a === null) return;
          if (shape.tools && i + 1 < shape.turns && a.callId === '') {
            r.errors++;
            if (r.errorSamples.length < 3) r.errorSamples.push(`turn ${i}: no function_call in a tool_choice "required" turn`);
            return;
          }
          callId = a.callId;
          r.ttft.push(a.ttft);
          if (i > 0) r.ttftLater.push(a.ttft);
          previous = a.id;
          if (i + 1 < shape.turns && shape.thinkMs > 0) await new Promise((res) => setTimeout(res, shape.thinkMs));
        }
        r.convMs.push(performance.now() - c0);
      })(),
    );
  }
  await Promise.all(pending);
  r.wallS = (performance.now() - t0) / 1000;
  await pool.close();
  return r;
}

/** What the router says about the run (its /metrics): pins followed and moved, flow-control holds, Responses results. */
async function routerCounters(url: string): Promise<string> {
  let text = '';
  try {
    text = await (await fetch(`${url}/metrics`)).text();
  } catch (e) {
    return `metrics unavailable: ${(e as Error).message}`;
  }
  const sum = (re: RegExp) => {
    let v = 0;
    for (const m of text.matchAll(re)) v += Number(m[1]);
    return v;
  };
  // how evenly the turns spread over the engines (a conversation's turns follow it)
  const perEp = new Map<string, number>();
  for (const m of text.matchAll(/^switchyard_upstream_ttft_seconds_count\{endpoint="([^"]+)"\} (\S+)$/gm)) perEp.set(m[1]!, (perEp.get(m[1]!) ?? 0) + Number(m[2]));
  const counts = [...perEp.values()];
  const spread = counts.length > 0 ? `turns per endpoint ${Math.min(...counts)}–${Math.max(...counts)}, ` : '';
  const waitN = sum(/^switchyard_flow_queue_wait_seconds_count\{[^}]*\} (\S+)$/gm);
  const waitS = sum(/^switchyard_flow_queue_wait_seconds_sum\{[^}]*\} (\S+)$/gm);
  // every request flow control lets through is observed, at once (0 s) or after waiting in its queue
  const waited1ms = sum(/^switchyard_flow_queue_wait_seconds_bucket\{[^}]*le="0\.001"[^}]*\} (\S+)$/gm);
  return (
    spread +
    `followed ${sum(/^switchyard_session_turns_followed_total (\S+)$/gm)}, ` +
    `moved saturated ${sum(/^switchyard_session_moves_total\{reason="saturated"\} (\S+)$/gm)} / failed ${sum(/^switchyard_session_moves_total\{reason="failed"\} (\S+)$/gm)}, ` +
    `continuations ${sum(/^switchyard_session_continuations_total (\S+)$/gm)}, ` +
    `through flow control ${waitN} (mean wait ${waitN > 0 ? fmt((waitS / waitN) * 1000) : 0} ms; held over 1 ms ${waitN - waited1ms}; continuations dispatched from the queue ${sum(/^switchyard_flow_continuations_total\{[^}]*\} (\S+)$/gm)}), ` +
    `responses created ${sum(/^switchyard_responses_total\{result="created"\} (\S+)$/gm)} continued ${sum(/^switchyard_responses_total\{result="continued"\} (\S+)$/gm)} failed ${sum(/^switchyard_responses_total\{result="failed"\} (\S+)$/gm)}`
  );
}

export interface AgentRow {
  rate: number;
  policy: string;
  turns: number;
  ttftP50: number;
  ttftP90: number;
  laterP90: number;
  convP50: number;
  convP90: number;
  hitRate: number;
  errors: number;
  wallS: number;
  /** The router's own counters for the run (pins followed / moved, flow-control holds, Responses results). */
  router: string;
}

export async function runAgent(argv: string[]): Promise<{ rows: AgentRow[]; config: string }> {
  const arg = (name: string) => option(argv, name);
  const quick = argv.includes('--quick');
  const shape: Shape = {
    conversations: Number(arg('--conversations') ?? (quick ? 24 : 64)),
    turns: Number(arg('--turns') ?? (quick ? 4 : 8)),
    systemTokens: 1024,
    sharedSystem: !argv.includes('--distinct-system'),
    taskTokens: Number(arg('--task-tokens') ?? 256),
    userTokens: 128,
    outputTokens: 16,
    thinkMs: 100,
    tools: arg('--workload') === 'tools',
  };
  const engine = arg('--engine') ?? 'sim';
  if (engine !== 'sim' && engine !== 'model') throw new Error(`--engine must be sim or model (got ${engine})`);
  const fleet: Fleet = {
    engines: Number(arg('--engines') ?? 8),
    kvCacheBlocks: Number(arg('--kv-cache-blocks') ?? 1400),
    blockSize: 16,
    maxNumSeqs: 16,
    prefillUsPerToken: 100,
    prefillOverheadMs: 5,
    itlMs: 10,
    timeScale: Number(arg('--time-scale') ?? 3),
  };
  const rates = (arg('--rates') ?? (quick ? '4,16' : '2,4,8,16,32')).split(',').map(Number);
  const policies = (arg('--policies') ?? 'round-robin,prefix-only,session').split(',');
  const dir = mkdtempSync(join(tmpdir(), 'swy-agent-'));
  const json = arg('--json');
  const rows: AgentRow[] = [];
  for (const rate of rates) {
    for (const policy of policies) {
      if (!(policy in AGENT_POLICIES)) throw new Error(`unknown policy ${policy} (known: ${Object.keys(AGENT_POLICIES).join(', ')})`);
      // other processes on a shared machine may take a port between the probe and the listen: try another range
      let base = 0;
      let sim: ReturnType<typeof start> | null = null;
      for (let attempt = 0; sim === null; attempt++) {
        base = await freePortRange(fleet.engines);
        // the reference engine model gets the same cache capacity in tokens and the same costs (bench/lib/fleet.ts)
        const p = startEngineFleet(engine === 'model' ? 'engine-model' : 'sim', engine === 'model' ? 'model' : 'sim', {
          engines: fleet.engines, basePort: base, slots: fleet.maxNumSeqs, kvCacheBlocks: fleet.kvCacheBlocks, blockSize: fleet.blockSize,
          prefillUsPerToken: fleet.prefillUsPerToken, prefillOverheadMs: fleet.prefillOverheadMs, itlMs: fleet.itlMs, timeScale: fleet.timeScale,
        });
        try {
          for (let i = 0; i < fleet.engines; i++) await waitReady(`http://127.0.0.1:${base + i}/health`, 60_000);
          sim = p;
        } catch (err) {
          await p.stop();
          if (attempt >= 2) throw err;
        }
      }
      const port = await freePort();
      const cfg = join(dir, `${policy}.yaml`);
      const endpoints = Array.from({ length: fleet.engines }, (_, i) => `        - { name: e${i}, url: "http://127.0.0.1:${base + i}" }`).join('\n');
      writeFileSync(
        cfg,
        `apiVersion: switchyard/v1\nkind: Router\nlisten: { host: 127.0.0.1, port: ${port} }\nlogging: { level: warn }\n` +
          // a health check slowed by a CPU-starved machine must not take the fleet out (503s)
          `dataLayer: { healthTimeoutMs: 10000 }\n` +
          `pools:\n  - name: sim\n    engine: vllm\n    models: [open-model]\n    endpoints:\n${endpoints}\n` +
          AGENT_POLICIES[policy],
      );
      const router = start('router', process.execPath, [CLI, 'serve', '--config', cfg]);
      try {
        await waitReady(`http://127.0.0.1:${port}/readyz`, 60_000);
        if (router.child.exitCode !== null) throw new Error('the router exited (its port was taken?)');
        const r = await runLoad(`http://127.0.0.1:${port}`, shape, rate, 4242 + rate);
        const routerStats = await routerCounters(`http://127.0.0.1:${port}`);
        const row: AgentRow = {
          rate, policy, turns: r.ttft.length,
          ttftP50: quantile(r.ttft, 0.5), ttftP90: quantile(r.ttft, 0.9), laterP90: quantile(r.ttftLater, 0.9),
          convP50: quantile(r.convMs, 0.5), convP90: quantile(r.convMs, 0.9),
          hitRate: r.promptTokens ? r.cachedTokens / r.promptTokens : 0, errors: r.errors, wallS: r.wallS, router: routerStats,
        };
        rows.push(row);
        if (json) writeFileSync(json, JSON.stringify({ rows }, null, 2)); // as it goes: a later failure keeps the rows so far
        if (r.errorSamples.length) console.error(`  errors: ${r.errorSamples.join(' | ')}`);
        console.error(`  router: ${routerStats}`);
        console.error(
          `rate=${rate} conv/s ${policy}: TTFT p50 ${fmt(row.ttftP50)} p90 ${fmt(row.ttftP90)} (turns 2+ p90 ${fmt(row.laterP90)}) ms, ` +
            `conversation p50 ${fmt(row.convP50)} p90 ${fmt(row.convP90)} ms, hit ${fmt(row.hitRate * 100)}%, errors ${r.errors}, wall ${fmt(r.wallS)} s`,
        );
      } finally {
        await router.stop();
        await sim!.stop();
      }
    }
  }
  const convBlocks = Math.ceil((shape.systemTokens + shape.taskTokens + shape.turns * (shape.userTokens + shape.outputTokens + 8)) / fleet.blockSize);
  const config =
    (shape.tools ? 'workload: tool loops (each turn a function call answered by a function_call_output next turn; the last turn text); ' : '') +
    `fleet: ${fleet.engines} ${engine === 'model' ? 'reference engine models (testkit/reference/engine-model.ts)' : 'simulated vLLM engines'}, kv-cache-blocks ${fleet.kvCacheBlocks} × ${fleet.blockSize} tokens ` +
    `(a whole conversation is ~${convBlocks} blocks: each engine holds ~${Math.floor(fleet.kvCacheBlocks / convBlocks)} of them, ` +
    `${Math.ceil(shape.conversations / fleet.engines)} per engine if spread evenly), max-num-seqs ${fleet.maxNumSeqs}, ` +
    `prefill ${fleet.prefillOverheadMs} ms + ${fleet.prefillUsPerToken} µs/uncached token (serial, stalls decode), ITL ${fleet.itlMs} ms, ` +
    `all simulated times × ${fleet.timeScale} (--time-scale: model costs above the CPU noise of a shared machine); ` +
    `${shape.conversations} conversations × ${shape.turns} turns, a ${shape.systemTokens}-token system prompt ` +
    `(${shape.sharedSystem ? 'the same agent for every conversation' : 'one per conversation'}), a ${shape.taskTokens}-token task in the first turn, ${shape.userTokens}-token user/tool turns, ` +
    `${shape.outputTokens} output tokens, ${shape.thinkMs} ms between an answer and the next turn; conversations start as a Poisson process at each rate`;
  if (json) writeFileSync(json, JSON.stringify({ config, rows }, null, 2));
  return { rows, config };
}

export function agentTable(rows: AgentRow[]): string {
  let md = '| rate (conv/s) | policy | turns | TTFT p50 (ms) | TTFT p90 (ms) | TTFT p90, turns 2+ (ms) | conversation p50 (ms) | conversation p90 (ms) | hit rate | errors |\n';
  md += '|---|---|---|---|---|---|---|---|---|---|\n';
  for (const r of rows) {
    md += `| ${r.rate} | ${r.policy} | ${r.turns} | ${fmt(r.ttftP50)} | ${fmt(r.ttftP90)} | ${fmt(r.laterP90)} | ${fmt(r.convP50)} | ${fmt(r.convP90)} | ${fmt(r.hitRate * 100)}% | ${r.errors} |\n`;
  }
  return md;
}

/** A policy run several times at one rate (policies repeated in --policies, interleaved): the median of each figure. */
function medianRow(rs: AgentRow[]): AgentRow {
  if (rs.length === 1) return rs[0]!;
  const med = (k: keyof AgentRow) => quantile(rs.map((r) => r[k] as number), 0.5);
  return { ...rs[0]!, ttftP50: med('ttftP50'), ttftP90: med('ttftP90'), laterP90: med('laterP90'), convP50: med('convP50'), convP90: med('convP90'), hitRate: med('hitRate') };
}

/** The floors, per rate: round-robin / session and prefix-only / session TTFT p90 (medians over repeated runs of a policy), and the same against session+turn-priority. */
export function agentRatios(rows: AgentRow[]): string {
  let s = '';
  for (const rate of [...new Set(rows.map((r) => r.rate))]) {
    const get = (p: string) => {
      const rs = rows.filter((r) => r.rate === rate && r.policy === p);
      return rs.length === 0 ? undefined : medianRow(rs);
    };
    const runs = rows.filter((r) => r.rate === rate && r.policy === 'session').length;
    if (runs > 1) s += `- ${rate} conv/s: medians over ${runs} interleaved runs of each repeated policy\n`;
    const tp = get('session+turn-priority');
    const rr0 = get('round-robin');
    const po0 = get('prefix-only');
    if (tp) {
      s +=
        `- ${rate} conv/s: TTFT p90 round-robin / session+turn-priority = ${rr0 ? fmt(rr0.ttftP90 / tp.ttftP90, 2) : '—'}×, ` +
        `prefix-only / session+turn-priority = ${po0 ? fmt(po0.ttftP90 / tp.ttftP90, 2) : '—'}× (turns 2+: ${po0 ? fmt(po0.laterP90 / tp.laterP90, 2) : '—'}×)\n`;
    }
    const se = get('session');
    if (!se) continue;
    const rr = get('round-robin');
    const po = get('prefix-only');
    s +=
      `- ${rate} conv/s: TTFT p90 round-robin / session = ${rr ? fmt(rr.ttftP90 / se.ttftP90, 2) : '—'}×, ` +
      `prefix-only / session = ${po ? fmt(po.ttftP90 / se.ttftP90, 2) : '—'}×; ` +
      `warm turns (2+) TTFT p90 round-robin / session = ${rr ? fmt(rr.laterP90 / se.laterP90, 2) : '—'}×; ` +
      `conversation p90 round-robin / session = ${rr ? fmt(rr.convP90 / se.convP90, 2) : '—'}×, prefix-only / session = ${po ? fmt(po.convP90 / se.convP90, 2) : '—'}×\n`;
  }
  return s;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  runMain(async () => {
    const { rows, config } = await runAgent(process.argv.slice(2));
    console.log(`${config}.\n\n${agentTable(rows)}\n${agentRatios(rows)}`);
  });
}
