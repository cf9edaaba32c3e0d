// JSONL checks of the Files and Batches API: the upload's (every line a JSON
// object) and a batch's per-line checks at validation (OpenAI's line errors).

export interface BatchLineError {
  code: string | null;
  message: string;
  param: string | null;
  line: number | null;
}

/** Calls fn for each non-blank line of a JSONL buffer with its 1-based line number. */
export function forEachLine(data: Buffer, fn: (line: string, n: number) => void): void {
  const text = data.toString('utf8');
  let n = 0;
  let start = 0;
  while (start <= text.length) {
    let end = text.indexOf('\n', start);
    if (end < 0) end = text.length;
    n++;
    const line = text.slice(start, end).trim();
    if (line !== '') fn(line, n);
    start = end + 1;
  }
}

/** Why a file is not JSONL of objects (the first bad line), or null. */
export function checkJsonl(data: Buffer): string | null {
  let problem: string | null = null;
  let lines = 0;
  forEachLine(data, (line, n) => {
    lines++;
    if (problem !== null) return;
    try {
      const v = JSON.parse(line) as unknown;
      if (v === null || typeof v !== 'object' || Array.isArray(v)) problem = `line ${n} is not a JSON object`;
    } catch (err) {
      problem = `line ${n} is not JSON (${(err as Error).message})`;
    }
  });
  if (problem === null && lines === 0) problem = 'the file is empty';
  return problem;
}

/** A batch input line's problem (OpenAI's per-line errors), or null. */
export function checkLine(line: string, n: number, endpoint: string, seen: Set<string>): BatchLineError | null {
  let v: Record<string, unknown>;
  try {
    v = JSON.parse(line) as Record<string, unknown>;
  } catch {
    return { code: 'invalid_json_line', message: `line ${n} is not JSON`, param: null, line: n };
  }
  if (v === null || typeof v !== 'object' || Array.isArray(v)) return { code: 'invalid_json_line', message: `line ${n} is not a JSON object`, param: null, line: n };
  if (typeof v.custom_id !== 'string' || v.custom_id === '') return { code: 'missing_required_parameter', message: `line ${n}: custom_id must be a non-empty string`, param: 'custom_id', line: n };
  if (seen.has(v.custom_id)) return { code: 'duplicate_custom_id', message: `line ${n}: custom_id ${JSON.stringify(v.custom_id.slice(0, 64))} appears more than once`, param: 'custom_id', line: n };
  seen.add(v.custom_id);
  if (v.method !== 'POST') return { code: 'invalid_value', message: `line ${n}: method must be "POST"`, param: 'method', line: n };
  if (v.url !== endpoint) return { code: 'mismatched_url', message: `line ${n}: url ${JSON.stringify(v.url ?? null)} is not the batch's endpoint ${endpoint}`, param: 'url', line: n };
  const b = v.body as Record<string, unknown> | undefined;
  if (b === null || typeof b !== 'object' || Array.isArray(b)) return { code: 'invalid_value', message: `line ${n}: body must be a JSON object`, param: 'body', line: n };
  if (typeof b.model !== 'string' || b.model === '') return { code: 'missing_required_parameter', message: `line ${n}: body.model must be a non-empty string`, param: 'body.model', line: n };
  if (b.stream === true) return { code: 'invalid_value', message: `line ${n}: body.stream is not supported in a batch`, param: 'body.stream', line: n };
  if (endpoint === '/v1/chat/completions' && !Array.isArray(b.messages)) return { code: 'missing_required_parameter', message: `line ${n}: body.messages must be an array`, param: 'body.messages', line: n };
  if (endpoint === '/v1/completions' && b.prompt === undefined) return { code: 'missing_required_parameter', message: `line ${n}: body.prompt is required`, param: 'body.prompt', line: n };
  if ((endpoint === '/v1/embeddings' || endpoint === '/v1/responses') && b.input === undefined) return { code: 'missing_required_parameter', message: `line ${n}: body.input is required`, param: 'body.input', line: n };
  return null;
}

/** At most this many line errors are reported for a batch (OpenAI's `errors` list). */
export const MAX_LINE_ERRORS = 100;

export interface BatchValidation {
  /** Requests (non-blank lines). */
  total: number;
  errors: BatchLineError[];
  /** The custom_ids in line order, each as its JSON text, one a line: the batch's snapshot (when there are no errors). */
  ids: Buffer;
}

/** A batch input file's checks at validation, and the snapshot of its custom_ids. */
export function validateBatchLines(data: Buffer, endpoint: string): BatchValidation {
  const errors: BatchLineError[] = [];
  const seen = new Set<string>();
  const ids: string[] = [];
  let total = 0;
  forEachLine(data, (line, n) => {
    total++;
    const e = checkLine(line, n, endpoint, seen);
    if (e !== null) {
      if (errors.length < MAX_LINE_ERRORS) errors.push(e);
    } else if (errors.length === 0) ids.push(JSON.stringify((JSON.parse(line) as { custom_id: string }).custom_id));
  });
  if (total === 0) errors.push({ code: 'empty_file', message: 'the input file has no requests', param: 'input_file_id', line: null });
  return { total, errors, ids: Buffer.from(errors.length === 0 && ids.length > 0 ? ids.join('\n') + '\n' : '') };
}

/** A run of a batch's lines, in line order, for its output and error files. */
export interface ResultLinesJob {
  /** The batch id without its `batch_` prefix. */
  tag: string;
  batchId: string;
  /** The batch ended expired: lines that did not run go to the error file as batch_expired (else they are left out). */
  expired: boolean;
  /** Per line: its index, its answer's status (0: did not run), its answer's body, its custom_id as JSON text. */
  lines: number[];
  statuses: number[];
  bodies: string[];
  ids: string[];
}

/** The run's output-file lines (2xx answers) and error-file lines, each '\n'-joined ('' for none). */
export interface ResultLines {
  out: string;
  err: string;
}

const EXPIRED_ERROR = JSON.stringify({ code: 'batch_expired', message: 'This request could not be executed before the completion window expired.' });

export function buildResultLines(j: ResultLinesJob): ResultLines {
  const out: string[] = [];
  const err: string[] = [];
  for (let k = 0; k < j.lines.length; k++) {
    const i = j.lines[k]!;
    const status = j.statuses[k]!;
    const head = `{"id":${JSON.stringify(`batch_req_${j.tag}_${i}`)},"custom_id":${j.ids[k]}`;
    if (status === 0) {
      if (j.expired) err.push(`${head},"response":null,"error":${EXPIRED_ERROR}}`);
      continue;
    }
    let body: unknown;
    try {
      body = JSON.parse(j.bodies[k]!);
    } catch {
      body = j.bodies[k];
    }
    const line = `${head},"response":${JSON.stringify({ status_code: status, request_id: `${j.batchId}.${i}`, body })},"error":null}`;
    (status >= 200 && status < 300 ? out : err).push(line);
  }
  return { out: out.join('\n'), err: err.join('\n') };
}

/** Each line's `body` as JSON text, in line order: `text` holds them one a line, `ends[i]` the end of line i's. */
export interface BatchBodies {
  text: Buffer;
  ends: Uint32Array;
}

/** A validated batch input's request bodies (what the tracker enqueues). */
export function batchBodies(data: Buffer): BatchBodies {
  const bodies: string[] = [];
  forEachLine(data, (line) => {
    bodies.push(JSON.stringify((JSON.parse(line) as { body: unknown }).body));
  });
  const ends = new Uint32Array(bodies.length);
  let at = 0;
  for (let i = 0; i < bodies.length; i++) {
    at += Buffer.byteLength(bodies[i]!);
    ends[i] = at;
    at++; // the '\n'
  }
  return { text: Buffer.from(bodies.join('\n')), ends };
}

/** Line i's body of a BatchBodies. */
export function bodyAt(b: BatchBodies, i: number): string {
  return b.text.toString('utf8', i === 0 ? 0 : b.ends[i - 1]! + 1, b.ends[i]!);
}
