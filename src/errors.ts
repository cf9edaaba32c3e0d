// Switchyard's error classes. Every error carries a stable string code
// (SWY_ERR_*) so callers can branch on `err.code` instead of messages. The
// same table, with where each is raised, is docs/errors.md.
//
// | class                 | file                       | code                      |
// |-----------------------|----------------------------|---------------------------|
// | SwitchyardError       | src/errors.ts              | SWY_ERR_GENERIC (base)    |
// | ConfigError           | src/errors.ts              | SWY_ERR_CONFIG            |
// | PluginError           | src/errors.ts              | SWY_ERR_PLUGIN            |
// | NoEndpointError       | src/errors.ts              | SWY_ERR_NO_ENDPOINT       |
// | UnknownModelError     | src/errors.ts              | SWY_ERR_UNKNOWN_MODEL     |
// | EndpointError         | src/errors.ts              | SWY_ERR_ENDPOINT_EXISTS, SWY_ERR_ENDPOINT_UNKNOWN, SWY_ERR_ENDPOINT_LAST, SWY_ERR_ENDPOINT_IDS, SWY_ERR_POOL_UNKNOWN |
// | HaStartError          | src/errors.ts              | SWY_ERR_HA_START          |
// | NativeLoadError       | bindings/native.ts         | SWY_ERR_NATIVE_LOAD       |
// | KvDecodeError         | src/kv-events/decode.ts    | SWY_ERR_KV_EVENT_DECODE   |
// | KubeApiError          | src/k8s/api.ts             | SWY_ERR_KUBE_API          |
// | RolloutError          | src/server/rollout.ts      | SWY_ERR_ROLLOUT           |
// | HttpError (admin API) | src/server/admin.ts        | SWY_ERR_ADMIN_REQUEST     |
// | StoreUnavailableError | src/responses/store.ts     | SWY_ERR_STORE_UNAVAILABLE |
// | AbortedByRouter       | src/proxy/undici-client.ts | SWY_ERR_ABORTED           |
// | SimOptionError        | src/sim/options.ts         | SWY_ERR_SIM_OPTION        |
// | FlagError (sim CLI)   | src/sim/cli.ts             | SWY_ERR_SIM_FLAG          |
// | PoolingError          | src/sim/pooling.ts         | SWY_ERR_SIM_POOLING       |
// | PdRuleError           | src/sim/pd.ts              | SWY_ERR_SIM_PD_RULE       |
// | ResponsesError        | src/responses/request.ts   | SWY_ERR_RESPONSES_REQUEST (swyCode; `code` the OpenAI code) |
// | BatchApiError         | src/batch/store.ts         | SWY_ERR_BATCH_API (swyCode; `code` the OpenAI code) |
// | UpstreamSocketError   | src/proxy/upstream.ts      | SWY_ERR_UPSTREAM_SOCKET (swyCode; `code` the errno name) |
//
// `swyCode` is the SWY_ERR_* code of every class. For all but the last three
// it is `code` itself; those three keep `code` for what the wire and their
// readers need (the OpenAI error code of a Responses or Batches answer,
// undefined / null when the status's default applies; the socket's errno-style
// name, ECONNRESET, ETIMEDOUT), so `C` types `code` per class.

export class SwitchyardError<C extends string | null | undefined = string> extends Error {
  readonly code: C;
  /** `code`: the subclass's SWY_ERR_* code when it does not declare one as a field. */
  constructor(message: string, options?: { cause?: unknown; code?: C }) {
    super(message, options);
    this.name = new.target.name;
    this.code = options?.code ?? ('SWY_ERR_GENERIC' as C);
  }

  /** The stable SWY_ERR_* code (docs/errors.md): `code`, unless the class keeps `code` for a wire code. */
  get swyCode(): string {
    return this.code as string;
  }
}

/** One validation problem: where (a dotted/indexed field path) and why. */
export interface ConfigIssue {
  path: string;
  message: string;
}

export class ConfigError extends SwitchyardError {
  override readonly code = 'SWY_ERR_CONFIG';
  readonly issues: ConfigIssue[];
  constructor(issues: ConfigIssue[], source?: string) {
    const head = source ? `invalid config (${source})` : 'invalid config';
    super(`${head}:\n` + issues.map((i) => `  ${i.path || '(root)'}: ${i.message}`).join('\n'));
    this.issues = issues;
  }
}

export class PluginError extends SwitchyardError {
  override readonly code = 'SWY_ERR_PLUGIN';
}

export class NoEndpointError extends SwitchyardError {
  override readonly code = 'SWY_ERR_NO_ENDPOINT';
}

export class UnknownModelError extends SwitchyardError {
  override readonly code = 'SWY_ERR_UNKNOWN_MODEL';
}

/** A runtime endpoint change that cannot be made (see the codes in the table above). */
export class EndpointError extends SwitchyardError {
  override readonly code: string;
  /** The HTTP status the admin API answers with. */
  readonly status: number;
  constructor(message: string, code: string) {
    super(message);
    this.code = code;
    this.status = code === 'SWY_ERR_ENDPOINT_UNKNOWN' || code === 'SWY_ERR_POOL_UNKNOWN' ? 404 : code === 'SWY_ERR_ENDPOINT_IDS' ? 507 : 409;
  }
}

export class HaStartError extends SwitchyardError {
  override readonly code = 'SWY_ERR_HA_START';
}
