// A scripted raw engine: a loopback HTTP server that answers each
// POST /v1/chat/completions with the next turn of a script, in vLLM's OpenAI
// server's shapes (message.tool_calls / streamed delta.tool_calls with argument
// fragments, reasoning_content, usage, finish_reason), and records every body
// it was sent. Tests use it as the "second, independent engine" beside the
// simulator: what the router sends (messages, tools, tool_choice, tool_call
// ids) is checked from the recorded bodies, and what it answers is whatever
// the script says, malformed on purpose where a test wants that.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';

export interface ScriptedCall {
  id?: string;
  name: string;
  arguments: string;
}

export interface ScriptedTurn {
  /** The answer's text (null: none, as with a tool call). */
  content?: string | null;
  /** reasoning_content (vLLM's --reasoning-parser). */
  reasoning?: string;
  toolCalls?: ScriptedCall[];
  /** Default: "tool_calls" when toolCalls, else "stop". */
  finishReason?: string;
  /** Answer this error instead (status and JSON body). */
  error?: { status: number; body: unknown };
  /** Streamed: an error event after the content (the stream then ends). */
  streamError?: string;
  /** Streamed argument fragments per call (default 3). */
  fragments?: number;
  promptTokens?: number;
}

export interface ScriptedEngine {
  readonly url: string;
  /** Every chat body received, parsed, in order. */
  readonly bodies: Record<string, any>[];
  /** Every POST body received, as the bytes that arrived, in order. */
  readonly raws: Buffer[];
  /** Turns left in the script. */
  readonly left: number;
  /** Appends turns to the script. */
  push(...turns: ScriptedTurn[]): void;
  close(): Promise<void>;
}

function split(s: string, n: number): string[] {
  if (s.length === 0) return [];
  const k = Math.max(1, Math.ceil(s.length / Math.max(1, n)));
  const out: string[] = [];
  for (let i = 0; i < s.length; i += k) out.push(s.slice(i, i + k));
  return out;
}

let serial = 0;

export async function startScriptedEngine(model = 'open-model', script: ScriptedTurn[] = []): Promise<ScriptedEngine> {
  const queue = [...script];
  const bodies: Record<string, any>[] = [];
  const raws: Buffer[] = [];
  const created = Math.floor(Date.now() / 1000);
  const answer = (req: IncomingMessage, res: ServerResponse, raw: string) => {
    const url = req.url ?? '/';
    if (req.method === 'GET' && url === '/health') return void res.writeHead(200).end();
    if (req.method === 'GET' && url === '/metrics') return void res.writeHead(200, { 'content-type': 'text/plain' }).end('');
    if (req.method === 'GET' && url === '/v1/models') {
      return void res
        .writeHead(200, { 'content-type': 'application/json' })
        .end(JSON.stringify({ object: 'list', data: [{ id: model, object: 'model', created, owned_by: 'scripted', max_model_len: 4096 }] }));
    }
    if (req.method !== 'POST' || url !== '/v1/chat/completions') return void res.writeHead(404, { 'content-type': 'application/json' }).end('{"error":{"message":"not found","type":"invalid_request_error","param":null,"code":null}}');
    let body: Record<string, any>;
    try {
      body = JSON.parse(raw);
    } catch {
      return void res.writeHead(400, { 'content-type': 'application/json' }).end('{"error":{"message":"bad json","type":"invalid_request_error","param":null,"code":null}}');
    }
    bodies.push(body);
    const turn = queue.shift() ?? { content: 'done' };
    if (turn.error !== undefined) return void res.writeHead(turn.error.status, { 'content-type': 'application/json' }).end(JSON.stringify(turn.error.body));
    const id = `chatcmpl-scripted-${++serial}`;
    const calls = (turn.toolCalls ?? []).map((c, i) => ({ id: c.id ?? `chatcmpl-tool-${serial}${i}`, name: c.name, arguments: c.arguments }));
    const finish = turn.finishReason ?? (calls.length > 0 ? 'tool_calls' : 'stop');
    const content = turn.content === undefined ? (calls.length > 0 ? null : 'ok') : turn.content;
    const promptTokens = turn.promptTokens ?? Math.ceil(raw.length / 4);
    const completionTokens = Math.ceil(((content ?? '').length + (turn.reasoning ?? '').length + calls.reduce((n, c) => n + c.arguments.length, 0)) / 4) + 1;
    const usage = { prompt_tokens: promptTokens, completion_tokens: completionTokens, total_tokens: promptTokens + completionTokens, prompt_tokens_details: null };
    if (body.stream !== true) {
      const message: Record<string, unknown> = { role: 'assistant', content, refusal: null, tool_calls: calls.map((c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: c.arguments } })) };
      if (turn.reasoning !== undefined) message.reasoning_content = turn.reasoning;
      return void res
        .writeHead(200, { 'content-type': 'application/json' })
        .end(JSON.stringify({ id, object: 'chat.completion', created, model: body.model, choices: [{ index: 0, message, logprobs: null, finish_reason: finish, stop_reason: null }], usage }));
    }
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    const chunk = (delta: unknown, finishReason: string | null = null) =>
      `data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created, model: body.model, choices: [{ index: 0, delta, logprobs: null, finish_reason: finishReason }] })}\n\n`;
    let out = chunk({ role: 'assistant', content: '' });
    for (const r of split(turn.reasoning ?? '', 3)) out += chunk({ reasoning_content: r });
    for (const c of split(content ?? '', 4)) out += chunk({ content: c });
    if (turn.streamError !== undefined) {
      res.end(`${out}data: ${JSON.stringify({ error: { message: turn.streamError, type: 'server_error', param: null, code: null } })}\n\ndata: [DONE]\n\n`);
      return;
    }
    calls.forEach((c, index) => {
      out += chunk({ tool_calls: [{ index, id: c.id, type: 'function', function: { name: c.name, arguments: '' } }] });
      for (const f of split(c.arguments, turn.fragments ?? 3)) out += chunk({ tool_calls: [{ index, function: { arguments: f } }] });
    });
    out += chunk({}, finish);
    out += `data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created, model: body.model, choices: [], usage })}\n\n`;
    // written in two pieces so the router's stream translation sees a chunk boundary
    const half = Math.floor(out.length / 2);
    res.write(out.slice(0, half));
    setImmediate(() => res.end(`${out.slice(half)}data: [DONE]\n\n`));
  };
  const server: Server = createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on('data', (d: Buffer) => parts.push(d));
    req.on('end', () => {
      const bytes = Buffer.concat(parts);
      if (req.method === 'POST') raws.push(bytes);
      answer(req, res, bytes.toString('utf8'));
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as { port: number }).port;
  return {
    url: `http://127.0.0.1:${port}`,
    bodies,
    raws,
    get left() {
      return queue.length;
    },
    push: (...turns) => void queue.push(...turns),
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}
