// Starting and stopping a router: the library entry point for the HTTP server.
import { pino, type Logger } from 'pino';
import type { RouterConfig } from '../config/schema.js';
import { RouterCore, type RouterOptions } from './core.js';
import { flowGateFactory } from './flow-gate.js';

export interface RunningRouter {
  readonly host: string;
  readonly port: number;
  readonly url: string;
  readonly core: RouterCore;
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
  const core = new RouterCore({ config, logger, gate, upstream: opts.upstream, random: opts.random, raiseFdLimit: opts.raiseFdLimit });
  const ready = core.dataLayer.start();
  if (opts.waitForFirstScrape !== false) await ready;
  const host = opts.host ?? config.listen.host;
  let port: number;
  try {
    port = await core.listen(host, opts.port ?? config.listen.port);
  } catch (err) {
    await core.close(0);
    throw err;
  }
  const url = `http://${host.includes(':') ? `[${host}]` : host}:${port}`;
  // the async processor (docs/batch.md): loaded only when configured
  let batch: import('../batch/processor.js').BatchProcessor | undefined;
  if (config.batch !== undefined) {
    const { BatchProcessor } = await import('../batch/processor.js');
    batch = new BatchProcessor({ config: config.batch, director: core.director, endpoints: core.endpoints, log: logger, band: config.batch.band ?? config.flowControl?.bands.at(-1) });
    try {
      await batch.start();
    } catch (err) {
      await batch.close(0);
      await core.close(0);
      throw err;
    }
  }
  const close = async (graceMs?: number) => {
    await batch?.close(graceMs);
    await core.close(graceMs);
  };
  return { host, port, url, core, ...(batch ? { batch } : {}), close };
}
