// Scenario `stream-relay` (issue #31): the router's CPU per output token while it relays streamed
// answers, on the native front end against uWebSockets.js, in one run. One simulated engine streams
// 512-token answers with a short inter-token latency (--itl-ms at --time-scale, so every token is its
// own SSE event and, mostly, its own read: the relay's per-chunk path, as with a real engine); a fixed
// number of clients in the bench process each run one streamed /v1/completions after another. Each
// round visits every router (the order rotated per round); a router's figure is the median over rounds
// of its process CPU (user + system, /proc) over the output tokens its clients read.
//
//   node dist/bench/system/stream-relay.js [--tokens 512] [--clients 16] [--seconds 4] [--rounds 5] [--itl-ms 10] [--time-scale 0.02]
import { Agent, request } from 'undici';
import { CLI, freePort, start, treeCpuSeconds, waitReady, option, runMain, type Proc } from '../lib/proc.js';
import { fmt, quantile } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';
import { uwsProblem } from '../../src/uws.js';

exitOnHelp(import.meta.url);

interface Round {
  tokens: number;
  streams: number;
  cpuUs: number;
  userUs: number;
  seconds: number;
  errors: number;
}

/** Clients that each stream one answer after another until the deadline; counts the tokens read. */
async function drive(url: string, body: string, clients: number, seconds: number, agent: Agent): Promise<{ tokens: number; streams: number; errors: number }> {
  const end = performance.now() + seconds * 1000;
  let tokens = 0;
  let streams = 0;
  let errors = 0;
  const one = async () => {
    while (performance.now() < end) {
      try {
        const r = await request(url, { method: 'POST', body, headers: { 'content-type': 'application/json' }, dispatcher: agent });
        if (r.statusCode !== 200) {
          errors++;
          await r.body.dump();
          continue;
        }
        // an SSE event per token: count the completion events that carry text
        let tail = '';
        let n = 0;
        for await (const chunk of r.body) {
          const s = tail + (chunk as Buffer).toString('latin1');
          let at = 0;
          for (;;) {
            const i = s.indexOf('"text":"', at);
            if (i < 0) break;
            if (s.charCodeAt(i + 8) !== 0x22) n++; // not an empty text
            at = i + 8;
          }
          tail = s.slice(Math.max(at, s.length - 16));
        }
        tokens += n;
        streams++;
      } catch {
        errors++;
      }
    }
  };
  await Promise.all(Array.from({ length: clients }, one));
  return { tokens, streams, errors };
}

async function main(): Promise<void> {
  const argv = process.argv.slice(2);
  const maxTokens = Number(option(argv, '--tokens') ?? 512);
  const clients = Number(option(argv, '--clients') ?? 16);
  const seconds = Number(option(argv, '--seconds') ?? 4);
  const rounds = Number(option(argv, '--rounds') ?? 5);
  const itlMs = option(argv, '--itl-ms') ?? '10';
  const timeScale = option(argv, '--time-scale') ?? '0.02';
  const procs: Proc[] = [];
  const agent = new Agent({ connections: clients * 2, pipelining: 1 });
  try {
    const enginePort = await freePort();
    procs.push(start('sim', process.execPath, [CLI, 'sim', '--port', String(enginePort), '--time-scale', timeScale, '--itl-ms', itlMs, '--decode-slowdown', '0', '--max-num-seqs', '1024', '--max-model-len', '100000']));
    await waitReady(`http://127.0.0.1:${enginePort}/health`);
    const fronts = uwsProblem() === null ? ['native', 'uws'] : ['native'];
    if (fronts.length === 1) console.log(`note: uWS does not load here (${uwsProblem()}): native only`);
    const targets: { name: string; port: number; proc: Proc }[] = [];
    for (const fe of fronts) {
      const port = await freePort();
      const p = start(`switchyard-${fe}`, process.execPath, [CLI, 'serve', '--port', String(port), '--upstream', `http://127.0.0.1:${enginePort}`, '--model', 'open-model'], { env: { SWITCHYARD_FRONT_END: fe } });
      procs.push(p);
      await waitReady(`http://127.0.0.1:${port}/readyz`);
      const served = (await fetch(`http://127.0.0.1:${port}/healthz`)).headers.has('uwebsockets') ? 'uws' : 'native';
      if (served !== fe) throw new Error(`switchyard-${fe}: the router serves on ${served}`);
      targets.push({ name: `switchyard-${fe}`, port, proc: p });
    }
    const body = JSON.stringify({ model: 'open-model', prompt: 'Stream a long answer through the router.', max_tokens: maxTokens, stream: true, ignore_eos: true });
    const runs = new Map<string, Round[]>(targets.map((t) => [t.name, []]));
    for (let round = 0; round < rounds; round++) {
      for (let k = 0; k < targets.length; k++) {
        const t = targets[(k + round) % targets.length]!;
        const url = `http://127.0.0.1:${t.port}/v1/completions`;
        await drive(url, body, clients, 1, agent); // warm-up
        const pid = t.proc.child.pid;
        const c0 = treeCpuSeconds(pid);
        const u0 = treeCpuSeconds(pid, true);
        const t0 = performance.now();
        const r = await drive(url, body, clients, seconds, agent);
        const secs = (performance.now() - t0) / 1000;
        const n = Math.max(1, r.tokens);
        const row: Round = { ...r, seconds: secs, cpuUs: ((treeCpuSeconds(pid) - c0) / n) * 1e6, userUs: ((treeCpuSeconds(pid, true) - u0) / n) * 1e6 };
        runs.get(t.name)!.push(row);
        console.error(`stream-relay round ${round + 1} ${t.name}: ${fmt(r.tokens / secs, 0)} tokens/s, ${r.streams} streams, CPU ${fmt(row.cpuUs, 2)} µs/token, errors ${r.errors}`);
      }
    }
    const med = (xs: number[]) => quantile(xs, 0.5);
    console.log(`\n${maxTokens}-token streams, ${clients} clients, ${seconds} s × ${rounds} rounds; engine --itl-ms ${itlMs} --time-scale ${timeScale}\n`);
    console.log('| router | tokens/s | streams/s | router CPU µs/token (user) | vs native | CPU µs/token per round | errors |');
    console.log('|---|---:|---:|---:|---:|---|---:|');
    const base = med(runs.get('switchyard-native')!.map((r) => r.cpuUs));
    for (const t of targets) {
      const rs = runs.get(t.name)!;
      const cpu = med(rs.map((r) => r.cpuUs));
      console.log(
        `| ${t.name} | ${fmt(med(rs.map((r) => r.tokens / r.seconds)), 0)} | ${fmt(med(rs.map((r) => r.streams / r.seconds)), 1)} | ${fmt(cpu, 2)} (${fmt(med(rs.map((r) => r.userUs)), 2)}) | ` +
          `${fmt((cpu / base) * 100, 0)} % | ${rs.map((r) => fmt(r.cpuUs, 2)).join(' / ')} | ${rs.reduce((a, r) => a + r.errors, 0)} |`,
      );
    }
  } finally {
    await agent.close();
    for (const p of procs.reverse()) await p.stop();
  }
}

runMain(main);
