// Loading a Router config from YAML text or a file, and building the configs
// the CLI needs without a file (quick mode, embedded default).
import { readFile } from 'node:fs/promises';
import { isMap, isScalar, isSeq, LineCounter, parseDocument, stringify, type Document } from 'yaml';
import { ConfigError, type ConfigIssue } from '../errors.js';
import { validateConfig, API_VERSION, type Engine, type PluginSpec, type RouterConfig } from './schema.js';
import { formatPath } from './schema-kit.js';

export type PluginValidator = (kind: 'filter' | 'scorer' | 'picker', spec: PluginSpec) => string[];

/** Parses YAML text and validates it; throws ConfigError listing every problem. */
export function parseConfig(text: string, validatePlugin?: PluginValidator, source?: string): RouterConfig {
  const lines = new LineCounter();
  const doc = parseDocument(text, { prettyErrors: true, uniqueKeys: true, lineCounter: lines });
  if (doc.errors.length > 0) {
    // a key given twice: named by its field path with both lines (a tenant with two budgets, ...)
    const dups = doc.errors.some((e) => e.code === 'DUPLICATE_KEY') ? duplicateKeys(doc, lines) : [];
    const issues: ConfigIssue[] = doc.errors
      .filter((e) => e.code !== 'DUPLICATE_KEY' || dups.length === 0)
      .map((e) => ({
        path: e.linePos ? `line ${e.linePos[0].line}, column ${e.linePos[0].col}` : '',
        message: `YAML syntax error: ${e.message.split('\n')[0]}`,
      }));
    throw new ConfigError([...dups, ...issues], source);
  }
  let value: unknown;
  try {
    value = doc.toJS();
  } catch (err) {
    // e.g. aliases expanding past the parser's limit (a YAML "billion laughs")
    throw new ConfigError([{ path: '', message: `YAML error: ${(err as Error).message}` }], source);
  }
  return validateConfig(value, validatePlugin, source);
}

/** Mappings whose keys are tenants, each value that tenant's budget: a key given twice there is a tenant with two budgets. */
const TENANT_BUDGETS = new Set(['rateLimits.tenants', 'batch.quotas.tenants']);

/**
 * Every key given twice in one mapping of `doc`, as an issue at the key's
 * field path naming the lines of both (YAML keeps one of them silently in
 * most readers; the router refuses the file).
 */
function duplicateKeys(doc: Document, lines: LineCounter): ConfigIssue[] {
  const out: ConfigIssue[] = [];
  const walk = (node: unknown, path: (string | number)[]): void => {
    if (isMap(node)) {
      const first = new Map<string, number>();
      for (const pair of node.items) {
        const k = isScalar(pair.key) ? String(pair.key.value) : null;
        const at = isScalar(pair.key) && pair.key.range ? pair.key.range[0] : -1;
        if (k !== null && at >= 0) {
          const line = lines.linePos(at).line;
          const was = first.get(k);
          if (was === undefined) first.set(k, line);
          else {
            const where = formatPath('', path);
            const field = formatPath('', [...path, k]);
            out.push({
              path: field,
              message: TENANT_BUDGETS.has(where)
                ? `tenant ${JSON.stringify(k)} has two budgets: line ${was} and line ${line} (give each tenant one entry)`
                : `${JSON.stringify(k)} is given twice in this mapping: line ${was} and line ${line} (keys must be unique)`,
            });
          }
        }
        if (k !== null) walk(pair.value, [...path, k]);
      }
    } else if (isSeq(node)) node.items.forEach((v, i) => walk(v, [...path, i]));
  };
  walk(doc.contents, []);
  return out;
}

/** Reads and validates a config file. */
export async function loadConfigFile(file: string, validatePlugin?: PluginValidator): Promise<RouterConfig> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    throw new ConfigError([{ path: '', message: `cannot read ${file}: ${(err as Error).message}` }], file);
  }
  return parseConfig(text, validatePlugin, file);
}

/** Quick mode: one pool of the given upstream URLs serving one model. */
export function quickConfig(
  upstreams: string[],
  model: string,
  engine: Engine,
  validatePlugin?: PluginValidator,
): RouterConfig {
  return validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [{ name: 'default', engine, models: [model], endpoints: upstreams.map((url, i) => ({ name: `e${i}`, url })) }],
    },
    validatePlugin,
    '--upstream',
  );
}

/**
 * A ConfigError as shell-friendly lines: one per problem, the field path
 * first (`pools[0].endpoints[1].url: must be …`), so `grep` and `wc -l` work.
 */
export function issueLines(err: ConfigError): string[] {
  return err.issues.map((i) => `${i.path || '(root)'}: ${i.message}`);
}

/**
 * A resolved config as plain data that validates again as a config: a limit
 * of Infinity ("no limit") becomes null, which is how a file says it.
 */
export function printableConfig(cfg: RouterConfig): unknown {
  const out = JSON.parse(JSON.stringify(cfg)) as Record<string, unknown>;
  const fc = out.flowControl as Record<string, unknown> | undefined;
  if (fc !== undefined) {
    // flowControl's durations are written `ttl` / `sweepInterval` (ms or "2s") and resolved to *Ms
    for (const [resolved, written] of [['ttlMs', 'ttl'], ['sweepIntervalMs', 'sweepInterval']] as const) {
      if (resolved in fc) {
        fc[written] = `${fc[resolved] as number}ms`; // a bare number would read as seconds
        delete fc[resolved];
      }
    }
    const tp = fc.turnPriority as Record<string, unknown> | undefined;
    if (tp !== undefined && 'maxColdWaitMs' in tp) {
      tp.maxColdWait = `${tp.maxColdWaitMs as number}ms`;
      delete tp.maxColdWaitMs;
    }
    const ad = fc.admission as Record<string, unknown> | undefined;
    for (const [resolved, written] of [['targetMs', 'target'], ['intervalMs', 'interval'], ['reserveWindowMs', 'reserveWindow']] as const) {
      if (ad !== undefined && resolved in ad) {
        ad[written] = `${ad[resolved] as number}ms`;
        delete ad[resolved];
      }
    }
  }
  // sessions.store is written {redis: URL, ...} and resolved to {url, ...}
  const ss = (out.sessions as Record<string, unknown> | undefined)?.store;
  if (ss !== null && typeof ss === 'object' && 'url' in ss) {
    const st = ss as Record<string, unknown>;
    (out.sessions as Record<string, unknown>).store = { redis: st.url, keyPrefix: st.keyPrefix, timeoutMs: st.timeoutMs };
  }
  // batch.consumer '' means "hostname-pid", chosen at start: written by leaving it out
  const b = out.batch as Record<string, unknown> | undefined;
  if (b !== undefined && b.consumer === '') delete b.consumer;
  return out;
}

/** A resolved config as YAML, every default filled in (what `switchyard check` and `serve --print-config` print). */
export function configYaml(cfg: RouterConfig): string {
  return stringify(printableConfig(cfg), { lineWidth: 0 });
}
