// Library entry point: `import { ... } from 'switchyard'`.
export { NativeLoadError } from '../bindings/index.js';
export { startEngine, startFleet, countTokens, renderChat, type SimEngine, type SimFleet, type SimOptions, type FailureKind } from './sim/index.js';
