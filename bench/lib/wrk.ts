// Runs wrk (closed loop, fixed connections) with a POST body and reads its
// latency distribution through a Lua `done` hook that prints JSON.
import { execFile } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export interface WrkResult {
  rps: number;
  p50Us: number;
  p90Us: number;
  p99Us: number;
  requests: number;
  errors: number;
  non2xx: number;
}

export function hasWrk(): Promise<boolean> {
  return new Promise((resolve) => execFile('wrk', ['--version'], (err, out, errOut) => resolve(!err || /wrk/.test(out + errOut))));
}

const dir = mkdtempSync(join(tmpdir(), 'swy-wrk-'));
let scripts = 0;

/** `cpus`: run wrk under `taskset -c <cpus>` (Linux), e.g. to keep it off the proxy's core. */
export function runWrk(url: string, body: string, opts: { connections: number; threads?: number; seconds: number; headers?: Record<string, string>; cpus?: string }): Promise<WrkResult> {
  const file = join(dir, `post-${scripts++}.lua`);
  const headers = { 'content-type': 'application/json', ...opts.headers };
  writeFileSync(
    file,
    `wrk.method = "POST"\nwrk.body = ${JSON.stringify(body)}\n` +
      Object.entries(headers).map(([k, v]) => `wrk.headers[${JSON.stringify(k)}] = ${JSON.stringify(v)}\n`).join('') +
      `done = function(summary, latency, requests)\n` +
      `  local e = summary.errors\n` +
      `  io.write(string.format('\\nWRKJSON {"requests":%d,"duration_us":%d,"p50":%d,"p90":%d,"p99":%d,"errors":%d,"non2xx":%d}\\n',` +
      ` summary.requests, summary.duration, latency:percentile(50), latency:percentile(90), latency:percentile(99),` +
      ` e.connect + e.read + e.write + e.timeout, e.status))\nend\n`,
  );
  const args = ['-t', String(opts.threads ?? 1), '-c', String(opts.connections), '-d', `${opts.seconds}s`, '-s', file, url];
  return new Promise((resolve, reject) => {
    const [cmd, argv] = opts.cpus ? ['taskset', ['-c', opts.cpus, 'wrk', ...args]] : ['wrk', args];
    execFile(cmd, argv, { maxBuffer: 1 << 20 }, (err, out) => {
      if (err) return reject(new Error(`wrk failed: ${err.message}`));
      const m = /WRKJSON (\{.*\})/.exec(out);
      if (!m) return reject(new Error(`wrk printed no summary: ${out}`));
      const j = JSON.parse(m[1]!);
      resolve({
        rps: j.requests / (j.duration_us / 1e6),
        p50Us: j.p50,
        p90Us: j.p90,
        p99Us: j.p99,
        requests: j.requests,
        errors: j.errors,
        non2xx: j.non2xx,
      });
    });
  });
}
