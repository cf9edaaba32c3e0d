// Shared setup for router tests: a simulated fleet and a router in front of it,
// both on loopback ports the OS picks, torn down with the test.
import { createServer, type Socket } from 'node:net';
import { EndpointSet } from '../../src/endpoints/endpoint.js';
import type { UpstreamClient, UpstreamSink } from '../../src/proxy/upstream.js';
import { startEngine, startFleet, type SimEngine, type SimFleet, type FleetOptions } from '../../src/sim/index.js';
import { parseConfig } from '../../src/config/load.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { registry } from '../../src/scheduler/plugins/index.js';
import { startRouter, type RunningRouter } from '../../src/server/router.js';

/** Plugin validation as `switchyard serve` does it. */
export const validatePlugin = (kind: 'filter' | 'scorer' | 'picker', s: { type: string; params: Record<string, unknown> }) =>
  registry.validate(kind, s.type, s.params);

export interface TestRouterOptions {
  /** Engines in the fleet (default 2). */
  n?: number;
  fleet?: FleetOptions;
  /** Top-level config fields merged over the defaults (proxy, scheduling, flowControl, ...). */
  extra?: Record<string, unknown>;
  /** Builds `pools` from the fleet's URLs; default: one pool `p` serving open-model. */
  pools?: (urls: string[]) => unknown;
  /** Endpoints appended to the default pool (e.g. a dead one). */
  extraEndpoints?: { name: string; url: string }[];
}

export async function startTestRouter(t: Tap.Test, o: TestRouterOptions = {}): Promise<{ fleet: SimFleet; router: RunningRouter; url: string }> {
  const fleet = await startFleet(o.n ?? 2, o.fleet ?? { timeScale: 0 });
  const cfg = validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: o.pools
        ? o.pools(fleet.urls)
        : [{ name: 'p', models: ['open-model'], endpoints: [...fleet.urls.map((url, i) => ({ name: `e${i}`, url })), ...(o.extraEndpoints ?? [])] }],
      logging: { level: 'silent' },
      ...o.extra,
    },
    validatePlugin,
  );
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(async () => {
    await router.close(200);
    await fleet.close();
  });
  return { fleet, router, url: router.url };
}

/**
 * A raw TCP server on a loopback port the OS picks, for hand-written engine
 * behaviour: `onSocket` handles each connection (socket errors are ignored).
 * Its sockets are destroyed and it closes with the test.
 */
export async function listenRaw(t: Tap.Test, onSocket: (sock: Socket) => void): Promise<{ port: number; socks: Set<Socket> }> {
  const socks = new Set<Socket>();
  const srv = createServer((sock) => {
    socks.add(sock);
    sock.on('error', () => {});
    sock.on('close', () => socks.delete(sock));
    onSocket(sock);
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  t.teardown(
    () =>
      new Promise<void>((r) => {
        for (const s of socks) s.destroy();
        srv.close(() => r());
      }),
  );
  return { port: (srv.address() as { port: number }).port, socks };
}

export interface ServeProcess {
  child: import('node:child_process').ChildProcessWithoutNullStreams;
  /** The router's URL from its "listening on" log line. */
  url: string;
  /** Everything it printed on stdout so far. */
  out(): string;
  /** Resolves with [exit code, signal] when it exits. */
  exited: Promise<[number | null, string | null]>;
}

/** Spawns `switchyard serve` (needs dist/) and waits for its listening line; killed at teardown. */
// 60 s: a loaded machine (CI beside other work) starts a router process in tens of seconds; a quiet one in under one
export async function spawnServe(t: Tap.Test, args: string[], startTimeoutMs = 60_000): Promise<ServeProcess> {
  const { spawn } = await import('node:child_process');
  const { fileURLToPath } = await import('node:url');
  const bin = fileURLToPath(new URL('../../bin/switchyard.js', import.meta.url));
  const child = spawn(process.execPath, [bin, 'serve', ...args], { stdio: ['pipe', 'pipe', 'pipe'] });
  t.teardown(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  });
  let out = '';
  child.stdout.on('data', (b: Buffer) => (out += b.toString()));
  const exited = new Promise<[number | null, string | null]>((r) => child.once('exit', (c, s) => r([c, s])));
  let timer: NodeJS.Timeout | undefined;
  const url = await new Promise<string>((resolve, reject) => {
    const look = () => {
      const m = /listening on (http:\/\/[0-9.:]+)/.exec(out);
      if (m) resolve(m[1]);
    };
    child.stdout.on('data', look);
    void exited.then(([code]) => reject(new Error(`exited ${code}: ${out}`)));
    timer = setTimeout(() => reject(new Error(`no listening line: ${out}`)), startTimeoutMs);
  }).finally(() => clearTimeout(timer));
  return { child, url, out: () => out, exited };
}

/** Longest gap between 5 ms ticks of this process's event loop (the router's) while `fn` runs. */
export async function maxStall<T>(fn: () => Promise<T>): Promise<[T, number]> {
  let max = 0;
  let last = performance.now();
  const tick = setInterval(() => {
    const now = performance.now();
    if (now - last > max) max = now - last;
    last = now;
  }, 5);
  try {
    return [await fn(), max];
  } finally {
    clearInterval(tick);
  }
}

/**
 * A raw engine for upstream-client tests: calls onRequest(sock, n, conn) for the
 * n-th complete request (1-based, over all connections; bodies framed by
 * Content-Length) on connection `conn`, so a test scripts the answer bytes.
 * Returns a one-endpoint set (pool p, model m) and the connection count.
 * Sockets are destroyed and the server closed with the test.
 */
export async function rawEngine(
  t: Tap.Test,
  onRequest: (sock: Socket, n: number, conn: number) => void,
  /** The host the endpoint URL names: `localhost` sends the client through its DNS lookup. */
  urlHost = '127.0.0.1',
): Promise<{ set: EndpointSet; conns: () => number }> {
  let conns = 0;
  let requests = 0;
  const sockets = new Set<Socket>();
  const server = createServer((sock) => {
    const conn = ++conns;
    sockets.add(sock);
    sock.on('close', () => sockets.delete(sock));
    let buf = '';
    sock.on('data', (b) => {
      buf += b.toString('latin1');
      for (;;) {
        const end = buf.indexOf('\r\n\r\n');
        if (end < 0) return;
        const len = Number(/content-length: (\d+)/i.exec(buf.slice(0, end))?.[1] ?? 0);
        if (buf.length < end + 4 + len) return;
        buf = buf.slice(end + 4 + len);
        onRequest(sock, ++requests, conn);
      }
    });
    sock.on('error', () => {});
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as { port: number }).port;
  t.teardown(() => {
    for (const s of sockets) s.destroy();
    return new Promise<void>((r) => server.close(() => r()));
  });
  const set = new EndpointSet([{ name: 'p', engine: 'vllm', accelerator: 'nvidia', models: ['m'], endpoints: [{ name: 'raw', url: `http://${urlHost}:${port}`, role: 'both' }] }]);
  return { set, conns: () => conns };
}

export interface CollectedAnswer {
  status: number;
  contentType: string;
  body: string;
  error?: Error & { code?: string };
}

/** Sends one POST through an upstream client to the set's first endpoint and collects the answer (or the error). */
export function collect(client: UpstreamClient, set: EndpointSet, path = '/x'): Promise<CollectedAnswer> {
  return new Promise((resolve) => {
    const r: CollectedAnswer = { status: 0, contentType: '', body: '' };
    const sink: UpstreamSink = {
      onUpstreamHeaders: (status, ct) => {
        r.status = status;
        r.contentType = ct;
      },
      onUpstreamData: (chunk) => {
        r.body += chunk.toString('latin1');
      },
      onUpstreamEnd: () => resolve(r),
      onUpstreamError: (err) => {
        r.error = err;
        resolve(r);
      },
    };
    client.send(set.all[0]!, { method: 'POST', path, headers: ['content-type', 'application/json'], body: Buffer.from('{}') }, sink);
  });
}

/**
 * One simulated engine and a router in front of it (pool `p`, endpoint `e0`,
 * model `open-model`, logging silent), `tail` appended to the router's YAML
 * (a flowControl block, …); both closed with the test.
 */
export async function routerOverEngine(
  t: Tap.Test,
  engineOpts: Parameters<typeof startEngine>[0],
  tail: string,
  source: string,
): Promise<{ router: RunningRouter; engine: SimEngine }> {
  const engine = await startEngine(engineOpts);
  const cfg = parseConfig(
    `apiVersion: switchyard/v1
kind: Router
pools:
  - name: p
    engine: vllm
    models: [open-model]
    endpoints:
      - { name: e0, url: "${engine.url}" }
logging: { level: silent }
${tail}`,
    validatePlugin,
    source,
  );
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(async () => {
    await router.close(200);
    await engine.close();
  });
  return { router, engine };
}
