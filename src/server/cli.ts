// `switchyard serve`: the router, from a config file, from --upstream URLs
// (quick mode), or with no options in front of 4 simulated engines it starts
// itself (the embedded default).
import { parseArgs } from 'node:util';
import { configYaml, issueLines, loadConfigFile, quickConfig } from '../config/load.js';
import { API_VERSION, ENGINES, validateConfig, type Engine, type RouterConfig } from '../config/schema.js';
import { ConfigError } from '../errors.js';
import { registry } from '../scheduler/plugins/index.js';
import { createLogger, startRouter } from './router.js';

const USAGE = `usage: switchyard serve [options]

  --config FILE        router config (YAML, apiVersion switchyard/v1, kind Router;
                       see docs/config.md)
  --upstream URL       quick mode without a file: route to this engine URL
                       (repeat for more endpoints)
  --model NAME         quick mode: the served model name (default open-model)
  --engine vllm|sglang quick mode: the engine type (default vllm)
  --host HOST          listen address (overrides the config; default 127.0.0.1)
  --port PORT          listen port (overrides the config; default 8000)
  --log-level LEVEL    fatal|error|warn|info|debug|trace|silent (default info)
  --watch-config       also reload the config file when it changes (as SIGHUP)
  --watch-settle-ms MS with --watch-config: how long a changed file must stay
                       unchanged before it is applied (default 1000; a writer
                       pausing longer mid-file could be caught half-written)
  --print-config       print the resolved config (every default filled in,
                       the options above applied) and exit without starting
  -h, --help           show this message

examples:
  switchyard serve                                  # 4 simulated engines, port 8000
  switchyard serve --config router.yaml --port 9000
  switchyard serve --upstream http://10.0.0.5:8000 --upstream http://10.0.0.6:8000 \\
                   --model llama-3-8b --engine vllm
  switchyard serve --config router.yaml --print-config
  curl -s localhost:8000/v1/chat/completions -H 'content-type: application/json' \\
       -d '{"model":"open-model","messages":[{"role":"user","content":"hi"}]}'

With neither --config nor --upstream, the router starts 4 simulated engines
in-process (model open-model) and routes to them; Ctrl-C stops everything.

SIGHUP: re-read the config file; an invalid one is refused (field paths in
the log) and the running config keeps serving. Endpoints added, removed or
changed in the file join, drain and leave without a restart (docs/operations.md).

SIGINT or SIGTERM: drain. /readyz answers 503 at once; the router keeps
accepting for shutdown.drainDelayMs (default 0: balancers take it out of
rotation meanwhile), then stops accepting; in-flight requests get up to
shutdown.graceMs (default 120 s) to finish (answers meanwhile close their
connection). Requests still running then end with an error: a stream with an
SSE error event (code router_shutting_down), any other with a 503. A second
signal within 1 s is ignored (npm passes on a Ctrl-C the router already got);
a later one ends the requests in flight that way at once and exits (130 for
SIGINT, 143 for SIGTERM).

Exit codes: 0 after a clean shutdown, 1 on a runtime failure, 2 on bad
options or an invalid config, 130/143 when a second signal cut the drain.`;

/** A second signal sooner than this after the first is the same Ctrl-C delivered twice. */
const REPEAT_MS = 1000;

const validatePlugin = (kind: 'filter' | 'scorer' | 'picker', spec: { type: string; params: Record<string, unknown> }) =>
  registry.validate(kind, spec.type, spec.params);

export async function runServeCli(argv: string[]): Promise<number> {
  let args;
  try {
    args = parseArgs({
      args: argv,
      options: {
        config: { type: 'string' },
        upstream: { type: 'string', multiple: true },
        model: { type: 'string' },
        engine: { type: 'string' },
        host: { type: 'string' },
        port: { type: 'string' },
        'log-level': { type: 'string' },
        'print-config': { type: 'boolean' },
        'watch-config': { type: 'boolean' },
        'watch-settle-ms': { type: 'string' },
        help: { type: 'boolean', short: 'h' },
      },
      strict: true,
      allowPositionals: false,
    }).values;
  } catch (err) {
    console.error(`switchyard serve: ${(err as Error).message}\n\n${USAGE}`);
    return 2;
  }
  if (args.help) {
    console.log(USAGE);
    return 0;
  }
  const problems: string[] = [];
  let port: number | undefined;
  if (args.port !== undefined) {
    port = Number(args.port);
    if (!/^\d+$/.test(args.port) || port > 65535) problems.push(`--port: must be an integer in [0, 65535] (got ${args.port})`);
  }
  if (args.host !== undefined && args.host.length === 0) problems.push('--host: must not be empty');
  if (args.config !== undefined && args.upstream !== undefined) problems.push('--config: cannot be combined with --upstream');
  if (args['watch-config'] === true && args.config === undefined) problems.push('--watch-config: needs --config');
  let settleMs: number | undefined;
  if (args['watch-settle-ms'] !== undefined) {
    settleMs = Number(args['watch-settle-ms']);
    if (!/^\d+$/.test(args['watch-settle-ms']) || settleMs > 600_000) problems.push(`--watch-settle-ms: must be an integer in [0, 600000] (got ${args['watch-settle-ms']})`);
    else if (args['watch-config'] !== true) problems.push('--watch-settle-ms: applies with --watch-config only');
  }
  if (args.engine !== undefined && !ENGINES.includes(args.engine as Engine)) problems.push(`--engine: must be one of: ${ENGINES.join(', ')} (got ${args.engine})`);
  if ((args.model !== undefined || args.engine !== undefined) && args.upstream === undefined && args.config !== undefined) {
    problems.push(`${args.model !== undefined ? '--model' : '--engine'}: applies to quick mode (--upstream) only, not with --config`);
  }
  const level = args['log-level'];
  if (level !== undefined && !['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'].includes(level)) {
    problems.push(`--log-level: must be one of fatal, error, warn, info, debug, trace, silent (got ${level})`);
  }
  if (problems.length > 0) {
    for (const p of problems) console.error(p);
    return 2;
  }

  let config: RouterConfig;
  let fleet: { urls: string[]; close(): Promise<void> } | undefined;
  try {
    if (args.config !== undefined) config = await loadConfigFile(args.config, validatePlugin);
    else if (args.upstream !== undefined) {
      config = quickConfig(args.upstream, args.model ?? 'open-model', (args.engine as Engine | undefined) ?? 'vllm', validatePlugin);
    } else {
      const models = [args.model ?? 'open-model'];
      if (!args['print-config']) {
        const { startFleet } = await import('../sim/index.js');
        fleet = await startFleet(4, { models, engine: (args.engine as Engine | undefined) ?? 'vllm' });
      }
      // --print-config starts nothing: validated with placeholder ports, printed with port 0 (chosen at start)
      const urls = fleet?.urls ?? [1, 2, 3, 4].map((p) => `http://127.0.0.1:${p}`);
      config = validateConfig(
        {
          apiVersion: API_VERSION,
          kind: 'Router',
          pools: [
            {
              name: 'sim',
              engine: args.engine ?? 'vllm',
              models,
              endpoints: urls.map((url, i) => ({ name: `sim-${i}`, url })),
            },
          ],
        },
        validatePlugin,
        'embedded default',
      );
    }
  } catch (err) {
    if (err instanceof ConfigError) {
      for (const line of issueLines(err)) console.error(line);
      await fleet?.close();
      return 2;
    }
    console.error(`switchyard serve: ${(err as Error).message}`);
    await fleet?.close();
    return 1;
  }
  if (level !== undefined) config.logging.level = level as RouterConfig['logging']['level'];
  if (args['print-config']) {
    if (args.host !== undefined) config.listen.host = args.host;
    if (port !== undefined) config.listen.port = port;
    if (args.config === undefined && args.upstream === undefined) for (const e of config.pools[0]!.endpoints) e.url = 'http://127.0.0.1:0';
    process.stdout.write(configYaml(config));
    return 0;
  }
  const log = createLogger(config.logging.level, { sync: false });

  let router;
  try {
    router = await startRouter(config, { logger: log, host: args.host, port, configFile: args.config, validatePlugin, watchConfig: args['watch-config'] !== true ? false : settleMs === undefined ? true : { settleMs } });
  } catch (err) {
    if (err instanceof ConfigError) {
      for (const line of issueLines(err)) console.error(line);
      await fleet?.close();
      return 2;
    }
    log.error({ err }, `the router failed to start: ${(err as Error)?.message ?? String(err)}`);
    await fleet?.close();
    return 1;
  }
  log.info(
    {
      url: router.url,
      pools: config.pools.map((p) => ({ name: p.name, engine: p.engine, models: p.models, endpoints: p.endpoints.map((e) => e.url) })),
      simulated: fleet !== undefined,
    },
    `switchyard router listening on ${router.url}`,
  );

  // the handlers stay installed until the end: a repeated signal within REPEAT_MS (npm
  // forwards a terminal's Ctrl-C to its child, which already got it from the terminal) must
  // not kill the process with the default action and cut the requests the grace period lets
  // finish; one after that is an operator asking again: exit at once (128 + signal number)
  let stoppingAt = 0;
  let onStop: () => void = () => {};
  const stop = (sig: 'SIGINT' | 'SIGTERM') => {
    const { graceMs, drainDelayMs } = router.core.shutdown;
    if (stoppingAt !== 0) {
      if (Date.now() - stoppingAt < REPEAT_MS) {
        log.warn({ signal: sig, grace_ms: graceMs }, 'already shutting down: in-flight requests get up to the grace period (signal again to stop at once)');
        return;
      }
      log.warn({ signal: sig, active: router.core.activeRequests }, 'second signal: stopping now, in-flight requests end with an error');
      // a stream gets its SSE error event, others a 503; the bytes leave before the exit
      const cut = router.core.cutInFlight(0);
      const code = sig === 'SIGINT' ? 130 : 143;
      setTimeout(() => process.exit(code), cut > 0 ? 50 : 0);
      return;
    }
    stoppingAt = Date.now();
    router.core.beginDrain();
    log.info({ signal: sig, grace_ms: graceMs, drain_delay_ms: drainDelayMs, in_flight: router.core.activeRequests }, 'shutting down: /readyz answers 503');
    if (drainDelayMs > 0) setTimeout(() => onStop(), drainDelayMs);
    else onStop();
  };
  const onInt = () => stop('SIGINT');
  const onTerm = () => stop('SIGTERM');
  // SIGHUP: re-read the config file (validated first; a bad one is refused and logged, the old one keeps serving)
  const reload = router.reload;
  const onHup = () => {
    if (reload === null) {
      log.warn('SIGHUP: no config file to reload (started without --config)');
      return;
    }
    log.info({ file: args.config }, 'SIGHUP: reloading the config');
    reload().catch((err: unknown) => log.error({ err }, 'config reload failed'));
  };
  process.on('SIGINT', onInt);
  process.on('SIGTERM', onTerm);
  process.on('SIGHUP', onHup);
  if (router.admin) log.info({ url: router.admin.url }, `admin API listening on ${router.admin.url}`);
  if (fleet !== undefined) {
    // a container image run without arguments lands here: say loudly that nothing real answers
    log.warn(
      { event: 'serve.simulated', engines: fleet.urls },
      'serving 4 SIMULATED engines (no --config or --upstream): every answer is generated text, not a model; give --config FILE or --upstream URL to route to real engines',
    );
  }
  try {
    await new Promise<void>((resolve) => (onStop = resolve));
    log.info({ in_flight: router.core.activeRequests }, 'not accepting new connections');
    await router.close(router.core.shutdown.graceMs);
    log.info('shutdown complete');
    await fleet?.close();
  } finally {
    process.off('SIGINT', onInt);
    process.off('SIGTERM', onTerm);
    process.off('SIGHUP', onHup);
  }
  return 0;
}
