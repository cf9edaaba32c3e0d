#!/usr/bin/env node
// Writes schema/switchyard-v1.schema.json from the zod config schema (needs dist/:
// `npm run schema` builds first). test/config/config-json-schema.test.ts checks the file is current.
import { writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { configJsonSchemaText } from '../dist/src/config/json-schema.js';
import { registry } from '../dist/src/scheduler/plugins/index.js';

const file = fileURLToPath(new URL('../schema/switchyard-v1.schema.json', import.meta.url));
writeFileSync(file, configJsonSchemaText(registry.factories()));
console.log(`wrote ${file}`);
