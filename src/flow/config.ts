// The `flowControl` block of the router config. Its types, defaults and schema
// live in src/config/flow-control.ts (the router config validates the block
// with everything else, and config/ depends on nothing of ours); this module
// keeps the flow layer's API: validateFlowControl collects every problem with
// its field path, e.g. `flowControl.flows[1].minShare: must be a number in
// [0, 1], got 1.5`. docs/flow-control.md documents each field.
import { parseFlowControl, type FlowControlConfig } from '../config/flow-control.js';

export {
  DEFAULT_BANDS,
  FLOW_DEFAULTS,
  defaultFlowControl,
  isValidatedFlowControl,
  parseDurationMs,
  type AdmissionMode,
  type AdmissionConfig,
  type FlowControlConfig,
  type FlowSpec,
  type QueueLimits,
  type SaturationConfig,
} from '../config/flow-control.js';

/**
 * Validates the raw `flowControl` block (as parsed from YAML). `undefined` or
 * `null` gives the defaults with flow control off; a config already validated
 * (e.g. a RouterConfig's `flowControl`) is returned as is. Returns the
 * normalised config when there are no errors; otherwise every problem as
 * `path: reason`.
 */
export function validateFlowControl(raw: unknown, path = 'flowControl'): { value?: FlowControlConfig; errors: string[] } {
  const { value, issues } = parseFlowControl(raw, path);
  return value !== undefined ? { value, errors: [] } : { errors: issues.map((i) => `${i.path}: ${i.message}`) };
}
