// Loaded into a spawned `switchyard serve` (node --import) by
// test/support/loop-stall.ts's spawnProbedServe: the same loop-stall probe,
// inside the router's own process (compiled code, no test runner or
// TypeScript compiler in its heap), driven over the IPC channel:
// {probe: 'start'} starts a measurement, {probe: 'stop'} answers
// {probe: 'stall', wall, own, waited, ticks, gc}. See loop-stall.ts for what
// `own` is (the wall-clock gap less this thread's wait for a CPU).
import { readFileSync } from 'node:fs';
import { PerformanceObserver } from 'node:perf_hooks';

const SCHEDSTAT = `/proc/${process.pid}/task/${process.pid}/schedstat`;
const runDelay = () => {
  try {
    return Number(readFileSync(SCHEDSTAT, 'latin1').split(' ')[1]);
  } catch {
    return null;
  }
};
const INTERVAL = 5;
let cur = null;

function start() {
  const s = { wall: 0, own: 0, ticks: 0, gc: 0, d0: runDelay(), lastT: performance.now(), lastD: null };
  s.lastD = s.d0;
  const see = () => {
    const t = performance.now();
    const d = runDelay();
    const gap = t - s.lastT - INTERVAL;
    const waited = d !== null && s.lastD !== null ? (d - s.lastD) / 1e6 : 0;
    s.wall = Math.max(s.wall, gap);
    s.own = Math.max(s.own, gap - waited);
    s.lastT = t;
    s.lastD = d;
    return d;
  };
  s.see = see;
  s.timer = setInterval(() => {
    see();
    s.ticks++;
  }, INTERVAL);
  s.obs = new PerformanceObserver((list) => {
    for (const e of list.getEntries()) s.gc = Math.max(s.gc, e.duration);
  });
  s.obs.observe({ entryTypes: ['gc'] });
  return s;
}

function stop(s) {
  clearInterval(s.timer);
  s.obs.disconnect();
  const d = s.see();
  return { probe: 'stall', wall: s.wall, own: s.own, waited: d !== null && s.d0 !== null ? (d - s.d0) / 1e6 : 0, ticks: s.ticks, gc: s.gc };
}

if (process.send !== undefined) {
  process.on('message', (m) => {
    if (m?.probe === 'start') {
      if (cur !== null) stop(cur);
      cur = start();
      process.send({ probe: 'started' });
    } else if (m?.probe === 'stop' && cur !== null) {
      const r = stop(cur);
      cur = null;
      process.send(r);
    }
  });
  // the channel must not keep a router that is told to stop alive
  process.channel?.unref();
}
