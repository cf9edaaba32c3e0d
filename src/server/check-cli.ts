// `switchyard check --config FILE`: validates a router config the way `serve`
// does (schema, cross-field rules, plugin parameters, flow control) without
// starting anything, and prints the resolved config with every default.
import { parseArgs } from 'node:util';
import { configYaml, issueLines, loadConfigFile, printableConfig } from '../config/load.js';
import { ConfigError } from '../errors.js';
import { registry } from '../scheduler/plugins/index.js';
import { flowGateFactory } from './flow-gate.js';
import { loadAuth } from '../auth/keys.js';

export const CHECK_USAGE = `usage: switchyard check --config FILE [options]

Validates a router config (YAML, apiVersion switchyard/v1, kind Router) as
\`switchyard serve\` would, without starting anything, and prints the resolved
config with every default filled in.

  --config FILE   the config to check (required)
  --json          print the resolved config as JSON instead of YAML
  -q, --quiet     print nothing when the config is valid
  -h, --help      show this message

examples:
  switchyard check --config router.yaml
  switchyard check --config router.yaml --json | jq .proxy
  switchyard check -q --config router.yaml || echo "fix the config first"

Problems go to stderr, one line each, the field path first:
  pools[0].endpoints[1].url: must be an http(s) URL with no path, ...

Exit codes: 0 valid, 2 invalid (or unreadable, or bad options).`;

export const validatePlugin = (kind: 'filter' | 'scorer' | 'picker', spec: { type: string; params: Record<string, unknown> }) =>
  registry.validate(kind, spec.type, spec.params);

export async function runCheckCli(argv: string[]): Promise<number> {
  let args;
  try {
    args = parseArgs({
      args: argv,
      options: { config: { type: 'string' }, json: { type: 'boolean' }, quiet: { type: 'boolean', short: 'q' }, help: { type: 'boolean', short: 'h' } },
      strict: true,
      allowPositionals: false,
    }).values;
  } catch (err) {
    console.error(`switchyard check: ${(err as Error).message}\nRun \`switchyard check --help\` for the options.`);
    return 2;
  }
  if (args.help) {
    console.log(CHECK_USAGE);
    return 0;
  }
  if (args.config === undefined) {
    console.error('--config: is required (the file to check)\nRun `switchyard check --help` for the options.');
    return 2;
  }
  try {
    const cfg = await loadConfigFile(args.config, validatePlugin);
    // flow control's own rules beyond the schema (what startRouter checks when it builds the gate)
    await flowGateFactory(cfg);
    // the auth block's keys file and variable, the pools' upstreamAuth variables (what startRouter reads)
    await loadAuth(cfg);
    if (!args.quiet) process.stdout.write(args.json ? `${JSON.stringify(printableConfig(cfg), null, 2)}\n` : configYaml(cfg));
    return 0;
  } catch (err) {
    if (err instanceof ConfigError) {
      for (const line of issueLines(err)) console.error(line);
      return 2;
    }
    console.error(`switchyard check: ${(err as Error).message}`);
    return 1;
  }
}
