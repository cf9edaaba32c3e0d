// A small fake serving engine whose prefill runs IN PARALLEL up to its slot
// count, for benchmarks that must not depend on one engine model. The
// simulator (src/sim) and testkit/reference/engine-model.ts both prefill one
// request at a time; here every request holding a slot prefills at once, the
// way a continuous-batching engine mixes several prompts into one forward
// pass. Written on its own, sharing no code with src/sim.
//
// Cost model (model milliseconds, multiplied by the engine's cost factor):
//
//   - admission: at most `slots` requests hold a slot; others wait (FIFO)
//     and count as vllm:num_requests_waiting;
//   - prefill: a request's work is `prefillMs` + `usPerToken` × prompt
//     tokens / 1000 (4 characters a token, no prefix cache: every prompt is
//     fresh work). With k requests prefilling at once each advances at rate
//     1 / (1 + contention × (k − 1)): contention 0 is perfect parallelism, 1
//     is processor sharing (the serial engine's total throughput, spread).
//     Exact event-driven progress: one timer per engine, for the next finish;
//   - decode: a token every `itlMs` × (1 + decodeSlowdown × running).
//
// Serves POST /v1/chat/completions and /v1/completions (streamed SSE and
// not), GET /health, /v1/models, /metrics (vllm:num_requests_waiting,
// vllm:num_requests_running, vllm:kv_cache_usage_perc: tokens held by
// running requests over `kvTokens`).
//
//   node dist/bench/lib/parallel-engine.js --fleet N --base-port P
//        [--cost-factors 1,1,3,3] [--slots 16] [--prefill-ms 5] [--us-per-token 250]
//        [--contention 0.25] [--itl-ms 5] [--decode-slowdown 0.01] [--kv-tokens 262144]
//        [--time-scale 1] [--model open-model]
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';

export interface ParallelEngineOptions {
  port: number;
  model: string;
  /** Multiplies every cost (3 = a 3× slower engine). */
  costFactor: number;
  slots: number;
  prefillMs: number;
  usPerToken: number;
  contention: number;
  itlMs: number;
  decodeSlowdown: number;
  kvTokens: number;
  /** Wall time per model time. */
  timeScale: number;
}

export const PARALLEL_ENGINE_DEFAULTS: Omit<ParallelEngineOptions, 'port'> = {
  model: 'open-model',
  costFactor: 1,
  slots: 16,
  prefillMs: 5,
  usPerToken: 250,
  contention: 0.25,
  itlMs: 5,
  decodeSlowdown: 0.01,
  kvTokens: 262144,
  timeScale: 1,
};

const MAX_BODY = 16 * 1024 * 1024;
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

interface Prefill {
  /** Remaining work, model ms at rate 1. */
  left: number;
  done: () => void;
}

function err(res: ServerResponse, status: number, message: string, type = 'invalid_request_error'): void {
  if (res.headersSent) return void res.destroy();
  res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify({ error: { message, type, param: null, code: null } }));
}

export class ParallelEngine {
  readonly o: ParallelEngineOptions;
  #server: Server | null = null;
  #running = 0;
  #kvHeld = 0;
  readonly #slotWaiters: (() => void)[] = [];
  readonly #prefills = new Set<Prefill>();
  /** Wall time (performance.now()) the prefills' `left` was last brought up to date. */
  #stamp = 0;
  #timer: NodeJS.Timeout | null = null;
  requests = 0;
  /** The most prefills ever in progress at once (a test checks the parallelism). */
  maxConcurrentPrefills = 0;

  constructor(o: Partial<ParallelEngineOptions> & { port: number }) {
    this.o = { ...PARALLEL_ENGINE_DEFAULTS, ...o };
  }

  #rate(): number {
    const k = this.#prefills.size;
    return k <= 1 ? 1 : 1 / (1 + this.o.contention * (k - 1));
  }

  /** Brings every prefill's remaining work up to now, finishes those done, arms the timer for the next. */
  #advance(): void {
    const now = performance.now();
    const modelMs = (now - this.#stamp) / this.o.timeScale;
    this.#stamp = now;
    const step = modelMs * this.#rate();
    for (const p of this.#prefills) {
      p.left -= step;
      if (p.left <= 1e-6) {
        this.#prefills.delete(p);
        p.done();
      }
    }
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
    if (this.#prefills.size === 0) return;
    let min = Infinity;
    for (const p of this.#prefills) min = Math.min(min, p.left);
    const wall = (min / this.#rate()) * this.o.timeScale;
    this.#timer = setTimeout(() => this.#advance(), Math.max(0, wall));
  }

  #prefill(ms: number): Promise<void> {
    return new Promise<void>((done) => {
      this.#advance();
      this.#prefills.add({ left: ms, done });
      this.maxConcurrentPrefills = Math.max(this.maxConcurrentPrefills, this.#prefills.size);
      this.#advance();
    });
  }

  async #slot(): Promise<void> {
    if (this.#running < this.o.slots) {
      this.#running++;
      return;
    }
    await new Promise<void>((r) => this.#slotWaiters.push(r));
    this.#running++;
  }

  #release(): void {
    this.#running--;
    this.#slotWaiters.shift()?.();
  }

  async #serve(chat: boolean, body: Record<string, any>, res: ServerResponse): Promise<void> {
    let text: string;
    if (chat) {
      if (!Array.isArray(body.messages)) return err(res, 400, "'messages' must be an array");
      text = '';
      for (const m of body.messages as { role?: unknown; content?: unknown }[]) text += `${String(m?.role)}\n${typeof m?.content === 'string' ? m.content : JSON.stringify(m?.content ?? '')}\n`;
    } else {
      if (typeof body.prompt !== 'string') return err(res, 400, "'prompt' must be a string");
      text = body.prompt;
    }
    const maxTokens = body.max_tokens ?? body.max_completion_tokens ?? 16;
    if (!Number.isInteger(maxTokens) || maxTokens < 1 || maxTokens > 100000) return err(res, 400, "'max_tokens' must be an integer in [1, 100000]");
    this.requests++;
    const n = this.requests;
    const promptTokens = Math.ceil(text.length / 4);
    const f = this.o.costFactor;
    let closed = false;
    res.once('close', () => (closed = true));
    await this.#slot();
    this.#kvHeld += promptTokens + maxTokens;
    try {
      if (closed) return;
      await this.#prefill(f * (this.o.prefillMs + (this.o.usPerToken * promptTokens) / 1000));
      if (closed) return;
      const itl = () => f * this.o.itlMs * (1 + this.o.decodeSlowdown * this.#running) * this.o.timeScale;
      const id = `${chat ? 'chatcmpl' : 'cmpl'}-par-${n}`;
      const created = Math.floor(Date.now() / 1000);
      const usage = { prompt_tokens: promptTokens, completion_tokens: maxTokens, total_tokens: promptTokens + maxTokens };
      const word = (i: number) => `t${i % 10} `;
      if (body.stream !== true) {
        // the first token comes out of the prefill; the rest are decoded
        let out = word(0);
        for (let i = 1; i < maxTokens && !closed; i++) {
          await sleep(itl());
          out += word(i);
        }
        if (closed) return;
        const choice = chat ? { index: 0, message: { role: 'assistant', content: out }, finish_reason: 'length' } : { index: 0, text: out, logprobs: null, finish_reason: 'length' };
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ id, object: chat ? 'chat.completion' : 'text_completion', created, model: body.model, choices: [choice], usage }));
        return;
      }
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      const chunk = (piece: string | null, finish: string | null) => {
        const c = chat ? { index: 0, delta: piece === null ? {} : { content: piece }, finish_reason: finish } : { index: 0, text: piece ?? '', logprobs: null, finish_reason: finish };
        return `data: ${JSON.stringify({ id, object: chat ? 'chat.completion.chunk' : 'text_completion', created, model: body.model, choices: [c] })}\n\n`;
      };
      if (chat) res.write(`data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created, model: body.model, choices: [{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }] })}\n\n`);
      for (let i = 0; i < maxTokens; i++) {
        if (closed) return;
        if (i > 0) await sleep(itl());
        res.write(chunk(word(i), null));
      }
      if (closed) return;
      res.write(chunk(null, 'length'));
      const tail = body.stream_options?.include_usage === true ? `data: ${JSON.stringify({ id, object: chat ? 'chat.completion.chunk' : 'text_completion', created, model: body.model, choices: [], usage })}\n\n` : '';
      res.end(`${tail}data: [DONE]\n\n`);
    } finally {
      this.#kvHeld -= promptTokens + maxTokens;
      this.#release();
    }
  }

  #metrics(): string {
    const l = `{model_name="${this.o.model}"}`;
    return (
      `# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running${l} ${this.#running}\n` +
      `# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting${l} ${this.#slotWaiters.length}\n` +
      `# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc${l} ${Math.min(1, this.#kvHeld / this.o.kvTokens).toFixed(4)}\n`
    );
  }

  #handle(req: IncomingMessage, res: ServerResponse, raw: string): void {
    const url = (req.url ?? '/').split('?')[0];
    if (req.method === 'GET' && url === '/health') return void res.writeHead(200).end();
    if (req.method === 'GET' && url === '/metrics') return void res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' }).end(this.#metrics());
    if (req.method === 'GET' && url === '/v1/models') {
      return void res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ object: 'list', data: [{ id: this.o.model, object: 'model', owned_by: 'parallel-engine' }] }));
    }
    const chat = url === '/v1/chat/completions';
    if (req.method !== 'POST' || (!chat && url !== '/v1/completions')) return err(res, 404, `no route ${req.method} ${url}`);
    let body: Record<string, any>;
    try {
      body = JSON.parse(raw);
    } catch {
      return err(res, 400, 'the body is not valid JSON');
    }
    if (typeof body !== 'object' || body === null || Array.isArray(body)) return err(res, 400, 'the body must be a JSON object');
    if (body.model !== this.o.model) return err(res, 404, `the model '${String(body.model)}' does not exist`, 'NotFoundError');
    this.#serve(chat, body, res).catch(() => res.destroy());
  }

  async listen(host = '127.0.0.1'): Promise<string> {
    const server = createServer((req, res) => {
      let raw = '';
      let size = 0;
      req.setEncoding('utf8');
      req.on('data', (d: string) => {
        size += d.length;
        if (size > MAX_BODY) {
          err(res, 413, `the body exceeds ${MAX_BODY} bytes`);
          req.destroy();
          return;
        }
        raw += d;
      });
      req.on('end', () => {
        if (size <= MAX_BODY) this.#handle(req, res, raw);
      });
    });
    server.keepAliveTimeout = 60_000;
    this.#server = server;
    await new Promise<void>((r, j) => server.once('error', j).listen(this.o.port, host, () => r()));
    return `http://${host}:${(server.address() as { port: number }).port}`;
  }

  close(): Promise<void> {
    const s = this.#server;
    if (this.#timer !== null) clearTimeout(this.#timer);
    if (s === null) return Promise.resolve();
    s.closeAllConnections();
    return new Promise((r) => s.close(() => r()));
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const argv = process.argv.slice(2);
  if (argv.includes('--help') || argv.includes('-h')) {
    process.stdout.write('usage: node dist/bench/lib/parallel-engine.js --fleet N --base-port P [--cost-factors 1,1,3,3] [--slots 16] [--prefill-ms 5] [--us-per-token 250] [--contention 0.25] [--itl-ms 5] [--decode-slowdown 0.01] [--kv-tokens 262144] [--time-scale 1] [--model open-model]\n');
    process.exit(0);
  }
  const opt = (name: string, d: number) => {
    const i = argv.indexOf(name);
    const v = i >= 0 ? Number(argv[i + 1]) : d;
    if (!Number.isFinite(v) || v < 0) {
      console.error(`parallel-engine: ${name} must be a non-negative number`);
      process.exit(2);
    }
    return v;
  };
  const fleet = opt('--fleet', 1);
  const base = opt('--base-port', 8000);
  const mi = argv.indexOf('--model');
  const ci = argv.indexOf('--cost-factors');
  const factors = ci >= 0 ? argv[ci + 1]!.split(',').map(Number) : [1];
  if (factors.some((x) => !Number.isFinite(x) || x <= 0)) {
    console.error('parallel-engine: --cost-factors must be positive numbers');
    process.exit(2);
  }
  const D = PARALLEL_ENGINE_DEFAULTS;
  const o: Omit<ParallelEngineOptions, 'port' | 'costFactor'> = {
    model: mi >= 0 ? argv[mi + 1]! : D.model,
    slots: Math.max(1, Math.floor(opt('--slots', D.slots))),
    prefillMs: opt('--prefill-ms', D.prefillMs),
    usPerToken: opt('--us-per-token', D.usPerToken),
    contention: opt('--contention', D.contention),
    itlMs: opt('--itl-ms', D.itlMs),
    decodeSlowdown: opt('--decode-slowdown', D.decodeSlowdown),
    kvTokens: Math.max(1, opt('--kv-tokens', D.kvTokens)),
    timeScale: opt('--time-scale', D.timeScale),
  };
  // the last factor repeats: `--fleet 4 --cost-factors 1,1,3` is 1,1,3,3
  const engines = Array.from({ length: fleet }, (_, i) => new ParallelEngine({ ...o, costFactor: factors[Math.min(i, factors.length - 1)]!, port: base + i }));
  Promise.all(engines.map((e) => e.listen())).then(
    (urls) => console.error(`parallel-engine: ${urls.map((u, i) => `${u} (×${engines[i]!.o.costFactor})`).join(' ')}`),
    (e: Error) => {
      console.error(`parallel-engine: ${e.message}`);
      process.exit(1);
    },
  );
  const stop = () => void Promise.all(engines.map((e) => e.close())).then(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}
