// One call: the HTTP side of one POST. Reads the body, has request.ts parse it, draws its failure
// (failures.ts), hands the generation to the scheduler and writes what it produces: timing comes from the
// scheduler, the tokens and their SSE chunks or the final JSON from here.

import { bootstrap, decodeTransferError, pull, type BootstrapTarget, type PullTarget, type RoomTable, type TransferTable } from './pd.js';
import { jsonNestsDeeper } from '../json-depth.js';
import type { SimHttpResponse as HttpResponse } from './http.js';
import type { KvEventPublisher } from './kv-events.js';
import type { FailureKind } from './options.js';
import { ReqState, SimRequest, type RequestSink, type Scheduler } from './scheduler.js';
import { PoolingError, detokenize, embeddings, rerank, score } from './pooling.js';
import { BadRequest, ENGINE_MAX_JSON_DEPTH, Kind, parseGeneration, resolveModel, tokenizeIds, type RequestContext } from './request.js';
import type { ToolCall } from './tools.js';
import { cutsGeneration, failAtToken, type FailureInjector } from './failures.js';
import { mix32, word, words } from './text.js';
import { chatEntry, chatLogprobs, completionLogprobs } from './logprobs.js';
import { DONE, JSON_TYPE, SSE_TYPE, STATUS, echoId, errorBody } from './wire.js';

/** What a call needs of its engine (server.ts's Engine). */
export interface CallHost extends RequestContext {
  readonly sched: Scheduler;
  readonly calls: Set<Call>;
  /** LoRA adapter name → its integer id in KV events (vLLM's lora_int_id: 1, 2, ...). */
  readonly loraId: Map<string, number>;
  readonly kvEvents: KvEventPublisher | null;
  readonly engineId: string;
  readonly idPrefix: string;
  readonly port: number;
  readonly transfers: TransferTable;
  readonly rooms: RoomTable;
  readonly failures: FailureInjector;
}

let idCounter = 0;

/** The HTTP side of one POST: reads the body, then receives the request's tokens. */
export class Call implements RequestSink {
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
  /** The tool this chat request calls (tools.ts), or null; toolId its JSON-quoted call id. */
  tool: ToolCall | null = null;
  toolId = '';
  /** A fixed content text (response_format's JSON, the text before a stop string), or null. */
  fixed: string | null = null;
  /** The stop string that ended the text (JSON), or "null". */
  stopJson = 'null';
  /** Completions with echo: the prompt (JSON-escaped, unquoted) before the text. */
  echo = '';
  /** --reasoning, chat with generated text: the first `think` tokens are reasoning_content (0: none). */
  think = 0;
  /** Log probabilities: -1 none, else alternatives per token (generated words only). */
  logprobs = -1;
  /** Completions with echo: the prompt's length (text offsets start after it). */
  echoLen = 0;
  /** Choices (n > 1: free text only); choice j > 0 has its own text seed and stream head. */
  n = 1;
  heads: string[] | null = null;

  constructor(
    readonly engine: CallHost,
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
    const model = resolveModel(e, body);
    this.modelJson = model.modelJson;
    const lora = model.lora;
    if (this.kind === Kind.Tokenize) {
      this.tokenize(body);
      return;
    }
    if (this.kind >= Kind.Detokenize) {
      this.pooling(body);
      return;
    }
    const p = parseGeneration(e, this.kind, this.rid, body, lora);
    this.stream = p.stream;
    this.includeUsage = p.includeUsage;
    this.textSeed = p.textSeed;
    this.pullFrom = p.pullFrom;
    this.bootFrom = p.bootFrom;
    this.room = p.room;
    if (p.remoteDecode) this.kvParams = '';
    this.tool = p.tool;
    this.fixed = p.fixed;
    this.stopJson = p.stopJson;
    this.echo = p.echo;
    if (p.echo !== '') this.echoLen = (JSON.parse(`"${p.echo}"`) as string).length;
    if (this.tool === null && this.fixed === null) this.logprobs = p.logprobs;
    this.n = p.n;
    if (o.reasoning && this.kind === Kind.Chat && this.tool === null && this.fixed === null) this.think = Math.floor(p.outTokens / 2);
    const outTokens = p.outTokens;
    // Identity.
    const prefix = this.kind === Kind.Chat ? 'chatcmpl-' : 'cmpl-';
    this.id = JSON.stringify(prefix + (this.rid !== '' ? this.rid : e.idPrefix + (++idCounter).toString(16)));
    this.created = Math.floor(Date.now() / 1000);
    if (this.tool !== null) this.toolId = `"chatcmpl-tool-${e.idPrefix}${(++idCounter).toString(16)}"`;
    if (this.room !== null) e.rooms.open(this.room); // from here on its decode side waits for it (or learns it failed)
    // Failure injection.
    const failure = e.failures.draw();
    if (failure !== null) {
      this.failure = failure;
      this.failAt = failAtToken(outTokens);
    }
    const nBlocks = p.nBlocks;
    const privateBlocks = p.needBlocks - nBlocks;
    const req = new SimRequest(p.hashes.slice(0, nBlocks), nBlocks, p.promptTokens, outTokens, privateBlocks, p.finishReason, p.remotePrefill, this);
    req.lora = lora;
    if (p.metaTokens !== null) req.meta = { tokens: p.metaTokens, loraId: lora === null ? null : e.loraId.get(lora)!, loraName: lora };
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
    if (this.stream && this.n > 1) {
      const heads: string[] = [];
      for (let j = 0; j < this.n; j++) heads.push(this.head.replace('"choices":[{"index":0,', `"choices":[{"index":${j},`));
      this.heads = heads;
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
    const ids = tokenizeIds(body);
    const out = `{"count":${ids.length},"max_model_len":${this.engine.options.maxModelLen},"tokens":[${ids.join(',')}],"token_strs":null}`;
    this.answerJson(out);
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
    this.answerJson(out);
  }

  /** Ends the call with a 200 JSON body. */
  answerJson(out: string): void {
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
    const fail = cutsGeneration(this.failure);
    if (fail && upTo >= this.failAt) upTo = this.failAt;
    if (this.stream && upTo > from) {
      const res = this.res;
      res.cork(() => {
        if (from === 0) {
          this.writeHead(res, SSE_TYPE);
          if (this.kind === Kind.Chat) {
            for (let j = 0; j < this.n; j++) res.write(this.headOf(j) + '{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n');
          }
        }
        for (let i = from; i < upTo; i++) res.write(this.chunk(req, i));
      });
    }
    if (fail && to >= this.failAt) this.fail(req);
  }

  /** The injected mid-generation failure strikes: the connection resets, or an error ends the answer. */
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
    if (i === 0 && this.echo !== '') {
      // the echoed prompt comes first, as its own chunk
      return `${this.head}${this.echo}","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n${this.tokenChunk(req, i)}`;
    }
    return this.tokenChunk(req, i);
  }

  tokenChunk(req: SimRequest, i: number): string {
    const last = i === req.maxTokens - 1;
    if (this.tool !== null) return this.toolChunk(this.tool, req.maxTokens, i, last);
    const fr = last ? `"${req.finishReason}"` : 'null';
    if (this.fixed !== null) {
      const piece = JSON.stringify(fragment(this.fixed, req.maxTokens, i, last));
      if (this.kind === Kind.Chat) return `${this.head}{"content":${piece}},"logprobs":null,"finish_reason":${fr}${last ? `,"stop_reason":${this.stopJson}` : ''}}]}\n\n`;
      return `${this.head}${piece.slice(1, -1)}","logprobs":null,"finish_reason":${fr},"stop_reason":${last ? this.stopJson : 'null'}}]}\n\n`;
    }
    if (this.n === 1) return this.wordChunk(this.head, this.textSeed, i, fr, last);
    let out = '';
    for (let j = 0; j < this.n; j++) out += this.wordChunk(this.headOf(j), this.seedOf(j), i, fr, last);
    return out;
  }

  /** Generated token i of one choice. */
  wordChunk(head: string, seed: number, i: number, fr: string, last: boolean): string {
    const w = word(seed, i);
    const k = this.logprobs;
    if (this.kind === Kind.Chat) {
      const lp = k < 0 ? 'null' : `{"content":[${chatEntry(seed, i, k)}]}`;
      return `${head}{"${i < this.think ? 'reasoning_content' : 'content'}":"${w}"},"logprobs":${lp},"finish_reason":${fr}${last ? ',"stop_reason":null' : ''}}]}\n\n`;
    }
    const lp = k < 0 ? 'null' : completionLogprobs(seed, i, i + 1, k, this.echoLen + 4 * i);
    return `${head}${w}","logprobs":${lp},"finish_reason":${fr},"stop_reason":null}]}\n\n`;
  }

  headOf(j: number): string {
    return j === 0 || this.heads === null ? this.head : this.heads[j]!;
  }

  /** Choice j's text seed (choice 0: the request's). */
  seedOf(j: number): number {
    return j === 0 ? this.textSeed : mix32((this.textSeed + Math.imul(j, 0x9e3779b9)) | 0);
  }

  /** Token i of a streamed tool call: the call's id and name first, then argument fragment i of n. */
  toolChunk(tool: ToolCall, n: number, i: number, last: boolean): string {
    const piece = fragment(tool.args, n, i, last);
    const fr = last ? '"tool_calls","stop_reason":null' : 'null';
    const frag = `${this.head}{"tool_calls":[{"index":0,"function":{"arguments":${JSON.stringify(piece)}}}]},"logprobs":null,"finish_reason":${fr}}]}\n\n`;
    if (i !== 0) return frag;
    return `${this.head}{"tool_calls":[{"index":0,"id":${this.toolId},"type":"function","function":{"name":${tool.nameJson},"arguments":""}}]},"logprobs":null,"finish_reason":null}]}\n\n${frag}`;
  }

  usage(req: SimRequest): string {
    const out = req.out * this.n;
    return `{"prompt_tokens":${req.promptTokens},"total_tokens":${req.promptTokens + out},"completion_tokens":${out},"prompt_tokens_details":{"cached_tokens":${req.cachedTokens}}}`;
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
    const kvp = this.kvParams !== null ? `,"kv_transfer_params":${this.kvParams}` : '';
    let choices = this.choice(req, 0, this.textSeed);
    for (let j = 1; j < this.n; j++) choices += ',' + this.choice(req, j, this.seedOf(j));
    const body =
      this.kind === Kind.Chat
        ? `{"id":${this.id},"object":"chat.completion","created":${this.created},"model":${this.modelJson},"choices":[${choices}],"usage":${this.usage(req)},"prompt_logprobs":null${kvp}}`
        : `{"id":${this.id},"object":"text_completion","created":${this.created},"model":${this.modelJson},"choices":[${choices}],"usage":${this.usage(req)}${kvp}}`;
    res.cork(() => {
      this.writeHead(res, JSON_TYPE);
      res.end(body);
    });
  }

  /** Choice j of a non-streamed answer. */
  choice(req: SimRequest, j: number, seed: number): string {
    const tool = this.tool;
    const message =
      tool === null
        ? this.think > 0
          ? `{"role":"assistant","reasoning_content":"${words(seed, 0, Math.min(this.think, req.out))}","content":"${words(seed, this.think, req.out)}","refusal":null,"tool_calls":[]}`
          : `{"role":"assistant","content":${this.text(req, seed)},"refusal":null,"tool_calls":[]}`
        : `{"role":"assistant","content":null,"refusal":null,"tool_calls":[{"id":${this.toolId},"type":"function","function":{"name":${tool.nameJson},"arguments":${JSON.stringify(tool.args)}}}]}`;
    if (this.kind === Kind.Chat) {
      return `{"index":${j},"message":${message},"logprobs":${this.logprobs < 0 ? 'null' : chatLogprobs(seed, 0, req.out, this.logprobs)},"finish_reason":"${tool === null ? req.finishReason : 'tool_calls'}","stop_reason":${this.stopJson}}`;
    }
    return `{"index":${j},"text":${this.text(req, seed)},"logprobs":${this.logprobs < 0 ? 'null' : completionLogprobs(seed, 0, req.out, this.logprobs, this.echoLen)},"finish_reason":"${req.finishReason}","stop_reason":${this.stopJson},"prompt_logprobs":null}`;
  }

  /** The whole content as a JSON string. */
  text(req: SimRequest, seed: number): string {
    if (this.fixed !== null) return this.echo === '' ? JSON.stringify(this.fixed) : `"${this.echo}${JSON.stringify(this.fixed).slice(1)}`;
    return `"${this.echo}${words(seed, 0, req.out)}"`;
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

/** Fragment i of n of a fixed text (the last one takes the rest). */
function fragment(text: string, n: number, i: number, last: boolean): string {
  return text.slice(Math.floor((i * text.length) / n), last ? text.length : Math.floor(((i + 1) * text.length) / n));
}
