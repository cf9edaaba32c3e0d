// Placeholder until the server command lands.
export async function runServeCli(argv: string[]): Promise<number> {
  console.error('switchyard server: not implemented yet', argv.length);
  return 1;
}
