// What the tenant tests of the Responses API share: a router whose flow
// control maps `key-a` to tenant a and `key-b` to tenant b, a JSON call with
// an Authorization value (or none), and a wait for a condition.
import { startTestRouter } from './router-util.js';

export const KEY_A = 'Bearer key-a';
export const KEY_B = 'Bearer key-b';

export async function tenantRouter(t: Tap.Test, responses: Record<string, unknown>) {
  return startTestRouter(t, { n: 1, extra: { responses, flowControl: { tenants: { 'key-a': 'a', 'key-b': 'b' } } } });
}

/** One request; the body parsed when it is JSON, else its text. */
export async function call(url: string, method: string, path: string, auth: string | null, body?: unknown): Promise<{ status: number; json: any }> {
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (auth !== null) headers.authorization = auth;
  const res = await fetch(url + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await res.text();
  let json: any = text;
  try {
    json = JSON.parse(text);
  } catch {
    /* not JSON */
  }
  return { status: res.status, json };
}

export async function until(cond: () => boolean, ms: number): Promise<boolean> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (cond()) return true;
    await new Promise((r) => setTimeout(r, 50));
  }
  return false;
}
