// A small, fast parser for the Prometheus text exposition format (0.0.4).
// It scans the text once, skips comments, and only parses the label set of
// series whose metric name the caller asks for.

export interface PromSample {
  name: string;
  /** Raw label text between the braces (without them); '' when none. */
  labelText: string;
  value: number;
}

/**
 * Calls `onSample` for every sample whose metric name passes `want`.
 * Malformed lines are skipped, never thrown on: a scrape of a broken exporter
 * must not take the router down.
 */
export function scanPrometheus(
  text: string,
  want: (name: string) => boolean,
  onSample: (name: string, labelText: string, value: number) => void,
): void {
  const n = text.length;
  let i = 0;
  while (i < n) {
    let eol = text.indexOf('\n', i);
    if (eol < 0) eol = n;
    // skip leading blanks
    while (i < eol && (text.charCodeAt(i) === 32 || text.charCodeAt(i) === 9)) i++;
    if (i < eol && text.charCodeAt(i) !== 35 /* # */) parseLine(text, i, eol, want, onSample);
    i = eol + 1;
  }
}

function parseLine(
  text: string,
  start: number,
  end: number,
  want: (name: string) => boolean,
  onSample: (name: string, labelText: string, value: number) => void,
): void {
  let j = start;
  while (j < end) {
    const c = text.charCodeAt(j);
    if (c === 123 /* { */ || c === 32 || c === 9) break;
    j++;
  }
  const name = text.slice(start, j);
  if (name.length === 0 || !want(name)) return;
  let labelText = '';
  if (j < end && text.charCodeAt(j) === 123) {
    // find the closing brace, honouring quoted values with escapes
    let k = j + 1;
    let inQuote = false;
    for (; k < end; k++) {
      const c = text.charCodeAt(k);
      if (inQuote) {
        if (c === 92 /* \ */) k++;
        else if (c === 34 /* " */) inQuote = false;
      } else if (c === 34) inQuote = true;
      else if (c === 125 /* } */) break;
    }
    if (k >= end) return;
    labelText = text.slice(j + 1, k);
    j = k + 1;
  }
  while (j < end && (text.charCodeAt(j) === 32 || text.charCodeAt(j) === 9)) j++;
  let v = j;
  while (v < end && text.charCodeAt(v) !== 32 && text.charCodeAt(v) !== 9 && text.charCodeAt(v) !== 13) v++;
  const raw = text.slice(j, v);
  let value: number;
  if (raw === 'NaN') value = NaN;
  else if (raw === '+Inf') value = Infinity;
  else if (raw === '-Inf') value = -Infinity;
  else {
    value = Number(raw);
    if (raw.length === 0 || Number.isNaN(value)) return;
  }
  onSample(name, labelText, value);
}

/** Parses a label set text (`a="x",b="y"`) into an object, unescaping values. */
export function parseLabels(labelText: string): Record<string, string> {
  const out: Record<string, string> = {};
  const n = labelText.length;
  let i = 0;
  while (i < n) {
    while (i < n && (labelText[i] === ',' || labelText[i] === ' ')) i++;
    const eq = labelText.indexOf('=', i);
    if (eq < 0) break;
    const key = labelText.slice(i, eq).trim();
    let j = eq + 1;
    if (labelText[j] !== '"') break;
    j++;
    let val = '';
    for (; j < n; j++) {
      const ch = labelText[j];
      if (ch === '\\' && j + 1 < n) {
        const nx = labelText[++j];
        val += nx === 'n' ? '\n' : nx;
      } else if (ch === '"') break;
      else val += ch;
    }
    out[key] = val;
    i = j + 1;
  }
  return out;
}

/** Convenience: all wanted samples as objects (tests and tools; not the hot path). */
export function parsePrometheus(text: string, want: (name: string) => boolean = () => true): PromSample[] {
  const out: PromSample[] = [];
  scanPrometheus(text, want, (name, labelText, value) => out.push({ name, labelText, value }));
  return out;
}
