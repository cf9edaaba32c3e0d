// Scenario `long-prompt` (issue 37): what routing a long prompt costs against
// relaying its bytes. One chat request with a long system prompt (1k, 10k,
// 100k tokens at ~4 bytes a token), sent by wrk with 4 connections to one
// zero-latency engine: through nginx (1 worker, upstream keepalive, the body
// kept in memory: client_body_buffer_size 16m), through Switchyard reading
// the body with the native scan (limits.bodyScan: native, the default; on the
// uWS front end and on the native one) and through Switchyard reading it with
// JSON.parse (limits.bodyScan: javascript, the path before issue 37), in one
// run. Reported: each proxy's process CPU per request (user + system, from
// /proc) and p50/p99 latency, and the ratio of each Switchyard's CPU per
// request to nginx's.
//
// The engine: `--engine sim` (switchyard sim --time-scale 0, which parses
// every body; 65,536 KV blocks, so a 200k-token prompt fits) or `--engine canned` (a node:http server answering every POST
// with one fixed completion without reading the body: a second, independent
// engine that costs the same whatever the prompt).
//
// `--idle-seconds N` (default 2; 0: none): then, per prompt size, one
// connection to the engine directly and to each proxy: the p50/p99 latency
// each adds to the engine's own.
//
// `--base <dir>`: another Switchyard build (its dist/ and build/ made) whose
// routers run beside this build's in the same run, as targets base-scan-uws,
// base-scan-native, base-json-uws, base-json-native (before vs after).
//
//   node dist/bench/system/long-prompt.js [--seconds 3] [--tokens 1000,10000,100000] [--engine sim|canned] [--targets ...] [--base <dir>] [--idle-seconds 2]
import { createServer } from 'node:http';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { CLI, freePort, start, treeCpuSeconds, waitReady, type Proc, option, runMain } from '../lib/proc.js';
import { NGINX_CONF, which } from '../lib/proxies.js';
import { hasWrk, runWrk } from '../lib/wrk.js';
import { fmt } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const WORDS = 'the router reads a long system prompt of an agent with tools and files and code and it must route it at wire speed'.split(' ');

/** A chat body whose system prompt is ~`tokens` tokens (~4 bytes each), ASCII with a few JSON escapes. */
export function longPromptBody(tokens: number): string {
  const parts: string[] = [];
  let n = 0;
  for (let i = 0; n < tokens * 4; i++) {
    const w = WORDS[(i * 7 + (i >> 3)) % WORDS.length]!;
    const piece = i % 50 === 49 ? `${w} "quoted"\n` : `${w} `;
    parts.push(piece);
    n += piece.length;
  }
  return JSON.stringify({
    model: 'open-model',
    messages: [
      { role: 'system', content: parts.join('') },
      { role: 'user', content: 'What should I do next?' },
    ],
    max_tokens: 8,
    stream: false,
    user: 'agent-1',
  });
}

const CANNED = JSON.stringify({
  id: 'cmpl-1',
  object: 'chat.completion',
  created: 1,
  model: 'open-model',
  choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }],
  usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
});

async function startCanned(port: number): Promise<() => Promise<void>> {
  const srv = createServer((req, res) => {
    if (req.method === 'POST') {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(CANNED) });
        res.end(CANNED);
      });
      return;
    }
    if (req.url === '/v1/models') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ object: 'list', data: [{ id: 'open-model', object: 'model', owned_by: 'canned' }] }));
      return;
    }
    res.writeHead(req.url === '/health' ? 200 : 404, { 'content-type': 'text/plain' });
    res.end(req.url === '/metrics' ? '' : 'ok');
  });
  srv.keepAliveTimeout = 60_000;
  await new Promise<void>((r) => srv.listen(port, '127.0.0.1', r));
  return () =>
    new Promise<void>((r) => {
      srv.closeAllConnections();
      srv.close(() => r());
    });
}

function routerYaml(port: number, enginePort: number, bodyScan: string, frontEnd: string): string {
  return `apiVersion: switchyard/v1
kind: Router
listen: { host: 127.0.0.1, port: ${port} }
logging: { level: warn }
server: { frontEnd: ${frontEnd} }
limits: { bodyScan: ${bodyScan} }
pools:
  - name: p
    engine: vllm
    models: [open-model]
    endpoints:
      - { name: e0, url: "http://127.0.0.1:${enginePort}" }
`;
}

interface Row {
  tokens: number;
  bodyBytes: number;
  target: string;
  rps: number;
  cpuUs: number;
  p50Us: number;
  p99Us: number;
  errors: number;
}

async function main(): Promise<void> {
  const argv = process.argv.slice(2);
  const seconds = Number(option(argv, '--seconds') ?? 3);
  const tokenLevels = (option(argv, '--tokens') ?? '1000,10000,100000').split(',').map(Number);
  const engine = option(argv, '--engine') ?? 'sim';
  const base = option(argv, '--base') ?? '';
  const want = new Set((option(argv, '--targets') ?? (base === '' ? 'nginx,scan-uws,scan-native,json-uws' : 'nginx,base-scan-uws,scan-uws,base-scan-native,scan-native')).split(','));
  if (!(await hasWrk())) throw new Error('wrk is not installed: `apt-get install -y wrk` (Debian) and run again');
  const dir = mkdtempSync(join(tmpdir(), 'swy-long-'));
  const procs: Proc[] = [];
  let closeCanned: (() => Promise<void>) | null = null;
  const targets: Array<{ name: string; port: number; proc: Proc }> = [];
  const rows: Row[] = [];
  const idleSeconds = Number(option(argv, '--idle-seconds') ?? 2);
  const idle: Array<{ tokens: number; target: string; p50Us: number; p99Us: number; directP50: number; directP99: number }> = [];
  try {
    const enginePort = await freePort();
    if (engine === 'canned') closeCanned = await startCanned(enginePort);
    else {
      procs.push(start('sim', process.execPath, [CLI, 'sim', '--port', String(enginePort), '--time-scale', '0', '--max-model-len', '1000000', '--kv-cache-blocks', '65536']));
      await waitReady(`http://127.0.0.1:${enginePort}/health`);
    }
    const routers: Array<[string, string, string, string]> = [];
    for (const [prefix, cli] of base === '' ? [['', CLI]] : [['', CLI], ['base-', join(resolve(base), 'bin', 'switchyard.js')]]) {
      routers.push(
        [`${prefix}scan-uws`, 'native', 'uws', cli!],
        [`${prefix}scan-native`, 'native', 'native', cli!],
        [`${prefix}json-uws`, 'javascript', 'uws', cli!],
        [`${prefix}json-native`, 'javascript', 'native', cli!],
      );
    }
    for (const [name, scan, fe, cli] of routers) {
      if (!want.has(name)) continue;
      const port = await freePort();
      const file = join(dir, `${name}.yaml`);
      writeFileSync(file, routerYaml(port, enginePort, scan, fe));
      const p = start(name, process.execPath, [cli, 'serve', '--config', file]);
      procs.push(p);
      await waitReady(`http://127.0.0.1:${port}/readyz`);
      targets.push({ name, port, proc: p });
    }
    if (want.has('nginx')) {
      const ng = which('nginx');
      if (ng === null) console.error('nginx is not installed: skipped');
      else {
        const port = await freePort();
        const conf = NGINX_CONF(port, enginePort, dir).replace('client_max_body_size 16m;', 'client_max_body_size 16m;\n  client_body_buffer_size 16m;');
        writeFileSync(join(dir, 'nginx.conf'), conf);
        const p = start('nginx', ng, ['-p', dir, '-c', join(dir, 'nginx.conf'), '-e', join(dir, 'error.log')]);
        procs.push(p);
        await waitReady(`http://127.0.0.1:${port}/v1/models`);
        targets.unshift({ name: 'nginx', port, proc: p });
      }
    }
    for (const tokens of tokenLevels) {
      const body = longPromptBody(tokens);
      for (const tg of targets) {
        const url = `http://127.0.0.1:${tg.port}/v1/chat/completions`;
        await runWrk(url, body, { connections: 4, seconds: 1 }); // warm-up: JIT, connections, the prefix index
        const c0 = treeCpuSeconds(tg.proc.child.pid);
        const w = await runWrk(url, body, { connections: 4, seconds });
        const c1 = treeCpuSeconds(tg.proc.child.pid);
        rows.push({
          tokens,
          bodyBytes: Buffer.byteLength(body),
          target: tg.name,
          rps: w.rps,
          cpuUs: ((c1 - c0) * 1e6) / Math.max(1, w.requests),
          p50Us: w.p50Us,
          p99Us: w.p99Us,
          errors: w.errors + w.non2xx,
        });
        process.stderr.write(`${tokens} tokens ${tg.name}: ${fmt(w.rps, 0)} req/s, ${fmt(rows.at(-1)!.cpuUs, 0)} µs CPU/request\n`);
      }
      if (idleSeconds > 0) {
        // one connection, one request at a time: the latency each proxy adds to the engine's own (p50, p99)
        const direct = await runWrk(`http://127.0.0.1:${enginePort}/v1/chat/completions`, body, { connections: 1, seconds: idleSeconds });
        for (const tg of targets) {
          const w = await runWrk(`http://127.0.0.1:${tg.port}/v1/chat/completions`, body, { connections: 1, seconds: idleSeconds });
          idle.push({ tokens, target: tg.name, p50Us: w.p50Us - direct.p50Us, p99Us: w.p99Us - direct.p99Us, directP50: direct.p50Us, directP99: direct.p99Us });
        }
      }
    }
  } finally {
    await Promise.all(procs.reverse().map((p) => p.stop()));
    await closeCanned?.();
  }
  console.log(`long-prompt: engine ${engine}, wrk 4 connections, ${seconds} s per cell; CPU = the proxy process's user + system time per request`);
  console.log('');
  console.log('| prompt | body | target | req/s | CPU µs/req | × nginx CPU | p50 µs | p99 µs | errors |');
  console.log('|---|---:|---|---:|---:|---:|---:|---:|---:|');
  for (const r of rows) {
    const ng = rows.find((x) => x.tokens === r.tokens && x.target === 'nginx');
    const ratio = ng && r.target !== 'nginx' ? `${fmt(r.cpuUs / ng.cpuUs, 2)}×` : '';
    console.log(`| ${r.tokens / 1000}k tokens | ${fmt(r.bodyBytes / 1024, 0)} KB | ${r.target} | ${fmt(r.rps, 0)} | ${fmt(r.cpuUs, 0)} | ${ratio} | ${fmt(r.p50Us, 0)} | ${fmt(r.p99Us, 0)} | ${r.errors} |`);
  }
  if (idle.length > 0) {
    console.log('');
    console.log(`added latency, one connection (${idleSeconds} s per cell): each proxy's wrk p50/p99 minus the engine's own, asked directly in the same run`);
    console.log('');
    console.log('| prompt | target | added p50 µs | added p99 µs | engine p50 / p99 µs |');
    console.log('|---|---|---:|---:|---:|');
    for (const r of idle) console.log(`| ${r.tokens / 1000}k tokens | ${r.target} | ${fmt(r.p50Us, 0)} | ${fmt(r.p99Us, 0)} | ${fmt(r.directP50, 0)} / ${fmt(r.directP99, 0)} |`);
  }
  console.log('');
  for (const tokens of tokenLevels) {
    for (const fe of ['uws', 'native']) {
      const a = rows.find((x) => x.tokens === tokens && x.target === `base-scan-${fe}`);
      const b = rows.find((x) => x.tokens === tokens && x.target === `scan-${fe}`);
      if (a && b) console.log(`${tokens / 1000}k tokens: this build / base router CPU per request (scan, ${fe}) = ${fmt(b.cpuUs / a.cpuUs, 2)}`);
    }
    const s = rows.find((x) => x.tokens === tokens && x.target === 'scan-uws');
    const j = rows.find((x) => x.tokens === tokens && x.target === 'json-uws');
    if (s && j) console.log(`${tokens / 1000}k tokens: native scan / JSON.parse router CPU per request (uWS) = ${fmt(s.cpuUs / j.cpuUs, 2)}`);
  }
}

runMain(main);
