// Typed public surface of the native addon. Only bindings/native.ts loads the
// .node file; this module re-exports the classes built over it.
export { NativeLoadError, NATIVE_ABI_VERSION } from './native.js';
export * from './flow-queues.js';
export * from './prefix-index.js';
export * from './upstream-client.js';
export * from './process-limits.js';
export * from './front-end.js';
export * from './body-scan.js';
