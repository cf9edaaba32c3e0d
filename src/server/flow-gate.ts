// Builds the flow-control admission gate from the config's `flowControl`
// block (validated by flow/'s own validator). Loaded only when the block is
// present, so the router does not depend on flow/ otherwise.
import { performance } from 'node:perf_hooks';
import type { RouterConfig } from '../config/schema.js';
import type { EndpointSet } from '../endpoints/endpoint.js';
import { ConfigError } from '../errors.js';
import type { AdmissionGate } from './gate.js';

/** Returns a gate factory for startRouter, or undefined when flow control is not configured. Throws ConfigError. */
export async function flowGateFactory(config: RouterConfig): Promise<((set: EndpointSet) => AdmissionGate) | undefined> {
  if (config.flowControl === undefined) return undefined;
  const { validateFlowControl } = await import('../flow/config.js');
  const { FlowControlGate } = await import('../flow/gate.js');
  const { SaturationDetector } = await import('../flow/saturation.js');
  const { value, errors } = validateFlowControl(config.flowControl);
  if (errors.length > 0 || value === undefined) {
    throw new ConfigError(
      errors.map((e) => {
        const i = e.indexOf(': ');
        return i > 0 ? { path: e.slice(0, i), message: e.slice(i + 2) } : { path: 'flowControl', message: e };
      }),
    );
  }
  const detector = new SaturationDetector(value.saturation);
  return (set) =>
    new FlowControlGate({
      config: value,
      utilisation: (model) => detector.poolLoad(set.forModel(model) ?? [], performance.now()),
    }) as unknown as AdmissionGate;
}
