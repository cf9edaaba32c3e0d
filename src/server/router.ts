// Starting and stopping a router: the library entry point for the HTTP server.
import { pino, destination, stdTimeFunctions, type Logger } from 'pino';
import type { RouterConfig } from '../config/schema.js';
import { RouterCore, type CoreOptions } from './core.js';
import { assembleRouter, type AssembleOptions, type Assembly } from './assemble.js';
import { startAdmin, type AdminServer } from './admin.js';
import { ConfigReloader, ConfigWatcher, type ReloadResult } from './reload.js';
import { CloseRank, Lifecycle } from './lifecycle.js';
import type { PluginValidator } from '../config/load.js';
// loaded only when configured: a feature that is off costs no import (ioredis, grpc-js)
import type { HighAvailability } from '../ha/standby.js';
import type { FleetShare } from '../ha/fleet.js';
import type { ExtProcServer } from '../extproc/server.js';
import type { KubernetesDiscovery } from '../k8s/discovery.js';

export interface RunningRouter {
  readonly host: string;
  readonly port: number;
  readonly url: string;
  readonly core: RouterCore;
  /** The admin API's listener (config.admin), or null. */
  readonly admin: AdminServer | null;
  /** Re-reads the config file (SIGHUP does this): refused when invalid, the old config keeps serving. Null without a config file. */
  readonly reload: (() => Promise<ReloadResult>) | null;
  /** The hot-standby pair's coordinator (config.ha, mode standby), or null. */
  readonly ha: HighAvailability | null;
  /** Active-active sharing (config.ha, mode active-active), or null. */
  readonly fleet: FleetShare | null;
  /** The Envoy ext_proc listener (config.extProc), or null. */
  readonly extProc: ExtProcServer | null;
  /** Endpoint sources of pools with `discovery` (Kubernetes pods), in pool order; empty without. */
  readonly discovery: readonly KubernetesDiscovery[];
  /** The async processor, when `config.batch` is set. */
  readonly batch?: import('../batch/processor.js').BatchProcessor;
  /** Graceful: stop accepting, wait for in-flight requests (up to graceMs), close pools and loops. */
  close(graceMs?: number): Promise<void>;
}

export interface StartRouterOptions extends Partial<Omit<AssembleOptions, 'config'>>, CoreOptions {
  /** Overrides config.listen. */
  host?: string;
  port?: number;
  /** The config file the config came from: reload() re-reads it (SIGHUP, POST /admin/reload). */
  configFile?: string;
  /** Checks plugin specs of a reloaded config (the CLI passes the registry's). */
  validatePlugin?: PluginValidator;
  /** Overrides config.admin.port (tests: 0). */
  adminPort?: number;
  /** Also reload when the config file changes (debounce in ms; true: 300; or {debounceMs, settleMs}: settle 1000). Needs configFile. */
  watchConfig?: boolean | number | { debounceMs?: number; settleMs?: number };
}

/**
 * The router's pino logger: JSON on stdout. `sync: false` (the CLI): lines are
 * buffered and written off the event loop (no write(2) on the request path),
 * and what is still buffered is written at exit.
 */
export function createLogger(level: string, opts: { sync?: boolean } = {}): Logger {
  // level names ("warn"), ISO 8601 times: what log pipelines parse without a pino-specific mapping
  const options = { level, base: { name: 'switchyard' }, formatters: { level: (label: string) => ({ level: label }) }, timestamp: stdTimeFunctions.isoTime };
  if (opts.sync !== false) return pino(options);
  const dest = destination({ dest: 1, sync: false });
  process.once('exit', () => {
    try {
      dest.flushSync();
    } catch {
      // stdout gone: nothing to flush to
    }
  });
  return pino(options, dest);
}

/**
 * Builds and starts a router from a validated config: assembleRouter
 * (assemble.ts) builds and starts the components (the admission gate is flow
 * control when `config.flowControl` is set, unless `opts.gate` replaces it),
 * RouterCore serves with them; then it listens, and the ext_proc listener,
 * the config watcher and the admin API start. The CLI and library users get
 * the same router from the same config. Throws ConfigError for an invalid
 * flowControl block.
 */
export async function startRouter(config: RouterConfig, opts: StartRouterOptions = {}): Promise<RunningRouter> {
  const logger = opts.logger ?? createLogger(config.logging.level);
  // every started service, in close order (src/server/lifecycle.ts); a failed start closes what started, with no grace
  const lifecycle = new Lifecycle();
  const failStart = async (err: unknown): Promise<never> => {
    await lifecycle.close(0);
    throw err;
  };
  let assembly: Assembly;
  try {
    assembly = await assembleRouter({ config, logger, gate: opts.gate, upstream: opts.upstream, random: opts.random, tracer: opts.tracer, waitForFirstScrape: opts.waitForFirstScrape, auth: opts.auth }, lifecycle);
  } catch (err) {
    return failStart(err);
  }
  const { ha, fleet, discovery, batch } = assembly;
  const core = new RouterCore(assembly.parts, { raiseFdLimit: opts.raiseFdLimit });
  lifecycle.add('router', CloseRank.serving, (graceMs) => core.close(graceMs));
  const host = opts.host ?? config.listen.host;
  let port = 0;
  let extProc: ExtProcServer | null = null;
  try {
    port = await core.listen(host, opts.port ?? config.listen.port);
    if (config.extProc) {
      const { ExtProcServer } = await import('../extproc/server.js');
      const started = await ExtProcServer.start(core, config.extProc);
      extProc = started;
      lifecycle.add('extProc', CloseRank.serving, (graceMs) => started.close(graceMs));
    }
  } catch (err) {
    await failStart(err);
  }
  const url = `http://${host.includes(':') ? `[${host}]` : host}:${port}`;
  const reloader = opts.configFile !== undefined ? new ConfigReloader(core, opts.configFile, opts.validatePlugin) : null;
  if (reloader !== null && opts.watchConfig !== undefined && opts.watchConfig !== false) {
    const w = opts.watchConfig;
    const watcher = new ConfigWatcher(reloader, typeof w === 'number' ? { debounceMs: w } : typeof w === 'object' ? { debounceMs: w.debounceMs, settleMs: w.settleMs } : {});
    lifecycle.add('watcher', CloseRank.watcher, () => watcher.close());
    await watcher.start();
  }
  let admin: AdminServer | null = null;
  if (config.admin !== undefined) {
    try {
      const started = await startAdmin(core, { ...config.admin, port: opts.adminPort ?? config.admin.port }, reloader);
      admin = started;
      lifecycle.add('admin', CloseRank.admin, () => started.close());
    } catch (err) {
      await failStart(new Error(`cannot start the admin API on ${config.admin.host}:${opts.adminPort ?? config.admin.port}: ${(err as Error).message}`));
    }
  }
  const close = (graceMs?: number) => lifecycle.close(graceMs);
  return { host, port, url, core, admin, reload: reloader ? () => reloader.reload() : null, ha, fleet, extProc, discovery, ...(batch !== null ? { batch } : {}), close };
}
