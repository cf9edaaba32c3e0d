// Filter `session-affinity`: keeps a conversation on the endpoint that served
// its earlier turns (it holds the conversation's KV cache) while that endpoint
// is not saturated. Runs last among the filters, on the endpoints that passed
// the others:
//
// - no session key: the candidates pass untouched (one property read);
// - no pin yet: untouched; the pick (prefix score and load, the normal
//   scorers) pins the session to whatever it chooses;
// - pinned endpoint among the candidates and not saturated: it alone passes;
// - pinned endpoint saturated: `sessions.moveQueueDepth` requests waiting
//   (the larger of the engine's waiting count and the router's occupancy
//   beyond the batch limit), or `sessions.moveLoadGap` more requests running
//   and waiting than the least occupied candidate (a pile-up: first turns
//   drawn to one replica by a shared system prompt stay there otherwise):
//   the less occupied candidates pass, the scorers choose among them and the
//   pin follows; when none is less occupied, the turn stays;
// - pinned endpoint not among the candidates (unhealthy, breaker open, tried
//   and failed on this request, or gone): the pin is dropped and the pick
//   pins anew.
// - `balanceSlack` (off unless set): a turn without a pin (a conversation's
//   first turn, or its pin dropped) may only go to the candidates with at
//   most `balanceSlack` more pinned sessions than the least pinned one, so
//   conversations spread evenly over the endpoints instead of following the
//   instantaneous queue and KV readings (bench/RESULTS.md, issue 13).
// The session table (src/sessions/table.ts) keeps pins, their expiry and
// bound, and counts followed turns and moves.
import type { Endpoint } from '../../endpoints/endpoint.js';
import { SessionTable, MOVE_FAILED, MOVE_LEFT, MOVE_SATURATED } from '../../sessions/table.js';
import { intParam, pluginParams, type PluginFactory } from '../registry.js';
import type { CycleContext, Filter } from '../types.js';

/**
 * Requests waiting at `ep`: the engine's own waiting count while its metrics
 * are fresh, or the router's occupancy beyond the batch limit (exact at any
 * moment for the router's own requests), whichever is larger. Not
 * ep.queueEstimate(): it counts every request sent since the last scrape as
 * waiting, so a conversation would leave its KV behind on any burst shorter
 * than a scrape interval.
 */
export function waiting(ep: Endpoint, now: number): number {
  const q = ep.fresh(now) ? ep.metrics.waiting : 0;
  const beyond = ep.occupancy(now) - ep.batchLimit;
  return beyond > q ? beyond : q;
}

export class SessionAffinityFilter implements Filter {
  readonly type = 'session-affinity';
  readonly name = 'session-affinity';
  readonly table: SessionTable;
  readonly #one: Endpoint[] = [];
  readonly #others: Endpoint[] = [];
  /** This cycle's verdict for onPicked: 0 (followed or first pin) or a MOVE_* reason. */
  #move = 0;

  /** -1: off; else how many more pinned sessions than the least pinned candidate an unpinned turn's endpoint may have. */
  readonly #slack: number;
  readonly #balanced: Endpoint[] = [];

  constructor(table: SessionTable, balanceSlack = -1) {
    this.table = table;
    this.#slack = balanceSlack;
  }

  /** An unpinned turn: the least pinned candidates (within the slack) when balancing is on. */
  #balance(eps: readonly Endpoint[]): readonly Endpoint[] {
    if (this.#slack < 0 || eps.length < 2) return eps;
    const t = this.table;
    let min = Infinity;
    let max = -1;
    for (let i = 0; i < eps.length; i++) {
      const n = t.pinsOn(eps[i]);
      if (n < min) min = n;
      if (n > max) max = n;
    }
    if (max - min <= this.#slack) return eps;
    const out = this.#balanced;
    out.length = 0;
    for (let i = 0; i < eps.length; i++) if (t.pinsOn(eps[i]) <= min + this.#slack) out.push(eps[i]);
    return out;
  }

  filter(ctx: CycleContext, eps: readonly Endpoint[]): readonly Endpoint[] {
    const key = ctx.request.sessionKey;
    this.#move = 0;
    if (key === undefined || key === '') return eps;
    const e = this.table.peek(key, Date.now());
    const pinned = e === undefined ? null : e.ep;
    if (pinned === null) return this.#balance(eps);
    if (!eps.includes(pinned)) {
      const all = this.table.endpoints.forModel(ctx.request.model);
      this.#move = all !== undefined && all.includes(pinned) ? MOVE_FAILED : MOVE_LEFT;
      return this.#balance(eps);
    }
    const now = ctx.now;
    const cfg = this.table.config;
    const occ = pinned.occupancy(now);
    let minOcc = occ;
    for (let i = 0; i < eps.length; i++) {
      const o = eps[i].occupancy(now);
      if (o < minOcc) minOcc = o;
    }
    if (waiting(pinned, now) >= cfg.moveQueueDepth || (cfg.moveLoadGap > 0 && occ - minOcc >= cfg.moveLoadGap)) {
      // saturated: the less occupied candidates (the scorers choose among them)
      const others = this.#others;
      others.length = 0;
      for (let i = 0; i < eps.length; i++) {
        const ep = eps[i];
        if (ep !== pinned && ep.occupancy(now) < occ) others.push(ep);
      }
      if (others.length > 0) {
        this.#move = MOVE_SATURATED;
        return others;
      }
    }
    const one = this.#one;
    one[0] = pinned;
    return one;
  }

  onPicked(ctx: CycleContext, ep: Endpoint): void {
    const key = ctx.request.sessionKey;
    if (key === undefined || key === '') return;
    this.table.picked(key, ep, this.#move);
    this.#move = 0;
  }
}

export const sessionAffinityFilter: PluginFactory<'filter'> = {
  kind: 'filter',
  type: 'session-affinity',
  params: pluginParams({ balanceSlack: intParam(0, 1_000_000).optional() }),
  create: (p, env) => new SessionAffinityFilter(env.sessions ?? new SessionTable(env.endpoints), (p as { balanceSlack?: number }).balanceSlack ?? -1),
};
