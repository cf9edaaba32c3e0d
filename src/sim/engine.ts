// The engine simulator's entry points, re-exported from the files that hold them:
// server.ts (the engine and its routes), call.ts (one generation), request.ts
// (parsing), failures.ts (failure injection), wire.ts (error bodies).

export { Engine, startEngine, startSaltedEngine, type SimEngine, type SimEngineStats } from './server.js';
export { errorBody } from './wire.js';
export { SimOptionError } from './options.js';
