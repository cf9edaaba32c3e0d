// Switchyard's error classes. Every error carries a stable string code
// (SWY_ERR_*) so callers can branch on `err.code` instead of messages.
//
// | class              | code                      | raised when                                     |
// |--------------------|---------------------------|-------------------------------------------------|
// | SwitchyardError    | SWY_ERR_GENERIC           | base class                                      |
// | ConfigError        | SWY_ERR_CONFIG            | a config file or object fails validation        |
// | PluginError        | SWY_ERR_PLUGIN            | unknown plugin type or bad plugin parameters    |
// | NoEndpointError    | SWY_ERR_NO_ENDPOINT       | Scheduler.pickOrThrow: every candidate filtered |
// | UnknownModelError  | SWY_ERR_UNKNOWN_MODEL     | Scheduler.pickOrThrow: no pool serves the model |
// | EndpointError      | SWY_ERR_ENDPOINT_EXISTS, SWY_ERR_ENDPOINT_UNKNOWN, SWY_ERR_ENDPOINT_LAST, SWY_ERR_ENDPOINT_IDS, SWY_ERR_POOL_UNKNOWN | a runtime endpoint change (admin API, reload, an endpoint source) cannot be made; `status` is the HTTP status the admin API answers |
// | HaStartError       | SWY_ERR_HA_START          | ha: Redis unreachable at start, onRedisDown: refuse |

export class SwitchyardError extends Error {
  readonly code: string = 'SWY_ERR_GENERIC';
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
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
