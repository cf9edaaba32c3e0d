// A plain reference model of a serving engine, independent of the simulator
// (src/sim/): written as simply as possible, sharing none of its code, so a
// benchmark that shows a routing effect on the simulator can show it on a
// second engine model too. An OpenAI-compatible chat completions server
// (streamed and not) whose costs come from:
//
//   - a prefix cache: the rendered prompt (each message as `role\ncontent\n`,
//     tool calls as `name(arguments)`) cut into blocks of `blockChars`
//     characters, each block keyed by a hash of the whole prefix through it;
//     a Map in insertion order is the LRU, `cacheBlocks` entries at most;
//   - one compute queue: prefills run one at a time, each costing
//     `prefillMs` + `prefillUsPerBlock` per uncached block;
//   - decoding: every running request emits a token every `itlMs` while at
//     most `maxRunning` run; others wait for a slot before their prefill;
//   - LoRA adapters (`adapters`, requested by name in `model`): at most
//     `maxLoras` distinct adapters are resident; a request whose adapter is
//     not resident takes a free place or the oldest idle adapter's, paying
//     `loraLoadMs` on the compute queue; with every place held by adapters
//     with running requests it waits until one is released.
//
// Tool calls: with `tools` and a tool_choice of "required" or a named
// function, the answer is a call (arguments `{"q": "..."}` streamed in
// fragments, finish_reason tool_calls); otherwise text. It serves /health,
// /v1/models and /metrics (vllm:num_requests_waiting/running,
// vllm:kv_cache_usage_perc) so a router scores it like a vLLM engine.
//
//   node dist/testkit/reference/engine-model.js --fleet N --base-port P
//        [--cache-blocks 400] [--block-chars 256] [--prefill-ms 5] [--prefill-us-per-block 6400]
//        [--itl-ms 10] [--max-running 16] [--time-scale 1] [--model open-model]
//        [--adapters a,b,c] [--max-loras 4] [--lora-load-ms 0]
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';

export interface EngineModelOptions {
  port: number;
  model: string;
  cacheBlocks: number;
  blockChars: number;
  prefillMs: number;
  prefillUsPerBlock: number;
  itlMs: number;
  maxRunning: number;
  /** Wall time per model time. */
  timeScale: number;
  /** LoRA adapters served on top of `model`. */
  adapters: string[];
  maxLoras: number;
  loraLoadMs: number;
}

export const ENGINE_MODEL_DEFAULTS: Omit<EngineModelOptions, 'port'> = {
  model: 'open-model',
  cacheBlocks: 400,
  blockChars: 256,
  prefillMs: 5,
  prefillUsPerBlock: 6400,
  itlMs: 10,
  maxRunning: 16,
  timeScale: 1,
  adapters: [],
  maxLoras: 4,
  loraLoadMs: 0,
};

/** FNV-1a over a string, continued from `h` (a prefix's hash extends to the next block). */
function fnv(h: number, s: string): number {
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}

function render(messages: unknown): string {
  if (!Array.isArray(messages)) return '';
  let s = '';
  for (const m of messages as { role?: unknown; content?: unknown; tool_calls?: { function?: { name?: unknown; arguments?: unknown } }[] }[]) {
    s += `${String(m.role)}\n${typeof m.content === 'string' ? m.content : ''}\n`;
    for (const c of m.tool_calls ?? []) s += `${String(c.function?.name)}(${String(c.function?.arguments)})\n`;
  }
  return s;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

export class EngineModel {
  readonly o: EngineModelOptions;
  readonly #cache = new Map<number, true>();
  #running = 0;
  #waiting = 0;
  readonly #slotWaiters: (() => void)[] = [];
  /** The compute queue: the promise the next prefill waits for. */
  #compute: Promise<void> = Promise.resolve();
  #server: Server | null = null;
  requests = 0;
  /** Resident adapters → their running requests (insertion order: oldest first). */
  readonly #resident = new Map<string, number>();
  readonly #adapterWaiters: (() => void)[] = [];
  readonly #adapterWaiting = new Map<string, number>();
  /** Adapters made resident (each cost loraLoadMs). */
  loraLoads = 0;

  constructor(o: Partial<EngineModelOptions> & { port: number }) {
    this.o = { ...ENGINE_MODEL_DEFAULTS, ...o };
  }

  /** Blocks of `text` already cached; records every block (most recent last). */
  #lookup(text: string): { blocks: number; hits: number } {
    const n = Math.floor(text.length / this.o.blockChars);
    let h = 0x811c9dc5;
    let hits = 0;
    let missed = false;
    for (let b = 0; b < n; b++) {
      h = fnv(h, text.slice(b * this.o.blockChars, (b + 1) * this.o.blockChars));
      const had = this.#cache.delete(h);
      if (had && !missed) hits++;
      else missed = true;
      this.#cache.set(h, true);
    }
    while (this.#cache.size > this.o.cacheBlocks) this.#cache.delete(this.#cache.keys().next().value!);
    return { blocks: n, hits };
  }

  async #slot(): Promise<void> {
    if (this.#running < this.o.maxRunning) {
      this.#running++;
      return;
    }
    this.#waiting++;
    await new Promise<void>((r) => this.#slotWaiters.push(r));
    this.#waiting--;
    this.#running++;
  }

  #release(): void {
    this.#running--;
    this.#slotWaiters.shift()?.();
  }

  /** Makes `a` resident (waiting for a place if need be); returns the model ms its load costs (0: it was resident). */
  async #adapter(a: string): Promise<number> {
    for (;;) {
      const n = this.#resident.get(a);
      if (n !== undefined) {
        this.#resident.delete(a);
        this.#resident.set(a, n + 1);
        return 0;
      }
      if (this.#resident.size >= this.o.maxLoras) {
        for (const [k, v] of this.#resident) {
          if (v === 0) {
            this.#resident.delete(k);
            break;
          }
        }
      }
      if (this.#resident.size < this.o.maxLoras) {
        this.#resident.set(a, 1);
        this.loraLoads++;
        return this.o.loraLoadMs;
      }
      this.#adapterWaiting.set(a, (this.#adapterWaiting.get(a) ?? 0) + 1);
      await new Promise<void>((r) => this.#adapterWaiters.push(r));
      const w = this.#adapterWaiting.get(a)! - 1;
      if (w > 0) this.#adapterWaiting.set(a, w);
      else this.#adapterWaiting.delete(a);
    }
  }

  #adapterDone(a: string): void {
    this.#resident.set(a, this.#resident.get(a)! - 1);
    for (const w of this.#adapterWaiters.splice(0)) w();
  }

  /** Waits its turn on the compute queue and spends `ms` (model time). */
  #prefill(ms: number): Promise<void> {
    const p = this.#compute.then(() => sleep(ms * this.o.timeScale));
    this.#compute = p;
    return p;
  }

  async #chat(body: Record<string, any>, res: ServerResponse): Promise<void> {
    this.requests++;
    const prompt = render(body.messages);
    const promptTokens = Math.ceil(prompt.length / 4);
    const maxTokens = typeof body.max_tokens === 'number' ? body.max_tokens : 16;
    const tools = Array.isArray(body.tools) ? (body.tools as { function?: { name?: string } }[]) : [];
    const choice = body.tool_choice;
    const named = typeof choice === 'object' && choice !== null ? (choice.function?.name as string | undefined) : undefined;
    const callName = tools.length > 0 && (choice === 'required' || named !== undefined) ? (named ?? tools[0]!.function?.name ?? 'tool') : null;
    const adapter = this.o.adapters.includes(body.model) ? (body.model as string) : null;
    await this.#slot();
    let loadMs = 0;
    let holds = false;
    try {
      if (adapter !== null) {
        loadMs = await this.#adapter(adapter);
        holds = true;
      }
      // an adapter's blocks are its own
      const { blocks, hits } = this.#lookup(adapter === null ? prompt : `${adapter}\n${prompt}`);
      await this.#prefill(this.o.prefillMs + loadMs + ((blocks - hits) * this.o.prefillUsPerBlock) / 1000);
      const cached = Math.min(promptTokens, Math.floor((hits * this.o.blockChars) / 4));
      const id = `chatcmpl-model-${this.requests}`;
      const created = Math.floor(Date.now() / 1000);
      const args = callName === null ? '' : JSON.stringify({ q: `lookup ${this.requests} ${'x'.repeat(Math.max(0, maxTokens * 4 - 24))}` });
      const pieces: string[] = [];
      if (callName === null) for (let i = 0; i < maxTokens; i++) pieces.push(`w${i % 10} `);
      else for (let i = 0; i < args.length; i += 4) pieces.push(args.slice(i, i + 4));
      const usage = { prompt_tokens: promptTokens, completion_tokens: pieces.length, total_tokens: promptTokens + pieces.length, prompt_tokens_details: { cached_tokens: cached } };
      const finish = callName === null ? (pieces.length >= maxTokens ? 'length' : 'stop') : 'tool_calls';
      const callId = `chatcmpl-tool-m${this.requests}`;
      if (body.stream !== true) {
        await sleep(pieces.length * this.o.itlMs * this.o.timeScale);
        const message =
          callName === null
            ? { role: 'assistant', content: pieces.join(''), tool_calls: [] }
            : { role: 'assistant', content: null, tool_calls: [{ id: callId, type: 'function', function: { name: callName, arguments: args } }] };
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ id, object: 'chat.completion', created, model: body.model, choices: [{ index: 0, message, finish_reason: finish }], usage }));
        return;
      }
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const chunk = (delta: unknown, fr: string | null = null) => `data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created, model: body.model, choices: [{ index: 0, delta, finish_reason: fr }] })}\n\n`;
      res.write(chunk({ role: 'assistant', content: '' }));
      if (callName !== null) res.write(chunk({ tool_calls: [{ index: 0, id: callId, type: 'function', function: { name: callName, arguments: '' } }] }));
      for (const p of pieces) {
        if (res.destroyed) return;
        res.write(chunk(callName === null ? { content: p } : { tool_calls: [{ index: 0, function: { arguments: p } }] }));
        await sleep(this.o.itlMs * this.o.timeScale);
      }
      res.write(chunk({}, finish));
      res.end(`data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created, model: body.model, choices: [], usage })}\n\ndata: [DONE]\n\n`);
    } finally {
      if (holds) this.#adapterDone(adapter!);
      this.#release();
    }
  }

  #metrics(): string {
    const l = `{model_name="${this.o.model}"}`;
    return (
      `vllm:num_requests_running${l} ${this.#running}\n` +
      `vllm:num_requests_waiting${l} ${this.#waiting}\n` +
      `vllm:kv_cache_usage_perc${l} ${(this.#cache.size / this.o.cacheBlocks).toFixed(4)}\n` +
      (this.o.adapters.length === 0
        ? ''
        : `vllm:lora_requests_info{max_lora="${this.o.maxLoras}",model_name="${this.o.model}",running_lora_adapters="${[...this.#resident].filter(([, n]) => n > 0).map(([a]) => a).join(',')}",waiting_lora_adapters="${[...this.#adapterWaiting.keys()].join(',')}"} ${Date.now() / 1000}\n`)
    );
  }

  #handle(req: IncomingMessage, res: ServerResponse, raw: string): void {
    const url = req.url ?? '/';
    if (url === '/health') return void res.writeHead(200).end();
    if (url === '/metrics') return void res.writeHead(200, { 'content-type': 'text/plain' }).end(this.#metrics());
    if (url === '/v1/models') {
      return void res.writeHead(200, { 'content-type': 'application/json' }).end(
        JSON.stringify({
          object: 'list',
          data: [{ id: this.o.model, object: 'model', owned_by: 'engine-model' }, ...this.o.adapters.map((a) => ({ id: a, object: 'model', owned_by: 'engine-model', parent: this.o.model, root: a }))],
        }),
      );
    }
    if (req.method !== 'POST' || url !== '/v1/chat/completions') return void res.writeHead(404, { 'content-type': 'application/json' }).end('{"error":{"message":"not found","type":"invalid_request_error","param":null,"code":null}}');
    let body: Record<string, any>;
    try {
      body = JSON.parse(raw);
    } catch {
      return void res.writeHead(400, { 'content-type': 'application/json' }).end('{"error":{"message":"invalid JSON","type":"invalid_request_error","param":null,"code":null}}');
    }
    this.#chat(body, res).catch(() => res.destroy());
  }

  async listen(host = '127.0.0.1'): Promise<string> {
    const server = createServer((req, res) => {
      let raw = '';
      req.setEncoding('utf8');
      req.on('data', (d: string) => (raw += d));
      req.on('end', () => this.#handle(req, res, raw));
    });
    this.#server = server;
    await new Promise<void>((r, j) => server.once('error', j).listen(this.o.port, host, () => r()));
    return `http://${host}:${(server.address() as { port: number }).port}`;
  }

  close(): Promise<void> {
    const s = this.#server;
    if (s === null) return Promise.resolve();
    s.closeAllConnections();
    return new Promise((r) => s.close(() => r()));
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const argv = process.argv.slice(2);
  const opt = (name: string, d: number) => {
    const i = argv.indexOf(name);
    return i >= 0 ? Number(argv[i + 1]) : d;
  };
  const fleet = opt('--fleet', 1);
  const base = opt('--base-port', 8000);
  const mi = argv.indexOf('--model');
  const o: Omit<EngineModelOptions, 'port'> = {
    model: mi >= 0 ? argv[mi + 1]! : ENGINE_MODEL_DEFAULTS.model,
    cacheBlocks: opt('--cache-blocks', ENGINE_MODEL_DEFAULTS.cacheBlocks),
    blockChars: opt('--block-chars', ENGINE_MODEL_DEFAULTS.blockChars),
    prefillMs: opt('--prefill-ms', ENGINE_MODEL_DEFAULTS.prefillMs),
    prefillUsPerBlock: opt('--prefill-us-per-block', ENGINE_MODEL_DEFAULTS.prefillUsPerBlock),
    itlMs: opt('--itl-ms', ENGINE_MODEL_DEFAULTS.itlMs),
    maxRunning: opt('--max-running', ENGINE_MODEL_DEFAULTS.maxRunning),
    timeScale: opt('--time-scale', ENGINE_MODEL_DEFAULTS.timeScale),
    adapters: argv.includes('--adapters') ? argv[argv.indexOf('--adapters') + 1]!.split(',') : [],
    maxLoras: opt('--max-loras', ENGINE_MODEL_DEFAULTS.maxLoras),
    loraLoadMs: opt('--lora-load-ms', ENGINE_MODEL_DEFAULTS.loraLoadMs),
  };
  const engines = Array.from({ length: fleet }, (_, i) => new EngineModel({ ...o, port: base + i }));
  Promise.all(engines.map((e) => e.listen())).then(
    (urls) => console.error(`engine-model: ${urls.join(' ')}`),
    (err: Error) => {
      console.error(`engine-model: ${err.message}`);
      process.exit(1);
    },
  );
  const stop = () => void Promise.all(engines.map((e) => e.close())).then(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}
