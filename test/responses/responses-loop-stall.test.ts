// Nothing big on the event loop in the Responses API: a ~15 MB POST
// /v1/responses body (350,000 tiny messages, the last one invalid) is parsed
// off the loop, and `input_items?limit=1` on a ~7 MB stored conversation
// parses only its page. The router runs as `switchyard serve` in its own
// process (test/support/loop-probe.mjs measures its loop); its worst own stall
// (the wall-clock gap less the time its thread waited for a CPU) while both
// run must stay within 50 ms (the best of three rounds after a warm-up: the
// machine is shared; on one so contended that the baseline's JSON.parse of
// the body takes over 200 ms, a quarter of that: stallBound). The engine
// is a raw loopback server that reads nothing of the prompt.
import t from 'tap';
import { createServer } from 'node:http';
import { startTestRouter } from '../support/router-util.js';
import { measureRounds, spawnProbedRouter, stallBound } from '../support/loop-stall.js';

async function engine(t: Tap.Test): Promise<string> {
  const srv = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.url !== '/v1/chat/completions') return res.writeHead(req.url === '/health' ? 200 : 404).end();
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ id: 'c', object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }], usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } }));
    });
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  t.teardown(() => {
    srv.closeAllConnections();
    srv.close();
  });
  return `http://127.0.0.1:${(srv.address() as { port: number }).port}`;
}

const post = (url: string, body: Buffer) => fetch(`${url}/v1/responses`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });

t.test('a 15 MB Responses body and input_items on a 7 MB conversation keep the loop within 50 ms', async (t) => {
  const raw = await engine(t);
  const router = await spawnProbedRouter(t, 'raw-model', [{ name: 'raw', url: raw }], {
    responses: { maxInputBytes: 64 * 1024 * 1024 },
    limits: { maxBodyBytes: 32 * 1024 * 1024 },
  });
  const url = router.url;
  // a ~7 MB stored conversation of 120,000 messages (stored through the off-loop path too)
  const made = await post(url, Buffer.from(JSON.stringify({ model: 'raw-model', input: Array.from({ length: 120_000 }, (_, i) => ({ role: i % 2 === 0 ? 'user' : 'assistant', content: `message ${i} of a long one` })) })));
  t.equal(made.status, 200, 'the long conversation is stored');
  const id = ((await made.json()) as { id: string }).id;
  // the hostile body: 350,000 tiny messages, the last invalid (a 400 after the whole parse)
  const bad = Buffer.from(JSON.stringify({ model: 'raw-model', input: [...Array.from({ length: 350_000 }, () => ({ role: 'user', content: 'hi' })), { role: 'robot', content: 'x' }] }));
  t.ok(bad.length > 10 * 1000 * 1000, `${(bad.length / 1e6).toFixed(1)} MB body`);

  // one warm-up round (the parse pool's first thread starts, the stored record is first read), then the
  // measured rounds; the machine is shared, so a round can be preempted: the best round's worst stall counts
  const round = async () => {
    const answers = await Promise.all([
      post(url, bad).then(async (r) => ({ status: r.status, body: (await r.json()) as any })),
      post(url, bad).then(async (r) => ({ status: r.status, body: (await r.json()) as any })),
      (async () => {
        const pages: any[] = [];
        for (let i = 0; i < 20; i++) pages.push(await (await fetch(`${url}/v1/responses/${id}/input_items?limit=1`)).json());
        return pages;
      })(),
    ]);
    return answers as [{ status: number; body: any }, { status: number; body: any }, any[]];
  };
  await round();
  const { results, best } = await measureRounds(t, router, 3, 'round', round);
  const last = results[results.length - 1];
  const [a, b, pages] = last!;
  t.equal(a.status, 400, 'the invalid last item is a 400');
  t.equal(a.body.error.param, 'input[350000].role', 'naming the field');
  t.equal(b.status, 400);
  t.equal(pages.length, 20);
  t.equal(pages[0].data.length, 1);
  t.equal(pages[0].data[0].content[0].text, 'message 119999 of a long one', 'the newest input item');
  t.equal(pages[0].has_more, true);
  // the baseline, on a loop (this one), now: what the old code did for each of the two bodies (a JSON.parse
  // of it, before any check; the old stall was that and the checks: 570-900 ms for 12 MB)
  const t0 = performance.now();
  JSON.parse(bad.toString('utf8'));
  const onLoop = performance.now() - t0;
  const bound = stallBound(onLoop);
  t.comment(`the body's JSON.parse on a loop: ${onLoop.toFixed(0)} ms`);
  t.ok(best.own <= bound, `the router loop's worst own stall in the best round (${best.own.toFixed(1)} ms) is at most ${bound.toFixed(0)} ms`);
});

t.test('input_items pages without parsing the chain: order, after, has_more, the last page', async (t) => {
  const raw = await engine(t);
  const { url } = await startTestRouter(t, { n: 1, pools: () => [{ name: 'p', models: ['raw-model'], endpoints: [{ name: 'raw', url: raw }] }] });
  const tricky = 'a "quoted" },{"role":"user"} \\ line\nend';
  const r1 = (await (await post(url, Buffer.from(JSON.stringify({ model: 'raw-model', input: [{ role: 'user', content: 'one' }, { role: 'user', content: tricky }] })))).json()) as any;
  const r2 = (await (await post(url, Buffer.from(JSON.stringify({ model: 'raw-model', input: 'three', previous_response_id: r1.id })))).json()) as any;
  const get = async (q: string) => (await (await fetch(`${url}/v1/responses/${r2.id}/input_items${q}`)).json()) as any;
  const asc = await get('?order=asc');
  t.same(
    asc.data.map((i: any) => [i.role, i.content[0].text]),
    [
      ['user', 'one'],
      ['user', tricky],
      ['assistant', 'ok'],
      ['user', 'three'],
    ],
    'every input item in order, a content that looks like a separator intact',
  );
  t.equal(asc.has_more, false);
  const desc = await get('?limit=2');
  t.same(desc.data.map((i: any) => i.content[0].text), ['three', 'ok']);
  t.equal(desc.has_more, true);
  const next = await get(`?limit=2&after=${desc.last_id}`);
  t.same(next.data.map((i: any) => i.content[0].text), [tricky, 'one']);
  t.equal(next.has_more, false);
  const ascAfter = await get(`?order=asc&limit=1&after=${asc.data[1].id}`);
  t.same(ascAfter.data.map((i: any) => i.content[0].text), ['ok']);
  t.equal(ascAfter.has_more, true);
  const badAfter = await fetch(`${url}/v1/responses/${r2.id}/input_items?after=msg_nope`);
  t.equal(badAfter.status, 400);
});
