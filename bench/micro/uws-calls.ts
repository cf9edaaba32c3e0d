// `node dist/bench/uws-calls.js`: what one uWS call costs with a JS string
// argument against a pre-encoded Buffer (uWS copies every string argument
// into a fresh UTF-8 heap buffer; a Buffer it reads in place), and three
// writeHeader calls against one call with a pre-built header block (the
// router's answer headers). In-process, inside one request handler on
// loopback; alternating variants, two passes, nanoseconds per call or per
// answer's headers.
//   node dist/bench/uws-calls.js [--iterations 300000]
import { uws } from '../../src/uws.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const argv = process.argv.slice(2);
const i = argv.indexOf('--iterations');
const N = i >= 0 ? Number(argv[i + 1]) : 300_000;
const KEY = 'content-length';
const KEY_BYTES = Buffer.from(KEY);
const BLOCK = Buffer.from('content-type: application/json\r\nx-switchyard-endpoint: e0\r\nx-request-id');
const ID = '6f1c2a9b-1k3z';
const HEADERS_PER_CORK = 50; // ~4 KB: stays inside uWS's 16 KB cork buffer
const CORKS = 40;

function ns(f: () => void, n: number): number {
  const t = process.hrtime.bigint();
  f();
  return Number(process.hrtime.bigint() - t) / n;
}

const app = uws.App();
app.get('/*', (res, req) => {
  let s = 0;
  const rows: string[] = [];
  for (let pass = 0; pass < 2; pass++) {
    const str = ns(() => {
      for (let k = 0; k < N; k++) s += req.getHeader(KEY).length;
    }, N);
    const buf = ns(() => {
      for (let k = 0; k < N; k++) s += req.getHeader(KEY_BYTES).length;
    }, N);
    rows.push(`| getHeader | ${pass + 1} | ${str.toFixed(1)} | ${buf.toFixed(1)} |`);
  }
  for (let pass = 0; pass < 2; pass++) {
    let three = 0;
    let one = 0;
    for (let c = 0; c < CORKS; c++) {
      // each cork is sent when it closes: time only what happens inside
      res.cork(() => {
        three += ns(() => {
          for (let k = 0; k < HEADERS_PER_CORK; k++) {
            res.writeHeader('content-type', 'application/json');
            res.writeHeader('x-switchyard-endpoint', 'e0');
            res.writeHeader('x-request-id', ID);
          }
        }, 1);
      });
      res.cork(() => {
        one += ns(() => {
          for (let k = 0; k < HEADERS_PER_CORK; k++) res.writeHeader(BLOCK, ID);
        }, 1);
      });
    }
    const n = CORKS * HEADERS_PER_CORK;
    rows.push(`| answer headers (3 string calls / 1 block call) | ${pass + 1} | ${(three / n).toFixed(1)} | ${(one / n).toFixed(1)} |`);
  }
  res.close();
  console.log(`uWS call costs, ns (${N} getHeader calls per variant and pass, ${CORKS * HEADERS_PER_CORK} answers' headers per pass; checksum ${s})`);
  console.log('| call | pass | JS strings | pre-encoded bytes |');
  console.log('|---|---:|---:|---:|');
  for (const r of rows) console.log(r);
  setImmediate(() => process.exit(0));
});
app.listen('127.0.0.1', 0, (sock) => {
  if (!sock) throw new Error('cannot listen');
  const port = uws.us_socket_local_port(sock as unknown as Parameters<typeof uws.us_socket_local_port>[0]);
  fetch(`http://127.0.0.1:${port}/`).catch(() => {});
});
