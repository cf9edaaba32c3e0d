// Placeholder until the sim command lands.
export async function runSimCli(argv: string[]): Promise<number> {
  console.error('switchyard sim: not implemented yet', argv.length);
  return 1;
}
