// Config reload (SIGHUP, the admin API's POST /admin/reload): the config file
// is read and validated first; a bad one is refused (every field path in the
// log, switchyard_config_reloads_total{result="invalid"}) and the running
// config keeps serving. A good one reconciles the config's endpoints through
// the live-endpoint manager: new ones join, removed or changed ones drain and
// leave. The auth block (its keys file and variable read again) applies
// live: a removed key is refused from the next request on, requests already
// under way finish. Of the rest logging.level and shutdown apply live; a change elsewhere is
// logged as needing a restart.
import { loadConfigFile, parseConfig, type PluginValidator } from '../config/load.js';
import type { RouterConfig } from '../config/schema.js';
import type { ReconcileResult } from '../endpoints/live.js';
import { ConfigError, type ConfigIssue } from '../errors.js';
import type { RouterCore } from './core.js';
import { loadAuth } from '../auth/keys.js';

export type ReloadResult =
  | { ok: true; changes: ReconcileResult; restartNeeded: string[] }
  | { ok: false; issues: ConfigIssue[]; message: string };

/** Top-level sections a reload cannot apply to a running router. */
const RESTART_SECTIONS = ['listen', 'scheduling', 'dataLayer', 'proxy', 'limits', 'flowControl', 'admin', 'disaggregation', 'metrics'] as const;

export class ConfigReloader {
  readonly file: string;
  readonly #core: RouterCore;
  readonly #validate: PluginValidator | undefined;
  #current: RouterConfig;
  /** Reloads run one at a time: a second SIGHUP during one waits for it. */
  #chain: Promise<unknown> = Promise.resolve();

  constructor(core: RouterCore, file: string, validatePlugin?: PluginValidator) {
    this.#core = core;
    this.file = file;
    this.#validate = validatePlugin;
    this.#current = core.config;
  }

  get current(): RouterConfig {
    return this.#current;
  }

  /** Re-reads the file; `text`: apply this text of it instead (the watcher's checked, stable read). */
  reload(text?: string): Promise<ReloadResult> {
    const r = this.#chain.then(() => this.#reload(text));
    this.#chain = r.catch(() => {});
    return r;
  }

  async #reload(text?: string): Promise<ReloadResult> {
    const core = this.#core;
    const log = core.log;
    const reloads = core.metrics.reloads;
    let next: RouterConfig;
    let auth: Awaited<ReturnType<typeof loadAuth>>;
    try {
      next = text !== undefined ? parseConfig(text, this.#validate, this.file) : await loadConfigFile(this.file, this.#validate);
      // the keys file and variable are read again: a removed key is refused from the next request on
      auth = await loadAuth(next);
    } catch (err) {
      const issues = err instanceof ConfigError ? err.issues : [{ path: '', message: (err as Error).message }];
      reloads.set('invalid', (reloads.get('invalid') ?? 0) + 1);
      log.error({ event: 'config.reload_refused', file: this.file, issues }, `config reload refused, the running config keeps serving: ${(err as Error).message}`);
      return { ok: false, issues, message: (err as Error).message };
    }
    const prev = this.#current;
    const restartNeeded: string[] = RESTART_SECTIONS.filter((k) => JSON.stringify(prev[k]) !== JSON.stringify(next[k]));
    // a pool's discovery (and the pool definition its watcher uses) is read at start only
    const discovered = (c: RouterConfig) => new Map(c.pools.filter((p) => p.discovery).map((p) => [p.name, JSON.stringify({ ...p, endpoints: [] })]));
    const [was, now] = [discovered(prev), discovered(next)];
    for (const name of new Set([...was.keys(), ...now.keys()])) if (was.get(name) !== now.get(name)) restartNeeded.push(`pools.${name}.discovery`);
    const changes = core.live.reconcile('config', next.pools);
    core.auth = auth;
    // rate limits: new limits from the next request on, what was used stays counted; adding or
    // removing the block, or moving its counters (redis), needs a restart (the gate is built at start)
    const [rlWas, rlNow] = [prev.rateLimits, next.rateLimits];
    if (core.limiter !== null && JSON.stringify(rlWas?.redis) === JSON.stringify(rlNow?.redis)) core.limiter.configure(rlNow ?? { tenants: {} });
    else if (JSON.stringify(rlWas) !== JSON.stringify(rlNow)) restartNeeded.push('rateLimits');
    if (JSON.stringify(next.logging) !== JSON.stringify(prev.logging)) core.setLogLevel(next.logging.level, next.logging);
    core.shutdown = next.shutdown;
    // model rewrites apply live: new conversations follow the new weights, running ones keep their target
    core.director.rewrites.setRules(next.modelRewrites ?? []);
    // the adapter hold's bounds apply from the next request on (off: the held requests go at once)
    if (next.adapterQueue !== undefined) core.director.adapterHold.configure(next.adapterQueue);
    this.#current = next;
    reloads.set('ok', (reloads.get('ok') ?? 0) + 1);
    const changed = (Object.keys(next) as (keyof RouterConfig)[]).filter((k) => k !== 'pools' && JSON.stringify(prev[k]) !== JSON.stringify(next[k]));
    log.info(
      { event: 'config.reload_applied', file: this.file, ...changes, sections_changed: changed },
      `config reloaded: ${changes.added.length} endpoint(s) added, ${changes.removed.length} removed, ${changes.replaced.length} replaced${changed.length > 0 ? `; changed: ${changed.join(', ')}` : ''}`,
    );
    if (restartNeeded.length > 0) log.warn({ sections: restartNeeded }, 'config reload: these sections changed and take effect only after a restart');
    return { ok: true, changes, restartNeeded };
  }
}

/**
 * How long a changed config file must stay the same before it is applied
 * (ms): a writer that rewrites the file in place and pauses mid-file for
 * less than the debounce plus this is never caught half-written. Config
 * writers finish in well under a second; a reload a second late costs
 * nothing.
 */
export const WATCH_SETTLE_MS = 1000;

/**
 * Reloads when the config file changes (`switchyard serve --watch-config`):
 * fs.watch on the file's directory (editors and config-map mounts replace the
 * file rather than write it in place), a debounce so that one save is one
 * reload, and the same path as SIGHUP (validated first; a bad file is refused
 * and the running config keeps serving). Only a stable file is reloaded: after
 * the debounce it is read, read again `settleMs` (default 1 s) later, and applied only when
 * both reads are identical and no change came in between (a file caught
 * half-written in place, even one whose prefix parses, is never applied; the
 * next change or a re-check reloads it once whole). Off unless started.
 */
export class ConfigWatcher {
  readonly #reloader: ConfigReloader;
  readonly #debounceMs: number;
  readonly #settleMs: number;
  readonly #onResult: (r: ReloadResult) => void;
  #watcher: import('node:fs').FSWatcher | null = null;
  #timer: NodeJS.Timeout | undefined;
  /** The file's text at the last reload this watcher ran (a save that changed nothing reloads nothing). */
  #last: string | null = null;
  /** Bumped on every change event: a check that sees it move lets the newer one decide. */
  #generation = 0;

  constructor(reloader: ConfigReloader, opts: { debounceMs?: number; settleMs?: number; onResult?: (r: ReloadResult) => void } = {}) {
    this.#reloader = reloader;
    this.#debounceMs = opts.debounceMs ?? 300;
    this.#settleMs = opts.settleMs ?? WATCH_SETTLE_MS;
    this.#onResult = opts.onResult ?? (() => {});
  }

  async start(): Promise<void> {
    const { watch } = await import('node:fs');
    const { readFile } = await import('node:fs/promises');
    const { basename, dirname, resolve } = await import('node:path');
    const file = resolve(this.#reloader.file);
    this.#last = await readFile(file, 'utf8').catch(() => null);
    const name = basename(file);
    this.#watcher = watch(dirname(file), { persistent: false }, (_event, changed) => {
      // some platforms do not name the file: then any change in the directory counts
      if (changed !== null && changed !== name && !String(changed).startsWith('..')) return;
      this.#generation++;
      this.#schedule(file, readFile, this.#debounceMs);
    });
    this.#watcher.on('error', () => {}); // the directory went away: nothing left to watch
  }

  #schedule(file: string, readFile: typeof import('node:fs/promises').readFile, ms: number): void {
    clearTimeout(this.#timer);
    this.#timer = setTimeout(() => void this.#fire(file, readFile), ms);
    this.#timer.unref();
  }

  async #fire(file: string, readFile: typeof import('node:fs/promises').readFile): Promise<void> {
    if (this.#watcher === null) return;
    const generation = this.#generation;
    const first = await readFile(file, 'utf8').catch(() => null);
    if (first === null || first === this.#last) return; // gone for a moment (replaced), or unchanged
    // stable? read again a moment later: a writer still at it changes the text (or sends an event)
    await new Promise((r) => setTimeout(r, this.#settleMs).unref());
    if (this.#watcher === null || generation !== this.#generation) return; // a newer change: its own check decides
    const second = await readFile(file, 'utf8').catch(() => null);
    if (second !== first) {
      // still changing without telling us: look again later rather than apply a partial file
      this.#schedule(file, readFile, this.#debounceMs);
      return;
    }
    this.#last = first;
    this.#onResult(await this.#reloader.reload(first)); // the text checked stable, not a third read
  }

  close(): void {
    clearTimeout(this.#timer);
    this.#watcher?.close();
    this.#watcher = null;
  }
}
