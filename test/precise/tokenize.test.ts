// Tokenizers for precise mode: the simulator's (in process), the engine's own
// POST /tokenize (a real simulated engine), a Hugging Face tokenizer.json +
// chat template in a piscina worker (a tiny BPE fixture), and the token
// source's cache, timeout fallback and counters.
import { createServer } from 'node:http';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { startEngine } from '../../src/sim/index.js';
import { renderChat } from '../../src/sim/tokenizer.js';
import { HfTokenizer } from '../../src/tokenize/hf-tokenizer.js';
import { TokenSource } from '../../src/tokenize/source.js';
import { EngineTokenizer, SimTokenizer } from '../../src/tokenize/tokenizer.js';

const HF_DIR = fileURLToPath(new URL('../fixtures/hf-tiny', import.meta.url));
const ids = (b: Uint8Array | null) => (b === null ? null : Array.from(new Uint32Array(b.buffer, b.byteOffset, b.length / 4)));

t.test('the simulator tokenizer agrees with the engine\'s POST /tokenize', async (t) => {
  const e = await startEngine({ timeScale: 0 });
  t.teardown(() => e.close());
  const sim = new SimTokenizer();
  const engine = new EngineTokenizer(() => e.url);
  const messages = [
    { role: 'system', content: 'be brief' },
    { role: 'user', content: 'héllo wörld, how are you today?' },
  ];
  for (const input of [{ model: 'open-model', messages }, { model: 'open-model', prompt: 'a prompt of some length' }, { model: 'open-model', prompt: [1, 2, 3, 70000] }]) {
    const a = ids(sim.tokenize(input));
    const b = ids(await engine.tokenize(input));
    t.same(a, b, JSON.stringify(input).slice(0, 40));
  }
  // the token bytes of a text prompt are its UTF-8 bytes (what the precise index hashes)
  const bytes = sim.tokenize({ model: 'm', messages })!;
  t.same(Buffer.from(bytes).subarray(0, Buffer.byteLength(renderChat(messages))).toString(), renderChat(messages));
  t.equal(sim.tokenize({ model: 'm', prompt: 42 }), null, 'not tokenizable');
});

t.test('a Hugging Face tokenizer.json and chat template, in a worker pool', async (t) => {
  const hf = new HfTokenizer(HF_DIR);
  t.teardown(() => hf.close());
  t.same(ids(await hf.tokenize({ model: 'm', prompt: 'hello world' })), [33, 37]);
  const chat = ids(await hf.tokenize({ model: 'm', messages: [{ role: 'user', content: 'hello' }] }))!;
  // "<|user|> hello <|assistant|>": the template ran, then the BPE merged "hello"
  t.ok(chat.includes(33), 'hello merged');
  t.ok(chat.length > 5);
  t.same(ids(await hf.tokenize({ model: 'm', prompt: [5, 6] })), [5, 6], 'token ids pass through');
  await t.rejects(new HfTokenizer('/nonexistent-dir').tokenize({ model: 'm', prompt: 'x' }) as Promise<unknown>, /ENOENT/);
});

t.test('token source: cache keyed by the prompt\'s block hashes, timeout and failure fall back (counted)', async (t) => {
  let calls = 0;
  let delayMs = 0;
  let fail = false;
  const server = createServer((req, res) => {
    calls++;
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      setTimeout(() => {
        if (fail) {
          res.writeHead(500).end('{}');
          return;
        }
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ count: 2, tokens: [7, 8] }));
      }, delayMs);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  const port = (server.address() as { port: number }).port;
  const src = new TokenSource(new Map([['m', { tokenizer: new EngineTokenizer(() => `http://127.0.0.1:${port}`), timeoutMs: 100, cacheEntries: 16 }]]));
  const prompt = Buffer.from('x'.repeat(200));
  t.same(ids(await src.tokens({ model: 'm', prompt: 'p' }, prompt)), [7, 8]);
  t.same(ids(await src.tokens({ model: 'm', prompt: 'p' }, prompt)), [7, 8]);
  t.equal(calls, 1, 'the second one came from the cache');
  t.equal(src.counters.cacheHits, 1);
  delayMs = 500;
  t.equal(await src.tokens({ model: 'm', prompt: 'q' }, Buffer.from('y'.repeat(200))), null, 'slow: null (approximate scoring)');
  t.equal(src.counters.timeouts, 1);
  delayMs = 0;
  fail = true;
  t.equal(await src.tokens({ model: 'm', prompt: 'r' }, Buffer.from('z'.repeat(200))), null, 'failed: null');
  t.equal(src.counters.failures, 1);
  t.equal(src.tokens({ model: 'other', prompt: 'r' }, prompt), null, 'a model without a tokenizer');
});
