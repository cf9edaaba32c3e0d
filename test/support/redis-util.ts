// A real redis-server for the tests that need one: started on a loopback port
// the OS picked, with no persistence, stopped with the test. `.ci/run` installs
// the Debian package when the binary is missing; a machine without it fails
// the test loudly instead of skipping it.
import { spawn, execFileSync } from 'node:child_process';
import { createServer, connect } from 'node:net';

export interface RedisServer {
  url: string;
  port: number;
  /** SIGKILL (no goodbye) and wait for the exit; used by fault tests. */
  kill(): Promise<void>;
  /** Start again on the same port after kill() (same empty data set). */
  restart(): Promise<void>;
}

function redisBinary(): string {
  const candidates = [process.env.REDIS_SERVER, '/usr/bin/redis-server', '/usr/local/bin/redis-server'];
  for (const c of candidates) {
    if (!c) continue;
    try {
      execFileSync(c, ['--version'], { stdio: 'ignore' });
      return c;
    } catch {
      /* try the next one */
    }
  }
  throw new Error('redis-server not found: install it (apt-get install redis-server) or set REDIS_SERVER; .ci/run installs it');
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

async function waitForPort(port: number, deadline: number): Promise<void> {
  for (;;) {
    const ok = await new Promise<boolean>((r) => {
      const c = connect(port, '127.0.0.1');
      c.once('connect', () => {
        c.destroy();
        r(true);
      });
      c.once('error', () => r(false));
    });
    if (ok) return;
    if (Date.now() > deadline) throw new Error(`redis-server did not listen on ${port}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Start a redis-server for this test; it is killed in the test's teardown. */
export async function startRedis(t: Tap.Test): Promise<RedisServer> {
  const bin = redisBinary();
  const port = await freePort();
  let child: ReturnType<typeof spawn> | undefined;
  const start = async () => {
    child = spawn(bin, ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--protected-mode', 'no'], {
      stdio: 'ignore',
    });
    await waitForPort(port, Date.now() + 10_000);
  };
  const kill = async () => {
    const c = child;
    if (!c || c.exitCode !== null || c.signalCode !== null) return;
    await new Promise<void>((r) => {
      c.once('exit', () => r());
      c.kill('SIGKILL');
    });
  };
  await start();
  t.teardown(kill);
  return { url: `redis://127.0.0.1:${port}`, port, kill, restart: start };
}
