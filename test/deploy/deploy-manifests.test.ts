// deploy/kubernetes: no cluster runs here, so every YAML document is parsed
// and the fields that make a standby pair work are checked against each
// other: known apiVersion/kind pairs, selectors that match the pod labels,
// ports that name container ports, probes on /readyz and /healthz, the RBAC
// chain (ServiceAccount ← RoleBinding → Role with pods, InferencePools and
// Leases), the ConfigMap mounted where the container reads its config, and
// that config valid under the switchyard/v1 schema.
import t from 'tap';
import { readFileSync, readdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { parse, parseAllDocuments } from 'yaml';
import { validateConfig } from '../../src/config/schema.js';
import { validatePlugin } from '../support/router-util.js';

const DIR = fileURLToPath(new URL('../../deploy/kubernetes/', import.meta.url));

/** apiVersion → kinds it serves (the resources these manifests may use). */
const KNOWN: Record<string, string[]> = {
  v1: ['ConfigMap', 'Service', 'ServiceAccount'],
  'apps/v1': ['Deployment'],
  'policy/v1': ['PodDisruptionBudget'],
  'rbac.authorization.k8s.io/v1': ['Role', 'RoleBinding'],
  'kustomize.config.k8s.io/v1beta1': ['Kustomization'],
  'inference.networking.k8s.io/v1': ['InferencePool'],
};

type Obj = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

const files = readdirSync(DIR).filter((f) => f.endsWith('.yaml'));
const docs: { file: string; doc: Obj }[] = [];
for (const f of files) {
  for (const d of parseAllDocuments(readFileSync(join(DIR, f), 'utf8'))) {
    if (d.errors.length > 0) throw new Error(`${f}: ${d.errors[0].message}`);
    docs.push({ file: f, doc: d.toJS() as Obj });
  }
}
const byKind = (kind: string) => docs.filter((d) => d.doc.kind === kind).map((d) => d.doc);
const one = (kind: string, name: string) => byKind(kind).find((d) => d.metadata?.name === name);
const matches = (selector: Record<string, string>, labels: Record<string, string>) => Object.entries(selector).every(([k, v]) => labels?.[k] === v);

t.test('every document has a known apiVersion/kind and a DNS-1123 name', async (t) => {
  t.ok(docs.length >= 9, `${docs.length} documents in ${files.join(', ')}`);
  for (const { file, doc } of docs) {
    t.ok(KNOWN[doc.apiVersion]?.includes(doc.kind), `${file}: ${doc.apiVersion} ${doc.kind} is known`);
    if (doc.kind !== 'Kustomization') t.match(doc.metadata?.name, /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/, `${file}: ${doc.kind} name`);
  }
});

t.test('kustomization lists every manifest file', async (t) => {
  const k = byKind('Kustomization')[0];
  t.same([...k.resources].sort(), files.filter((f) => f !== 'kustomization.yaml').sort());
});

t.test('the router Deployment: two replicas, selector matches its pods, image switchyard, probes, config mount', async (t) => {
  const dep = one('Deployment', 'switchyard')!;
  t.ok(dep);
  t.equal(dep.spec.replicas, 2, 'a standby pair');
  const labels = dep.spec.template.metadata.labels;
  t.ok(matches(dep.spec.selector.matchLabels, labels), 'selector matches the pod template labels');
  const c = dep.spec.template.spec.containers[0];
  t.match(c.image, /^switchyard(:|$)/, 'the image of the repository Dockerfile');
  const portNames = new Set(c.ports.map((p: Obj) => p.name));
  t.equal(c.readinessProbe.httpGet.path, '/readyz', 'readiness follows the lease');
  t.equal(c.livenessProbe.httpGet.path, '/healthz', 'liveness on both');
  t.ok(portNames.has(c.readinessProbe.httpGet.port) && portNames.has(c.livenessProbe.httpGet.port), 'probes use named container ports');
  // the config: args point into the mount, the mount comes from the ConfigMap
  const cfgArg = c.args[c.args.indexOf('--config') + 1] as string;
  const mount = c.volumeMounts.find((m: Obj) => cfgArg.startsWith(m.mountPath + '/'));
  t.ok(mount, `--config ${cfgArg} lies in a mounted volume`);
  const vol = dep.spec.template.spec.volumes.find((v: Obj) => v.name === mount.name);
  const cm = one('ConfigMap', vol.configMap.name);
  t.ok(cm, `the volume's ConfigMap ${vol.configMap.name} exists`);
  t.ok(cm!.data[cfgArg.slice(mount.mountPath.length + 1)], 'and holds the file --config names');
  t.ok(one('ServiceAccount', dep.spec.template.spec.serviceAccountName), 'its service account exists');
  // ports agree with the config the pods load
  const cfg = validateConfig(parse(cm!.data['router.yaml']), validatePlugin, 'router.yaml');
  const http = c.ports.find((p: Obj) => p.name === 'http');
  const grpc = c.ports.find((p: Obj) => p.name === 'grpc-ext-proc');
  t.equal(http.containerPort, cfg.listen.port, 'http port = listen.port');
  t.equal(grpc.containerPort, cfg.extProc?.port, 'grpc port = extProc.port');
  t.equal(cfg.listen.host, '0.0.0.0', 'listens on all interfaces in the pod');
  t.equal(cfg.extProc?.host, '0.0.0.0');
  t.ok(cfg.ha?.redis, 'the pair has a Redis');
  const redisHost = new URL(cfg.ha!.redis).hostname;
  t.ok(one('Service', redisHost), `ha.redis names the Service ${redisHost}`);
});

t.test('Services select pods that exist and target named ports', async (t) => {
  for (const svc of byKind('Service')) {
    const dep = byKind('Deployment').find((d) => matches(svc.spec.selector, d.spec.template.metadata.labels));
    t.ok(dep, `Service ${svc.metadata.name} selects Deployment ${dep?.metadata.name}`);
    const names = new Set(dep!.spec.template.spec.containers.flatMap((c: Obj) => c.ports.map((p: Obj) => p.name)));
    for (const p of svc.spec.ports) t.ok(names.has(p.targetPort), `${svc.metadata.name}:${p.port} → ${p.targetPort}`);
  }
});

t.test('RBAC: pods, InferencePools and Leases, bound to the service account', async (t) => {
  const role = one('Role', 'switchyard')!;
  const rule = (group: string, resource: string) => role.rules.find((r: Obj) => r.apiGroups.includes(group) && r.resources.includes(resource));
  t.ok(rule('', 'pods')?.verbs.includes('watch'), 'pods: watch');
  t.ok(rule('inference.networking.k8s.io', 'inferencepools')?.verbs.includes('list'), 'inferencepools: list');
  const leases = rule('coordination.k8s.io', 'leases');
  t.ok(leases && ['get', 'create', 'update'].every((v) => leases.verbs.includes(v)), 'leases: get/create/update');
  const rb = one('RoleBinding', 'switchyard')!;
  t.equal(rb.roleRef.kind, 'Role');
  t.ok(one('Role', rb.roleRef.name));
  for (const s of rb.subjects) t.ok(one(s.kind, s.name), `subject ${s.kind}/${s.name} exists`);
});

t.test('the InferencePool the config discovers from: selector, target ports, the endpoint picker on the router Service', async (t) => {
  const cm = one('ConfigMap', 'switchyard-config')!;
  const cfg = validateConfig(parse(cm.data['router.yaml']), validatePlugin, 'router.yaml');
  const discovered = cfg.pools.filter((p) => p.discovery !== undefined);
  t.ok(discovered.length > 0, 'the example config discovers its endpoints');
  for (const p of discovered) {
    const name = p.discovery!.kubernetes.inferencePool!;
    const pool = one('InferencePool', name);
    t.ok(pool, `pools.${p.name}.discovery names the InferencePool ${name} of these manifests`);
    const labels = pool!.spec.selector.matchLabels as Record<string, string>;
    t.ok(Object.keys(labels).length > 0 && Object.entries(labels).every(([k, v]) => typeof k === 'string' && typeof v === 'string'), 'spec.selector.matchLabels: a non-empty label map');
    const ports = pool!.spec.targetPorts as Obj[];
    t.ok(ports.length >= 1 && ports.length <= 8, 'targetPorts: 1 to 8 (the v1 API bound)');
    t.ok(ports.every((x) => Number.isInteger(x.number) && x.number >= 1 && x.number <= 65535), 'targetPorts[].number are ports');
    t.equal(new Set(ports.map((x) => x.number)).size, ports.length, 'unique ports');
    const ref = pool!.spec.endpointPickerRef;
    const svc = one('Service', ref.name);
    t.ok(svc, `endpointPickerRef names the Service ${ref.name}`);
    const grpc = svc!.spec.ports.find((x: Obj) => x.port === ref.port.number);
    t.ok(grpc, 'at a port of that Service');
    t.equal(grpc.targetPort, 'grpc-ext-proc', "the router's ext_proc port");
    t.equal(grpc.port, cfg.extProc?.port, 'which the config listens on');
    t.ok(['FailOpen', 'FailClose', undefined].includes(ref.failureMode), 'failureMode is FailOpen or FailClose');
  }
  const role = one('Role', 'switchyard')!;
  t.ok(role.rules.some((r: Obj) => r.apiGroups.includes('inference.networking.k8s.io') && r.resources.includes('inferencepools') && ['get', 'list', 'watch'].every((v) => r.verbs.includes(v))), 'the router may watch InferencePools');
});

t.test('PodDisruptionBudget covers the router pods and keeps one', async (t) => {
  const pdb = one('PodDisruptionBudget', 'switchyard')!;
  const dep = one('Deployment', 'switchyard')!;
  t.ok(matches(pdb.spec.selector.matchLabels, dep.spec.template.metadata.labels));
  t.equal(pdb.spec.minAvailable, 1);
  t.equal(pdb.spec.unhealthyPodEvictionPolicy, 'AlwaysAllow', 'the never-Ready standby can be evicted');
});
