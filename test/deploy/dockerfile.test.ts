// The Dockerfile without a Docker daemon: its COPY sources exist and are not
// excluded by .dockerignore, the runtime stage is non-root with a health
// check, and the runtime stage's file layout (assembled here from the same
// paths it copies) runs the entrypoint's commands: --version, check, serve
// --print-config, and serve and sim answering the HEALTHCHECK command.
import t from 'tap';
import { spawn, spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const dockerfile = readFileSync(join(ROOT, 'Dockerfile'), 'utf8');
const ignore = readFileSync(join(ROOT, '.dockerignore'), 'utf8')
  .split('\n')
  .map((l) => l.trim())
  .filter((l) => l !== '' && !l.startsWith('#'));

interface Stage {
  name: string;
  from: string;
  lines: string[];
}

function stages(): Stage[] {
  const out: Stage[] = [];
  // join continuation lines
  const lines = dockerfile.replace(/\\\n/g, ' ').split('\n').map((l) => l.trim()).filter((l) => l !== '' && !l.startsWith('#'));
  for (const l of lines) {
    const m = /^FROM\s+(\S+)(?:\s+AS\s+(\S+))?/i.exec(l);
    if (m) out.push({ from: m[1]!, name: m[2] ?? String(out.length), lines: [] });
    else out.at(-1)?.lines.push(l);
  }
  return out;
}

/** True when .dockerignore excludes `path` (the patterns used here: names, dir/name, *.ext). */
function ignored(path: string): boolean {
  const p = path.replace(/^\.\//, '').replace(/\/$/, '');
  return ignore.some((pat) => {
    if (pat.startsWith('*.')) return p.endsWith(pat.slice(1)) && !p.includes('/');
    return p === pat || p.startsWith(`${pat}/`);
  });
}

function copies(stage: Stage): { from: string | null; srcs: string[]; dest: string }[] {
  return stage.lines
    .filter((l) => /^COPY\s/i.test(l))
    .map((l) => {
      const words = l.split(/\s+/).slice(1);
      const flags = words.filter((w) => w.startsWith('--'));
      const rest = words.filter((w) => !w.startsWith('--'));
      const from = flags.find((f) => f.startsWith('--from='))?.slice(7) ?? null;
      return { from, srcs: rest.slice(0, -1), dest: rest.at(-1)! };
    });
}

const all = stages();
const build = all.find((s) => s.name === 'build');
const runtime = all.find((s) => s.name === 'runtime');
const standalone = all.find((s) => s.name === 'standalone');

t.test('build, the standalone executable, then (the default target, last) a slim non-root runtime with a health check', async (t) => {
  t.same(
    all.map((s) => s.name),
    ['build', 'standalone', 'runtime'],
  );
  t.match(build!.from, /^node:/);
  t.match(runtime!.from, /^node:.*slim/);
  t.ok(build!.lines.some((l) => /npm ci/.test(l)), 'the build stage runs npm ci (node-gyp builds the addon, tsc builds dist/)');
  t.ok(build!.lines.some((l) => /npm prune --omit=dev/.test(l)), 'dev dependencies are pruned');
  const user = runtime!.lines.filter((l) => /^USER\s/i.test(l)).at(-1);
  t.ok(user && !/\b(root|0)\b/.test(user), `runs as a non-root user (${user})`);
  t.ok(runtime!.lines.some((l) => /^HEALTHCHECK\s.*CMD/.test(l)), 'a HEALTHCHECK');
  t.ok(runtime!.lines.some((l) => l === 'ENTRYPOINT ["node", "bin/switchyard.js"]'), 'the switchyard command is the entrypoint (serve, sim, check)');
  t.notOk(runtime!.lines.some((l) => /^RUN\s/.test(l)), 'nothing is built in the runtime stage');
});

t.test('the standalone stage: the binary alone on Debian, non-root, with a health check that needs no Node', async (t) => {
  t.ok(build!.lines.some((l) => /npm run build:binary.*npm prune/.test(l)), 'the build stage builds the binary before pruning the dev dependencies (postject)');
  t.match(standalone!.from, /^debian:\S+-slim$/);
  t.same(copies(standalone!), [{ from: 'build', srcs: ['/app/out/switchyard'], dest: '/usr/local/bin/switchyard' }], 'only the binary');
  const user = standalone!.lines.filter((l) => /^USER\s/i.test(l)).at(-1);
  t.ok(user && !/\b(root|0)\b/.test(user), `runs as a non-root user (${user})`);
  t.ok(standalone!.lines.includes('ENTRYPOINT ["switchyard"]'));
  t.notOk(standalone!.lines.some((l) => /\bnode\b/.test(l) && !/native/.test(l)), 'no node in the stage');
  const hc = standalone!.lines.find((l) => /^HEALTHCHECK\s.*CMD/.test(l));
  t.ok(hc, 'a HEALTHCHECK');
  const cmd = JSON.parse(hc!.slice(hc!.indexOf('['))) as string[];
  t.equal(cmd[0], 'bash');
  // the command itself, against a router here (native front end: it answers HTTP/1.0) and against nothing
  const port = await freePort();
  const child = spawn(process.execPath, ['bin/switchyard.js', 'serve', '--port', String(port)], {
    cwd: ROOT,
    stdio: 'ignore',
    env: { ...process.env, SWITCHYARD_FRONT_END: 'native' },
  });
  t.teardown(() => {
    if (child.exitCode === null) child.kill('SIGKILL');
  });
  let healthy = false;
  for (let i = 0; i < 100 && !healthy; i++) {
    healthy = spawnSync(cmd[0]!, cmd.slice(1), { env: { ...process.env, SWITCHYARD_HEALTH_PORT: String(port) }, timeout: 3000 }).status === 0;
    if (!healthy) await new Promise((r) => setTimeout(r, 100));
  }
  t.ok(healthy, 'the health check passes against a running router');
  child.kill('SIGTERM');
  await new Promise((r) => (child.exitCode !== null ? r(null) : child.on('exit', r)));
  t.not(spawnSync(cmd[0]!, cmd.slice(1), { env: { ...process.env, SWITCHYARD_HEALTH_PORT: String(port) }, timeout: 3000 }).status, 0, 'and fails once it is gone');
});

t.test('every COPY source of the build stage exists and is not excluded by .dockerignore', async (t) => {
  for (const c of copies(build!)) {
    t.equal(c.from, null);
    for (const s of c.srcs) {
      t.ok(existsSync(join(ROOT, s)), `${s} exists`);
      t.notOk(ignored(s), `${s} is not excluded by .dockerignore`);
    }
  }
  for (const p of ['node_modules', 'build', 'dist', '.git', 'test', 'out']) t.ok(ignored(p), `${p} stays out of the build context`);
});

async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const p = (s.address() as { port: number }).port;
  await new Promise<void>((r) => s.close(() => r()));
  return p;
}

t.test("the runtime stage's layout runs every entrypoint command", async (t) => {
  // what `COPY --from=build /app/X Y` puts in /app, from this checkout's build (npm ci's
  // output: dist/ and build/Release/); node_modules is linked (the image has it pruned)
  const app = mkdtempSync(join(tmpdir(), 'swy-image-'));
  t.teardown(() => rmSync(app, { recursive: true, force: true }));
  for (const c of copies(runtime!)) {
    t.equal(c.from, 'build', 'the runtime stage copies from the build stage only');
    for (const s of c.srcs) {
      const rel = s.replace(/^\/app\//, '');
      const dest = c.dest.endsWith('/') || c.srcs.length > 1 ? join(app, c.dest, rel.split('/').at(-1)!) : join(app, c.dest);
      if (rel === 'node_modules') {
        symlinkSync(join(ROOT, 'node_modules'), dest);
        continue;
      }
      t.ok(existsSync(join(ROOT, rel)), `${rel} exists after a build`);
      mkdirSync(dirname(dest), { recursive: true });
      cpSync(join(ROOT, rel), dest, { recursive: true });
    }
  }
  t.notOk(existsSync(join(app, 'native')), 'no C++ sources in the image');
  const cli = (args: string[], env: Record<string, string> = {}) =>
    spawnSync(process.execPath, ['bin/switchyard.js', ...args], { cwd: app, encoding: 'utf8', env: { ...process.env, NODE_ENV: 'production', ...env }, timeout: 30_000 });
  const v = cli(['--version']);
  t.equal(v.status, 0, `--version: ${v.stderr}`);
  t.match(v.stdout, /^switchyard \d+\.\d+\.\d+/);
  t.equal(cli(['check', '--config', join(ROOT, 'test/fixtures/router-valid.yaml'), '-q']).status, 0, 'check: a valid config');
  t.equal(cli(['check', '--config', join(ROOT, 'test/fixtures/router-invalid.yaml')]).status, 2, 'check: an invalid config');
  const pc = cli(['serve', '--print-config', '--host', '0.0.0.0']);
  t.equal(pc.status, 0);
  t.match(pc.stdout, /host: 0\.0\.0\.0/);

  // serve (the image's default command) and sim, each checked by the HEALTHCHECK command
  for (const args of [['serve'], ['sim']]) {
    const port = await freePort();
    const child = spawn(process.execPath, ['bin/switchyard.js', ...args, '--port', String(port)], { cwd: app, stdio: ['ignore', 'pipe', 'pipe'] });
    t.teardown(() => {
      if (child.exitCode === null) child.kill('SIGKILL');
    });
    let healthy = false;
    for (let i = 0; i < 100 && !healthy; i++) {
      const h = spawnSync(process.execPath, ['bin/healthcheck.js'], { cwd: app, env: { ...process.env, SWITCHYARD_HEALTH_PORT: String(port) }, encoding: 'utf8', timeout: 10_000 });
      healthy = h.status === 0;
      if (!healthy) await new Promise((r) => setTimeout(r, 100));
    }
    t.ok(healthy, `${args[0]}: the health check passes`);
    child.kill('SIGTERM');
    const code = await new Promise<number | null>((r) => (child.exitCode !== null ? r(child.exitCode) : child.on('exit', (c) => r(c))));
    t.equal(code, 0, `${args[0]}: a clean exit on SIGTERM`);
    const h = spawnSync(process.execPath, ['bin/healthcheck.js'], { cwd: app, env: { ...process.env, SWITCHYARD_HEALTH_PORT: String(port) }, encoding: 'utf8' });
    t.equal(h.status, 1, `${args[0]}: the health check fails once it is gone`);
  }
});
