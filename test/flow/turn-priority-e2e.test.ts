// Turn priority end to end: the session tracker marks a request that
// continues a conversation (its previous turn ended recently) and flow
// control dispatches it ahead of cold requests queued earlier in its band;
// with the feature off, the same request waits its turn.
import t from 'tap';
import { routerOverEngine } from '../support/router-util.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function setup(t: Tap.Test, turnPriority: boolean) {
  // one engine, 10 ms per output token: max_tokens sets a request's duration
  const { router } = await routerOverEngine(
    t,
    { itlMs: 10, prefillOverheadMs: 1, prefillUsPerToken: 0, seed: 3 },
    `flowControl:
  admission: { mode: "off" }
  saturation: { maxConcurrency: 1 }
  turnPriority: { enabled: ${turnPriority}, maxColdWait: 30s }
`,
    'turn-priority-e2e',
  );
  return router;
}

async function chat(url: string, tag: string, headers: Record<string, string>, maxTokens: number): Promise<{ tag: string; status: number; endedAt: number }> {
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'open-model', messages: [{ role: 'user', content: `turn ${tag}` }], max_tokens: maxTokens }),
  });
  await res.arrayBuffer();
  return { tag, status: res.status, endedAt: performance.now() };
}

async function metric(url: string, name: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  let sum = 0;
  for (const line of text.split('\n')) if (line.startsWith(name)) sum += Number(line.slice(line.lastIndexOf(' ') + 1));
  return sum;
}

async function run(t: Tap.Test, turnPriority: boolean): Promise<string[]> {
  const router = await setup(t, turnPriority);
  const url = router.url;
  // the conversation's first turn ends: its next turn is a continuation for sessions.continuationWindowMs
  t.equal((await chat(url, 'agent-1', { 'x-session-id': 'agent' }, 2)).status, 200);
  // a long cold request takes the only slot; three cold ones queue, then the agent's next turn
  const blocker = chat(url, 'blocker', {}, 40);
  await sleep(60);
  const queued: Promise<{ tag: string; status: number; endedAt: number }>[] = [];
  for (let i = 0; i < 3; i++) {
    queued.push(chat(url, `cold-${i}`, {}, 5));
    await sleep(30);
  }
  queued.push(chat(url, 'agent-2', { 'x-session-id': 'agent' }, 5));
  const all = await Promise.all([blocker, ...queued]);
  t.ok(all.every((r) => r.status === 200), 'everything is served');
  return all
    .slice(1)
    .sort((a, b) => a.endedAt - b.endedAt)
    .map((r) => r.tag);
}

t.test('on (the default): the continuation goes ahead of cold requests queued before it', async (t) => {
  const order = await run(t, true);
  t.equal(order[0], 'agent-2', `dispatch order ${order.join(' ')}`);
});

t.test('off: the continuation waits behind the cold requests queued before it', async (t) => {
  const order = await run(t, false);
  t.equal(order[order.length - 1], 'agent-2', `dispatch order ${order.join(' ')}`);
});

t.test('continuations are counted by the session tracker', async (t) => {
  const router = await setup(t, true);
  await chat(router.url, 'a', { 'x-session-id': 's' }, 2);
  await chat(router.url, 'b', { 'x-session-id': 's' }, 2);
  t.ok((await metric(router.url, 'switchyard_session_continuations_total')) >= 1, 'session tracker');
});
