// Starting and stopping a router: the library entry point for the HTTP server.
import { pino, type Logger } from 'pino';
import type { RouterConfig } from '../config/schema.js';
import { RouterCore, type RouterOptions } from './core.js';

export interface RunningRouter {
  readonly host: string;
  readonly port: number;
  readonly url: string;
  readonly core: RouterCore;
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

export async function startRouter(config: RouterConfig, opts: StartRouterOptions = {}): Promise<RunningRouter> {
  const logger = opts.logger ?? createLogger(config.logging.level);
  const core = new RouterCore({ config, logger, gate: opts.gate, upstream: opts.upstream, random: opts.random });
  const ready = core.scheduler.start();
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
  return { host, port, url, core, close: (graceMs?: number) => core.close(graceMs) };
}
