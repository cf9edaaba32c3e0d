#!/usr/bin/env node
// Smoke test of an installed Switchyard on the running Node (npm run smoke): starts the router on its
// embedded default (4 simulated engines), sends the README's chat completion and Responses requests, a
// streamed chat completion and a /metrics scrape, checks status and shapes, stops it with SIGTERM and
// expects exit 0. Plain JavaScript on purpose: it runs on any Node without the dev dependencies.
//
//   node scripts/smoke.mjs                       # `node bin/switchyard.js serve` on a free port
//   node scripts/smoke.mjs --bin ./switchyard    # the standalone binary (npm run build:binary)
//
// Exit 0 when every check passed; 1 with the failed check and the router's output otherwise.
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const args = process.argv.slice(2);
const binAt = args.indexOf('--bin');
const bin = binAt >= 0 ? args[binAt + 1] : null;
const START_MS = 60_000;

function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

const port = await freePort();
const base = `http://127.0.0.1:${port}`;
const cmd = bin ?? process.execPath;
const cmdArgs = [...(bin ? [] : ['bin/switchyard.js']), 'serve', '--port', String(port), '--log-level', 'warn'];
const child = spawn(cmd, cmdArgs, { cwd: bin ? process.cwd() : root, stdio: ['ignore', 'pipe', 'pipe'] });
let output = '';
child.stdout.on('data', (b) => (output += b));
child.stderr.on('data', (b) => (output += b));
const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
let over = false;
exited.then(() => (over = true));

const results = [];
function check(name, ok, detail = '') {
  results.push({ name, ok });
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${name}${detail && !ok ? `: ${detail}` : ''}`);
  if (!ok) throw new Error(`smoke check failed: ${name}`);
}

async function json(path, body) {
  const r = await fetch(base + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const text = await r.text();
  let j = null;
  try {
    j = JSON.parse(text);
  } catch {}
  return { status: r.status, headers: r.headers, text, j };
}

let failed = false;
try {
  // up: /healthz answers 200 once the router listens
  const t0 = Date.now();
  for (;;) {
    if (over) throw new Error('the router exited before it listened');
    try {
      if ((await fetch(base + '/healthz')).status === 200) break;
    } catch {}
    if (Date.now() - t0 > START_MS) throw new Error(`the router did not answer /healthz within ${START_MS / 1000} s`);
    await new Promise((r) => setTimeout(r, 200));
  }
  check(`router up on ${base} (${Date.now() - t0} ms, ${bin ? bin : `node ${process.version}`})`, true);

  const version = await new Promise((resolve) => {
    const v = spawn(cmd, [...(bin ? [] : ['bin/switchyard.js']), '--version'], { cwd: bin ? process.cwd() : root });
    let out = '';
    v.stdout.on('data', (b) => (out += b));
    v.on('exit', () => resolve(out.trim()));
  });
  check(`--version: ${version}`, /^switchyard \S+ \(node v\d+\.\d+\.\d+\)$/.test(version), version);

  // the README's chat completion
  const c = await json('/v1/chat/completions', { model: 'open-model', messages: [{ role: 'user', content: 'Hello!' }], max_tokens: 16 });
  check('chat completion: 200', c.status === 200, `${c.status} ${c.text}`);
  check(
    'chat completion: shape',
    c.j?.object === 'chat.completion' && typeof c.j.choices?.[0]?.message?.content === 'string' && c.j.usage?.completion_tokens === 16,
    c.text,
  );
  check('chat completion: x-switchyard-endpoint', /^sim-\d$/.test(c.headers.get('x-switchyard-endpoint') ?? ''), String(c.headers.get('x-switchyard-endpoint')));

  // a streamed chat completion
  const s = await fetch(base + '/v1/chat/completions', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'open-model', messages: [{ role: 'user', content: 'Hello!' }], max_tokens: 8, stream: true }),
  });
  const sse = await s.text();
  const events = sse.split('\n\n').filter((e) => e.startsWith('data: '));
  check('stream: 200 text/event-stream', s.status === 200 && /^text\/event-stream/.test(s.headers.get('content-type') ?? ''), `${s.status}`);
  check('stream: chunks then [DONE]', events.length >= 9 && events.at(-1) === 'data: [DONE]' && JSON.parse(events[1].slice(6)).object === 'chat.completion.chunk', sse.slice(0, 300));

  // the README's Responses request (16 tokens reach max_output_tokens: status incomplete), then its continuation
  const r1 = await json('/v1/responses', { model: 'open-model', input: 'Hello!', max_output_tokens: 16 });
  check('responses: 200', r1.status === 200, `${r1.status} ${r1.text}`);
  const out = r1.j?.output?.find?.((o) => o.type === 'message');
  check(
    'responses: shape',
    r1.j?.object === 'response' && ['completed', 'incomplete'].includes(r1.j.status) && r1.j.usage?.output_tokens === 16 && /^resp_/.test(r1.j.id) && typeof out?.content?.[0]?.text === 'string',
    r1.text,
  );
  const r2 = await json('/v1/responses', { model: 'open-model', input: 'And then?', max_output_tokens: 4, previous_response_id: r1.j.id });
  check('responses: previous_response_id continues', r2.status === 200 && r2.j?.previous_response_id === r1.j.id, `${r2.status} ${r2.text}`);

  // /metrics
  const m = await fetch(base + '/metrics');
  const mt = await m.text();
  check('/metrics: 200 with the router series', m.status === 200 && /switchyard_/.test(mt), `${m.status}`);
} catch (err) {
  failed = true;
  console.log(`FAIL ${err.message}`);
}

if (!over) child.kill('SIGTERM');
const stop = setTimeout(() => child.kill('SIGKILL'), 15_000);
const { code, signal } = await exited;
clearTimeout(stop);
if (!failed) {
  try {
    check(`SIGTERM: exit 0`, code === 0, `code ${code} signal ${signal}`);
  } catch {
    failed = true;
  }
}
if (failed) {
  console.log('--- router output ---\n' + output.slice(-4000));
  process.exit(1);
}
console.log(`smoke: ${results.length} checks passed`);
