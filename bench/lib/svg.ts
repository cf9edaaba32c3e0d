// Minimal SVG charts for the benchmark report: line charts (a series per
// policy over request rate) and grouped bar charts (a bar per proxy).

export interface Series {
  name: string;
  points: Array<[number, number]>;
  /** Dashed line (line charts), e.g. a second measure of the same policy. */
  dashed?: boolean;
  /** Palette index; defaults to the series' position. */
  color?: number;
}

const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b'];
const W = 640;
const H = 360;
const M = { l: 70, r: 150, t: 40, b: 50 };

function esc(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

function niceMax(v: number): number {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function frame(title: string, xLabel: string, yLabel: string, body: string, legend: string[], colors?: number[], dashed?: boolean[]): string {
  const items = legend
    .map((name, i) => {
      const c = COLORS[(colors?.[i] ?? i) % COLORS.length];
      const mark = dashed?.[i]
        ? `<line x1="${W - M.r + 13}" x2="${W - M.r + 29}" y1="${M.t + i * 20 + 6}" y2="${M.t + i * 20 + 6}" stroke="${c}" stroke-width="2" stroke-dasharray="4 3"/>`
        : `<rect x="${W - M.r + 15}" y="${M.t + i * 20}" width="12" height="12" fill="${c}"/>`;
      return mark + `<text x="${W - M.r + 32}" y="${M.t + i * 20 + 11}" font-size="12">${esc(name)}</text>`;
    })
    .join('');
  // Long legend names widen the canvas to the right (the plot area keeps its size).
  const longest = Math.max(0, ...legend.map((n) => n.length));
  const width = Math.max(W, W - M.r + 32 + Math.ceil(longest * 7) + 10);
  return (
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${H}" font-family="sans-serif">` +
    `<rect width="${width}" height="${H}" fill="white"/>` +
    `<text x="${W / 2}" y="22" font-size="15" text-anchor="middle">${esc(title)}</text>` +
    `<text x="${M.l + (W - M.l - M.r) / 2}" y="${H - 10}" font-size="12" text-anchor="middle">${esc(xLabel)}</text>` +
    `<text transform="translate(16 ${M.t + (H - M.t - M.b) / 2}) rotate(-90)" font-size="12" text-anchor="middle">${esc(yLabel)}</text>` +
    body +
    items +
    `</svg>\n`
  );
}

function yAxis(yMax: number): string {
  const ph = H - M.t - M.b;
  let out = '';
  for (let i = 0; i <= 5; i++) {
    const v = (yMax * i) / 5;
    const y = M.t + ph - (ph * i) / 5;
    out += `<line x1="${M.l}" x2="${W - M.r}" y1="${y}" y2="${y}" stroke="#ddd"/>`;
    out += `<text x="${M.l - 6}" y="${y + 4}" font-size="11" text-anchor="end">${+v.toPrecision(3)}</text>`;
  }
  return out;
}

/** A line chart; x and y axes start at 0. */
export function lineChart(title: string, xLabel: string, yLabel: string, series: Series[]): string {
  const xs = series.flatMap((s) => s.points.map((p) => p[0]));
  const ys = series.flatMap((s) => s.points.map((p) => p[1])).filter(Number.isFinite);
  const xMax = niceMax(Math.max(...xs, 0));
  const yMax = niceMax(Math.max(...ys, 0));
  const pw = W - M.l - M.r;
  const ph = H - M.t - M.b;
  const X = (x: number) => M.l + (pw * x) / xMax;
  const Y = (y: number) => M.t + ph - (ph * y) / yMax;
  let body = yAxis(yMax);
  for (let i = 0; i <= 5; i++) {
    const v = (xMax * i) / 5;
    body += `<text x="${X(v)}" y="${H - M.b + 16}" font-size="11" text-anchor="middle">${+v.toPrecision(3)}</text>`;
  }
  body += `<line x1="${M.l}" x2="${M.l}" y1="${M.t}" y2="${H - M.b}" stroke="#333"/>`;
  body += `<line x1="${M.l}" x2="${W - M.r}" y1="${H - M.b}" y2="${H - M.b}" stroke="#333"/>`;
  series.forEach((s, i) => {
    const c = COLORS[(s.color ?? i) % COLORS.length];
    const pts = s.points.filter((p) => Number.isFinite(p[1]));
    body += `<polyline fill="none" stroke="${c}" stroke-width="2"${s.dashed ? ' stroke-dasharray="6 4"' : ''} points="${pts.map((p) => `${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(' ')}"/>`;
    for (const p of pts) body += `<circle cx="${X(p[0]).toFixed(1)}" cy="${Y(p[1]).toFixed(1)}" r="3" fill="${c}"/>`;
  });
  return frame(title, xLabel, yLabel, body, series.map((s) => s.name), series.map((s, i) => s.color ?? i), series.map((s) => !!s.dashed));
}

/** Grouped bars: one group per category, one bar per series. */
export function barChart(title: string, categories: string[], yLabel: string, series: Series[]): string {
  const ys = series.flatMap((s) => s.points.map((p) => p[1])).filter(Number.isFinite);
  const yMax = niceMax(Math.max(...ys, 0));
  const pw = W - M.l - M.r;
  const ph = H - M.t - M.b;
  const gw = pw / Math.max(1, categories.length);
  const bw = (gw * 0.8) / Math.max(1, series.length);
  let body = yAxis(yMax);
  categories.forEach((c, ci) => {
    body += `<text x="${M.l + gw * ci + gw / 2}" y="${H - M.b + 16}" font-size="11" text-anchor="middle">${esc(c)}</text>`;
  });
  series.forEach((s, si) => {
    for (const [ci, v] of s.points) {
      if (!Number.isFinite(v)) continue;
      const h = (ph * v) / yMax;
      const x = M.l + gw * ci + gw * 0.1 + bw * si;
      body += `<rect x="${x.toFixed(1)}" y="${(M.t + ph - h).toFixed(1)}" width="${bw.toFixed(1)}" height="${h.toFixed(1)}" fill="${COLORS[si % COLORS.length]}"/>`;
    }
  });
  body += `<line x1="${M.l}" x2="${W - M.r}" y1="${H - M.b}" y2="${H - M.b}" stroke="#333"/>`;
  return frame(title, '', yLabel, body, series.map((s) => s.name));
}
