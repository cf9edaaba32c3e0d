// `switchyard <command>`: serve (the router), sim (the engine simulator),
// check (validate a config), version.
import { VERSION } from './version.js';

const USAGE = `usage: switchyard <command> [options]

commands:
  serve    run the router (no options: the embedded default, a router on
           127.0.0.1:8000 in front of 4 simulated engines)
  sim      run a simulated vLLM/SGLang engine (or a fleet of them)
  check    validate a router config and print it with every default filled in
  version  print the version (also --version, -V)
  rollout  move a pool to another revision through a router's admin API
  help     show this message

examples:
  switchyard serve                                   # try it: router + 4 simulated engines
  switchyard serve --config router.yaml
  switchyard serve --upstream http://10.0.0.5:8000 --model llama-3-8b
  switchyard check --config router.yaml > resolved.yaml
  switchyard sim --port 8001 --model llama-3-8b

Run \`switchyard <command> --help\` for a command's options.
Exit codes: 0 ok, 1 runtime failure, 2 bad options or an invalid config.`;

export async function main(argv: string[]): Promise<number> {
  const [cmd, ...rest] = argv;
  switch (cmd) {
    case 'serve': {
      const { runServeCli } = await import('./server/cli.js');
      return runServeCli(rest);
    }
    case 'sim': {
      const { runSimCli } = await import('./sim/cli.js');
      return runSimCli(rest);
    }
    case 'check': {
      const { runCheckCli } = await import('./server/check-cli.js');
      return runCheckCli(rest);
    }
    case 'version':
    case '--version':
    case '-V':
      console.log(`switchyard ${VERSION} (node ${process.version})`);
      return 0;
    case 'rollout': {
      const { runRolloutCli } = await import('./server/rollout.js');
      return runRolloutCli(rest);
    }
    case undefined:
    case 'help':
    case '--help':
    case '-h':
      if (cmd === undefined) {
        console.error(USAGE);
        return 2;
      }
      console.log(USAGE);
      return 0;
    default:
      console.error(`switchyard: unknown command '${cmd}'\nRun \`switchyard --help\` for the commands.`);
      return 2;
  }
}
