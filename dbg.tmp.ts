import { flowControlSchema } from './src/config/flow-control.js';
const base = { flows: [{ id: 'tenant:ok' }, { id: 'tenant:ok' }] };
for (const extra of [{ admission: { mode: 'random' } }, { admission: { maxUtilisation: 0 } }, {enabled: 'yes'}, {maxFlows: 1.5}]) {
  const r = flowControlSchema.safeParse({ ...base, ...extra });
  console.log(JSON.stringify(extra), JSON.stringify(r.error?.issues.map((i) => i.message)));
}
