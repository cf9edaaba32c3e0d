// `node dist/bench/metrics-render.js --base <dir>`: the cost of the metrics
// code of this build against another build (a checkout or copy with dist/
// built), in one process, interleaved: the request-path calls (histogram
// observe, countRequest) and one /metrics render of the router (8 endpoints,
// counters filled) and of a simulated vLLM engine. Reports the median over
// rounds of µs per render and ns per hot-path call.
//   node dist/bench/metrics-render.js --base /tmp/swy-base [--rounds 7] [--renders 2000] [--calls 2000000]
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { ROOT, option, runMain } from '../lib/proc.js';
import { median } from '../lib/stats.js';
import { exitOnHelp } from '../lib/help.js';

exitOnHelp(import.meta.url);

const argv = process.argv.slice(2);
const base = option(argv, '--base') ?? '';
const rounds = Number(option(argv, '--rounds') ?? '7');
const renders = Number(option(argv, '--renders') ?? '2000');
const calls = Number(option(argv, '--calls') ?? '2000000');

/** What either build offers, reached through its dist/ modules. */
interface Build {
  name: string;
  /** Renders the router's /metrics text (as its route does). */
  routerText: () => string | Promise<string>;
  /** Renders a simulated engine's /metrics text. */
  simText: () => string | Promise<string>;
  observe: (v: number) => void;
  count: (i: number) => void;
}

async function load(name: string, dir: string): Promise<Build> {
  const mod = (p: string) => import(pathToFileURL(join(dir, 'dist', p)).href);
  const schema = await mod('src/config/schema.js');
  const builtins = await mod('src/scheduler/plugins/index.js');
  const { EndpointSet } = await mod('src/endpoints/endpoint.js');
  const { RouterMetrics } = await mod('src/server/metrics.js');
  const simMetrics = await mod('src/sim/metrics.js');
  const { Scheduler } = await mod('src/sim/scheduler.js');
  const { resolveSimOptions } = await mod('src/sim/options.js');
  const cfg = schema.validateConfig(
    {
      apiVersion: schema.API_VERSION,
      kind: 'Router',
      pools: [{ name: 'p', models: ['open-model'], endpoints: Array.from({ length: 8 }, (_, i) => ({ name: `e${i}`, url: `http://127.0.0.1:${9000 + i}` })) }],
      logging: { level: 'silent' },
    },
    (kind: 'filter' | 'scorer' | 'picker', s: { type: string; params: Record<string, unknown> }) => builtins.registry.validate(kind, s.type, s.params),
  );
  const set = new EndpointSet(cfg.pools, cfg.dataLayer);
  const m = new RouterMetrics(set);
  for (let i = 0; i < 5000; i++) {
    m.countRequest('open-model', i % 8, i % 50 === 0 ? 503 : 200);
    m.decision.observe(i * 1e-7);
    m.ttft[i % 8].observe((i % 100) * 0.003);
  }
  m.countRequest('', -1, 404);
  m.rejected.set('rejected-saturated', 3);
  m.promptBlocks = 1000;
  m.matchedBlocks = 400;
  const o = resolveSimOptions({ timeScale: 0 });
  const s = new Scheduler(o);
  for (let i = 0; i < 1000; i++) {
    s.ttft.observe(i * 0.001);
    s.itl.observe(0.01);
    s.e2e.observe(i * 0.01);
    s.queueTime.observe(0);
  }
  const routerText: () => string | Promise<string> = typeof m.render === 'function' ? () => m.render() : () => m.text();
  let simText: () => string | Promise<string>;
  if (typeof simMetrics.renderMetrics === 'function') simText = () => simMetrics.renderMetrics(o, s);
  else {
    const sm = new simMetrics.SimMetrics(o, s);
    simText = () => sm.text();
  }
  const h = m.ttft[3];
  return {
    name,
    routerText,
    simText,
    observe: (v) => h.observe(v),
    count: (i) => m.countRequest('open-model', i & 7, 200),
  };
}

async function perRender(f: () => string | Promise<string>): Promise<number> {
  let bytes = 0;
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < renders; i++) bytes += (await f()).length;
  const us = Number(process.hrtime.bigint() - t0) / 1e3 / renders;
  if (bytes === 0) throw new Error('empty render');
  return us;
}

function perCall(f: (i: number) => void, arg: (i: number) => number): number {
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < calls; i++) f(arg(i));
  return Number(process.hrtime.bigint() - t0) / calls;
}

async function main(): Promise<void> {
  if (base === '') throw new Error('--base <dir of another Switchyard build> is required');
  const builds = [await load('base', base), await load('this', ROOT)];
  // this build's default process/Node.js metrics alone (newRegistry with nothing else in it)
  const prom = await import(pathToFileURL(join(ROOT, 'dist/src/metrics/prom.js')).href);
  const defaults = prom.newRegistry();
  const defaultsUs: number[] = [];
  const res = new Map(builds.map((b) => [b.name, { router: [] as number[], sim: [] as number[], observe: [] as number[], count: [] as number[] }]));
  for (let r = 0; r < rounds; r++) {
    const order = r % 2 === 0 ? builds : [...builds].reverse();
    for (const b of order) {
      const x = res.get(b.name)!;
      x.router.push(await perRender(b.routerText));
      x.sim.push(await perRender(b.simText));
      x.observe.push(perCall(b.observe, (i) => (i % 1000) * 0.001));
      x.count.push(perCall(b.count, (i) => i));
    }
    defaultsUs.push(await perRender(() => defaults.metrics()));
  }
  const b = res.get('base')!;
  const t = res.get('this')!;
  const line = (what: string, unit: string, k: 'router' | 'sim' | 'observe' | 'count', digits: number) => {
    const mb = median(b[k]);
    const mt = median(t[k]);
    return `| ${what} | ${mb.toFixed(digits)} ${unit} | ${mt.toFixed(digits)} ${unit} | ${Math.round((mt / mb) * 100)} % |`;
  };
  console.log(`metrics A/B: base = ${base}, this = ${ROOT}; ${rounds} interleaved rounds (medians); ${renders} renders, ${calls} calls per round`);
  console.log('| what | base | this | this vs base |');
  console.log('|---|---:|---:|---:|');
  console.log(line('router /metrics render (8 endpoints)', 'µs', 'router', 1));
  console.log(`| of which the default process/Node.js metrics alone | – | ${median(defaultsUs).toFixed(1)} µs | – |`);
  console.log(line('sim (vLLM) /metrics render', 'µs', 'sim', 1));
  console.log(line('ttft[id].observe(v)', 'ns', 'observe', 1));
  console.log(line('countRequest(model, id, 200)', 'ns', 'count', 1));
}

runMain(main);
