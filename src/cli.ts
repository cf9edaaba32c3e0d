// `switchyard <command>`: serve (the router), sim (the engine simulator), bench.
const USAGE = `usage: switchyard <command> [options]

commands:
  serve    run the router (no options: the embedded default, a router on
           127.0.0.1:8000 in front of 4 simulated engines)
  sim      run a simulated vLLM/SGLang engine (or a fleet of them)
  rollout  move a pool to another revision through a router's admin API
  help     show this message

Run \`switchyard <command> --help\` for a command's options.`;

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
    case 'rollout': {
      const { runRolloutCli } = await import('./server/rollout.js');
      return runRolloutCli(rest);
    }
    case undefined:
    case 'help':
    case '--help':
    case '-h':
      console.log(USAGE);
      return cmd === undefined ? 2 : 0;
    default:
      console.error(`switchyard: unknown command '${cmd}'\n\n${USAGE}`);
      return 2;
  }
}
