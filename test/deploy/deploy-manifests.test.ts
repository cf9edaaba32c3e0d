// deploy/kubernetes: no cluster runs here, so the manifests are rendered
// (`kubectl kustomize` when kubectl is installed, else the base's files read
// as listed) and checked: what PodSecurity "restricted" admission demands
// (non-root, no privilege escalation, capabilities dropped, seccomp
// RuntimeDefault), probes with sane periods and timeouts, resources,
// --watch-config, a drain that fits in the termination grace, scrape
// annotations and the ServiceMonitor, Redis with a password from a Secret that
// matches the router's URL, an image with a version tag, the InferencePool
// optional (a component); and the wiring: known apiVersion/kind pairs,
// selectors that match pod labels, named ports, the RBAC chain, the config
// Secret mounted where the container reads it, valid under switchyard/v1.
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { parse, parseAllDocuments } from 'yaml';
import { validateConfig, type RouterConfig } from '../../src/config/schema.js';
import { VERSION } from '../../src/version.js';
import { validatePlugin } from '../support/router-util.js';

const ROOT = fileURLToPath(new URL('../../deploy/kubernetes/', import.meta.url));

/** apiVersion → kinds it serves (the resources these manifests may use). */
const KNOWN: Record<string, string[]> = {
  v1: ['Secret', 'Service', 'ServiceAccount'],
  'apps/v1': ['Deployment'],
  'policy/v1': ['PodDisruptionBudget'],
  'rbac.authorization.k8s.io/v1': ['Role', 'RoleBinding'],
  'inference.networking.k8s.io/v1': ['InferencePool'],
  'monitoring.coreos.com/v1': ['ServiceMonitor'],
};

type Obj = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

const hasKubectl = spawnSync('kubectl', ['version', '--client'], { encoding: 'utf8' }).status === 0;

/** The objects `kubectl kustomize <dir>` renders; without kubectl, the listed files of a plain kustomization (no components). */
function render(dir: string): Obj[] {
  let text: string;
  if (hasKubectl) {
    const r = spawnSync('kubectl', ['kustomize', join(ROOT, dir)], { encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`kubectl kustomize ${dir}: ${r.stderr}`);
    text = r.stdout;
  } else {
    const k = parse(readFileSync(join(ROOT, dir, 'kustomization.yaml'), 'utf8')) as Obj;
    if (k.components) throw new Error('components need kubectl');
    text = (k.resources as string[]).map((f) => (f.endsWith('.yaml') ? readFileSync(join(ROOT, dir, f), 'utf8') : render(join(dir, f)).map((o) => JSON.stringify(o)).join('\n---\n'))).join('\n---\n');
  }
  return parseAllDocuments(text).map((d) => {
    if (d.errors.length > 0) throw new Error(`${dir}: ${d.errors[0]!.message}`);
    return d.toJS() as Obj;
  }).filter((o) => o !== null);
}

const base = render('.');
const byKind = (objs: Obj[], kind: string) => objs.filter((d) => d.kind === kind);
const one = (objs: Obj[], kind: string, name: string) => byKind(objs, kind).find((d) => d.metadata?.name === name);
const matches = (selector: Record<string, string>, labels: Record<string, string>) => Object.entries(selector).every(([k, v]) => labels?.[k] === v);
const router = () => one(base, 'Deployment', 'switchyard')!;
const routerConfig = (objs: Obj[]): RouterConfig => {
  const s = one(objs, 'Secret', 'switchyard-config')!;
  return validateConfig(parse(s.stringData['router.yaml']), validatePlugin, 'router.yaml');
};

t.test('rendered with kubectl kustomize (the CI images have kubectl)', { skip: hasKubectl ? false : 'kubectl not installed: the files are read as listed' }, async (t) => {
  t.ok(base.length >= 10, `${base.length} objects`);
});

t.test('every object has a known apiVersion/kind and a DNS-1123 name; the base needs no CRD', async (t) => {
  for (const doc of base) {
    t.ok(KNOWN[doc.apiVersion]?.includes(doc.kind), `${doc.apiVersion} ${doc.kind} is known`);
    t.match(doc.metadata?.name, /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/, `${doc.kind} name`);
    t.notOk(['inference.networking.k8s.io/v1', 'monitoring.coreos.com/v1'].includes(doc.apiVersion), `the base has no ${doc.kind} (a CRD): optional, as a component`);
  }
});

t.test('PodSecurity "restricted": every pod runs as non-root, no privilege escalation, capabilities dropped, seccomp RuntimeDefault, read-only root', async (t) => {
  for (const dep of byKind(base, 'Deployment')) {
    const pod = dep.spec.template.spec;
    const name = dep.metadata.name;
    t.equal(pod.securityContext?.runAsNonRoot, true, `${name}: runAsNonRoot`);
    t.ok(Number.isInteger(pod.securityContext?.runAsUser) && pod.securityContext.runAsUser > 0, `${name}: a numeric non-root runAsUser (the kubelet cannot check a user name)`);
    t.equal(pod.securityContext?.seccompProfile?.type, 'RuntimeDefault', `${name}: seccomp RuntimeDefault`);
    for (const c of pod.containers) {
      const sc = c.securityContext ?? {};
      t.equal(sc.allowPrivilegeEscalation, false, `${name}/${c.name}: allowPrivilegeEscalation false`);
      t.same(sc.capabilities?.drop, ['ALL'], `${name}/${c.name}: drops ALL capabilities`);
      t.notOk(sc.capabilities?.add?.length, `${name}/${c.name}: adds none`);
      t.notOk(sc.privileged, `${name}/${c.name}: not privileged`);
      t.equal(sc.readOnlyRootFilesystem, true, `${name}/${c.name}: read-only root filesystem`);
      t.ok(c.resources?.requests?.cpu && c.resources?.requests?.memory && c.resources?.limits?.memory, `${name}/${c.name}: cpu/memory requests and a memory limit`);
      t.ok(c.readinessProbe && c.livenessProbe, `${name}/${c.name}: readiness and liveness probes`);
      for (const p of [c.readinessProbe, c.livenessProbe, c.startupProbe].filter(Boolean)) t.ok((p.timeoutSeconds ?? 1) >= 2, `${name}/${c.name}: probe timeout ≥ 2 s`);
      t.notMatch(c.image, /:latest$|^[^:]+$/, `${name}/${c.name}: a pinned image tag (${c.image})`);
    }
    for (const v of pod.volumes ?? []) t.notOk(v.hostPath, `${name}: no hostPath volume`);
  }
});

t.test('the router: probes that survive a GC pause, --watch-config, the drain inside the termination grace, scrape annotations, a versioned image', async (t) => {
  const dep = router();
  t.equal(dep.spec.replicas, 2, 'two active-active replicas');
  const cfgHa = routerConfig(base).ha!;
  t.equal(cfgHa.mode, 'active-active', 'ha: every replica serves (Ready), so the rolling update below never waits on a never-Ready standby');
  t.equal(routerConfig(base).sessions.store === 'memory' ? '' : (routerConfig(base).sessions.store as { url: string }).url, cfgHa.redis, 'session pins shared through the same Redis');
  const ru = dep.spec.strategy.rollingUpdate;
  t.equal(dep.spec.strategy.type, 'RollingUpdate');
  t.equal(ru.maxUnavailable, 0, 'maxUnavailable 0: an old pod goes only once a new one is Ready');
  t.ok(ru.maxSurge >= 1, `maxSurge ${ru.maxSurge}: the new pod comes first`);
  const pod = dep.spec.template;
  t.ok(matches(dep.spec.selector.matchLabels, pod.metadata.labels), 'selector matches the pod template labels');
  const c = pod.spec.containers[0];
  t.equal(c.image, `registry.example.com/switchyard:${VERSION}`, 'the kustomization pins the image to the package version (set newName to your registry)');
  const r = c.readinessProbe;
  t.equal(r.httpGet.path, '/readyz', 'readiness: can route, not draining');
  t.ok(r.periodSeconds >= 2 && r.failureThreshold >= 3 && r.timeoutSeconds >= 2, `readiness: period ${r.periodSeconds} s × ${r.failureThreshold} misses, timeout ${r.timeoutSeconds} s (one slow answer does not take the router out)`);
  t.equal(c.livenessProbe.httpGet.path, '/healthz');
  t.ok(c.livenessProbe.periodSeconds * c.livenessProbe.failureThreshold >= 20, 'liveness tolerates 20 s of trouble before a restart');
  t.equal(c.startupProbe?.httpGet.path, '/healthz', 'a startup probe covers the first health round');
  const portNames = new Set(c.ports.map((p: Obj) => p.name));
  for (const p of [r, c.livenessProbe, c.startupProbe]) t.ok(portNames.has(p.httpGet.port), 'probes use named container ports');
  t.ok(c.args.includes('--watch-config'), '--watch-config: a config edit applies without a restart');
  const cfgArg = c.args[c.args.indexOf('--config') + 1] as string;
  const mount = c.volumeMounts.find((m: Obj) => cfgArg.startsWith(m.mountPath + '/'));
  t.ok(mount, `--config ${cfgArg} lies in a mounted volume`);
  const vol = pod.spec.volumes.find((v: Obj) => v.name === mount.name);
  const secret = one(base, 'Secret', vol.secret?.secretName);
  t.ok(secret, `the volume's Secret ${vol.secret?.secretName} exists`);
  t.ok(secret!.stringData[cfgArg.slice(mount.mountPath.length + 1)], 'and holds the file --config names');
  t.ok(c.volumeMounts.some((m: Obj) => m.mountPath === '/tmp'), 'a writable /tmp beside the read-only root');
  const cfg = routerConfig(base);
  const drainMs = cfg.shutdown.drainDelayMs + cfg.shutdown.graceMs;
  t.ok(cfg.shutdown.drainDelayMs >= 2000, `shutdown.drainDelayMs ${cfg.shutdown.drainDelayMs}: the Service drops the pod before it stops accepting`);
  t.ok(pod.spec.terminationGracePeriodSeconds * 1000 > drainMs, `terminationGracePeriodSeconds ${pod.spec.terminationGracePeriodSeconds} s > drain ${drainMs} ms: no SIGKILL mid-drain`);
  const ann = pod.metadata.annotations ?? {};
  t.equal(ann['prometheus.io/scrape'], 'true');
  t.equal(Number(ann['prometheus.io/port']), cfg.listen.port, 'scrape port = listen.port');
  t.equal(ann['prometheus.io/path'], '/metrics');
  t.ok(one(base, 'ServiceAccount', pod.spec.serviceAccountName), 'its service account exists');
  const http = c.ports.find((p: Obj) => p.name === 'http');
  const grpc = c.ports.find((p: Obj) => p.name === 'grpc-ext-proc');
  t.equal(http.containerPort, cfg.listen.port, 'http port = listen.port');
  t.equal(grpc.containerPort, cfg.extProc?.port, 'grpc port = extProc.port');
  t.equal(cfg.listen.host, '0.0.0.0', 'listens on all interfaces in the pod');
});

t.test('Redis: a password from a Secret, the same one in the router config, resources', async (t) => {
  const cfg = routerConfig(base);
  const u = new URL(cfg.ha!.redis!);
  t.ok(one(base, 'Service', u.hostname), `ha.redis names the Service ${u.hostname}`);
  const dep = one(base, 'Deployment', 'switchyard-redis')!;
  const c = dep.spec.template.spec.containers[0];
  t.ok(c.args.includes('--requirepass'), 'Redis requires a password');
  const arg = c.args[c.args.indexOf('--requirepass') + 1] as string;
  const env = c.env.find((e: Obj) => `$(${e.name})` === arg);
  t.ok(env?.valueFrom?.secretKeyRef, 'the password comes from a Secret');
  const s = one(base, 'Secret', env.valueFrom.secretKeyRef.name)!;
  t.ok(s, 'which exists');
  t.equal(decodeURIComponent(u.password), s.stringData[env.valueFrom.secretKeyRef.key], "the router's ha.redis URL carries that password");
  t.notOk(byKind(base, 'ConfigMap').some((cm) => JSON.stringify(cm).includes(u.password)), 'no password in a ConfigMap');
});

t.test('Services select pods that exist and target named ports', async (t) => {
  const objs = render('overlays/full');
  for (const svc of byKind(objs, 'Service')) {
    const dep = byKind(objs, 'Deployment').find((d) => matches(svc.spec.selector, d.spec.template.metadata.labels));
    t.ok(dep, `Service ${svc.metadata.name} selects Deployment ${dep?.metadata.name}`);
    const names = new Set(dep!.spec.template.spec.containers.flatMap((c: Obj) => c.ports.map((p: Obj) => p.name)));
    for (const p of svc.spec.ports) t.ok(names.has(p.targetPort), `${svc.metadata.name}:${p.port} → ${p.targetPort}`);
  }
});

t.test('RBAC: pods, InferencePools and Leases, bound to the service account', async (t) => {
  const role = one(base, 'Role', 'switchyard')!;
  const rule = (group: string, resource: string) => role.rules.find((r: Obj) => r.apiGroups.includes(group) && r.resources.includes(resource));
  t.ok(rule('', 'pods')?.verbs.includes('watch'), 'pods: watch');
  t.ok(rule('inference.networking.k8s.io', 'inferencepools')?.verbs.includes('list'), 'inferencepools: list');
  const leases = rule('coordination.k8s.io', 'leases');
  t.ok(leases && ['get', 'create', 'update'].every((v) => leases.verbs.includes(v)), 'leases: get/create/update');
  const rb = one(base, 'RoleBinding', 'switchyard')!;
  t.equal(rb.roleRef.kind, 'Role');
  t.ok(one(base, 'Role', rb.roleRef.name));
  for (const s of rb.subjects) t.ok(one(base, s.kind, s.name), `subject ${s.kind}/${s.name} exists`);
});

t.test('components: the InferencePool over the pods the config discovers, the endpoint picker on the router Service; the ServiceMonitor scrapes every router pod', { skip: hasKubectl ? false : 'components need kubectl' }, async (t) => {
  const objs = render('overlays/full');
  const cfg = routerConfig(objs);
  const discovered = cfg.pools.filter((p) => p.discovery !== undefined);
  t.ok(discovered.length > 0, 'the example config discovers its endpoints');
  const pool = one(objs, 'InferencePool', 'llama')!;
  t.ok(pool, 'the InferencePool component');
  const sel = discovered[0]!.discovery!.kubernetes.labelSelector!;
  const labels = pool.spec.selector.matchLabels as Record<string, string>;
  t.same(labels, typeof sel === 'string' ? Object.fromEntries(sel.split(',').map((kv) => kv.split('='))) : sel, 'the same pods as the config selects');
  const ports = pool.spec.targetPorts as Obj[];
  t.ok(ports.length >= 1 && ports.length <= 8 && ports.every((x) => Number.isInteger(x.number) && x.number >= 1 && x.number <= 65535), 'targetPorts: 1 to 8 ports');
  const ref = pool.spec.endpointPickerRef;
  const svc = one(objs, 'Service', ref.name)!;
  const grpc = svc.spec.ports.find((x: Obj) => x.port === ref.port.number);
  t.equal(grpc?.targetPort, 'grpc-ext-proc', "endpointPickerRef: the router's ext_proc port");
  t.equal(grpc?.port, cfg.extProc?.port);
  const sm = one(objs, 'ServiceMonitor', 'switchyard')!;
  t.ok(sm, 'the ServiceMonitor component');
  const target = byKind(objs, 'Service').find((s) => matches(sm.spec.selector.matchLabels, s.metadata.labels))!;
  t.ok(target, 'selects a Service');
  t.equal(target.spec.publishNotReadyAddresses, true, 'that lists not-Ready pods too (the standby is scraped)');
  t.ok(matches(target.spec.selector, router().spec.template.metadata.labels), 'over the router pods');
  t.equal(sm.spec.endpoints[0].port, 'http');
  t.equal(sm.spec.endpoints[0].path, '/metrics');
});

t.test('PodDisruptionBudget covers the router pods and lets a drain take one at a time', async (t) => {
  const pdb = one(base, 'PodDisruptionBudget', 'switchyard')!;
  t.ok(matches(pdb.spec.selector.matchLabels, router().spec.template.metadata.labels));
  t.equal(pdb.spec.maxUnavailable, 1, 'one router at a time (whatever the replica count)');
  t.notOk('minAvailable' in pdb.spec, 'not minAvailable: with every replica Ready a drain may always take one');
  t.ok(router().spec.replicas > pdb.spec.maxUnavailable, 'a drain never leaves zero routers');
  t.equal(pdb.spec.unhealthyPodEvictionPolicy, 'AlwaysAllow', 'a pod that is not Ready (starting) can be evicted: a drain never waits on it');
});
