// At the open-file limit the router stops accepting instead of spinning
// (uWS retries a failing accept() at once, forever: one core burned and
// /healthz took seconds), keeps serving the connections already open, says so
// in /metrics, and accepts again once connections close.
import t from 'tap';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { fileURLToPath } from 'node:url';
import { AcceptGuard } from '../../src/server/accept-guard.js';
import { lowestFreeFd } from '../../bindings/index.js';
import { startEngine } from '../../src/sim/index.js';
import { sleep, until } from '../support/sim-util.js';

t.test('the guard pauses near the limit and resumes with hysteresis', async (t) => {
  let free = 10;
  const log: string[] = [];
  let listenOk = true;
  const g = new AcceptGuard({
    limit: 1000,
    probe: () => free,
    pause: (n) => log.push(`pause ${n}`),
    resume: (n) => (log.push(`resume ${n} ${listenOk}`), listenOk),
  });
  t.equal(g.reserve, 50);
  g.check();
  free = 949;
  g.check();
  t.same(log, [], 'below limit - reserve: accepting');
  free = 950;
  g.check();
  t.same(log, ['pause 950']);
  free = 920;
  g.check();
  t.same(log, ['pause 950'], 'inside the hysteresis band: still paused');
  free = -1; // table full
  g.check();
  t.equal(g.inUse, 1000);
  listenOk = false;
  free = 100;
  g.check();
  t.ok(g.paused, 'a failed listen stays paused and is retried');
  listenOk = true;
  g.check();
  t.notOk(g.paused);
  t.same(log, ['pause 950', 'resume 100 false', 'resume 100 true']);
  t.equal(g.pauses, 1);
  t.notOk(new AcceptGuard({ limit: Infinity, probe: () => 0, pause: () => {}, resume: () => true }).enabled, 'no finite limit: no guard');
  const low = lowestFreeFd();
  t.ok(low > 2, `lowestFreeFd() is a real descriptor number (${low})`);
});

/** utime + stime of a process, seconds. */
function cpuSeconds(pid: number): number {
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const rest = f.slice(f.lastIndexOf(')') + 2).split(' ');
  return (Number(rest[11]) + Number(rest[12])) / 100;
}

/** One request over an open socket; resolves with the raw answer text once `done` matches it. */
function ask(sock: Socket, req: string, done: RegExp, ms = 2000): Promise<string> {
  return new Promise((resolve, reject) => {
    let text = '';
    const on = (b: Buffer) => {
      text += b.toString('latin1');
      if (done.test(text)) {
        sock.off('data', on);
        clearTimeout(timer);
        resolve(text);
      }
    };
    const timer = setTimeout(() => {
      sock.off('data', on);
      reject(new Error(`no answer within ${ms} ms: ${JSON.stringify(text.slice(0, 200))}`));
    }, ms);
    sock.on('data', on);
    sock.write(req);
  });
}

function open(port: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = connect(port, '127.0.0.1', () => resolve(s));
    s.on('error', reject);
  });
}

t.test('switchyard serve at a low open-file limit: no busy loop, open connections served, accepting again after', async (t) => {
  const engine = await startEngine({ timeScale: 0 });
  t.teardown(() => engine.close());
  const bin = fileURLToPath(new URL('../../bin/switchyard.js', import.meta.url));
  // soft = hard = 256: raising the soft limit cannot help, the guard has to
  const child = spawn('bash', ['-c', `ulimit -n 256 && exec "${process.execPath}" "${bin}" serve --upstream ${engine.url} --port 0`], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  t.teardown(() => {
    if (child.exitCode === null) child.kill('SIGKILL');
  });
  let out = '';
  child.stdout.on('data', (b: Buffer) => (out += b.toString()));
  child.stderr.on('data', (b: Buffer) => (out += b.toString()));
  const port = await new Promise<number>((resolve, reject) => {
    const started = Date.now();
    const look = setInterval(() => {
      // the listening line only: a state-change line (endpoint.down) carrying the engine's url may come first
      const m = /listening on http:\/\/[0-9.]+:(\d+)/.exec(out) ?? /"url":"http:\/\/[0-9.]+:(\d+)"[^\n]*"msg":"switchyard router listening/.exec(out);
      if (m) {
        clearInterval(look);
        resolve(Number(m[1]));
      } else if (Date.now() - started > 15000 || child.exitCode !== null) {
        clearInterval(look);
        reject(new Error(`no listening line: ${out}`));
      }
    }, 20);
  });
  const keep = await open(port);
  t.teardown(() => keep.destroy());
  t.match(await ask(keep, 'GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n', /"ok"/), /200 OK/, 'kept-alive connection served before the flood');
  const flood: Socket[] = [];
  t.teardown(() => flood.forEach((s) => s.destroy()));
  for (let i = 0; i < 400; i++) {
    const s = connect(port, '127.0.0.1');
    s.on('error', () => {});
    flood.push(s);
  }
  await sleep(500);
  const c0 = cpuSeconds(child.pid!);
  const w0 = performance.now();
  await sleep(1000);
  const busy = (cpuSeconds(child.pid!) - c0) / ((performance.now() - w0) / 1000);
  t.ok(busy < 0.5, `router CPU with 400 connections queued at the limit: ${(busy * 100).toFixed(0)} % of a core`);
  const t0 = performance.now();
  t.match(await ask(keep, 'GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n', /"ok"/), /200 OK/, 'the open connection is still served');
  t.ok(performance.now() - t0 < 500, `in ${(performance.now() - t0).toFixed(0)} ms`);
  const m = await ask(keep, 'GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n', /switchyard_open_fds_limit \d+/);
  t.match(m, /switchyard_accept_paused 1/, 'paused, in /metrics');
  t.match(m, /switchyard_accept_pauses_total [1-9]/);
  t.match(out, /open-file limit: not accepting/, 'and in the log');
  for (const s of flood) s.destroy();
  // watched over the open connection: a client connecting to a port nobody listens on can be
  // given that same port as its own (a TCP self-connect in the ephemeral range) and block the
  // router's listen again
  const back = await until(async () => /switchyard_accept_paused 0/.test(await ask(keep, 'GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n', /switchyard_open_fds_limit \d+/)), 5000);
  t.ok(back, 'accepting again once the connections closed (switchyard_accept_paused 0)');
  if (!back) t.comment(out.slice(-2000));
  const fresh = await open(port);
  t.teardown(() => fresh.destroy());
  t.match(await ask(fresh, 'GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n', /"ok"/), /200 OK/, 'a new connection is served');
  t.match(out, /below the open-file limit again/, 'and the log says so');
});
