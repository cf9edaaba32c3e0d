// Loaded into a spawned `switchyard serve` (node --expose-gc --import) by
// test/router/gc-survival.test.ts: over the IPC channel, {gcprobe: 'full'}
// runs a full GC (as V8 does by itself under load) and answers {gcprobe:
// 'full'}; {gcprobe: 'start'} starts recording GCs (v8.GCProfiler);
// {gcprobe: 'stop'} answers {gcprobe: 'stats', promoted, scavenges, fulls}:
// the bytes the old generation grew by across the scavenges since 'start'
// (what they promoted), their count, and the count of full GCs meanwhile.
import v8 from 'node:v8';

const oldUsed = (s) => s.heapSpaceStatistics.find((x) => x.spaceName === 'old_space')?.spaceUsedSize ?? 0;
let prof = null;
process.on('message', (m) => {
  switch (m?.gcprobe) {
    case 'full':
      globalThis.gc();
      process.send({ gcprobe: 'full' });
      break;
    case 'start':
      prof = new v8.GCProfiler();
      prof.start();
      process.send({ gcprobe: 'started' });
      break;
    case 'stop': {
      const r = prof.stop();
      let promoted = 0;
      let scavenges = 0;
      let fulls = 0;
      for (const g of r.statistics) {
        if (g.gcType === 'Scavenge') {
          scavenges++;
          promoted += Math.max(0, oldUsed(g.afterGC) - oldUsed(g.beforeGC));
        } else if (g.gcType === 'MarkSweepCompact') fulls++;
      }
      process.send({ gcprobe: 'stats', promoted, scavenges, fulls });
      break;
    }
  }
});
