// Scenario `cost-model`: the cost-fairness run (bench/cost-fairness.ts)
// replayed on the real FlowController and native queues with a virtual
// clock: two backlogged tenants in one band (`--clients` closed-loop clients
// each), 8192- and 256-token prompts, max_tokens 16, a pool of `--slots`,
// each request taking 160 ms + 0.05 ms per prompt token. Served prompt +
// output tokens per tenant after a 4 s warm-up, per newFlowQuantum setting
// (`fairness: tokens`). Deterministic; no lock needed.
//
//   node dist/bench/cost-model.js [--seconds 200] [--slots 4] [--clients 8] [--quanta 16,0]
import { FlowController, type AdmitResult } from '../../src/flow/controller.js';
import { validateFlowControl } from '../../src/flow/config.js';
import { option } from '../lib/proc.js';
import { fmt } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const PROMPT = { long: 8192, short: 256 } as const;
type Tenant = keyof typeof PROMPT;
const OUTPUT = 16;
const turn = () => new Promise<void>((r) => setImmediate(r));

async function replay(seconds: number, slots: number, clients: number, quantum: number) {
  const { value: cfg, errors } = validateFlowControl({ admission: { mode: 'off' }, fairness: { mode: 'tokens', newFlowQuantum: quantum } });
  if (!cfg) throw new Error(errors.join('\n'));
  let now = 0;
  let ctl!: FlowController;
  ctl = new FlowController({ config: cfg, utilisation: () => ctl.inFlight / slots, now: () => now, sweepTimer: false });
  const running: { end: number; tenant: Tenant; ticket: number }[] = [];
  const served = { long: { requests: 0, tokens: 0 }, short: { requests: 0, tokens: 0 } };
  const send = (tenant: Tenant) => {
    const r = ctl.admit({ flowId: `tenant:${tenant}`, band: 1, bytes: 1, promptTokens: PROMPT[tenant], maxTokens: OUTPUT });
    const done = (x: AdmitResult) => {
      if (x.ok) running.push({ end: now + 160 + 0.05 * PROMPT[tenant], tenant, ticket: x.ticket });
    };
    if (r instanceof Promise) r.then(done);
    else done(r);
  };
  for (let i = 0; i < clients; i++) {
    send('long');
    send('short');
  }
  while (now < seconds * 1000) {
    for (let i = 0; i < 4; i++) await turn();
    let k = 0;
    for (let i = 1; i < running.length; i++) if (running[i]!.end < running[k]!.end) k = i;
    const r = running.splice(k, 1)[0]!;
    now = r.end;
    if (now > 4000) {
      served[r.tenant].requests++;
      served[r.tenant].tokens += PROMPT[r.tenant] + OUTPUT;
    }
    ctl.release(r.ticket, { promptTokens: PROMPT[r.tenant], maxTokens: OUTPUT, uncached: 1, outputTokens: OUTPUT });
    send(r.tenant);
  }
  ctl.close();
  return served;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const argv = process.argv.slice(2);
  const seconds = Number(option(argv, '--seconds') ?? 200);
  const slots = Number(option(argv, '--slots') ?? 4);
  const clients = Number(option(argv, '--clients') ?? 8);
  const quanta = (option(argv, '--quanta') ?? '16,0').split(',').map(Number);
  console.log(`cost-model: ${slots} slots, ${clients} clients per tenant, ${seconds} s of virtual time, fairness: tokens\n`);
  console.log('| newFlowQuantum | long: requests / tokens | short: requests / tokens | tokens long : short |');
  console.log('|---|---|---|---|');
  for (const q of quanta) {
    const s = await replay(seconds, slots, clients, q);
    console.log(`| ${q} | ${s.long.requests} / ${s.long.tokens} | ${s.short.requests} / ${s.short.tokens} | **${fmt(s.long.tokens / s.short.tokens, 3)} : 1** |`);
  }
}
