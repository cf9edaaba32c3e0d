// Flow control as an admission gate (the contract in src/admission.ts, which
// the director imports too). One FlowController per model: each model's pool
// has its own saturation.
import type { Identity } from '../identity.js';
import type { AbortLike, Admission, AdmissionGate, Admitted, FinishedRequest, Rejected, ReleaseOutcome, RequestInfo } from '../admission.js';
import { Classifier, CLASSIFY_HEADERS } from './classify.js';
import type { FlowControlConfig } from './config.js';
import { FlowController, type AdmitResult, type FlowRequest, type FlowUsage, type Refused } from './controller.js';
import { BYTES_PER_TOKEN, maxTokensOf, promptTokensOf } from './cost.js';
import type { Rng } from './admission.js';
import type { Registry } from '../metrics/prom.js';
import { LabelCap } from '../metrics/label-cap.js';
import { registerFlowMetrics, type FlowMetricsSource } from './metrics.js';
import { SaturationDetector, type EndpointLoad } from './saturation.js';
import type { FleetFlows, FlowReporter } from './fleet-flows.js';

/** An endpoint as the gate's endpoint-based constructor sees it (structurally the router's Endpoint). */
export interface GateEndpoint extends EndpointLoad {
  /** False while the endpoint is down or its circuit breaker is open. */
  routable?(now: number): boolean;
  /**
   * The endpoint's P/D role: a `prefill` endpoint never serves a request on its
   * own (it only runs prefill legs, docs/disaggregation.md), so it is not
   * capacity for admission and the gate skips it.
   */
  readonly role?: string;
}

export interface FlowControlGateOptions {
  config: FlowControlConfig;
  /** Pool utilisation for a model (SaturationDetector.poolLoad over its candidate endpoints); Infinity = no endpoint. */
  utilisation: (model: string) => number;
  /** What one more request adds to the utilisation the last `utilisation` call returned (see FlowControllerOptions.step). */
  step?: () => number;
  /** The utilisation probabilistic admission sheds by, for the last `utilisation` call (see FlowControllerOptions.shedUtilisation). */
  shedUtilisation?: () => number;
  /** Free batch slots for the last `utilisation` call (see FlowControllerOptions.free). */
  free?: () => number;
  maxInFlight?: number;
  /** Distinct flow label values in the gate's metrics (config metrics.maxLabelValues); later flows count under `(overflow)`. Default 1,000. */
  maxLabelValues?: number;
  now?: () => number;
  rng?: Rng;
}

interface Ticket {
  readonly controller: FlowController;
  /** The controller's ticket. */
  readonly n: number;
}

interface Entry {
  controller: FlowController;
  /** Admitted values by controller ticket, made on first use (one per flow slot, never per request). */
  tickets: Admitted[];
}

/** What admit() reads of a request; tests may leave out everything past bodyBytes. */
export type GateRequest = Pick<RequestInfo, 'model' | 'headers' | 'bodyBytes'> &
  Partial<Pick<RequestInfo, 'promptBytes' | 'body' | 'continuation' | 'caller'>>;

const PASS: Admitted = Object.freeze({ admitted: true as const, ticket: null });

export class FlowControlGate implements AdmissionGate, FlowReporter {
  readonly headerNames: readonly string[] = CLASSIFY_HEADERS;
  readonly classifier: Classifier;
  /** A request's tenant: the name of its `tenant:<name>` flow, else ''. */
  readonly identity: Identity = {
    tenantOf: (get) => {
      const flow = this.classifier.flowId(get);
      return flow.startsWith('tenant:') ? flow.slice('tenant:'.length) : '';
    },
  };
  readonly #opts: FlowControlGateOptions;
  readonly #controllers = new Map<string, Entry>();
  /** One bound on flow label values over every pool's controller. */
  readonly #labels: LabelCap;
  /** Reused for every admit() and release() (read synchronously by the controller). */
  readonly #req: FlowRequest = { flowId: '', band: 0, bytes: 0, promptTokens: 0, maxTokens: -1, continuation: false };
  readonly #usage: FlowUsage = { promptTokens: 0, maxTokens: -1, uncached: 1, outputTokens: -1 };
  /** True when some band counts tokens: release() then reads the request's usage. */
  readonly wantsUsage: boolean;
  readonly #rejections = new Map<Refused, Rejected>();
  #headers: Readonly<Record<string, string>> = {};
  /** Active-active: the other replicas' flows (ha.shareFlows), or null. */
  #fleet: FleetFlows | null = null;
  readonly #get = (name: string): string | undefined => this.#headers[name];

  constructor(opts: FlowControlGateOptions) {
    this.#opts = opts;
    this.#labels = new LabelCap(opts.maxLabelValues);
    this.classifier = new Classifier(opts.config);
    const f = opts.config.fairness;
    this.wantsUsage = opts.config.enabled && (f.mode === 'tokens' || Object.values(f.bands).includes('tokens'));
  }

  /**
   * A gate whose pool utilisation is the SaturationDetector's load of the
   * model's least-loaded routable endpoint (Infinity, hence 503, when none):
   * the router's own in-flight requests (plus other clients' from fresh
   * metrics) over each engine's learned batch limit, so it is current between
   * scrapes. One more request takes one more of that endpoint's batch slots
   * (a step of 1 / its batch limit), which keeps lower bands off the last
   * slot of a small batch. Prefill endpoints are not counted: in a P/D pool a
   * request is admitted against the endpoints that decode it (decode or both).
   */
  static fromEndpoints(opts: Omit<FlowControlGateOptions, 'utilisation' | 'step' | 'shedUtilisation' | 'free'> & {
    endpointsFor: (model: string) => readonly GateEndpoint[] | undefined;
  }): FlowControlGate {
    const detector = new SaturationDetector(opts.config.saturation);
    const cap = opts.config.saturation.maxConcurrency;
    // the free slots are read only by the reserve for the bands above
    const wantFree = opts.config.admission.reserveWindowMs > 0;
    const clock = opts.now ?? (() => performance.now());
    // the step of the endpoint the last utilisation() call found least loaded
    // (the controller asks for it right after, in the same turn)
    let lastStep = 0;
    // and the same pool's load without the prefill-backlog term (what shedding reads)
    let lastBase = Infinity;
    // and its free batch slots (the sum over the same endpoints)
    let lastFree = 0;
    const utilisation = (model: string): number => {
      const eps = opts.endpointsFor(model);
      lastStep = 0;
      lastBase = Infinity;
      lastFree = 0;
      if (eps === undefined) return Infinity;
      const now = clock();
      let best = Infinity;
      let base = Infinity;
      let limit = 0;
      let free = 0;
      for (const ep of eps) {
        if (ep.role === 'prefill' || (ep.routable !== undefined && !ep.routable(now))) continue;
        const b = detector.baseLoad(ep, now);
        if (b < base) base = b;
        // its slots: the batch limit, or the in-flight cap when that is lower (what `b` counts against)
        if (wantFree && b < 1) free += (1 - b) * (ep.batchLimit < cap ? ep.batchLimit : cap);
        const u = detector.withBacklog(ep, b);
        if (u < best) {
          best = u;
          limit = ep.batchLimit;
        }
      }
      if (limit > 0) lastStep = 1 / limit;
      lastBase = base;
      lastFree = free;
      return best;
    };
    const { endpointsFor: _unused, ...rest } = opts;
    return new FlowControlGate({ ...rest, utilisation, step: () => lastStep, shedUtilisation: () => lastBase, free: () => lastFree });
  }

  /** The controller of a model's pool (created on first use). */
  controller(model: string): FlowController {
    return this.#entry(model).controller;
  }

  admit(info: GateRequest, signal: AbortLike): Admission | Promise<Admission> {
    if (!this.#opts.config.enabled) return PASS;
    this.#headers = info.headers;
    // the caller's flow when authentication decided it (an API key's tenant), else the headers'
    const c = info.caller;
    const flowId = c !== undefined && c.flow !== '' ? c.flow : this.classifier.flowId(this.#get);
    let band = this.classifier.band(flowId, this.#get('x-priority'));
    // the key's band ceiling: a higher band (declared for its flow) is clamped to it
    if (c !== undefined && c.maxBand !== '') {
      const ceiling = this.classifier.bandIndex(c.maxBand);
      if (ceiling > band) band = ceiling;
    }
    this.#headers = {};
    const e = this.#entry(info.model);
    const req = this.#req;
    req.flowId = flowId;
    req.band = band;
    req.bytes = info.bodyBytes;
    req.promptTokens = promptTokensOf(info.promptBytes ?? 0, info.bodyBytes);
    req.maxTokens = maxTokensOf(info.body);
    req.continuation = info.continuation === true;
    const r = e.controller.admit(req, signal);
    if (r instanceof Promise) return r.then((x) => this.#map(e, x));
    return this.#map(e, r);
  }

  release(ticket: unknown, _outcome?: ReleaseOutcome, request?: FinishedRequest): void {
    if (ticket === null || typeof ticket !== 'object') return;
    const t = ticket as Ticket;
    if (request === undefined || !this.wantsUsage) {
      t.controller.release(t.n);
      return;
    }
    const u = this.#usage;
    u.promptTokens = promptTokensOf(request.promptBytes, request.bodyBytes);
    u.maxTokens = maxTokensOf(request.body);
    u.uncached = request.promptBlocks > 0 ? 1 - Math.min(request.matchedBlocks, request.promptBlocks) / request.promptBlocks : 1;
    u.outputTokens =
      request.completionTokens >= 0
        ? request.completionTokens
        : request.responseBytes === 0
          ? 0
          : request.body.stream === true
            ? request.responseChunks
            : Math.ceil(request.responseBytes / BYTES_PER_TOKEN);
    t.controller.release(t.n, u);
  }

  bandName(ticket: unknown): string {
    if (ticket === null || typeof ticket !== 'object') return '';
    const t = ticket as Ticket;
    const b = t.controller.bandOf(t.n);
    return b < 0 ? '' : (this.classifier.bands[b] ?? '');
  }

  /** Call when a model's endpoints got fresh metrics or capacity (all models when omitted). */
  onCapacity(model?: string): void {
    if (model !== undefined) this.#controllers.get(model)?.controller.onCapacity();
    else for (const e of this.#controllers.values()) e.controller.onCapacity();
  }

  /**
   * Active-active (ha.shareFlows): every pool's controller weighs the other
   * replicas' flows (src/flow/fleet-flows.ts), and this gate's flows go into
   * this replica's reports. True: flow control is on, so the shares apply.
   */
  attachFleet(flows: FleetFlows): boolean {
    if (!this.#opts.config.enabled) return false;
    this.#fleet = flows;
    flows.attach(this, () => this.onCapacity());
    for (const [model, e] of this.#controllers) e.controller.attachFleet(flows.view(model, this.#opts.config.bands));
    return true;
  }

  fleetReport(out: unknown[], max: number): void {
    const bands = this.#opts.config.bands;
    for (const { controller } of this.#controllers.values()) controller.fleetReport(out, max, bands);
  }

  /** Registers the switchyard_flow_* families (read at scrape time) in the router's registry. */
  registerMetrics(registry: Registry): void {
    registerFlowMetrics(registry, () => this.#metricsSources());
  }

  *#metricsSources(): IterableIterator<FlowMetricsSource> {
    const bands = this.#opts.config.bands;
    for (const { controller } of this.#controllers.values()) {
      yield { pool: controller.pool, bands, bandStats: controller.bandStats, flowStats: controller.flowStats() };
    }
  }

  close(): void {
    for (const e of this.#controllers.values()) e.controller.close();
    this.#controllers.clear();
  }

  #entry(model: string): Entry {
    let e = this.#controllers.get(model);
    if (e === undefined) {
      const o = this.#opts;
      const controller = new FlowController({
        config: o.config,
        utilisation: () => o.utilisation(model),
        ...(o.maxInFlight !== undefined ? { maxInFlight: o.maxInFlight } : {}),
        ...(o.step !== undefined ? { step: o.step } : {}),
        ...(o.shedUtilisation !== undefined ? { shedUtilisation: o.shedUtilisation } : {}),
        ...(o.free !== undefined ? { free: o.free } : {}),
        ...(o.now !== undefined ? { now: o.now } : {}),
        ...(o.rng !== undefined ? { rng: o.rng } : {}),
        pool: model,
        labels: this.#labels,
      });
      e = { controller, tickets: [] };
      this.#controllers.set(model, e);
      if (this.#fleet !== null) controller.attachFleet(this.#fleet.view(model, o.config.bands));
    }
    return e;
  }

  #map(e: Entry, r: AdmitResult): Admission {
    if (r.ok) {
      const n = r.ticket;
      if (n < 0) return PASS;
      let a = e.tickets[n];
      if (a === undefined) {
        a = Object.freeze({ admitted: true as const, ticket: Object.freeze({ controller: e.controller, n }) });
        e.tickets[n] = a;
      }
      return a;
    }
    let g = this.#rejections.get(r);
    if (g === undefined) {
      g = Object.freeze({ admitted: false as const, status: r.status, message: r.message, reason: r.reason, retryAfterSeconds: r.retryAfterSeconds });
      this.#rejections.set(r, g);
    }
    return g;
  }
}
