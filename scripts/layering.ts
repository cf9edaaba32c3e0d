// The import-graph check `npm test` runs (test/layering.test.ts): no import circles among the modules of
// src/ and bindings/, and the layering of docs/architecture.md. It reads every .ts file with the
// TypeScript parser (static imports and re-exports, type-only ones included, and dynamic `import()` with
// a string literal), resolves relative specifiers to files, finds the strongly connected components of
// the graph (Tarjan) and checks each edge against RULES.
// (TypeScript, run by tap's loader: `npx tap test/layering.test.ts`; its output names each finding.)
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve, sep } from 'node:path';
import ts from 'typescript';

/** One import: the importing file, what it names, the file it resolves to (ours) or null (a package). */
export interface ImportEdge {
  from: string;
  specifier: string;
  to: string | null;
  typeOnly: boolean;
}

/** A rule: files under `from` may not import files under (or packages named) any of `forbid`. */
export interface LayerRule {
  from: string;
  forbid: string[];
  why: string;
}

export const RULES: LayerRule[] = [
  { from: 'src/director/', forbid: ['src/server/'], why: 'the director never imports the server (it is given ports)' },
  { from: 'src/k8s/', forbid: ['src/ha/'], why: 'k8s/ is an adapter ha/ may use, not the reverse' },
  {
    from: 'src/scheduler/',
    forbid: ['src/server/', 'src/proxy/', 'src/director/', 'src/uws.ts', 'node:http', 'node:https', 'http', 'https', 'undici', 'uWebSockets.js'],
    why: 'the scheduler knows nothing of HTTP',
  },
  { from: 'bindings/', forbid: ['src/'], why: 'bindings/ is below every module of src/ (src/errors.ts, the leaf every layer may use, apart)' },
  {
    from: 'src/config/',
    forbid: ['src/server/', 'src/director/', 'src/scheduler/', 'src/proxy/', 'src/endpoints/'],
    why: 'the config is a leaf (plugin params are validated through a callback)',
  },
  { from: 'src/sim/', forbid: ['src/server/', 'src/director/', 'src/scheduler/', 'src/proxy/'], why: 'the simulator uses leaf modules only' },
];

/**
 * Circles accepted for now, by the folder that holds all of their files. src/responses/ (store.ts ↔ its
 * stores, service.ts ↔ turn.ts) is being untangled on its own branch; remove the entry when that lands.
 */
export const KNOWN_CIRCLE_FOLDERS: string[] = [];

const SCANNED = ['src', 'bindings'];

function listTs(dir: string, out: string[]): void {
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return;
  }
  for (const name of names) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) listTs(p, out);
    else if (name.endsWith('.ts') && !name.endsWith('.d.ts')) out.push(p);
  }
}

function posix(p: string): string {
  return p.split(sep).join('/');
}

function resolveSpecifier(root: string, fromFile: string, spec: string, files: Set<string>): string | null {
  if (!spec.startsWith('.')) return null;
  const base = posix(relative(root, resolve(dirname(join(root, fromFile)), spec)));
  const candidates = [base, base.replace(/\.js$/, '.ts'), base.replace(/\.mjs$/, '.mts'), `${base}.ts`, `${base}/index.ts`];
  for (const c of candidates) if (files.has(c)) return c;
  return null;
}

function importsOf(text: string, file: string): Array<{ specifier: string; typeOnly: boolean }> {
  const sf = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, false, ts.ScriptKind.TS);
  const out: Array<{ specifier: string; typeOnly: boolean }> = [];
  const visit = (node: ts.Node): void => {
    if (ts.isImportDeclaration(node) && ts.isStringLiteral(node.moduleSpecifier)) {
      const clause = node.importClause;
      let typeOnly = clause?.isTypeOnly ?? false;
      if (!typeOnly && clause && !clause.name && clause.namedBindings && ts.isNamedImports(clause.namedBindings)) {
        const els = clause.namedBindings.elements;
        typeOnly = els.length > 0 && els.every((e) => e.isTypeOnly);
      }
      out.push({ specifier: node.moduleSpecifier.text, typeOnly });
    } else if (ts.isExportDeclaration(node) && node.moduleSpecifier && ts.isStringLiteral(node.moduleSpecifier)) {
      out.push({ specifier: node.moduleSpecifier.text, typeOnly: node.isTypeOnly });
    } else if (ts.isImportEqualsDeclaration(node) && ts.isExternalModuleReference(node.moduleReference)) {
      const e = node.moduleReference.expression;
      if (ts.isStringLiteral(e)) out.push({ specifier: e.text, typeOnly: node.isTypeOnly });
    } else if (
      ts.isCallExpression(node) &&
      node.expression.kind === ts.SyntaxKind.ImportKeyword &&
      node.arguments.length > 0 &&
      ts.isStringLiteralLike(node.arguments[0]!)
    ) {
      out.push({ specifier: (node.arguments[0] as ts.StringLiteralLike).text, typeOnly: false });
    } else if (ts.isImportTypeNode(node) && ts.isLiteralTypeNode(node.argument) && ts.isStringLiteral(node.argument.literal)) {
      out.push({ specifier: node.argument.literal.text, typeOnly: true });
    }
    ts.forEachChild(node, visit);
  };
  visit(sf);
  return out;
}

/** Every import edge of the .ts files under root/src and root/bindings (paths relative to root, '/'). */
export function importGraph(root: string): ImportEdge[] {
  const abs: string[] = [];
  for (const d of SCANNED) listTs(join(root, d), abs);
  const files = new Set(abs.map((p) => posix(relative(root, p))));
  const edges: ImportEdge[] = [];
  for (const file of [...files].sort()) {
    const text = readFileSync(join(root, file), 'utf8');
    for (const { specifier, typeOnly } of importsOf(text, file)) {
      edges.push({ from: file, specifier, to: resolveSpecifier(root, file, specifier, files), typeOnly });
    }
  }
  return edges;
}

/** The circles (strongly connected components of more than one file, or a file importing itself). */
export function circles(edges: ImportEdge[]): string[][] {
  const adj = new Map<string, string[]>();
  for (const e of edges) {
    if (!adj.has(e.from)) adj.set(e.from, []);
    if (e.to !== null) adj.get(e.from)!.push(e.to);
  }
  let counter = 0;
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const out: string[][] = [];
  // Iterative Tarjan: the graph has hundreds of files, recursion depth would follow the longest chain.
  for (const start of adj.keys()) {
    if (index.has(start)) continue;
    const work: Array<{ v: string; i: number }> = [{ v: start, i: 0 }];
    index.set(start, counter);
    low.set(start, counter++);
    stack.push(start);
    onStack.add(start);
    while (work.length > 0) {
      const top = work[work.length - 1]!;
      const next = adj.get(top.v) ?? [];
      if (top.i < next.length) {
        const w = next[top.i++]!;
        if (!index.has(w)) {
          index.set(w, counter);
          low.set(w, counter++);
          stack.push(w);
          onStack.add(w);
          work.push({ v: w, i: 0 });
        } else if (onStack.has(w)) {
          low.set(top.v, Math.min(low.get(top.v)!, index.get(w)!));
        }
        continue;
      }
      work.pop();
      if (work.length > 0) {
        const parent = work[work.length - 1]!.v;
        low.set(parent, Math.min(low.get(parent)!, low.get(top.v)!));
      }
      if (low.get(top.v) === index.get(top.v)) {
        const comp: string[] = [];
        let w: string;
        do {
          w = stack.pop()!;
          onStack.delete(w);
          comp.push(w);
        } while (w !== top.v);
        if (comp.length > 1 || next.includes(top.v)) out.push(comp.sort());
      }
    }
  }
  return out.sort((a, b) => a[0]!.localeCompare(b[0]!));
}

function matches(target: string, prefix: string): boolean {
  return prefix.endsWith('/') ? target.startsWith(prefix) : target === prefix || target.startsWith(`${prefix}/`);
}

export interface LayeringReport {
  circles: string[][];
  knownCircles: string[][];
  violations: string[];
}

/** Checks root's src/ and bindings/: circles (known ones apart) and rule violations. */
export function checkLayering(root: string, rules: LayerRule[] = RULES, known: string[] = KNOWN_CIRCLE_FOLDERS): LayeringReport {
  const edges = importGraph(root);
  const all = circles(edges);
  const isKnown = (c: string[]): boolean => known.some((k) => c.every((f) => f.startsWith(k)));
  const violations: string[] = [];
  for (const e of edges) {
    const target = e.to ?? e.specifier;
    for (const r of rules) {
      if (!e.from.startsWith(r.from)) continue;
      if (target !== 'src/errors.ts' && r.forbid.some((f) => matches(target, f))) violations.push(`${e.from} imports ${target}: ${r.why}`);
    }
  }
  return { circles: all.filter((c) => !isKnown(c)), knownCircles: all.filter(isKnown), violations };
}

export function formatReport(r: LayeringReport): string {
  const lines: string[] = [];
  for (const c of r.circles) lines.push(`import circle: ${c.join(' ↔ ')}`);
  for (const v of r.violations) lines.push(`layering: ${v}`);
  return lines.join('\n');
}
