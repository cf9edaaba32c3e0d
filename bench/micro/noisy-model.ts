// Scenario `noisy-model`: the noisy-neighbour run (bench/noisy-neighbour.ts)
// replayed on the real FlowController and native queues with a virtual clock,
// so the dispatch order's effect on b's and c's latency is measured without
// the machine's noise. The pool has `--slots` slots (the router gives lower
// bands 3 of each 4-slot engine: 6 for two engines) and every request takes
// `--service-ms` (10 tokens at 20 ms plus prefill). Per round: b and c send
// `--others` each at once (alone; b first in even rounds, c in odd ones);
// 2 s later a sends `--burst` at once and `--gap-ms` later b and c send
// `--others` each (loud). Admission is off (the exact run never sheds).
// Figures: b and c's p95 loud over alone, per newFlowQuantum setting.
//
//   node dist/bench/noisy-model.js [--rounds 6] [--slots 6] [--service-ms 220] [--burst 60] [--others 10]
//                                  [--gap-ms 300] [--quanta 16,0]
import { FlowController, type AdmitResult } from '../../src/flow/controller.js';
import { validateFlowControl } from '../../src/flow/config.js';
import { option } from '../lib/proc.js';
import { fmt, quantile } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

interface Shape {
  rounds: number;
  slots: number;
  serviceMs: number;
  burst: number;
  others: number;
  gapMs: number;
}

const turn = () => new Promise<void>((r) => setImmediate(r));

async function replay(s: Shape, quantum: number): Promise<Record<string, number[]>> {
  const { value: cfg, errors } = validateFlowControl({ admission: { mode: 'off' }, fairness: { newFlowQuantum: quantum } });
  if (!cfg) throw new Error(errors.join('\n'));
  let now = 0;
  let ctl!: FlowController;
  ctl = new FlowController({ config: cfg, utilisation: () => ctl.inFlight / s.slots, now: () => now, sweepTimer: false });
  const running: { end: number; ticket: number; t0: number; key: string }[] = [];
  const lat: Record<string, number[]> = {};
  const send = (tenant: string, phase: string, n: number) => {
    for (let i = 0; i < n; i++) {
      const t0 = now;
      const r = ctl.admit({ flowId: `tenant:${tenant}`, band: 1, bytes: 100 });
      const done = (x: AdmitResult) => {
        if (x.ok) running.push({ end: now + s.serviceMs, ticket: x.ticket, t0, key: `${phase} ${tenant}` });
      };
      if (r instanceof Promise) r.then(done);
      else done(r);
    }
  };
  // runs completions (and the dispatches they allow) up to virtual time `to`
  const advance = async (to: number) => {
    for (;;) {
      for (let i = 0; i < 4; i++) await turn();
      let k = -1;
      for (let i = 0; i < running.length; i++) if (k < 0 || running[i]!.end < running[k]!.end) k = i;
      if (k < 0 || running[k]!.end > to) break;
      const r = running.splice(k, 1)[0]!;
      now = r.end;
      (lat[r.key] ??= []).push(now - r.t0);
      ctl.release(r.ticket);
    }
    now = to;
  };
  const pair = (round: number, phase: string) => {
    const [x, y] = round % 2 === 0 ? ['b', 'c'] : ['c', 'b'];
    send(x!, phase, s.others);
    send(y!, phase, s.others);
  };
  for (let round = 0; round < s.rounds; round++) {
    pair(round, 'alone');
    await advance(now + 2000);
    send('a', 'loud', s.burst);
    await advance(now + s.gapMs);
    pair(round, 'loud');
    await advance(now + 60_000);
  }
  ctl.close();
  return lat;
}

const num = (argv: string[], name: string, dflt: number) => {
  const v = option(argv, name);
  const n = v === undefined ? dflt : Number(v);
  if (!(n > 0)) throw new Error(`noisy-model: ${name} must be a positive number, got ${v}`);
  return n;
};

if (import.meta.url === `file://${process.argv[1]}`) {
  const argv = process.argv.slice(2);
  const s: Shape = {
    rounds: num(argv, '--rounds', 6), slots: num(argv, '--slots', 6), serviceMs: num(argv, '--service-ms', 220),
    burst: num(argv, '--burst', 60), others: num(argv, '--others', 10), gapMs: num(argv, '--gap-ms', 300),
  };
  const quanta = (option(argv, '--quanta') ?? '16,0').split(',').map(Number);
  console.log(`noisy-model: ${s.slots} slots, ${s.serviceMs} ms per request, a ${s.burst}, b and c ${s.others} each, gap ${s.gapMs} ms, ${s.rounds} rounds (virtual clock)\n`);
  console.log('| newFlowQuantum | b p50 alone → loud | c p50 alone → loud | b p95 alone → loud | c p95 alone → loud | b, c p95 ratio | a p95 |');
  console.log('|---|---|---|---|---|---|---|');
  for (const q of quanta) {
    const lat = await replay(s, q);
    const p = (k: string, f: number) => quantile(lat[k] ?? [], f);
    const rb = p('loud b', 0.95) / p('alone b', 0.95);
    const rc = p('loud c', 0.95) / p('alone c', 0.95);
    console.log(
      `| ${q} | ${fmt(p('alone b', 0.5))} → ${fmt(p('loud b', 0.5))} | ${fmt(p('alone c', 0.5))} → ${fmt(p('loud c', 0.5))} | ` +
        `${fmt(p('alone b', 0.95))} → ${fmt(p('loud b', 0.95))} | ${fmt(p('alone c', 0.95))} → ${fmt(p('loud c', 0.95))} | ` +
        `**${fmt(rb, 2)}×, ${fmt(rc, 2)}×** | ${fmt(p('loud a', 0.95))} |`,
    );
  }
}
