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
