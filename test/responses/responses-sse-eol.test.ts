// Streamed Responses stream whatever line ends the engine's SSE uses: a raw
// loopback engine that ends its lines with CRLF (one CRLF split across two
// writes) or a lone CR, its tokens 200 ms apart. Each delta must reach the
// client as the engine sends it, not all at the end, and the text must be
// whole.
import t from 'tap';
import { createServer } from 'node:http';
import { startTestRouter } from '../support/router-util.js';

const TOKENS = ['Hello', ', ', 'wor', 'ld', '!'];
const GAP_MS = 200;

async function engine(t: Tap.Test, eol: string): Promise<string> {
  const srv = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.url !== '/v1/chat/completions') return res.writeHead(req.url === '/health' ? 200 : 404).end();
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      let i = 0;
      const next = () => {
        if (res.destroyed) return;
        if (i < TOKENS.length) {
          const ev = `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content: TOKENS[i] }, finish_reason: null }] })}${eol}${eol}`;
          if (eol === '\r\n' && i === 1) {
            // a CRLF split across two writes: the CR ends one chunk, the LF begins the next
            res.write(ev.slice(0, -1));
            setTimeout(() => res.write(ev.slice(-1)), 20);
          } else res.write(ev);
          i++;
          setTimeout(next, GAP_MS);
          return;
        }
        const fin = { id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta: {}, finish_reason: 'stop' }], usage: { prompt_tokens: 3, completion_tokens: 5, total_tokens: 8 } };
        res.end(`data: ${JSON.stringify(fin)}${eol}${eol}data: [DONE]${eol}${eol}`);
      };
      next();
    });
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  t.teardown(() => {
    srv.closeAllConnections();
    srv.close();
  });
  return `http://127.0.0.1:${(srv.address() as { port: number }).port}`;
}

for (const [name, eol] of [
  ['CRLF', '\r\n'],
  ['CR', '\r'],
  ['LF', '\n'],
] as const) {
  t.test(`the engine ends SSE lines with ${name}: deltas stream as they come`, async (t) => {
    const url = await engine(t, eol);
    const { url: router } = await startTestRouter(t, { n: 1, pools: () => [{ name: 'p', models: ['raw-model'], endpoints: [{ name: 'raw', url }] }] });
    const t0 = performance.now();
    const res = await fetch(`${router}/v1/responses`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'raw-model', input: 'hi', stream: true }),
    });
    t.equal(res.status, 200);
    const dec = new TextDecoder();
    let buf = '';
    const deltaAt: number[] = [];
    const deltas: string[] = [];
    let final: any = null;
    for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
      buf += dec.decode(chunk, { stream: true });
      let at: number;
      while ((at = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, at);
        buf = buf.slice(at + 2);
        const data = ev.split('\n').find((l) => l.startsWith('data: '));
        if (data === undefined) continue;
        const o = JSON.parse(data.slice(6));
        if (o.type === 'response.output_text.delta') {
          deltas.push(o.delta);
          deltaAt.push(performance.now() - t0);
        }
        if (o.type === 'response.completed') final = o.response;
      }
    }
    const end = performance.now() - t0;
    t.same(deltas, TOKENS, 'every delta, in order');
    t.ok(final !== null, 'response.completed');
    t.equal(final?.output?.[0]?.content?.[0]?.text, TOKENS.join(''), 'the whole text');
    t.ok(end - deltaAt[0]! >= (TOKENS.length - 1) * GAP_MS * 0.8, `the first delta came ${Math.round(end - deltaAt[0]!)} ms before the end (streamed, not held)`);
  });
}
