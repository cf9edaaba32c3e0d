// Starting and stopping a router: the library entry point for the HTTP server.
import { pino, type Logger } from 'pino';
import type { RouterConfig } from '../config/schema.js';
import { RouterCore, type RouterOptions } from './core.js';
import { flowGateFactory } from './flow-gate.js';
import { loadAuth } from '../auth/keys.js';
import { VERSION } from '../version.js';
import { startAdmin, type AdminServer } from './admin.js';
import { ConfigReloader, ConfigWatcher, type ReloadResult } from './reload.js';
import { CloseRank, Lifecycle } from './lifecycle.js';
import type { PluginValidator } from '../config/load.js';
// loaded only when configured: a feature that is off costs no import (ioredis, grpc-js)
import type { HighAvailability } from '../ha/standby.js';
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
  /** The hot-standby pair's coordinator (config.ha), or null. */
  readonly ha: HighAvailability | null;
  /** The Envoy ext_proc listener (config.extProc), or null. */
  readonly extProc: ExtProcServer | null;
  /** Endpoint sources of pools with `discovery` (Kubernetes pods), in pool order; empty without. */
  readonly discovery: readonly KubernetesDiscovery[];
  /** The async processor, when `config.batch` is set. */
  readonly batch?: import('../batch/processor.js').BatchProcessor;
  /** Graceful: stop accepting, wait for in-flight requests (up to graceMs), close pools and loops. */
  close(graceMs?: number): Promise<void>;
}

export interface StartRouterOptions extends Partial<Omit<RouterOptions, 'config'>> {
  /** Overrides config.listen. */
  host?: string;
  port?: number;
  /** Wait for the first round of health checks and scrapes before listening (default true). */
  waitForFirstScrape?: boolean;
  /** The config file the config came from: reload() re-reads it (SIGHUP, POST /admin/reload). */
  configFile?: string;
  /** Checks plugin specs of a reloaded config (the CLI passes the registry's). */
  validatePlugin?: PluginValidator;
  /** Overrides config.admin.port (tests: 0). */
  adminPort?: number;
  /** Also reload when the config file changes (debounce in ms; true: 300; or {debounceMs, settleMs}: settle 100). Needs configFile. */
  watchConfig?: boolean | number | { debounceMs?: number; settleMs?: number };
}

export function createLogger(level: string): Logger {
  return pino({ level, base: { name: 'switchyard' } });
}

/**
 * Builds and starts a router from a validated config: endpoints, data layer,
 * scheduler, upstream client, and the admission gate (flow control when
 * `config.flowControl` is set, unless `opts.gate` replaces it), then listens.
 * The CLI and library users get the same router from the same config. Throws
 * ConfigError for an invalid flowControl block.
 */
export async function startRouter(config: RouterConfig, opts: StartRouterOptions = {}): Promise<RunningRouter> {
  const logger = opts.logger ?? createLogger(config.logging.level);
  const gate = opts.gate ?? (await flowGateFactory(config));
  // API keys (config.auth): the keys file and variable are read now, and again on every reload
  const auth = opts.auth !== undefined ? opts.auth : await loadAuth(config);
  // OpenTelemetry is loaded only when tracing is on
  const tracer = opts.tracer ?? (config.tracing.enabled ? await (await import('../telemetry/tracing.js')).createTracer(config.tracing, VERSION) : null);
  const core = new RouterCore({ config, logger, gate, upstream: opts.upstream, random: opts.random, raiseFdLimit: opts.raiseFdLimit, tracer, auth });
  try {
    await core.responses?.open(); // a sqlite file that cannot be opened stops the start
  } catch (err) {
    await core.close(0);
    throw err;
  }
  const ready = core.dataLayer.start();
  if (opts.waitForFirstScrape !== false) await ready;
  // a shared session store (Redis): connected before the first request when it can be (bounded; without it, requests use the local view)
  await core.sessions.shared?.ready();
  const host = opts.host ?? config.listen.host;
  // every started service, in close order (src/server/lifecycle.ts); a failed start closes what started, with no grace
  const lifecycle = new Lifecycle();
  lifecycle.add('router', CloseRank.serving, (graceMs) => core.close(graceMs));
  const failStart = async (err: unknown): Promise<never> => {
    await lifecycle.close(0);
    throw err;
  };
  let port = 0;
  let ha: HighAvailability | null = null;
  let extProc: ExtProcServer | null = null;
  const discovery: KubernetesDiscovery[] = [];
  try {
    // pools with discovery: their pods become endpoints through core.live (loaded only when configured)
    const discovered = config.pools.filter((p) => p.discovery !== undefined);
    if (discovered.length > 0) {
      const { KubernetesDiscovery, registerDiscoveryMetrics } = await import('../k8s/discovery.js');
      for (const pool of discovered) discovery.push(new KubernetesDiscovery(pool, logger));
      registerDiscoveryMetrics(core.metrics.registry, discovery);
      lifecycle.add('discovery', CloseRank.discovery, () => Promise.all(discovery.map((d) => d.close())).then(() => undefined));
      await Promise.all(discovery.map((d) => d.start(core.live)));
    }
    if (config.ha) {
      const { HighAvailability } = await import('../ha/standby.js');
      const started = await HighAvailability.start(config.ha, { endpoints: core.endpoints, store: core.scheduler.prefix?.store ?? null, log: logger });
      ha = started;
      lifecycle.add('lease', CloseRank.lease, () => started.close());
      started.registerMetrics(core.metrics.registry);
      core.leadership = started;
    }
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
  // the async processor (docs/batch.md): loaded only when configured
  let batch: import('../batch/processor.js').BatchProcessor | undefined;
  if (config.batch !== undefined) {
    const { BatchProcessor } = await import('../batch/processor.js');
    const processor = new BatchProcessor({ config: config.batch, director: core.director, endpoints: core.endpoints, log: logger, band: config.batch.band ?? config.flowControl?.bands.at(-1) });
    batch = processor;
    const { BatchApi } = await import('../batch/api.js');
    const api = new BatchApi({ config: config.batch, log: logger });
    lifecycle.add('batchApi', CloseRank.batchApi, () => api.close());
    lifecycle.add('batch', CloseRank.batch, (graceMs) => processor.close(graceMs));
    try {
      await processor.start();
      await api.start();
      core.batchApi = api;
    } catch (err) {
      await failStart(err);
    }
  }
  const close = (graceMs?: number) => lifecycle.close(graceMs);
  return { host, port, url, core, admin, reload: reloader ? () => reloader.reload() : null, ha, extProc, discovery, ...(batch ? { batch } : {}), close };
}
