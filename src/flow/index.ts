// Flow control: classification, saturation, admission and the dispatch loop.
export * from './config.js';
export * from './classify.js';
export * from './saturation.js';
export * from './admission.js';
export * from './metrics.js';
export * from './controller.js';
export * from './gate.js';
