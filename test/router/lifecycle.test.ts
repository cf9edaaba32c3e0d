import t from 'tap';
import { CloseRank, Lifecycle } from '../../src/server/lifecycle.js';

t.test('closes by rank, equal ranks together, once, passing the grace', async (t) => {
  const lc = new Lifecycle();
  const log: string[] = [];
  let releaseRouter: () => void = () => {};
  lc.add('router', CloseRank.serving, (g) => new Promise<void>((r) => { log.push(`router:${g}`); releaseRouter = r; }));
  lc.add('discovery', CloseRank.discovery, () => { log.push('discovery'); });
  lc.add('lease', CloseRank.lease, async () => { log.push('lease'); });
  lc.add('extProc', CloseRank.serving, (g) => { log.push(`extProc:${g}`); });
  lc.add('watcher', CloseRank.watcher, () => { log.push('watcher'); });
  t.same(lc.order, ['watcher', 'lease', 'discovery', 'router', 'extProc']);
  const first = lc.close(500);
  const second = lc.close(0);
  t.equal(first, second, 'a second close joins the first');
  await new Promise((r) => setImmediate(r));
  // router and extProc (same rank) both started before either finished
  t.same(log, ['watcher', 'lease', 'discovery', 'router:500', 'extProc:500']);
  releaseRouter();
  await first;
});

t.test('a failing close rejects close()', async (t) => {
  const lc = new Lifecycle();
  lc.add('bad', CloseRank.admin, () => Promise.reject(new Error('boom')));
  await t.rejects(lc.close(), /boom/);
});
