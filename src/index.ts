// Library entry point: `import { ... } from 'switchyard'`.
export { NativeLoadError } from '../bindings/index.js';
export { startEngine, startFleet, countTokens, renderChat, type SimEngine, type SimFleet, type SimOptions, type FailureKind } from './sim/index.js';
export { createScheduler, Scheduler, type Decision, type Outcome, type SchedulerConfig, type SchedulerOptions } from './scheduler/scheduler.js';
export { PluginRegistry, type PluginFactory, type PluginKind } from './scheduler/registry.js';
export { registry, builtinRegistry } from './scheduler/plugins/index.js';
export type { Filter, Scorer, Picker, Plugin, CycleContext, SchedRequest, PluginEnv } from './scheduler/types.js';
export { Endpoint, EndpointSet } from './endpoints/endpoint.js';
export { parseConfig, loadConfigFile, quickConfig } from './config/load.js';
export { validateConfig, type RouterConfig, type PoolConfig, type EndpointConfig } from './config/schema.js';
export { startRouter, type RunningRouter, type StartRouterOptions } from './server/router.js';
export type { AdmissionGate, Admission, Admitted, Rejected, RequestInfo, AbortLike, ReleaseOutcome } from './admission.js';
export type { UpstreamClient, UpstreamCall, UpstreamSink, UpstreamRequest } from './proxy/upstream.js';
export { SwitchyardError, ConfigError, PluginError, NoEndpointError, UnknownModelError } from './errors.js';
export { NativeUpstreamClient } from './proxy/native-client.js';
export { UndiciUpstreamClient } from './proxy/undici-client.js';
export { PassThroughGate } from './admission.js';
export { Director, Flight, type ClientPort } from './director/director.js';
