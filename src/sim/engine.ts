// One simulated engine: an OpenAI-compatible HTTP server on uWebSockets.js in
// front of a Scheduler. Several engines can share one process and event loop.

import {
  BOOTSTRAP_PATH,
  bootstrap,
  bootstrapTarget,
  checkRole,
  decodeTransferError,
  pull,
  pullTarget,
  PdRuleError,
  PULL_PATH,
  roomKey,
  RoomTable,
  TransferTable,
  type BootstrapTarget,
  type PullTarget,
} from './pd.js';
import { jsonNestsDeeper } from '../json-depth.js';
import { uws, type HttpRequest, type HttpResponse, type TemplatedApp, type us_listen_socket } from '../uws.js';
import { hashByteBlocks, hashTokenBlocks } from './kv-cache.js';
import { SimMetrics } from './metrics.js';
import { KvEventPublisher, resolveKvEventsConfig } from './kv-events.js';
import { resolveSimOptions, scaledCosts, type FailureKind, type ResolvedSimOptions, type SimOptions, SimOptionError } from './options.js';
import { ReqState, Scheduler, SimRequest, type RequestSink, type SchedulerStats } from './scheduler.js';
import { BYTES_PER_TOKEN, renderChat, type ChatMessage } from './tokenizer.js';
import { PoolingError, detokenize, embeddings, rerank, score } from './pooling.js';
import { mix32, rng, word, words } from './text.js';

export interface SimEngineStats extends SchedulerStats {
  /** HTTP requests currently open (reading, waiting, running or delayed). */
  open: number;
  healthy: boolean;
}

export interface SimEngine {
  /** http://HOST:PORT */
  readonly url: string;
  readonly port: number;
  readonly options: ResolvedSimOptions;
  stats(): SimEngineStats;
  /** Marks the engine dead (GET /health answers 503) or alive again. */
  setHealthy(healthy: boolean): void;
  /** Changes failure injection at run time. */
  setFailures(rate: number, kinds?: FailureKind[]): void;
  /** Graceful shutdown: new requests 503, in-flight ones finish (up to graceMs), then close. */
  drain(graceMs?: number): Promise<void>;
  /** Drops every idle cached KV block. */
  clearCache(): void;
  /** An engine restart as the fleet sees it: the cache is gone, the KV-event publisher starts again at seq 0 (POST /sim/restart). */
  restart(): void;
  /**
   * Starts (names) or stops (null) recording the named request headers of
   * every POST, for tests that check what a router forwards; the last 256 are
   * kept, oldest first. Off by default (then no cost).
   */
  recordHeaders(names: readonly string[] | null): void;
  /** The recorded requests: path and the named headers ('' when absent). */
  recorded(): { path: string; headers: Record<string, string> }[];
  /** The KV-event publisher (null unless kvEventsConfig enables it): its bound addresses, restart (seq 0). */
  readonly kvEvents: KvEventPublisher | null;
  /** The inter-token latencies so far, model ms (empty unless options.keepItlSamples). */
  itlSamples(): readonly number[];
  /** Renders /metrics text (what GET /metrics serves). */
  metricsText(): Promise<string>;
  /** Stops listening, drops open connections and frees everything. Idempotent. */
  close(): Promise<void>;
}

const STATUS: Record<number, string> = {
  200: '200 OK',
  400: '400 Bad Request',
  404: '404 Not Found',
  405: '405 Method Not Allowed',
  413: '413 Payload Too Large',
  429: '429 Too Many Requests',
  500: '500 Internal Server Error',
  503: '503 Service Unavailable',
};
const ERROR_TYPE: Record<number, string> = {
  400: 'BadRequestError',
  404: 'NotFoundError',
  405: 'MethodNotAllowed',
  413: 'BadRequestError',
  429: 'RateLimitError',
  500: 'InternalServerError',
  503: 'ServiceUnavailableError',
};

/** The OpenAI/vLLM error body. */
export function errorBody(status: number, message: string, param: string | null = null, legacy = false): string {
  const fields = `"message":${JSON.stringify(message)},"type":"${ERROR_TYPE[status] ?? 'Error'}","param":${
    param === null ? 'null' : JSON.stringify(param)
  },"code":${status}`;
  // Older vLLM releases answered a flat object.
  return legacy ? `{"object":"error",${fields}}` : `{"error":{${fields}}}`;
}

/** Past Python's default recursion limit a real engine's JSON decoder gives up. */
const ENGINE_MAX_JSON_DEPTH = 1000;
const JSON_TYPE = 'application/json';
const SSE_TYPE = 'text/event-stream; charset=utf-8';
const DONE = 'data: [DONE]\n\n';

let scratch = Buffer.allocUnsafe(1 << 16);
const hashScratch: number[] = [];

class BadRequest {
  constructor(
    readonly status: number,
    readonly message: string,
    readonly param: string | null,
  ) {}
}

const enum Kind {
  Completion = 0,
  Chat = 1,
  Tokenize = 2,
  Detokenize = 3,
  Embeddings = 4,
  Score = 5,
  Rerank = 6,
}

/** Routes that answer at once, without generating (the pooling and tokenizer routes). */
const INSTANT_ROUTES: [string, Kind][] = [
  ['/tokenize', Kind.Tokenize],
  ['/detokenize', Kind.Detokenize],
  ['/v1/embeddings', Kind.Embeddings],
  ['/score', Kind.Score],
  ['/v1/score', Kind.Score],
  ['/rerank', Kind.Rerank],
  ['/v1/rerank', Kind.Rerank],
  ['/v2/rerank', Kind.Rerank],
];
const POST_PATHS = new Set(['/v1/completions', '/v1/chat/completions', ...INSTANT_ROUTES.map(([p]) => p), '/sim/restart']);

let idCounter = 0;
const CHAT_MAX_KEYS = ['max_completion_tokens', 'max_tokens'] as const;
const COMPLETION_MAX_KEYS = ['max_tokens'] as const;

/** The HTTP side of one POST: reads the body, then receives the request's tokens. */
class Call implements RequestSink {
  aborted = false;
  ended = false;
  body: Buffer | null = null;
  bodyLen = 0;
  req: SimRequest | null = null;
  stream = false;
  includeUsage = false;
  failure: FailureKind | null = null;
  failAt = 0;
  textSeed = 0;
  head = '';
  modelJson = '';
  id = '';
  created = 0;
  kvParams: string | null = null;
  /** A decode leg's transfer to read from its prefill engine before it runs (P/D, src/sim/pd.ts). */
  pullFrom: PullTarget | null = null;
  /** SGLang decode leg: the prefill engine and bootstrap room whose KV it waits for. */
  bootFrom: BootstrapTarget | null = null;
  /** SGLang prefill leg: its bootstrap room (open in the engine's RoomTable until this request ends). */
  room: string | null = null;
  delay: NodeJS.Timeout | null = null;

  constructor(
    readonly engine: Engine,
    readonly res: HttpResponse,
    readonly kind: Kind,
    readonly rid: string,
  ) {}

  onAborted(): void {
    this.aborted = true;
    this.engine.calls.delete(this);
    this.roomEnd(false);
    if (this.delay !== null) clearTimeout(this.delay);
    if (this.req !== null) this.engine.sched.abort(this.req);
  }

  onData(chunk: ArrayBuffer, isLast: boolean): void {
    if (this.ended) return;
    const len = chunk.byteLength;
    if (this.bodyLen + len > this.engine.options.maxBodyBytes) {
      this.sendError(413, `request body exceeds ${this.engine.options.maxBodyBytes} bytes`, null);
      return;
    }
    if (isLast && this.body === null) {
      // One chunk: use it in place, synchronously (uWS reuses the buffer after we return).
      this.handleBytes(Buffer.from(chunk, 0, len));
      return;
    }
    if (this.body === null) this.body = Buffer.allocUnsafe(Math.max(len * 2, 4096));
    if (this.bodyLen + len > this.body.length) {
      const grown = Buffer.allocUnsafe(Math.max((this.bodyLen + len) * 2, this.body.length * 2));
      this.body.copy(grown, 0, 0, this.bodyLen);
      this.body = grown;
    }
    this.body.set(new Uint8Array(chunk, 0, len), this.bodyLen);
    this.bodyLen += len;
    if (isLast) this.handleBytes(this.body.subarray(0, this.bodyLen));
  }

  /** A body in place (valid only during this call). */
  handleBytes(b: Buffer): void {
    // Python's json gives up past its recursion limit (~1000 levels); vLLM answers 400
    if (jsonNestsDeeper(b, ENGINE_MAX_JSON_DEPTH)) {
      this.sendError(400, `Invalid JSON body: nesting deeper than ${ENGINE_MAX_JSON_DEPTH} levels`, null);
      return;
    }
    this.handle(b.toString('utf8'));
  }

  handle(text: string): void {
    let body: unknown;
    try {
      body = JSON.parse(text);
    } catch (err) {
      this.sendError(400, `Invalid JSON body: ${(err as Error).message}`, null);
      return;
    }
    try {
      this.start(body);
    } catch (err) {
      if (err instanceof BadRequest) this.sendError(err.status, err.message, err.param);
      else this.sendError(500, `internal error: ${(err as Error).message}`, null);
    }
  }

  start(b: unknown): void {
    const e = this.engine;
    const o = e.options;
    if (typeof b !== 'object' || b === null || Array.isArray(b)) throw new BadRequest(400, 'request body must be a JSON object', null);
    const body = b as Record<string, unknown>;
    // Model.
    let model = body.model;
    if (model === undefined || model === null) model = o.models[0];
    if (typeof model !== 'string') throw new BadRequest(400, "'model' must be a string", 'model');
    const modelJson = e.modelJson.get(model);
    if (modelJson === undefined) throw new BadRequest(404, `The model \`${model}\` does not exist.`, 'model');
    this.modelJson = modelJson;
    const lora = e.loraSalt.has(model) ? model : null;
    if (this.kind === Kind.Tokenize) {
      this.tokenize(body);
      return;
    }
    if (this.kind >= Kind.Detokenize) {
      this.pooling(body);
      return;
    }
    // Stream flags.
    const stream = body.stream;
    if (stream !== undefined && stream !== null && typeof stream !== 'boolean') throw new BadRequest(400, "'stream' must be a boolean", 'stream');
    this.stream = stream === true;
    const so = body.stream_options;
    if (so !== undefined && so !== null) {
      if (typeof so !== 'object' || Array.isArray(so)) throw new BadRequest(400, "'stream_options' must be an object", 'stream_options');
      const iu = (so as Record<string, unknown>).include_usage;
      if (iu !== undefined && iu !== null && typeof iu !== 'boolean') {
        throw new BadRequest(400, "'stream_options.include_usage' must be a boolean", 'stream_options');
      }
      if (!this.stream) throw new BadRequest(400, 'Stream options can only be defined when `stream=True`.', 'stream_options');
      this.includeUsage = iu === true;
    }
    const n = body.n;
    if (n !== undefined && n !== null && n !== 1) throw new BadRequest(400, "the simulator supports only 'n': 1", 'n');
    // Prompt → bytes or token ids → block hashes.
    const hashes = hashScratch;
    let promptTokens: number;
    let nBlocks: number;
    let metaTokens: Uint32Array | null = null;
    let seed = o.seed;
    if (this.kind === Kind.Chat) {
      const messages = body.messages;
      if (!Array.isArray(messages) || messages.length === 0) throw new BadRequest(400, "'messages' must be a non-empty array", 'messages');
      for (let i = 0; i < messages.length; i++) checkMessage(messages[i], i);
      const text = renderChat(messages as ChatMessage[]);
      const len = writeScratch(text);
      promptTokens = Math.ceil(len / BYTES_PER_TOKEN);
      nBlocks = hashByteBlocks(scratch, len, o.blockSize * BYTES_PER_TOKEN, hashes);
      seed ^= tailHash(scratch, nBlocks * o.blockSize * BYTES_PER_TOKEN, len);
      if (e.kvEvents !== null) metaTokens = byteBlockTokens(nBlocks * o.blockSize);
    } else {
      let prompt = body.prompt;
      if (Array.isArray(prompt) && prompt.length === 1 && (typeof prompt[0] === 'string' || Array.isArray(prompt[0]))) prompt = prompt[0];
      if (typeof prompt === 'string') {
        const len = writeScratch(prompt);
        promptTokens = Math.ceil(len / BYTES_PER_TOKEN);
        nBlocks = hashByteBlocks(scratch, len, o.blockSize * BYTES_PER_TOKEN, hashes);
        seed ^= tailHash(scratch, nBlocks * o.blockSize * BYTES_PER_TOKEN, len);
        if (e.kvEvents !== null) metaTokens = byteBlockTokens(nBlocks * o.blockSize);
      } else if (Array.isArray(prompt) && prompt.length > 0 && prompt.every((t) => Number.isInteger(t) && t >= 0)) {
        promptTokens = prompt.length;
        nBlocks = hashTokenBlocks(prompt as number[], o.blockSize, hashes);
        if (e.kvEvents !== null) metaTokens = Uint32Array.from((prompt as number[]).slice(0, nBlocks * o.blockSize));
        let h = prompt.length;
        for (let i = nBlocks * o.blockSize; i < prompt.length; i++) h = Math.imul(h ^ (prompt[i] as number), 0x01000193);
        seed ^= h;
      } else if (prompt === undefined || prompt === null) {
        throw new BadRequest(400, "'prompt' is required", 'prompt');
      } else if (Array.isArray(prompt) && prompt.length > 1) {
        throw new BadRequest(400, 'the simulator accepts one prompt per request (a string or an array of token ids)', 'prompt');
      } else {
        throw new BadRequest(400, "'prompt' must be a string or an array of token ids", 'prompt');
      }
    }
    if (promptTokens === 0) throw new BadRequest(400, 'The prompt is empty.', this.kind === Kind.Chat ? 'messages' : 'prompt');
    if (lora !== null) {
      // An adapter's KV differs from the base model's: its blocks hash apart (vLLM adds the LoRA id to the block key).
      const salt = e.loraSalt.get(lora)!;
      for (let i = 0; i < nBlocks; i++) hashes[i] = (hashes[i]! * 31 + salt) % 9007199254740881;
    }
    if (nBlocks > 0) seed ^= mix32(hashes[nBlocks - 1]! | 0);
    // Output length.
    let maxTokens: number | undefined;
    for (const key of this.kind === Kind.Chat ? CHAT_MAX_KEYS : COMPLETION_MAX_KEYS) {
      const v = body[key];
      if (v === undefined || v === null) continue;
      if (typeof v !== 'number' || !Number.isInteger(v) || v < 1) throw new BadRequest(400, `'${key}' must be an integer >= 1`, key);
      maxTokens = v;
      break;
    }
    if (promptTokens > o.maxModelLen || promptTokens + (maxTokens ?? 1) > o.maxModelLen) {
      throw new BadRequest(
        400,
        maxTokens === undefined || promptTokens > o.maxModelLen
          ? `This model's maximum context length is ${o.maxModelLen} tokens. However, your request has ${promptTokens} input tokens. Please reduce the length of the input messages.`
          : `This model's maximum context length is ${o.maxModelLen} tokens. However, you requested ${promptTokens + maxTokens} tokens (${promptTokens} in the messages, ${maxTokens} in the completion). Please reduce the length of the messages or completion.`,
        this.kind === Kind.Chat ? 'messages' : 'prompt',
      );
    }
    const finishReason = maxTokens === undefined ? 'stop' : 'length';
    let outTokens = maxTokens ?? Math.min(o.defaultMaxTokens, o.maxModelLen - promptTokens);
    const needBlocks = e.sched.blocksNeeded(promptTokens, outTokens);
    if (needBlocks > o.kvCacheBlocks) {
      throw new BadRequest(400, `the request needs ${needBlocks} KV blocks but the cache holds ${o.kvCacheBlocks}`, 'max_tokens');
    }
    const rs = body.seed;
    if (rs !== undefined && rs !== null) {
      if (typeof rs !== 'number' || !Number.isInteger(rs)) throw new BadRequest(400, "'seed' must be an integer", 'seed');
      seed = mix32(o.seed ^ rs);
    }
    this.textSeed = mix32(seed);
    // P/D: a prefill leg answers with kv_transfer_params; a decode leg skips the prefill work.
    let remotePrefill = false;
    const kv = body.kv_transfer_params;
    if (kv !== undefined && kv !== null) {
      if (typeof kv !== 'object' || Array.isArray(kv)) throw new BadRequest(400, "'kv_transfer_params' must be an object", 'kv_transfer_params');
      const k = kv as Record<string, unknown>;
      if (k.do_remote_prefill === true) remotePrefill = true;
      else if (k.do_remote_decode === true) this.kvParams = '';
    }
    try {
      checkRole(o.engine, o.role, body, this.rid);
      if (remotePrefill) this.pullFrom = pullTarget(kv as Record<string, unknown>);
      if (o.engine === 'sglang' && o.role === 'decode') {
        // a decode server pairs with the prefill server its bootstrap fields name
        this.bootFrom = bootstrapTarget(body);
        if (this.bootFrom !== null) remotePrefill = true;
      } else if (o.engine === 'sglang' && o.role === 'prefill') {
        // a prefill server computes the prompt and the first token for its decode side: nothing more
        this.room = roomKey(body.bootstrap_room);
        outTokens = 1;
      }
    } catch (err) {
      if (err instanceof PdRuleError) throw new BadRequest(err.status, err.message, err.param);
      throw err;
    }
    // Identity.
    const prefix = this.kind === Kind.Chat ? 'chatcmpl-' : 'cmpl-';
    this.id = JSON.stringify(prefix + (this.rid !== '' ? this.rid : e.idPrefix + (++idCounter).toString(16)));
    this.created = Math.floor(Date.now() / 1000);
    if (this.room !== null) e.rooms.open(this.room); // from here on its decode side waits for it (or learns it failed)
    // Failure injection.
    if (e.failureRate > 0 && e.rand() < e.failureRate) {
      const kind = e.failureKinds[Math.floor(e.rand() * e.failureKinds.length)]!;
      switch (kind) {
        case '500':
          throw new BadRequest(500, 'simulated engine failure (injected)', null);
        case '429':
          throw new BadRequest(429, 'simulated rate limit (injected)', null);
        case '503':
          throw new BadRequest(503, 'simulated overload: service unavailable (injected)', null);
        default:
          this.failure = kind;
          this.failAt = Math.max(1, Math.floor(outTokens / 2));
      }
    }
    const privateBlocks = needBlocks - nBlocks;
    const req = new SimRequest(hashes.slice(0, nBlocks), nBlocks, promptTokens, outTokens, privateBlocks, finishReason, remotePrefill, this);
    req.lora = lora;
    if (metaTokens !== null) req.meta = { tokens: metaTokens, loraId: lora === null ? null : e.loraId.get(lora)!, loraName: lora };
    this.req = req;
    if (this.kvParams !== null) {
      this.kvParams = this.kvTransferParams(req);
      e.transfers.add(JSON.parse(this.id) as string); // held for the decode side until read or expired
    }
    if (this.stream) {
      this.head =
        this.kind === Kind.Chat
          ? `data: {"id":${this.id},"object":"chat.completion.chunk","created":${this.created},"model":${this.modelJson},"choices":[{"index":0,"delta":`
          : `data: {"id":${this.id},"object":"text_completion","created":${this.created},"model":${this.modelJson},"choices":[{"index":0,"text":"`;
    }
    if (this.failure === 'slow-first-byte' && o.slowFirstByteMs > 0) {
      this.delay = setTimeout(() => {
        this.delay = null;
        if (!this.aborted) e.sched.submit(req);
      }, o.slowFirstByteMs);
      return;
    }
    const boot = this.bootFrom;
    if (boot !== null) {
      // the decode side waits for its room's KV from the prefill engine: a room that never gets there fails the request
      void bootstrap(boot, o.bootstrapTimeoutMs).then((problem) => {
        if (this.aborted || this.ended) return;
        if (problem !== null) this.sendError(500, decodeTransferError(JSON.parse(this.id) as string, boot.room, problem), null);
        else e.sched.submit(req);
      });
      return;
    }
    const from = this.pullFrom;
    if (from !== null) {
      // the decode side reads the prefill's KV first: a transfer its engine does not hold fails the request
      void pull(from).then((problem) => {
        if (this.aborted || this.ended) return;
        if (problem !== null) this.sendError(500, `KV transfer from ${from.engineId} (request ${from.requestId}) failed: ${problem}`, 'kv_transfer_params');
        else e.sched.submit(req);
      });
      return;
    }
    e.sched.submit(req);
  }

  /** vLLM's POST /tokenize: the prompt's (or rendered messages') token count and simulated ids. */
  tokenize(body: Record<string, unknown>): void {
    let ids: number[];
    if (body.messages !== undefined) {
      const messages = body.messages;
      if (!Array.isArray(messages) || messages.length === 0) throw new BadRequest(400, "'messages' must be a non-empty array", 'messages');
      for (let i = 0; i < messages.length; i++) checkMessage(messages[i], i);
      ids = byteTokenIds(renderChat(messages as ChatMessage[]));
    } else if (typeof body.prompt === 'string') {
      ids = byteTokenIds(body.prompt);
    } else if (Array.isArray(body.prompt) && body.prompt.every((t) => Number.isInteger(t) && t >= 0)) {
      ids = body.prompt as number[];
    } else {
      throw new BadRequest(400, "'prompt' (a string or token ids) or 'messages' is required", 'prompt');
    }
    const out = `{"count":${ids.length},"max_model_len":${this.engine.options.maxModelLen},"tokens":[${ids.join(',')}],"token_strs":null}`;
    this.ended = true;
    this.engine.calls.delete(this);
    const res = this.res;
    res.cork(() => {
      this.writeHead(res, JSON_TYPE);
      res.end(out);
    });
  }

  /** Embeddings, score, rerank, detokenize: answered at once (pooling.ts). */
  pooling(body: Record<string, unknown>): void {
    const id = this.rid !== '' ? this.rid : this.engine.idPrefix + (++idCounter).toString(16);
    const created = Math.floor(Date.now() / 1000);
    let out: string;
    try {
      switch (this.kind) {
        case Kind.Embeddings:
          out = embeddings(body, this.modelJson, id, created);
          break;
        case Kind.Score:
          out = score(body, this.modelJson, id, created);
          break;
        case Kind.Rerank:
          out = rerank(body, this.modelJson, id);
          break;
        default:
          out = detokenize(body);
      }
    } catch (err) {
      if (err instanceof PoolingError) throw new BadRequest(400, err.message, err.param);
      throw err;
    }
    this.ended = true;
    this.engine.calls.delete(this);
    const res = this.res;
    res.cork(() => {
      this.writeHead(res, JSON_TYPE);
      res.end(out);
    });
  }

  kvTransferParams(req: SimRequest): string {
    const e = this.engine;
    const ids: number[] = [];
    for (let i = 0; i < req.nBlocks; i++) ids.push(req.hashes[i]! % 1_000_000_007);
    return `{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[${ids.join(',')}],"remote_engine_id":${JSON.stringify(
      e.engineId,
    )},"remote_request_id":${this.id},"remote_host":${JSON.stringify(e.options.host)},"remote_port":${e.port},"tp_size":1}`;
  }

  // --- RequestSink ---

  tokens(req: SimRequest, from: number, to: number): void {
    if (this.aborted) return;
    let upTo = to;
    const fail = this.failure === 'reset-mid-stream' || this.failure === 'error-mid-stream';
    if (fail && upTo >= this.failAt) upTo = this.failAt;
    if (this.stream && upTo > from) {
      const res = this.res;
      res.cork(() => {
        if (from === 0) {
          this.writeHead(res, SSE_TYPE);
          if (this.kind === Kind.Chat) res.write(this.head + '{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n');
        }
        for (let i = from; i < upTo; i++) res.write(this.chunk(req, i));
      });
    }
    if (fail && to >= this.failAt) this.fail(req);
  }

  fail(req: SimRequest): void {
    const e = this.engine;
    e.sched.abort(req);
    this.roomEnd(false);
    if (this.failure === 'reset-mid-stream') {
      this.ended = true;
      e.calls.delete(this);
      this.res.close();
      return;
    }
    // error-mid-stream
    if (this.stream) {
      this.ended = true;
      e.calls.delete(this);
      const res = this.res;
      res.cork(() => {
        res.write(`data: ${errorBody(500, 'simulated error in the middle of the stream (injected)', null, this.engine.options.legacy)}\n\n`);
        res.end(DONE);
      });
    } else {
      this.sendError(500, 'simulated error during generation (injected)', null);
    }
  }

  chunk(req: SimRequest, i: number): string {
    const w = word(this.textSeed, i);
    const last = i === req.maxTokens - 1;
    const fr = last ? `"${req.finishReason}"` : 'null';
    if (this.kind === Kind.Chat) return `${this.head}{"content":"${w}"},"logprobs":null,"finish_reason":${fr}${last ? ',"stop_reason":null' : ''}}]}\n\n`;
    return `${this.head}${w}","logprobs":null,"finish_reason":${fr},"stop_reason":null}]}\n\n`;
  }

  usage(req: SimRequest): string {
    return `{"prompt_tokens":${req.promptTokens},"total_tokens":${req.promptTokens + req.out},"completion_tokens":${req.out},"prompt_tokens_details":{"cached_tokens":${req.cachedTokens}}}`;
  }

  finish(req: SimRequest): void {
    if (this.aborted) return;
    this.ended = true;
    this.engine.calls.delete(this);
    this.roomEnd(true);
    const res = this.res;
    if (this.stream) {
      res.cork(() => {
        if (this.includeUsage) {
          const h = this.kind === Kind.Chat ? 'chat.completion.chunk' : 'text_completion';
          res.write(`data: {"id":${this.id},"object":"${h}","created":${this.created},"model":${this.modelJson},"choices":[],"usage":${this.usage(req)}}\n\n`);
        }
        res.end(DONE);
      });
      return;
    }
    const text = words(this.textSeed, 0, req.out);
    const kvp = this.kvParams !== null ? `,"kv_transfer_params":${this.kvParams}` : '';
    const body =
      this.kind === Kind.Chat
        ? `{"id":${this.id},"object":"chat.completion","created":${this.created},"model":${this.modelJson},"choices":[{"index":0,"message":{"role":"assistant","content":"${text}","tool_calls":[]},"logprobs":null,"finish_reason":"${req.finishReason}","stop_reason":null}],"usage":${this.usage(req)},"prompt_logprobs":null${kvp}}`
        : `{"id":${this.id},"object":"text_completion","created":${this.created},"model":${this.modelJson},"choices":[{"index":0,"text":"${text}","logprobs":null,"finish_reason":"${req.finishReason}","stop_reason":null,"prompt_logprobs":null}],"usage":${this.usage(req)}${kvp}}`;
    res.cork(() => {
      this.writeHead(res, JSON_TYPE);
      res.end(body);
    });
  }

  writeHead(res: HttpResponse, type: string, status = '200 OK'): void {
    res.writeStatus(status).writeHeader('Content-Type', type);
    if (this.rid !== '') res.writeHeader('x-request-id', echoId(this.rid));
  }

  /** SGLang prefill leg: its room's KV is there for the decode side (ok), or never will be. */
  roomEnd(ok: boolean): void {
    const room = this.room;
    if (room === null) return;
    this.room = null;
    if (ok) this.engine.rooms.ready(room);
    else this.engine.rooms.fail(room, 'the prefill request of this room failed or was aborted');
  }

  sendError(status: number, message: string, param: string | null): void {
    if (this.aborted || this.ended) return;
    this.ended = true;
    this.engine.calls.delete(this);
    this.roomEnd(false);
    if (this.req !== null && this.req.state <= ReqState.Running) this.engine.sched.abort(this.req);
    const res = this.res;
    res.cork(() => {
      this.writeHead(res, JSON_TYPE, STATUS[status] ?? `${status} Error`);
      if (status === 429) res.writeHeader('Retry-After', '1');
      res.end(errorBody(status, message, param, this.engine.options.legacy));
    });
  }
}

/**
 * The x-request-id value to echo. uWS hands header values over as latin1
 * strings (one char per byte) but writes strings as UTF-8, so an id with bytes
 * >= 0x80 would come back re-encoded (the client could not match it): echo
 * such an id as its original bytes. ASCII ids (the norm) pass as they are.
 */
function echoId(rid: string): string | Buffer {
  for (let i = 0; i < rid.length; i++) if (rid.charCodeAt(i) > 0x7f) return Buffer.from(rid, 'latin1');
  return rid;
}

function checkMessage(m: unknown, i: number): void {
  if (typeof m !== 'object' || m === null || Array.isArray(m)) throw new BadRequest(400, `'messages[${i}]' must be an object`, 'messages');
  const msg = m as Record<string, unknown>;
  if (typeof msg.role !== 'string') throw new BadRequest(400, `'messages[${i}].role' must be a string`, 'messages');
  const c = msg.content;
  if (c === undefined || c === null || typeof c === 'string') return;
  if (!Array.isArray(c)) throw new BadRequest(400, `'messages[${i}].content' must be a string, an array of parts or null`, 'messages');
  for (const part of c) {
    if (typeof part === 'string') continue;
    if (typeof part !== 'object' || part === null || typeof (part as { type?: unknown }).type !== 'string') {
      throw new BadRequest(400, `'messages[${i}].content' parts must be objects with a 'type'`, 'messages');
    }
  }
}

/** Simulated token ids of a text: each 4-byte group of its UTF-8 bytes read as a little-endian uint32. */
function byteTokenIds(text: string): number[] {
  const len = writeScratch(text);
  const ids: number[] = [];
  for (let i = 0; i < len; i += BYTES_PER_TOKEN) {
    let v = 0;
    for (let j = Math.min(len, i + BYTES_PER_TOKEN) - 1; j >= i; j--) v = v * 256 + scratch[j]!;
    ids.push(v);
  }
  return ids;
}

/** The token ids of the scratch prompt's first `tokens` tokens (full blocks: 4 bytes each, little-endian). */
function byteBlockTokens(tokens: number): Uint32Array {
  const bytes = new Uint8Array(tokens * BYTES_PER_TOKEN);
  bytes.set(scratch.subarray(0, bytes.length));
  const out = new Uint32Array(tokens);
  const dv = new DataView(bytes.buffer);
  for (let i = 0; i < tokens; i++) out[i] = dv.getUint32(i * 4, true);
  return out;
}

/** FNV-1a of bytes [from, to) mixed with the length: the part of the prompt the block hashes do not cover. */
function tailHash(bytes: Uint8Array, from: number, to: number): number {
  let h = 0x811c9dc5 ^ to;
  for (let i = from; i < to; i++) h = Math.imul(h ^ bytes[i]!, 0x01000193);
  return h;
}

function writeScratch(s: string): number {
  // Worst case 3 bytes per UTF-16 unit.
  if (s.length * 3 > scratch.length) {
    const need = Buffer.byteLength(s);
    if (need > scratch.length) scratch = Buffer.allocUnsafe(Math.max(need, scratch.length * 2));
  }
  return scratch.write(s, 0);
}

export class Engine implements SimEngine {
  readonly options: ResolvedSimOptions;
  readonly sched: Scheduler;
  readonly #metrics: SimMetrics;
  readonly calls = new Set<Call>();
  readonly modelJson = new Map<string, string>();
  /** LoRA adapter name → hash salt. */
  readonly loraSalt = new Map<string, number>();
  /** LoRA adapter name → its integer id in KV events (vLLM's lora_int_id: 1, 2, ...). */
  readonly loraId = new Map<string, number>();
  readonly kvEvents: KvEventPublisher | null;
  readonly engineId: string;
  readonly idPrefix: string;
  readonly rand: () => number;
  failureRate: number;
  failureKinds: FailureKind[];
  healthy = true;
  /** Transfers this engine holds for decode engines (a prefill with do_remote_decode). */
  readonly transfers: TransferTable;
  /** SGLang bootstrap rooms this engine (a prefill server) has seen, for its decode sides. */
  readonly rooms: RoomTable;
  /** Date.now() until which the engine is "loading" (health 503, requests 503). */
  loadingUntil = 0;
  /** drain() began: health 503, no new requests. */
  draining = false;
  #app: TemplatedApp | null = null;
  #listen: us_listen_socket | null = null;
  #port = 0;
  #closed: Promise<void> | null = null;
  #recordNames: readonly string[] | null = null;
  #recorded: { path: string; headers: Record<string, string> }[] = [];

  /** `salt` separates the failure draws of the engines of a fleet (their text stays the same). */
  constructor(opts: ResolvedSimOptions, salt = 0) {
    this.options = opts;
    this.sched = new Scheduler(scaledCosts(opts));
    this.#metrics = new SimMetrics(opts, this.sched);
    for (const m of opts.models) this.modelJson.set(m, JSON.stringify(m));
    opts.loras.forEach((m, i) => {
      this.modelJson.set(m, JSON.stringify(m));
      this.loraSalt.set(m, mix32(0x10a + i) + 1);
      this.loraId.set(m, i + 1);
    });
    const kv = resolveKvEventsConfig(opts.kvEventsConfig);
    this.kvEvents = kv === null ? null : new KvEventPublisher(kv, salt);
    if (this.kvEvents !== null) this.sched.cache.setEvents(this.kvEvents);
    this.rand = rng(mix32(opts.seed ^ 0x5eed) ^ mix32(salt + 1));
    this.failureRate = opts.failureRate;
    this.failureKinds = [...opts.failureKinds];
    this.engineId = `sim-${process.pid}-${(Math.random() * 0xffffffff) >>> 0}`;
    this.transfers = new TransferTable(opts.kvTransferTtlMs);
    this.rooms = new RoomTable(opts.kvTransferTtlMs);
    this.loadingUntil = opts.loadingMs > 0 ? Date.now() + opts.loadingMs : 0;
    this.idPrefix = ((Math.random() * 0xffffff) >>> 0).toString(16) + '-';
  }

  get port(): number {
    return this.#port;
  }
  get url(): string {
    const h = this.options.host;
    const host = h === '0.0.0.0' ? '127.0.0.1' : h.includes(':') ? `[${h}]` : h;
    return `http://${host}:${this.#port}`;
  }

  async listen(): Promise<void> {
    if (this.kvEvents !== null) await this.kvEvents.open();
    try {
      await this.#listenHttp();
    } catch (err) {
      this.kvEvents?.close();
      throw err;
    }
  }

  #listenHttp(): Promise<void> {
    const o = this.options;
    const app = uws.App();
    this.#app = app;
    app.post('/v1/completions', (res, req) => this.#post(res, req, Kind.Completion));
    app.post('/v1/chat/completions', (res, req) => this.#post(res, req, Kind.Chat));
    for (const [path, kind] of INSTANT_ROUTES) app.post(path, (res, req) => this.#post(res, req, kind));
    app.post(PULL_PATH, (res) => this.#pull(res));
    app.post(BOOTSTRAP_PATH, (res) => this.#bootstrap(res));
    // an engine restart as the fleet sees it (docs/sim.md): the cache is gone and the publisher starts at seq 0
    app.post('/sim/restart', (res) => {
      res.onAborted(() => {});
      this.restart();
      res.writeHeader('Content-Type', JSON_TYPE).end('{"restarted":true}');
    });
    app.get('/health', (res, req) => {
      const rid = req.getHeader('x-request-id');
      res.writeStatus(this.healthy && !this.draining && !this.loading() ? '200 OK' : '503 Service Unavailable');
      if (rid !== '') res.writeHeader('x-request-id', echoId(rid));
      res.end();
    });
    app.get('/metrics', (res) => {
      // prom-client renders asynchronously: the client may be gone before the text is
      let gone = false;
      res.onAborted(() => {
        gone = true;
      });
      this.metricsText().then(
        (text) => {
          if (!gone) res.cork(() => res.writeHeader('Content-Type', this.#metrics.registry.contentType).end(text));
        },
        () => {
          if (!gone) res.cork(() => res.writeStatus('500 Internal Server Error').end());
        },
      );
    });
    app.get('/v1/models', (res, req) => {
      const rid = req.getHeader('x-request-id');
      res.writeHeader('Content-Type', JSON_TYPE);
      if (rid !== '') res.writeHeader('x-request-id', echoId(rid));
      res.end(this.#modelsBody());
    });
    app.get('/version', (res) => {
      res.writeHeader('Content-Type', JSON_TYPE).end(JSON.stringify({ version: o.revision, engine: o.engine, role: o.role }));
    });
    app.any('/*', (res, req) => {
      const method = req.getMethod();
      const url = req.getUrl();
      const known = POST_PATHS.has(url) || url === '/health' || url === '/metrics' || url === '/v1/models';
      const status = known ? 405 : 404;
      res.writeStatus(STATUS[status]!).writeHeader('Content-Type', JSON_TYPE);
      const msg = known ? `method ${method.toUpperCase()} not allowed on ${url}` : `no route for ${method.toUpperCase()} ${url}`;
      // A response to HEAD carries no body (RFC 9110 9.3.2): the client reads
      // none, so body bytes would be parsed as the next response on its
      // keep-alive connection. (Not endWithoutBody(length): in uWS 20.30 that
      // does not count as responding, and uWS aborts the process.)
      if (method.toLowerCase() === 'head') res.end();
      else res.end(errorBody(status, msg, null, o.legacy));
    });
    return new Promise((resolve, reject) => {
      app.listen(o.host, o.port, (sock) => {
        if (!sock) {
          reject(new Error(`switchyard sim: cannot listen on ${o.host}:${o.port} (port in use or address unavailable)`));
          return;
        }
        this.#listen = sock;
        this.#port = uws.us_socket_local_port(sock as never);
        resolve();
      });
    });
  }

  #modelsBody(): string {
    const o = this.options;
    const created = Math.floor(Date.now() / 1000);
    const base = o.models.map((m) => ({ id: m, object: 'model', created, owned_by: o.engine, root: o.models[0], parent: null, max_model_len: o.maxModelLen }));
    const loras = o.loras.map((m) => ({ id: m, object: 'model', created, owned_by: o.engine, root: m, parent: o.models[0], max_model_len: o.maxModelLen }));
    return JSON.stringify({ object: 'list', data: [...base, ...loras] });
  }

  loading(): boolean {
    if (this.loadingUntil === 0) return false;
    if (Date.now() < this.loadingUntil) return true;
    this.loadingUntil = 0;
    return false;
  }

  /** A decode engine reads a transfer this engine holds (the simulator's stand-in for the NIXL read). */
  #pull(res: HttpResponse): void {
    let text = '';
    let gone = false;
    res.onAborted(() => (gone = true));
    res.onData((chunk, isLast) => {
      text += Buffer.from(chunk).toString('utf8');
      if (!isLast || gone) return;
      let id: unknown;
      try {
        id = (JSON.parse(text) as Record<string, unknown>).remote_request_id;
      } catch {
        id = undefined;
      }
      const ok = typeof id === 'string' && this.transfers.take(id);
      res.cork(() => {
        if (ok) res.writeHeader('Content-Type', JSON_TYPE).end('{"ok":true}');
        else
          res
            .writeStatus(STATUS[404] ?? '404 Not Found')
            .writeHeader('Content-Type', JSON_TYPE)
            .end(errorBody(404, `no KV transfer ${JSON.stringify(id)} held by engine ${this.engineId} (unknown, expired or already read)`, null, false));
      });
    });
  }

  /**
   * The bootstrap server of a prefill engine (SGLang): a decode engine asks
   * for a room and the answer comes once that room's prefill is done (200),
   * or failed, expired, was taken, or never arrived within the wait (404).
   */
  #bootstrap(res: HttpResponse): void {
    let text = '';
    let gone = false;
    res.onAborted(() => (gone = true));
    res.onData((chunk, isLast) => {
      text += Buffer.from(chunk).toString('utf8');
      if (!isLast || gone) return;
      let room: string;
      let timeoutMs = this.options.bootstrapTimeoutMs;
      try {
        const b = JSON.parse(text) as Record<string, unknown>;
        room = roomKey(b.bootstrap_room);
        if (typeof b.timeout_ms === 'number' && b.timeout_ms >= 0) timeoutMs = Math.min(b.timeout_ms, 600_000);
      } catch {
        res.cork(() => res.writeStatus(STATUS[400]!).writeHeader('Content-Type', JSON_TYPE).end(errorBody(400, 'expected {"bootstrap_room": <integer>}', 'bootstrap_room')));
        return;
      }
      const answer = (problem: string | null): void => {
        if (gone) return;
        res.cork(() => {
          if (problem === null) res.writeHeader('Content-Type', JSON_TYPE).end('{"ok":true}');
          else res.writeStatus(STATUS[404]!).writeHeader('Content-Type', JSON_TYPE).end(errorBody(404, `bootstrap room ${room} on engine ${this.engineId}: ${problem}`, null));
        });
      };
      void this.rooms.wait(room, timeoutMs).then(answer);
    });
  }

  #post(res: HttpResponse, req: HttpRequest, kind: Kind): void {
    const names = this.#recordNames;
    if (names !== null) {
      const headers: Record<string, string> = {};
      for (const n of names) headers[n] = req.getHeader(n);
      if (this.#recorded.length >= 256) this.#recorded.shift();
      this.#recorded.push({ path: req.getUrl(), headers });
    }
    if (this.draining || this.loading()) {
      res.writeStatus('503 Service Unavailable').writeHeader('Content-Type', JSON_TYPE);
      res.end(errorBody(503, this.draining ? 'the engine is shutting down' : 'the model is loading', null, this.options.legacy));
      return;
    }
    const call = new Call(this, res, kind, req.getHeader('x-request-id'));
    this.calls.add(call);
    res.onAborted(() => call.onAborted());
    res.onData((chunk, isLast) => call.onData(chunk, isLast));
  }

  stats(): SimEngineStats {
    return { ...this.sched.stats(), open: this.calls.size, healthy: this.healthy };
  }

  setHealthy(healthy: boolean): void {
    this.healthy = healthy;
  }

  setFailures(rate: number, kinds?: FailureKind[]): void {
    const r = resolveSimOptions({ ...this.options, failureRate: rate, failureKinds: kinds ?? this.failureKinds, port: 0 });
    this.failureRate = r.failureRate;
    this.failureKinds = r.failureKinds;
  }

  clearCache(): void {
    this.sched.clearCache();
  }

  /**
   * What a restart does to the cache, without dropping connections: every cached block (GPU and host
   * tier) is gone, and the KV-event publisher reopens at seq 0 with an empty replay buffer; the removals
   * are not published (a restarted engine knows nothing of its old blocks). Requests in flight keep
   * running (a real restart would fail them), but their blocks are freed when they end, not cached.
   */
  restart(): void {
    this.sched.cache.forgetAll();
    if (this.kvEvents !== null) void this.kvEvents.restart().catch(() => {});
  }

  recordHeaders(names: readonly string[] | null): void {
    this.#recordNames = names === null ? null : names.map((n) => n.toLowerCase());
    this.#recorded = [];
  }

  recorded(): { path: string; headers: Record<string, string> }[] {
    return this.#recorded.map((r) => ({ path: r.path, headers: { ...r.headers } }));
  }

  itlSamples(): readonly number[] {
    return this.sched.itlSamples ?? [];
  }

  metricsText(): Promise<string> {
    return this.#metrics.text();
  }

  /**
   * Graceful shutdown: health 503 and new requests 503 at once (a router
   * stops sending), requests in flight run to their end (up to graceMs), then close().
   */
  async drain(graceMs = 30_000): Promise<void> {
    this.draining = true;
    const t0 = Date.now();
    while (this.calls.size > 0 && Date.now() - t0 < graceMs) await new Promise((r) => setTimeout(r, 10));
    await this.close();
  }

  close(): Promise<void> {
    if (this.#closed !== null) return this.#closed;
    this.#closed = new Promise((resolve) => {
      for (const call of this.calls) {
        call.aborted = true;
        if (call.delay !== null) clearTimeout(call.delay);
        if (call.req !== null) this.sched.abort(call.req);
      }
      this.calls.clear();
      this.rooms.clear('the prefill server went away');
      this.kvEvents?.close();
      if (this.#listen !== null) uws.us_listen_socket_close(this.#listen);
      this.#listen = null;
      // Closes every remaining connection too (keep-alive sockets).
      (this.#app as unknown as { close?: () => void } | null)?.close?.();
      this.#app = null;
      setImmediate(resolve);
    });
    return this.#closed;
  }
}

/** Starts one simulated engine; resolves once it listens. */
export function startEngine(opts: SimOptions = {}): Promise<SimEngine> {
  return startSaltedEngine(opts, 0);
}

/** startEngine for engine `salt` of a fleet (distinct failure draws). */
export async function startSaltedEngine(opts: SimOptions, salt: number): Promise<SimEngine> {
  const engine = new Engine(resolveSimOptions(opts), salt);
  await engine.listen();
  return engine;
}

export { SimOptionError };
