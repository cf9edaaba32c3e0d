// Builds the flow-control admission gate from the config's `flowControl`
// block (validated with the rest of the config). Loaded only when the block is
// present, so the router does not depend on flow/ otherwise.
import type { RouterConfig } from '../config/schema.js';
import type { EndpointSet } from '../endpoints/endpoint.js';
import { ConfigError } from '../errors.js';
import type { AdmissionGate } from '../admission.js';

/** Returns a gate factory for startRouter, or undefined when flow control is not configured. Throws ConfigError. */
export async function flowGateFactory(config: RouterConfig): Promise<((set: EndpointSet) => AdmissionGate) | undefined> {
  if (config.flowControl === undefined) return undefined;
  const { validateFlowControl } = await import('../flow/config.js');
  const { FlowControlGate } = await import('../flow/gate.js');
  const { value, errors } = validateFlowControl(config.flowControl);
  if (errors.length > 0 || value === undefined) {
    throw new ConfigError(
      errors.map((e) => {
        const i = e.indexOf(': ');
        return i > 0 ? { path: e.slice(0, i), message: e.slice(i + 2) } : { path: 'flowControl', message: e };
      }),
    );
  }
  const fc = value;
  // Pool utilisation is the least-loaded routable endpoint's load: endpoints
  // that are down or behind an open circuit breaker are skipped, and a model
  // with none left is answered 503 instead of being queued.
  return (set) => FlowControlGate.fromEndpoints({ config: fc, endpointsFor: (model) => set.forModel(model), maxLabelValues: config.metrics.maxLabelValues });
}
