// A new connection's connect limit counts from when it was opened, not from a
// clock read before the JavaScript that opened it ran: after 500 ms of
// synchronous work on the event loop (a slow config reload, a GC pause, a
// loaded machine), the first request to an endpoint with connectTimeoutMs
// 300 failed with "connect timeout" before its connect completion (already
// there) was even looked at. Both plain-http clients, a real loopback engine.
import t from 'tap';
import { createServer, type Server } from 'node:net';
import { NativeUpstreamClient } from '../../src/proxy/native-client.js';
import { EndpointSet } from '../../src/endpoints/endpoint.js';
import { DEFAULTS } from '../../src/config/schema.js';

// the native client over an endpoint given by IP address, and by DNS name (the
// TypeScript client these cases also ran over served names until it was retired)
const CLIENTS = [
  ['native', NativeUpstreamClient, '127.0.0.1'],
  ['native, endpoint named localhost', NativeUpstreamClient, 'localhost'],
] as const;

for (const [name, Client, host] of CLIENTS) {
  t.test(`${name}: a connect limit is not eaten by synchronous work before the send`, async (t) => {
    const server: Server = createServer((sock) => {
      sock.on('data', () => sock.write('HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok'));
      sock.on('error', () => {});
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    t.teardown(() => new Promise<void>((r) => server.close(() => r())));
    const port = (server.address() as { port: number }).port;
    const set = new EndpointSet([{ name: 'p', engine: 'vllm', accelerator: 'nvidia', models: ['m'], endpoints: [{ name: 'raw', url: `http://${host}:${port}`, role: 'both' }] }]);
    const client = new Client({ ...DEFAULTS.proxy, connectTimeoutMs: 300 });
    t.teardown(() => client.close());
    // a sweep timer from an earlier call, so the clock the client keeps is running
    const warm = await new Promise<string>((resolve) => {
      client.send(set.all[0]!, { method: 'GET', path: '/', headers: [], body: null }, {
        onUpstreamHeaders: () => {},
        onUpstreamData: () => {},
        onUpstreamEnd: () => resolve('ok'),
        onUpstreamError: (e) => resolve(e.message),
      });
    });
    t.equal(warm, 'ok', 'a first request');
    const result = await new Promise<string>((resolve) => {
      setImmediate(() => {
        const until = performance.now() + 500;
        while (performance.now() < until) {
          // synchronous work on the loop's thread
        }
        // a second call at once: the first connection is busy only if the pool
        // has none idle, so ask for two at the same time to open a new one
        let left = 2;
        const out: string[] = [];
        for (let i = 0; i < 2; i++) {
          client.send(set.all[0]!, { method: 'GET', path: '/', headers: [], body: null }, {
            onUpstreamHeaders: () => {},
            onUpstreamData: () => {},
            onUpstreamEnd: () => {
              out.push('ok');
              if (--left === 0) resolve(out.join(','));
            },
            onUpstreamError: (e) => {
              out.push(e.message);
              if (--left === 0) resolve(out.join(','));
            },
          });
        }
      });
    });
    t.equal(result, 'ok,ok', 'both answered (one on a new connection)');
  });
}
