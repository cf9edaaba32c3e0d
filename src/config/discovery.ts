// A pool's `discovery` block: its endpoints come from Kubernetes pods (an
// InferencePool's selector, or a plain label selector) instead of, or beside,
// its static `endpoints` list (docs/operations.md "Kubernetes discovery").
// Types, defaults and the zod schema; schema.ts adds it to the pool.
import { got, int, nonEmpty, strict, z } from './schema-kit.js';

export interface KubernetesDiscoveryConfig {
  /** Namespace of the pods (and the InferencePool); default: the router's own (in-cluster), else the kubeconfig context's, else "default". */
  namespace?: string;
  /** Name of an `inference.networking.k8s.io/v1` InferencePool: its spec.selector picks the pods, its spec.targetPorts the ports. */
  inferencePool?: string;
  /** A label selector (Kubernetes syntax, `app=vllm,tier in (a,b)`) picking the pods directly. */
  labelSelector?: string;
  /** The engine's port on each pod; overrides the InferencePool's targetPorts. Required with labelSelector unless every pod carries portAnnotation. */
  targetPort?: number;
  /** A pod annotation whose value (a port number) overrides the port for that pod. */
  portAnnotation: string;
  /** The pod label carrying the endpoint's role (prefill, decode, both, encode; absent: both). */
  roleLabel: string;
  /** The pod label carrying the endpoint's revision (absent: no revision). */
  revisionLabel?: string;
  /** A kubeconfig file; absent: the in-cluster service account (else $KUBECONFIG / ~/.kube/config). */
  kubeconfig?: string;
  /** Server-side lifetime of one watch request (the watch then resumes from its last resourceVersion). */
  watchTimeoutSeconds: number;
  /** First and largest delay between reconnects of a failed list or broken watch (doubling, with jitter). */
  backoffInitialMs: number;
  backoffMaxMs: number;
  /** How long the router's start waits for the first pod list (it serves anyway after). */
  initialSyncTimeoutMs: number;
}

export interface DiscoveryConfig {
  kubernetes: KubernetesDiscoveryConfig;
}

export const KUBERNETES_DISCOVERY_DEFAULTS = {
  portAnnotation: 'switchyard.io/port',
  roleLabel: 'llm-d.ai/role',
  watchTimeoutSeconds: 300,
  backoffInitialMs: 250,
  backoffMaxMs: 30_000,
  initialSyncTimeoutMs: 10_000,
};

// RFC 1123 label (namespaces) and subdomain (object names), as the API server checks them
const DNS_LABEL = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/;
// a label key: optional DNS-subdomain prefix and '/', then a name of at most 63 characters
const LABEL_KEY = /^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$/;
const LABEL_VALUE = /^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$/;

const labelKey = (what: string) =>
  nonEmpty().refine((s) => LABEL_KEY.test(s), { error: (i) => `must be a Kubernetes ${what} key, e.g. llm-d.ai/role (got ${got(i.input)})` });

/** A selector as a string (passed to the API server as is) or a mapping of labels (turned into `k=v,...`). */
const selectorSchema = z.union(
  [
    nonEmpty(),
    z
      .record(z.string(), z.string(), { error: 'must be a selector string or a mapping of label: value' })
      .superRefine((m, ctx) => {
        if (Object.keys(m).length === 0) ctx.addIssue({ code: 'custom', message: 'must list at least one label (an empty selector would pick every pod)', input: m });
        for (const [k, v] of Object.entries(m)) {
          if (!LABEL_KEY.test(k)) ctx.addIssue({ code: 'custom', path: [k], message: `is not a Kubernetes label key`, input: k });
          else if (!LABEL_VALUE.test(v)) ctx.addIssue({ code: 'custom', path: [k], message: `must be a Kubernetes label value (got ${got(v)})`, input: v });
        }
      })
      .transform((m) => Object.entries(m).map(([k, v]) => `${k}=${v}`).join(',')),
  ],
  { error: 'must be a label selector string (e.g. "app=vllm") or a mapping of label: value' },
);

const d = KUBERNETES_DISCOVERY_DEFAULTS;
export const kubernetesDiscoverySchema = strict(
  {
    namespace: nonEmpty()
      .refine((s) => DNS_LABEL.test(s), { error: (i) => `must be a Kubernetes namespace name (got ${got(i.input)})` })
      .optional()
      .describe("namespace of the pods and the InferencePool; default: the router's own"),
    inferencePool: nonEmpty()
      .refine((s) => DNS_SUBDOMAIN.test(s), { error: (i) => `must be a Kubernetes object name (got ${got(i.input)})` })
      .optional()
      .describe('name of an inference.networking.k8s.io/v1 InferencePool (its selector and targetPorts)'),
    labelSelector: selectorSchema.optional().describe('pods picked by this label selector (instead of an InferencePool)'),
    targetPort: int(1, 65535).optional().describe("the engine's port on each pod; overrides the InferencePool's targetPorts"),
    portAnnotation: nonEmpty().default(d.portAnnotation).describe('a pod annotation whose value overrides the port for that pod'),
    roleLabel: labelKey('label').default(d.roleLabel).describe("pod label with the endpoint's role (prefill, decode, both, encode)"),
    revisionLabel: labelKey('label').optional().describe("pod label with the endpoint's revision; absent: none"),
    kubeconfig: nonEmpty().optional().describe('kubeconfig file; absent: the in-cluster service account'),
    watchTimeoutSeconds: int(1, 3600).default(d.watchTimeoutSeconds).describe('server-side lifetime of one watch request'),
    backoffInitialMs: int(1, 600_000).default(d.backoffInitialMs).describe('first delay before reconnecting a failed list or watch'),
    backoffMaxMs: int(1, 3_600_000).default(d.backoffMaxMs).describe('largest delay between reconnects'),
    initialSyncTimeoutMs: int(0, 600_000).default(d.initialSyncTimeoutMs).describe('how long start-up waits for the first pod list'),
  },
  'must be a mapping (inferencePool: NAME or labelSelector: SELECTOR)',
).superRefine((v, ctx) => {
  const pool = v.inferencePool !== undefined;
  const sel = v.labelSelector !== undefined;
  if (pool === sel) ctx.addIssue({ code: 'custom', path: [], message: 'needs exactly one of inferencePool or labelSelector', input: v });
  if (sel && v.targetPort === undefined)
    ctx.addIssue({ code: 'custom', path: ['targetPort'], message: `is required with labelSelector (a pod's ${v.portAnnotation} annotation overrides it)`, input: undefined });
  if (typeof v.backoffInitialMs === 'number' && typeof v.backoffMaxMs === 'number' && v.backoffMaxMs < v.backoffInitialMs)
    ctx.addIssue({ code: 'custom', path: ['backoffMaxMs'], message: `must be at least backoffInitialMs (${v.backoffInitialMs})`, input: v.backoffMaxMs });
});

export const discoverySchema = strict(
  { kubernetes: kubernetesDiscoverySchema.describe('pods of an InferencePool or a label selector (docs/operations.md)') },
  'must be a mapping {kubernetes}',
);
