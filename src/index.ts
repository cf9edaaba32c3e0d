// Library entry point: `import { ... } from 'switchyard'`.
export { NativeLoadError } from '../bindings/index.js';
