// `node dist/bench/framing-scan.js`: what the router's request-framing check
// (framingProblem: one req.forEach over every header line) costs per request,
// against the two header lookups the check would need if uWS reported
// duplicates itself (getHeader content-length + transfer-encoding). In-process,
// inside one uWS request handler per header set, on loopback; alternating
// variants, three passes, nanoseconds per request.
//   node dist/bench/framing-scan.js [--iterations 200000]
import { connect } from 'node:net';
import { uws } from '../../src/uws.js';
import { framingProblem } from '../../src/server/core.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const argv = process.argv.slice(2);
const i = argv.indexOf('--iterations');
const N = i >= 0 ? Number(argv[i + 1]) : 200_000;
const CL = Buffer.from('content-length');
const TE = Buffer.from('transfer-encoding');

/** Request heads: what wrk sends, what the OpenAI Python SDK sends, and a client behind two proxies. */
const HEADS: [string, string][] = [
  ['wrk (3 lines)', 'Host: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n'],
  [
    'OpenAI SDK (9 lines)',
    'Host: 127.0.0.1:8000\r\nAccept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\nAccept: application/json\r\nContent-Type: application/json\r\n' +
      'User-Agent: OpenAI/Python 1.40.0\r\nX-Stainless-Lang: python\r\nAuthorization: Bearer sk-abcdefghijklmnopqrstuvwxyz0123456789\r\nContent-Length: 2\r\n',
  ],
  [
    'SDK behind two proxies (20 lines)',
    'Host: 127.0.0.1:8000\r\nAccept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\nAccept: application/json\r\nContent-Type: application/json\r\n' +
      'User-Agent: OpenAI/Python 1.40.0\r\nX-Stainless-Lang: python\r\nX-Stainless-Package-Version: 1.40.0\r\nX-Stainless-OS: Linux\r\nX-Stainless-Arch: x64\r\n' +
      'X-Stainless-Runtime: CPython\r\nX-Stainless-Runtime-Version: 3.11.9\r\nX-Forwarded-For: 10.0.0.1, 10.0.0.2\r\nX-Forwarded-Proto: https\r\nX-Request-Id: 7d1e0c2a-55aa\r\n' +
      'Via: 1.1 envoy\r\nX-Envoy-Expected-Rq-Timeout-Ms: 600000\r\nTraceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n' +
      'Authorization: Bearer sk-abcdefghijklmnopqrstuvwxyz0123456789\r\nContent-Length: 2\r\n',
  ],
];

function ns(f: () => void): number {
  const t = process.hrtime.bigint();
  f();
  return Number(process.hrtime.bigint() - t) / N;
}

const rows: string[] = [];
let sum = 0;
let next = 0;
const app = uws.App();
app.any('/*', (res, req) => {
  const [name] = HEADS[next]!;
  for (let pass = 0; pass < 3; pass++) {
    const two = ns(() => {
      for (let k = 0; k < N; k++) sum += req.getHeader(CL).length + req.getHeader(TE).length;
    });
    const scan = ns(() => {
      for (let k = 0; k < N; k++) sum += framingProblem(req).length;
    });
    rows.push(`| ${name} | ${pass + 1} | ${two.toFixed(0)} | ${scan.toFixed(0)} | ${(scan - two).toFixed(0)} |`);
  }
  res.end('{}', true);
  next++;
  if (next < HEADS.length) send();
  else {
    console.log(`request framing check, ns per request (${N} per variant and pass; checksum ${sum})`);
    console.log('| request head | pass | 2 getHeader | framingProblem (forEach) | difference |');
    console.log('|---|---:|---:|---:|---:|');
    for (const r of rows) console.log(r);
    setImmediate(() => process.exit(0));
  }
});
let port = 0;
function send(): void {
  const s = connect(port, '127.0.0.1');
  s.on('error', () => {});
  s.write(`POST /x HTTP/1.1\r\n${HEADS[next]![1]}\r\n{}`);
}
app.listen('127.0.0.1', 0, (sock) => {
  if (!sock) throw new Error('cannot listen');
  port = uws.us_socket_local_port(sock as unknown as Parameters<typeof uws.us_socket_local_port>[0]);
  send();
});
