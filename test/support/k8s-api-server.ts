// A local HTTP server that speaks the part of the Kubernetes API that
// Switchyard's discovery and Lease use, for tests (no cluster runs here): list
// and watch of pods and InferencePools (namespaced, label and field selectors,
// resourceVersion, chunked JSON-lines watch streams, BOOKMARK events, an
// ERROR 410 Gone for a compacted resourceVersion, a stream cut mid-event),
// and coordination.k8s.io/v1 Leases with optimistic concurrency (a PUT whose
// metadata.resourceVersion is not the current one gets 409 Conflict).
// Behaviour follows https://kubernetes.io/docs/reference/using-api/api-concepts/.
import http from 'node:http';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { AddressInfo } from 'node:net';

type Obj = { apiVersion?: string; kind?: string; metadata: { name: string; namespace?: string; resourceVersion?: string; labels?: Record<string, string>; [k: string]: unknown }; [k: string]: unknown };
type Kind = 'pods' | 'inferencepools' | 'leases';
interface Change {
  rv: number;
  kind: Kind;
  ns: string;
  type: 'ADDED' | 'MODIFIED' | 'DELETED';
  obj: Obj;
  prev: Obj | null;
}
interface Watcher {
  kind: Kind;
  ns: string;
  label: ((l: Record<string, string>) => boolean) | null;
  field: ((o: Obj) => boolean) | null;
  bookmarks: boolean;
  res: http.ServerResponse;
}

const KIND_INFO: Record<Kind, { apiVersion: string; kind: string }> = {
  pods: { apiVersion: 'v1', kind: 'Pod' },
  inferencepools: { apiVersion: 'inference.networking.k8s.io/v1', kind: 'InferencePool' },
  leases: { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease' },
};

/** Equality-based selectors (k=v, k==v, k!=v), existence (k, !k). */
export function parseLabelSelector(s: string): (l: Record<string, string>) => boolean {
  const terms = s
    .split(',')
    .map((x) => x.trim())
    .filter((x) => x !== '')
    .map((x) => {
      let m: RegExpMatchArray | null;
      if ((m = x.match(/^([^!=]+)!=(.*)$/))) return (l: Record<string, string>) => l[m![1]!.trim()] !== m![2]!.trim();
      if ((m = x.match(/^([^!=]+)==?(.*)$/))) return (l: Record<string, string>) => l[m![1]!.trim()] === m![2]!.trim();
      if ((m = x.match(/^!(.+)$/))) return (l: Record<string, string>) => !(m![1]!.trim() in l);
      return (l: Record<string, string>) => x in l;
    });
  return (l) => terms.every((f) => f(l));
}

function parseFieldSelector(s: string): (o: Obj) => boolean {
  const terms = s.split(',').map((x) => x.split('='));
  return (o) => terms.every(([k, v]) => (k === 'metadata.name' ? o.metadata.name === v : k === 'metadata.namespace' ? o.metadata.namespace === v : true));
}

const status = (code: number, reason: string, message: string) => ({ kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, code });

export class KubeApiServer {
  readonly server: http.Server;
  url = '';
  token = 'test-token';
  #rv = 100;
  /** Watches from a resourceVersion below this get 410 Gone. */
  #compacted = 0;
  readonly #store: Record<Kind, Map<string, Obj>> = { pods: new Map(), inferencepools: new Map(), leases: new Map() };
  readonly #history: Change[] = [];
  readonly #watchers = new Set<Watcher>();
  #cutNext = false;
  readonly requests: string[] = [];
  readonly counts = { lists: 0, watches: 0, gone: 0, cuts: 0, conflicts: 0 };
  /** The next n list requests get this status (an API server in trouble). */
  failLists = 0;
  failStatus = 500;
  /** Watches never end by timeoutSeconds and stay silent (a peer that died without a FIN looks the same). */
  ignoreWatchTimeout = false;
  /** Runs once before the next lease PUT is judged (a write that lands between a client's read and its write). */
  beforeLeasePut: (() => void) | null = null;

  constructor() {
    this.server = http.createServer((req, res) => this.#handle(req, res));
  }

  async listen(): Promise<this> {
    await new Promise<void>((r) => this.server.listen(0, '127.0.0.1', r));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
    return this;
  }

  async close(): Promise<void> {
    for (const w of this.#watchers) w.res.destroy();
    this.#watchers.clear();
    this.server.closeAllConnections();
    await new Promise<void>((r) => this.server.close(() => r()));
  }

  /** Writes a kubeconfig pointing at this server (plain http needs insecure-skip-tls-verify in client-node). */
  async kubeconfig(dir: string, namespace = 'llm'): Promise<string> {
    const file = join(dir, 'kubeconfig.yaml');
    await writeFile(
      file,
      [
        'apiVersion: v1',
        'kind: Config',
        'clusters:',
        `- name: local`,
        `  cluster: { server: "${this.url}", insecure-skip-tls-verify: true }`,
        'users:',
        `- name: tester`,
        `  user: { token: ${this.token} }`,
        'contexts:',
        `- name: local`,
        `  context: { cluster: local, user: tester, namespace: ${namespace} }`,
        'current-context: local',
        '',
      ].join('\n'),
    );
    return file;
  }

  get resourceVersion(): number {
    return this.#rv;
  }

  get openWatches(): number {
    return this.#watchers.size;
  }

  get(kind: Kind, ns: string, name: string): Obj | undefined {
    return this.#store[kind].get(`${ns}/${name}`);
  }

  /** Creates or replaces an object (a new resourceVersion; watchers get ADDED or MODIFIED). */
  apply(kind: Kind, ns: string, obj: Obj): Obj {
    const key = `${ns}/${obj.metadata.name}`;
    const prev = this.#store[kind].get(key) ?? null;
    const next: Obj = { ...KIND_INFO[kind], ...structuredClone(obj), metadata: { ...structuredClone(obj.metadata), namespace: ns, resourceVersion: String(++this.#rv) } };
    this.#store[kind].set(key, next);
    this.#emit({ rv: this.#rv, kind, ns, type: prev ? 'MODIFIED' : 'ADDED', obj: next, prev });
    return next;
  }

  delete(kind: Kind, ns: string, name: string): void {
    const key = `${ns}/${name}`;
    const prev = this.#store[kind].get(key);
    if (!prev) return;
    this.#store[kind].delete(key);
    const gone: Obj = { ...prev, metadata: { ...prev.metadata, resourceVersion: String(++this.#rv) } };
    this.#emit({ rv: this.#rv, kind, ns, type: 'DELETED', obj: gone, prev });
  }

  /** Sends a BOOKMARK with the current resourceVersion to every watch that asked for bookmarks. */
  bookmark(): void {
    for (const w of this.#watchers) {
      if (!w.bookmarks) continue;
      w.res.write(JSON.stringify({ type: 'BOOKMARK', object: { ...KIND_INFO[w.kind], metadata: { resourceVersion: String(this.#rv) } } }) + '\n');
    }
  }

  /**
   * Compacts history: every resourceVersion so far is too old to watch from.
   * Open watches get an ERROR event with 410 Gone and end (as etcd compaction does).
   */
  compact(): void {
    this.#compacted = this.#rv; // a list now returns this version, which stays watchable
    this.#history.length = 0;
    for (const w of [...this.#watchers]) {
      w.res.end(JSON.stringify({ type: 'ERROR', object: status(410, 'Expired', 'too old resource version') }) + '\n');
      this.#watchers.delete(w);
    }
  }

  /** The next event is written half to every open watch, whose connection is then destroyed. */
  cutNextEvent(): void {
    this.#cutNext = true;
  }

  /** Ends every open watch cleanly (as the server does at timeoutSeconds). */
  endWatches(): void {
    for (const w of this.#watchers) w.res.end();
    this.#watchers.clear();
  }

  #emit(c: Change): void {
    this.#history.push(c);
    const cut = this.#cutNext;
    this.#cutNext = false;
    for (const w of [...this.#watchers]) {
      const line = this.#lineFor(w, c);
      if (line === null) continue;
      if (cut) {
        this.counts.cuts++;
        w.res.write(line.slice(0, Math.floor(line.length / 2)));
        this.#watchers.delete(w);
        // let the half line reach the client before the connection goes
        setTimeout(() => w.res.socket?.destroy(), 20);
        continue;
      }
      w.res.write(line + '\n');
    }
  }

  #lineFor(w: Watcher, c: Change): string | null {
    if (w.kind !== c.kind || w.ns !== c.ns) return null;
    const matches = (o: Obj | null) => o !== null && (w.label === null || w.label(o.metadata.labels ?? {})) && (w.field === null || w.field(o));
    let type: string | null = null;
    if (c.type === 'ADDED') type = matches(c.obj) ? 'ADDED' : null;
    else if (c.type === 'DELETED') type = matches(c.prev) ? 'DELETED' : null;
    else {
      const was = matches(c.prev);
      const is = matches(c.obj);
      type = was && is ? 'MODIFIED' : is ? 'ADDED' : was ? 'DELETED' : null;
    }
    return type === null ? null : JSON.stringify({ type, object: c.obj });
  }

  #handle(req: http.IncomingMessage, res: http.ServerResponse): void {
    const u = new URL(req.url ?? '/', 'http://x');
    this.requests.push(`${req.method} ${u.pathname}${u.search}`);
    const send = (code: number, body: unknown) => {
      res.writeHead(code, { 'content-type': 'application/json' });
      res.end(JSON.stringify(body));
    };
    if (req.headers.authorization !== `Bearer ${this.token}`) return send(401, status(401, 'Unauthorized', 'Unauthorized'));
    let m = u.pathname.match(/^\/api\/v1\/namespaces\/([^/]+)\/pods$/);
    let kind: Kind | null = m ? 'pods' : null;
    if (!m && (m = u.pathname.match(/^\/apis\/inference\.networking\.k8s\.io\/v1\/namespaces\/([^/]+)\/inferencepools$/))) kind = 'inferencepools';
    if (m && kind && req.method === 'GET') return this.#listOrWatch(kind, m[1]!, u, res, send);
    m = u.pathname.match(/^\/apis\/coordination\.k8s\.io\/v1\/namespaces\/([^/]+)\/leases(?:\/([^/]+))?$/);
    if (m) return this.#lease(req, m[1]!, m[2], send);
    send(404, status(404, 'NotFound', `no route ${u.pathname}`));
  }

  #listOrWatch(kind: Kind, ns: string, u: URL, res: http.ServerResponse, send: (code: number, body: unknown) => void): void {
    const ls = u.searchParams.get('labelSelector');
    const fs = u.searchParams.get('fieldSelector');
    const label = ls ? parseLabelSelector(ls) : null;
    const field = fs ? parseFieldSelector(fs) : null;
    const watch = u.searchParams.get('watch');
    if (watch !== '1' && watch !== 'true') {
      this.counts.lists++;
      if (this.failLists > 0) {
        this.failLists--;
        return send(this.failStatus, status(this.failStatus, 'InternalError', 'the test server refused this list'));
      }
      const items = [...this.#store[kind].entries()]
        .filter(([k, o]) => k.startsWith(`${ns}/`) && (label === null || label(o.metadata.labels ?? {})) && (field === null || field(o)))
        .map(([, o]) => o);
      return send(200, { apiVersion: KIND_INFO[kind].apiVersion, kind: `${KIND_INFO[kind].kind}List`, metadata: { resourceVersion: String(this.#rv) }, items });
    }
    this.counts.watches++;
    const from = Number(u.searchParams.get('resourceVersion') ?? this.#rv);
    res.writeHead(200, { 'content-type': 'application/json', 'transfer-encoding': 'chunked' });
    res.flushHeaders();
    if (from < this.#compacted) {
      this.counts.gone++;
      res.end(JSON.stringify({ type: 'ERROR', object: status(410, 'Expired', `too old resource version: ${from} (${this.#compacted})`) }) + '\n');
      return;
    }
    const w: Watcher = { kind, ns, label, field, bookmarks: u.searchParams.get('allowWatchBookmarks') === 'true', res };
    for (const c of this.#history) {
      if (c.rv <= from) continue;
      const line = this.#lineFor(w, c);
      if (line !== null) res.write(line + '\n');
    }
    this.#watchers.add(w);
    const timeout = this.ignoreWatchTimeout ? 0 : Number(u.searchParams.get('timeoutSeconds') ?? 0);
    const timer = timeout > 0 ? setTimeout(() => {
      this.#watchers.delete(w);
      res.end();
    }, timeout * 1000) : null;
    res.on('close', () => {
      if (timer) clearTimeout(timer);
      this.#watchers.delete(w);
    });
  }

  #lease(req: http.IncomingMessage, ns: string, name: string | undefined, send: (code: number, body: unknown) => void): void {
    let text = '';
    req.setEncoding('utf8');
    req.on('data', (c: string) => (text += c));
    req.on('end', () => {
      const key = (n: string) => `${ns}/${n}`;
      if (req.method === 'GET' && name) {
        const o = this.#store.leases.get(key(name));
        return o ? send(200, o) : send(404, status(404, 'NotFound', `leases.coordination.k8s.io "${name}" not found`));
      }
      let body: Obj;
      try {
        body = JSON.parse(text) as Obj;
      } catch {
        return send(400, status(400, 'BadRequest', 'not JSON'));
      }
      if (req.method === 'POST' && !name) {
        if (this.#store.leases.has(key(body.metadata.name))) {
          this.counts.conflicts++;
          return send(409, status(409, 'AlreadyExists', `leases.coordination.k8s.io "${body.metadata.name}" already exists`));
        }
        return send(201, this.apply('leases', ns, body));
      }
      if (req.method === 'PUT' && name) {
        const hook = this.beforeLeasePut;
        this.beforeLeasePut = null;
        hook?.();
        const cur = this.#store.leases.get(key(name));
        if (!cur) return send(404, status(404, 'NotFound', `leases.coordination.k8s.io "${name}" not found`));
        if (body.metadata.resourceVersion !== cur.metadata.resourceVersion) {
          this.counts.conflicts++;
          return send(409, status(409, 'Conflict', `Operation cannot be fulfilled on leases.coordination.k8s.io "${name}": the object has been modified; please apply your changes to the latest version and try again`));
        }
        return send(200, this.apply('leases', ns, body));
      }
      send(405, status(405, 'MethodNotAllowed', `${req.method} not allowed`));
    });
  }
}

/** A pod as the kubelet reports it: IP 127.0.0.1 (tests), its port in the switchyard.io/port annotation. */
export function pod(name: string, port: number, o: { ready?: boolean; labels?: Record<string, string>; terminating?: boolean; ip?: string } = {}): Obj {
  const ready = o.ready ?? true;
  return {
    metadata: {
      name,
      labels: o.labels ?? { app: 'vllm' },
      annotations: { 'switchyard.io/port': String(port) },
      ...(o.terminating ? { deletionTimestamp: new Date().toISOString() } : {}),
    },
    spec: { containers: [{ name: 'engine', image: 'vllm' }] },
    status: {
      phase: 'Running',
      podIP: o.ip ?? '127.0.0.1',
      conditions: [
        { type: 'PodScheduled', status: 'True' },
        { type: 'Ready', status: ready ? 'True' : 'False' },
      ],
    },
  };
}

export function inferencePool(name: string, matchLabels: Record<string, string>, ports: number[] = [8000]): Obj {
  return {
    metadata: { name },
    spec: { selector: { matchLabels }, targetPorts: ports.map((number) => ({ number })), endpointPickerRef: { name: 'switchyard', port: { number: 9002 } } },
  };
}
