#!/usr/bin/env node
// The container's health check: GET /healthz (the router) or, when that path
// is unknown, /health (the simulator) on 127.0.0.1:$SWITCHYARD_HEALTH_PORT
// (default 8000). Exit 0 when healthy, 1 otherwise; one line on failure.
const port = process.env.SWITCHYARD_HEALTH_PORT || '8000';
const base = `http://127.0.0.1:${port}`;

async function status(path) {
  const res = await fetch(base + path, { signal: AbortSignal.timeout(2000) });
  await res.arrayBuffer();
  return res.status;
}

try {
  let s = await status('/healthz');
  if (s === 404) s = await status('/health');
  if (s !== 200) {
    console.error(`healthcheck: ${base} answered ${s}`);
    process.exit(1);
  }
} catch (err) {
  console.error(`healthcheck: ${base}: ${err.message}`);
  process.exit(1);
}
