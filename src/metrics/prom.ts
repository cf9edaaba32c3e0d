// prom-client glue. The request path only bumps plain numbers and typed arrays;
// prom-client sees them at scrape time: Counter and Gauge objects copy them in
// their collect() callbacks, and a HistogramMetric reads our Histograms.
import { collectDefaultMetrics, Counter, Histogram as PromHistogram, Registry, type LabelValues, type Metric } from 'prom-client';
import type { Histogram } from './histogram.js';

export { Registry };

let processMetrics: Registry | undefined;

/**
 * A registry of its own (never prom-client's global one, so several routers
 * in one process do not collide) holding the default process_* and nodejs_*
 * metrics under their standard names. Those metric objects are created once
 * per process and shared: collectDefaultMetrics starts an event-loop-delay
 * monitor and a GC observer that prom-client offers no way to stop, so one
 * per router would pile up in a process that starts many, and the figures
 * are the process's anyway.
 */
export function newRegistry(opts: { defaultMetrics?: boolean } = {}): Registry {
  const r = new Registry();
  if (opts.defaultMetrics !== false) {
    if (processMetrics === undefined) {
      processMetrics = new Registry();
      collectDefaultMetrics({ register: processMetrics });
    }
    for (const m of processMetrics.getMetricsAsArray()) r.registerMetric(m as unknown as Metric);
  }
  return r;
}

/** A label-less counter whose value `read()` gives at scrape time (a running total the code keeps as a plain number). */
export function scrapeCounter(registers: Registry[], name: string, help: string, read: () => number): Counter {
  return new Counter({
    name,
    help,
    registers,
    collect() {
      this.reset();
      this.inc(read());
    },
  });
}

/** Calls `emit` once per series (label values, histogram) at scrape time. */
export type HistogramSeries<T extends string> = (emit: (labels: LabelValues<T>, h: Histogram) => void) => void;

export interface HistogramMetricConfiguration<T extends string> {
  name: string;
  help: string;
  labelNames?: readonly T[];
  /** The bounds of every Histogram the series hand over (checked at scrape time). */
  buckets: readonly number[];
  registers: Registry[];
  /** Text of the `le` label for a bound; default String(bound). */
  formatLe?: (bound: number) => string;
  series: HistogramSeries<T>;
}

type Labels = Record<string, string | number>;
/** A sample as prom-client's Registry renders it: `labels` first, then the (cached) text of `sharedLabels`. */
type Sample = { metricName: string; labels: Labels; value: number; sharedLabels: Labels };
const NO_SHARED: Labels = Object.freeze({});

/**
 * A prom-client histogram whose series are our allocation-free Histograms,
 * read when the registry renders. Observe those Histograms, never this metric
 * (its inherited observe() would fill a map that is never rendered). Labels
 * come out in labelNames order with `le` last, as before prom-client.
 */
export class HistogramMetric<T extends string = string> extends PromHistogram<T> {
  readonly #bounds: readonly number[];
  /** `{le}` per bound then `+Inf`, made once: the Registry caches the text of a sharedLabels object. */
  readonly #le: Labels[];
  readonly #series: HistogramSeries<T>;
  readonly #name: string;
  readonly #help: string;

  constructor(cfg: HistogramMetricConfiguration<T>) {
    // prom-client validates the name, label names (`le` is reserved) and buckets, then registers us
    super({ name: cfg.name, help: cfg.help, labelNames: cfg.labelNames ?? [], buckets: [...cfg.buckets], registers: cfg.registers });
    this.#name = cfg.name;
    this.#help = cfg.help;
    this.#bounds = cfg.buckets;
    const fmt = cfg.formatLe ?? String;
    this.#le = [...cfg.buckets.map((b) => Object.freeze({ le: fmt(b) })), Object.freeze({ le: '+Inf' })];
    this.#series = cfg.series;
  }

  /** The samples with `le` merged into each bucket's labels (the JSON shape prom-client's get() has). */
  override async get(): ReturnType<PromHistogram<T>['get']> {
    const m = this.#collect();
    m.values = m.values.map((v) => ({ ...v, labels: { ...v.labels, ...v.sharedLabels }, sharedLabels: NO_SHARED }));
    return m as unknown as Awaited<ReturnType<PromHistogram<T>['get']>>;
  }

  /** What prom-client's Registry calls when rendering text: the series' own label objects, `le` as shared labels. */
  async getForPromString(): ReturnType<PromHistogram<T>['get']> {
    return this.#collect() as unknown as Awaited<ReturnType<PromHistogram<T>['get']>>;
  }

  #collect(): { name: string; help: string; type: 'histogram'; values: Sample[]; aggregator: 'sum' } {
    const values: Sample[] = [];
    const bucket = `${this.#name}_bucket`;
    const sum = `${this.#name}_sum`;
    const count = `${this.#name}_count`;
    const le = this.#le;
    const n = this.#bounds.length;
    this.#series((labels, h) => {
      if (h.bounds.length !== n || h.bounds.some((b, i) => b !== this.#bounds[i])) {
        throw new RangeError(`HistogramMetric ${this.#name}: a series has bounds [${h.bounds.join(', ')}], the metric [${this.#bounds.join(', ')}]`);
      }
      const l = labels as Labels;
      let acc = 0;
      for (let i = 0; i < n; i++) {
        acc += h.counts[i]!;
        values.push({ metricName: bucket, labels: l, value: acc, sharedLabels: le[i]! });
      }
      values.push({ metricName: bucket, labels: l, value: h.count, sharedLabels: le[n]! });
      values.push({ metricName: sum, labels: l, value: h.sum, sharedLabels: NO_SHARED });
      values.push({ metricName: count, labels: l, value: h.count, sharedLabels: NO_SHARED });
    });
    return { name: this.#name, help: this.#help, type: 'histogram', values, aggregator: 'sum' };
  }
}
