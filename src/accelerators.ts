// Named accelerator profiles: how fast (relative per-token cost of prefill and
// of decode) and how dear (relative cost per hour) one replica of a model is
// on a kind of machine, against the reference `nvidia` profile (1, 1, 1).
// A leaf module: the router's config (pools[].accelerator) and the simulator
// (--accelerator) read the same table, so a simulated fleet and the priors of
// the router's latency model agree on what a name means.
//
// The factors are coarse, illustrative ratios for one mid-size model, not
// measurements of any machine: operators who know their fleet set
// pools[].speed (prefillCostFactor, decodeCostFactor) and pools[].cost, which
// win over the profile. The router learns each endpoint's real costs online
// anyway (src/scheduler/latency-model.ts); the profile only seeds it.

export interface AcceleratorProfile {
  /** Multiplies the per-token prefill cost (2 = half as fast at prefill). */
  readonly prefillCostFactor: number;
  /** Multiplies the inter-token latency. */
  readonly decodeCostFactor: number;
  /** Relative cost of a replica per unit of time (the scheduler prefers cheaper endpoints that meet the SLO). */
  readonly cost: number;
}

export const ACCELERATOR_PROFILES = Object.freeze({
  // vendor names (the config's earlier labels): the reference speed
  nvidia: { prefillCostFactor: 1, decodeCostFactor: 1, cost: 1 },
  amd: { prefillCostFactor: 1, decodeCostFactor: 1, cost: 1 },
  intel: { prefillCostFactor: 1, decodeCostFactor: 1, cost: 1 },
  tpu: { prefillCostFactor: 1, decodeCostFactor: 1, cost: 1 },
  // named parts
  'nvidia-h200': { prefillCostFactor: 0.8, decodeCostFactor: 0.7, cost: 1.3 },
  'nvidia-h100': { prefillCostFactor: 1, decodeCostFactor: 1, cost: 1 },
  'nvidia-a100': { prefillCostFactor: 2, decodeCostFactor: 1.6, cost: 0.55 },
  'nvidia-l4': { prefillCostFactor: 3, decodeCostFactor: 3, cost: 0.25 },
  'amd-mi300x': { prefillCostFactor: 1, decodeCostFactor: 0.9, cost: 0.9 },
  'intel-gaudi3': { prefillCostFactor: 1.2, decodeCostFactor: 1.2, cost: 0.7 },
  'tpu-v5e': { prefillCostFactor: 2, decodeCostFactor: 2, cost: 0.4 },
  'tpu-v6e': { prefillCostFactor: 1.1, decodeCostFactor: 1.1, cost: 0.75 },
  // the simulator's two speeds for mixed-fleet tests and benchmarks
  'sim-fast': { prefillCostFactor: 1, decodeCostFactor: 1, cost: 1 },
  'sim-slow': { prefillCostFactor: 3, decodeCostFactor: 3, cost: 0.3 },
} satisfies Record<string, AcceleratorProfile>);

export type AcceleratorName = keyof typeof ACCELERATOR_PROFILES;

export const ACCELERATOR_NAMES = Object.keys(ACCELERATOR_PROFILES) as [AcceleratorName, ...AcceleratorName[]];

/** The profile of `name`, or undefined for an unknown name. */
export function acceleratorProfile(name: string): AcceleratorProfile | undefined {
  return Object.hasOwn(ACCELERATOR_PROFILES, name) ? ACCELERATOR_PROFILES[name as AcceleratorName] : undefined;
}
