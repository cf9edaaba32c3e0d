// Model rewrites (config `modelRewrites`, docs/models.md): a rule on the
// requested model name (exact, or `default` for requests that name none)
// sends fixed shares of its traffic to target models. Shares are kept, not
// drawn: each new choice goes to the target furthest below its share of the
// requests the rule has sent since its weights were set (every request counts,
// a conversation's later turns too), so over N requests each target is within
// a few requests of its share, whatever the conversations' lengths. A
// conversation (a session key) keeps the target its first request got while
// that target stays in the rule with a positive weight, so changing the
// weights (SIGHUP, --watch-config, the admin API) moves new conversations
// only, and they make up for the old ones still running. Sessions are remembered per rule up to `maxSessions` (oldest first
// out). One process: replicas of the router each keep their own.
import type { RewriteRule } from '../config/models.js';

/** The label of the default rule's counters. */
export const DEFAULT_RULE = '(default)';

class Rule {
  readonly name: string;
  readonly targets: string[];
  readonly weights: Float64Array;
  /** Requests per target since the weights were set (the shares are kept over these). */
  readonly since: Float64Array;
  #sinceTotal = 0;
  readonly total: number;
  /** Requests sent to each target by this rule (the router's metrics). */
  readonly counts: Float64Array;
  /** session key → target name. */
  sessions: Map<string, string>;

  constructor(r: RewriteRule, sessions: Map<string, string>) {
    this.name = r.default ? DEFAULT_RULE : r.model!;
    this.targets = r.targets.map((t) => t.model);
    this.weights = Float64Array.from(r.targets.map((t) => t.weight));
    this.since = new Float64Array(this.targets.length);
    this.counts = new Float64Array(this.targets.length);
    this.total = this.weights.reduce((a, b) => a + b, 0);
    this.sessions = sessions;
  }

  /** The target furthest below its share of the requests since the weights were set (this one included). */
  next(): number {
    const w = this.weights;
    const n = this.#sinceTotal + 1;
    let best = -1;
    let gap = -Infinity;
    for (let i = 0; i < w.length; i++) {
      if (w[i] <= 0) continue;
      const g = (w[i] / this.total) * n - this.since[i];
      if (g > gap) {
        gap = g;
        best = i;
      }
    }
    return best;
  }

  count(i: number): void {
    this.counts[i]++;
    this.since[i]++;
    this.#sinceTotal++;
  }

  index(model: string): number {
    const i = this.targets.indexOf(model);
    return i >= 0 && this.weights[i] > 0 ? i : -1;
  }
}

export class ModelRewriter {
  #rules = new Map<string, Rule>();
  #default: Rule | null = null;
  readonly maxSessions: number;

  constructor(rules: readonly RewriteRule[] = [], maxSessions = 100_000) {
    this.maxSessions = maxSessions;
    this.setRules(rules);
  }

  /** True when some rule exists (the director skips the step otherwise). */
  get active(): boolean {
    return this.#rules.size > 0 || this.#default !== null;
  }

  /** True when a rule takes requests without a model. */
  get hasDefault(): boolean {
    return this.#default !== null;
  }

  /** New rules (a reload): a rule's remembered sessions carry over to the rule of the same name. */
  setRules(rules: readonly RewriteRule[]): void {
    const old = new Map<string, Rule>(this.#rules);
    if (this.#default !== null) old.set(DEFAULT_RULE, this.#default);
    const next = new Map<string, Rule>();
    let def: Rule | null = null;
    for (const r of rules) {
      const name = r.default ? DEFAULT_RULE : r.model!;
      const prev = old.get(name);
      const rule = new Rule(r, prev?.sessions ?? new Map());
      // the counters are totals since start: a rule keeps those of its targets that remain
      if (prev !== undefined) prev.targets.forEach((t, i) => {
        const j = rule.targets.indexOf(t);
        if (j >= 0) rule.counts[j] = prev.counts[i];
      });
      if (r.default) def = rule;
      else next.set(name, rule);
    }
    this.#rules = next;
    this.#default = def;
  }

  /**
   * The model a request for `model` ('' = none named) goes to, and the
   * conversation it belongs to ('' = none). Returns `model` itself when no
   * rule matches.
   */
  apply(model: string, session: string): string {
    const rule = model === '' ? this.#default : this.#rules.get(model);
    if (rule === undefined || rule === null) return model;
    let i = -1;
    if (session !== '') {
      const s = rule.sessions.get(session);
      if (s !== undefined) i = rule.index(s);
    }
    if (i < 0) {
      i = rule.next();
      if (session !== '') {
        const m = rule.sessions;
        if (m.size >= this.maxSessions && !m.has(session)) m.delete(m.keys().next().value!);
        m.set(session, rule.targets[i]);
      }
    }
    rule.count(i);
    return rule.targets[i];
  }

  /** Requests per rule and target since start (for /metrics). */
  counts(): { rule: string; target: string; requests: number }[] {
    const out: { rule: string; target: string; requests: number }[] = [];
    const all = this.#default !== null ? [...this.#rules.values(), this.#default] : [...this.#rules.values()];
    for (const r of all) r.targets.forEach((t, i) => out.push({ rule: r.name, target: t, requests: r.counts[i] }));
    return out;
  }
}
