// Rollout under load: a P/D fleet (1 prefill + 2 decode engines) on revision
// A serves steady streamed chat; `rollout()` (what `switchyard rollout` runs)
// moves it to revision B (prefill and decode all replaced, the new engines
// "loading" for a while first) and back to A (fresh engines). Reported: failed
// requests, prefill/decode pairs that mixed revisions, TTFT p99 during the
// rollouts against TTFT p99 of the steady phase before them (same run), and
// each rollout's duration.
//
//   npm run build:ts && node dist/bench/pd-rollout.js [--steady 6] [--workers 6] [--time-scale 0.2]
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import http from 'node:http';
import { startEngine } from '../../src/sim/index.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { startRouter } from '../../src/server/router.js';
import { registry } from '../../src/scheduler/plugins/index.js';
import { rollout } from '../../src/server/rollout.js';
import { quantile } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const { values: a } = parseArgs({
  options: {
    steady: { type: 'string', default: '6' },
    workers: { type: 'string', default: '6' },
    'time-scale': { type: 'string', default: '0.2' },
  },
});
const steadyS = Number(a.steady);
const workers = Number(a.workers);
const SIM = { timeScale: Number(a['time-scale']), prefillOverheadMs: 2, prefillUsPerToken: 25, prefillChunkTokens: 2048, itlMs: 15, maxModelLen: 65536, kvCacheBlocks: 65536 };
const FILLER = 'the rollout benchmark prompt text. '.repeat(230); // ≈ 2,000 tokens
const agent = new http.Agent({ keepAlive: true, maxSockets: 256 });

interface Result {
  at: number;
  ok: boolean;
  ttftMs: number;
  decode: string;
  prefill: string;
}

function one(url: string, body: string): Promise<Result> {
  return new Promise((resolve) => {
    const t0 = performance.now();
    let ttft = -1;
    let text = '';
    const req = http.request(url + '/v1/chat/completions', { method: 'POST', agent, headers: { 'content-type': 'application/json' } }, (res) => {
      res.setEncoding('utf8');
      res.on('data', (c: string) => {
        if (ttft < 0) ttft = performance.now() - t0;
        text += c;
      });
      res.on('end', () =>
        resolve({
          at: t0,
          ok: res.statusCode === 200 && text.endsWith('data: [DONE]\n\n') && !text.includes('"error"'),
          ttftMs: ttft,
          decode: String(res.headers['x-switchyard-endpoint'] ?? ''),
          prefill: String(res.headers['x-switchyard-prefill-endpoint'] ?? ''),
        }),
      );
    });
    req.on('error', () => resolve({ at: t0, ok: false, ttftMs: -1, decode: '', prefill: '' }));
    req.end(body);
  });
}

async function main() {
  const gen = (rev: string, loadingMs: number) =>
    Promise.all([startEngine({ ...SIM, role: 'prefill', revision: rev, loadingMs }), startEngine({ ...SIM, role: 'decode', revision: rev, loadingMs }), startEngine({ ...SIM, role: 'decode', revision: rev, loadingMs })]);
  const A = await gen('a', 0);
  const cfg = validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [{ name: 'pd', models: ['open-model'], endpoints: A.map((e, i) => ({ name: `a-${i}`, url: e.url, role: i === 0 ? 'prefill' : 'decode', revision: 'a' })) }],
      logging: { level: 'silent' },
      dataLayer: { healthIntervalMs: 100, healthTimeoutMs: 3000 },
      admin: { drainGraceMs: 30_000 },
      disaggregation: { thresholdTokens: 256 },
    },
    (kind, s) => registry.validate(kind, s.type, s.params),
  );
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1', adminPort: 0 });
  const results: Result[] = [];
  let stop = false;
  let n = 0;
  const loop = async () => {
    while (!stop) {
      const body = JSON.stringify({ model: 'open-model', messages: [{ role: 'user', content: `${n++} ${FILLER}` }], max_tokens: 40, stream: true });
      results.push(await one(router.url, body));
    }
  };
  const load = Promise.all(Array.from({ length: workers }, loop));
  const tSteady = performance.now();
  await new Promise((r) => setTimeout(r, steadyS * 1000));
  const tRoll = performance.now();
  const B = await gen('b', 1500);
  const spec = (prefix: string, es: typeof A) => es.map((e, i) => ({ name: `${prefix}-${i}`, url: e.url, role: (i === 0 ? 'prefill' : 'decode') as 'prefill' | 'decode' }));
  const admin = { admin: router.admin!.url, token: '', pool: 'pd', pollMs: 50 };
  const d1 = await rollout({ ...admin, to: 'b', endpoints: spec('b', B) });
  const A2 = await gen('a', 1500);
  const d2 = await rollout({ ...admin, to: 'a', from: 'b', endpoints: spec('a2', A2) });
  const tEnd = performance.now();
  stop = true;
  await load;
  const rev = (name: string) => name.split('-')[0]!.replace(/2$/, '');
  const steady = results.filter((r) => r.at >= tSteady + 1000 && r.at < tRoll && r.ok).map((r) => r.ttftMs);
  const during = results.filter((r) => r.at >= tRoll && r.at < tEnd && r.ok).map((r) => r.ttftMs);
  const failed = results.filter((r) => !r.ok).length;
  const mixed = results.filter((r) => r.ok && r.prefill !== '' && rev(r.prefill) !== rev(r.decode)).length;
  const pd = results.filter((r) => r.ok && r.prefill !== '').length;
  const p99s = quantile(steady, 0.99);
  const p99r = quantile(during, 0.99);
  console.log(`Rollout under load: ${workers} streaming workers, prompts ≈2,000 tokens, 40 output tokens, time-scale ${SIM.timeScale}; 1 prefill + 2 decode engines per revision`);
  console.log('| requests | disaggregated | failed | mixed-revision pairs | TTFT p99 steady (ms) | TTFT p99 during rollouts (ms) | ratio | rollout A→B (s) | rollout B→A (s) |');
  console.log('|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
  console.log(
    `| ${results.length} | ${pd} | ${failed} | ${mixed} | ${p99s.toFixed(0)} | ${p99r.toFixed(0)} | ${(p99r / p99s).toFixed(2)}× | ${(d1 / 1000).toFixed(2)} | ${(d2 / 1000).toFixed(2)} |`,
  );
  console.log(`(steady samples ${steady.length}, during ${during.length}; the new engines were "loading" 1.5 s after start)`);
  await router.close(2000);
  await Promise.all([...A, ...B, ...A2].map((e) => e.close()));
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
