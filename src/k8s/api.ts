// The Kubernetes API as the discovery and the Lease need it: GET/PUT/POST of
// JSON objects and a watch stream, over node:http(s). @kubernetes/client-node
// loads the kubeconfig (a file, or the in-cluster service account with its
// rotating token) and builds the TLS agent and auth headers; the requests are
// made here so that the watch protocol's details stay in our hands: a partial
// line when the stream breaks is dropped (never parsed), an ERROR event is
// returned with its Status code (410 Gone: the caller relists), and the
// caller owns resourceVersion.
import http from 'node:http';
import https from 'node:https';
import { readFileSync } from 'node:fs';
import { SwitchyardError } from '../errors.js';

/** A Kubernetes object as far as we read it. */
export interface KubeObject {
  apiVersion?: string;
  kind?: string;
  metadata: { name: string; namespace?: string; resourceVersion?: string; labels?: Record<string, string>; annotations?: Record<string, string>; deletionTimestamp?: string; [k: string]: unknown };
  spec?: unknown;
  status?: unknown;
  [k: string]: unknown;
}

export interface KubeList<T extends KubeObject = KubeObject> {
  metadata: { resourceVersion: string };
  items: T[];
}

/** One line of a watch stream (https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes). */
export interface WatchEvent {
  type: 'ADDED' | 'MODIFIED' | 'DELETED' | 'BOOKMARK' | 'ERROR';
  object: KubeObject & { code?: number; reason?: string; message?: string };
}

/** An answer the API server gave with a non-2xx status (its Status object's message when it sent one). */
export class KubeApiError extends SwitchyardError {
  readonly status: number;
  readonly reason: string;
  constructor(status: number, reason: string, message: string) {
    super(message, { code: 'SWY_ERR_KUBE_API' });
    this.name = 'KubeApiError';
    this.status = status;
    this.reason = reason;
  }
}

/** How a watch request ended. */
export type WatchEnd =
  | { kind: 'closed'; events: number } // the server ended the response (timeoutSeconds, or it closed)
  | { kind: 'gone'; events: number } // 410: the resourceVersion is too old, relist
  | { kind: 'error'; events: number; error: Error }; // the stream broke, or an ERROR event other than 410

const NAMESPACE_FILE = '/var/run/secrets/kubernetes.io/serviceaccount/namespace';

/** The subset of client-node's KubeConfig we call. */
interface KubeConfigLike {
  loadFromFile(file: string): void;
  loadFromCluster(): void;
  loadFromDefault(): void;
  getCurrentCluster(): { server: string } | null;
  getContextObject(name: string): { namespace?: string } | null;
  getCurrentContext(): string;
  applyToHTTPSOptions(opts: { headers?: Record<string, unknown>; agent?: unknown; auth?: string }): Promise<void>;
}

export class KubeApi {
  readonly server: URL;
  /** The namespace the kubeconfig (or the in-cluster service account) implies. */
  readonly defaultNamespace: string;
  readonly #kc: KubeConfigLike;

  private constructor(kc: KubeConfigLike, server: URL, ns: string) {
    this.#kc = kc;
    this.server = server;
    this.defaultNamespace = ns;
  }

  /**
   * Loads a kubeconfig file, else the in-cluster service account (when
   * KUBERNETES_SERVICE_HOST is set), else $KUBECONFIG / ~/.kube/config.
   * Throws with the reason when none gives a cluster.
   */
  static async load(kubeconfig?: string): Promise<KubeApi> {
    // loaded only when discovery or the Kubernetes lease is configured
    const { KubeConfig } = await import('@kubernetes/client-node');
    const kc = new KubeConfig() as unknown as KubeConfigLike;
    let ns = '';
    try {
      if (kubeconfig !== undefined) kc.loadFromFile(kubeconfig);
      else if (process.env.KUBERNETES_SERVICE_HOST) {
        kc.loadFromCluster();
        try {
          ns = readFileSync(NAMESPACE_FILE, 'utf8').trim();
        } catch {
          // no namespace file: the context's, else default
        }
      } else kc.loadFromDefault();
    } catch (err) {
      throw new Error(`cannot load the Kubernetes config${kubeconfig ? ` ${kubeconfig}` : ''}: ${(err as Error).message}`);
    }
    const cluster = kc.getCurrentCluster();
    if (cluster === null || !cluster.server) throw new Error(`no Kubernetes cluster in ${kubeconfig ?? 'the default kubeconfig'} (not running in a cluster either)`);
    let server: URL;
    try {
      server = new URL(cluster.server);
    } catch {
      throw new Error(`the kubeconfig's cluster server is not a URL: ${JSON.stringify(cluster.server)}`);
    }
    if (ns === '') ns = kc.getContextObject(kc.getCurrentContext())?.namespace ?? 'default';
    return new KubeApi(kc, server, ns);
  }

  /** GET a JSON object or list. */
  get<T>(path: string, query: Record<string, string | number | boolean | undefined> = {}): Promise<T> {
    return this.#json<T>('GET', path, query);
  }

  put<T>(path: string, body: unknown): Promise<T> {
    return this.#json<T>('PUT', path, {}, body);
  }

  post<T>(path: string, body: unknown): Promise<T> {
    return this.#json<T>('POST', path, {}, body);
  }

  /**
   * Opens a watch (`?watch=1`) on a collection and calls `onEvent` for each
   * complete line; resolves when the stream ends (never rejects). `signal`
   * aborts it (resolves as closed).
   */
  async watch(path: string, query: Record<string, string | number | boolean | undefined>, onEvent: (ev: WatchEvent) => void, signal: AbortSignal): Promise<WatchEnd> {
    let req: http.ClientRequest;
    try {
      req = await this.#request('GET', path, { ...query, watch: 1 });
    } catch (err) {
      return { kind: 'error', events: 0, error: err as Error };
    }
    let events = 0;
    return new Promise<WatchEnd>((resolve) => {
      let settled = false;
      const finish = (end: WatchEnd) => {
        if (settled) return;
        settled = true;
        signal.removeEventListener('abort', onAbort);
        req.destroy();
        resolve(end);
      };
      const onAbort = () => finish({ kind: 'closed', events });
      if (signal.aborted) return onAbort();
      signal.addEventListener('abort', onAbort, { once: true });
      req.on('error', (err) => finish(signal.aborted ? { kind: 'closed', events } : { kind: 'error', events, error: err }));
      // a connection that went silent (a dead peer without a FIN): the server would have ended the watch by now
      const idle = typeof query.timeoutSeconds === 'number' ? query.timeoutSeconds * 1100 + 2000 : 0;
      if (idle > 0) req.setTimeout(idle, () => finish({ kind: 'error', events, error: new Error(`the watch was silent for ${(idle / 1000).toFixed(1)} s`) }));
      req.on('response', (res) => {
        if (res.statusCode !== 200) {
          readBody(res).then(
            (text) => {
              const e = apiError(res.statusCode ?? 0, text);
              finish(e.status === 410 ? { kind: 'gone', events } : { kind: 'error', events, error: e });
            },
            (err: Error) => finish({ kind: 'error', events, error: err }),
          );
          return;
        }
        res.setEncoding('utf8');
        let buf = '';
        res.on('data', (chunk: string) => {
          buf += chunk;
          let nl: number;
          while ((nl = buf.indexOf('\n')) >= 0) {
            const line = buf.slice(0, nl).trim();
            buf = buf.slice(nl + 1);
            if (line === '') continue;
            let ev: WatchEvent;
            try {
              ev = JSON.parse(line) as WatchEvent;
            } catch {
              finish({ kind: 'error', events, error: new Error(`malformed watch event: ${line.slice(0, 120)}`) });
              return;
            }
            if (ev === null || typeof ev !== 'object' || typeof ev.type !== 'string' || ev.object === null || typeof ev.object !== 'object') {
              finish({ kind: 'error', events, error: new Error(`malformed watch event: ${line.slice(0, 120)}`) });
              return;
            }
            if (ev.type === 'ERROR') {
              const code = typeof ev.object.code === 'number' ? ev.object.code : 0;
              finish(code === 410 ? { kind: 'gone', events } : { kind: 'error', events, error: new KubeApiError(code, String(ev.object.reason ?? ''), `watch ERROR event: ${String(ev.object.message ?? code)}`) });
              return;
            }
            events++;
            try {
              onEvent(ev);
            } catch (err) {
              finish({ kind: 'error', events, error: err as Error });
              return;
            }
          }
        });
        // a partial line left in buf when the stream breaks is dropped: the resumed watch replays from the last whole event
        res.on('aborted', () => finish({ kind: 'error', events, error: new Error('the watch stream broke' + (buf.length > 0 ? ' mid-event' : '')) }));
        res.on('error', (err) => finish({ kind: 'error', events, error: err }));
        res.on('end', () => finish(buf.trim() !== '' ? { kind: 'error', events, error: new Error('the watch stream ended mid-event') } : { kind: 'closed', events }));
        res.on('close', () => finish(res.complete ? { kind: 'closed', events } : { kind: 'error', events, error: new Error('the watch stream broke' + (buf.length > 0 ? ' mid-event' : '')) }));
      });
      req.end();
    });
  }

  async #json<T>(method: string, path: string, query: Record<string, string | number | boolean | undefined>, body?: unknown): Promise<T> {
    const req = await this.#request(method, path, query, body === undefined ? undefined : 'application/json');
    return new Promise<T>((resolve, reject) => {
      req.setTimeout(30_000, () => req.destroy(new Error(`${method} ${path}: no answer in 30 s`)));
      req.on('error', reject);
      req.on('response', (res) => {
        readBody(res).then((text) => {
          const status = res.statusCode ?? 0;
          if (status < 200 || status >= 300) return reject(apiError(status, text));
          try {
            resolve(JSON.parse(text) as T);
          } catch {
            reject(new Error(`${method} ${path}: the API server's answer is not JSON`));
          }
        }, reject);
      });
      req.end(body === undefined ? undefined : JSON.stringify(body));
    });
  }

  async #request(method: string, path: string, query: Record<string, string | number | boolean | undefined>, contentType?: string): Promise<http.ClientRequest> {
    const opts: { headers?: Record<string, unknown>; agent?: unknown; auth?: string } = { headers: {} };
    await this.#kc.applyToHTTPSOptions(opts); // re-read per request: a service-account token rotates
    const url = new URL(this.server.pathname.replace(/\/$/, '') + path, this.server);
    for (const [k, v] of Object.entries(query)) if (v !== undefined) url.searchParams.set(k, String(v));
    const headers: Record<string, string> = { accept: 'application/json' };
    for (const [k, v] of Object.entries(opts.headers ?? {})) if (typeof v === 'string') headers[k] = v;
    if (opts.auth) headers.authorization = `Basic ${Buffer.from(opts.auth).toString('base64')}`;
    if (contentType) headers['content-type'] = contentType;
    const mod = url.protocol === 'http:' ? http : https;
    return mod.request(url, { method, headers, agent: opts.agent as http.Agent | undefined });
  }
}

function readBody(res: http.IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    let text = '';
    res.setEncoding('utf8');
    res.on('data', (c: string) => {
      if (text.length < 1 << 24) text += c;
    });
    res.on('end', () => resolve(text));
    res.on('error', reject);
  });
}

function apiError(status: number, text: string): KubeApiError {
  try {
    const s = JSON.parse(text) as { reason?: string; message?: string };
    return new KubeApiError(status, s.reason ?? '', `HTTP ${status}: ${s.message ?? text.slice(0, 200)}`);
  } catch {
    return new KubeApiError(status, '', `HTTP ${status}: ${text.slice(0, 200)}`);
  }
}
