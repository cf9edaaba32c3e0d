// `switchyard sim` flags: parsing, --help, bad flags exit 2.
import t from 'tap';
import { parseSimArgs, runSimCli, SIM_USAGE } from '../../src/sim/cli.js';

t.test('flags parse into options', async (t) => {
  const o = parseSimArgs([
    '--host', '0.0.0.0', '--port=9001', '--model', 'a', '--model', 'b', '--engine', 'sglang', '--max-num-seqs', '4',
    '--kv-cache-blocks', '100', '--block-size', '8', '--prefill-overhead-ms', '2.5', '--prefill-us-per-token', '30',
    '--itl-ms', '7', '--decode-slowdown', '0.1', '--time-scale', '0', '--seed', '9', '--revision', 'r2', '--role', 'prefill',
    '--failure-rate', '0.5', '--failure-kinds', '500,reset-mid-stream', '--slow-first-byte-ms', '10', '--max-model-len', '2048',
    '--default-max-tokens', '3', '--max-body-bytes', '1000', '--fleet', '3', '--base-port', '9100',
    '--lora', 'l1', '--lora=l2', '--max-loras', '2', '--serial-prefill', 'false', '--legacy',
  ]);
  t.not(o, 'help');
  t.match(o, {
    host: '0.0.0.0', port: 9001, models: ['a', 'b'], engine: 'sglang', maxNumSeqs: 4, kvCacheBlocks: 100, blockSize: 8,
    prefillOverheadMs: 2.5, prefillUsPerToken: 30, itlMs: 7, decodeSlowdown: 0.1, timeScale: 0, seed: 9, revision: 'r2',
    role: 'prefill', failureRate: 0.5, failureKinds: ['500', 'reset-mid-stream'], slowFirstByteMs: 10, maxModelLen: 2048,
    defaultMaxTokens: 3, maxBodyBytes: 1000, fleet: 3, basePort: 9100, loras: ['l1', 'l2'], maxLoras: 2, serialPrefill: false, legacy: true,
  });
  t.match(parseSimArgs(['--legacy=false']), { legacy: false });
  t.match(parseSimArgs(['--lora-modules', 'sql=/adapters/sql', '--lora-modules=fr=/a/fr', '--lora-load-ms', '40', '--enable-lora']), {
    loras: ['sql', 'fr'], loraPaths: { sql: '/adapters/sql', fr: '/a/fr' }, loraLoadMs: 40, enableLora: true,
  });
  t.throws(() => parseSimArgs(['--lora-modules', 'sql']), { message: /--lora-modules expects name=path/ });
  t.match(parseSimArgs(['--port', '0']), { port: 0, basePort: 0, fleet: 1 });
  t.equal(parseSimArgs(['--itl-ms', '3', '--help']), 'help');
  t.equal(parseSimArgs(['-h']), 'help');
  t.match(parseSimArgs(['--failure-kind', '429']), { failureKinds: ['429'] }, '--failure-kind is an alias');
  t.match(parseSimArgs(['--legacy=true', '--model=x']), { legacy: true, models: ['x'] });
  t.throws(() => parseSimArgs(['--port', '--host', 'h']), { message: /--port needs a value/ }, 'a flag is not a value');
  t.throws(() => parseSimArgs(['--bogus', '--help']), { message: /unknown flag '--bogus'/ }, 'flags are read in order');
  t.throws(() => parseSimArgs(['-x']), { message: /unknown flag '-x'/ });
  t.throws(() => parseSimArgs(['--legacy=maybe']), { message: /--legacy expects true or false/ });
});

t.test('bad flags exit 2 with a clear message; --help exits 0 and lists every flag', async (t) => {
  const errors: string[] = [];
  const logs: string[] = [];
  const err = console.error;
  const log = console.log;
  console.error = (m: string) => errors.push(m);
  console.log = (m: string) => logs.push(m);
  try {
    const bad: [string[], RegExp][] = [
      [['--bogus'], /unknown flag '--bogus'/],
      [['--port'], /--port needs a value/],
      [['--port', 'x'], /--port expects a number/],
      [['--port', '70000'], /--port: expected an integer in \[0, 65535\]/],
      [['--max-num-seqs', '1.5'], /--max-num-seqs expects an integer/],
      [['--max-num-seqs', '0'], /--max-num-seqs: expected an integer/],
      [['--engine', 'tgi'], /--engine expects vllm or sglang/],
      [['--role', 'x'], /--role expects both, prefill or decode/],
      [['--failure-rate', '2'], /--failure-rate: expected a number in \[0, 1\]/],
      [['--failure-kinds', '500,boom'], /unknown kind 'boom'/],
      [['--time-scale', '-1'], /--time-scale/],
      [['--fleet', '0'], /--fleet expects an integer in \[1, 4096\]/],
      [['--fleet', '10', '--base-port', '65530'], /runs past port 65535/],
      [['stray'], /unexpected argument 'stray'/],
      [['--serial-prefill', 'yes'], /--serial-prefill expects true or false/],
      [['--lora', 'open-model'], /--lora: expected a list of non-empty adapter names distinct/],
    ];
    for (const [argv, re] of bad) {
      errors.length = 0;
      t.equal(await runSimCli(argv), 2, argv.join(' '));
      t.match(errors.join('\n'), re);
      t.match(errors.join('\n'), /switchyard sim --help/);
    }
    t.equal(await runSimCli(['--help']), 0);
  } finally {
    console.error = err;
    console.log = log;
  }
  const help = logs.join('\n');
  t.equal(help, SIM_USAGE);
  for (const f of ['--host', '--port', '--model', '--engine', '--max-num-seqs', '--kv-cache-blocks', '--block-size', '--prefill-overhead-ms',
    '--prefill-us-per-token', '--itl-ms', '--decode-slowdown', '--serial-prefill', '--time-scale', '--seed', '--revision', '--role', '--failure-rate',
    '--failure-kinds', '--slow-first-byte-ms', '--max-model-len', '--default-max-tokens', '--max-body-bytes', '--lora', '--max-loras', '--lora-modules', '--lora-load-ms', '--enable-lora', '--legacy', '--fleet', '--base-port']) {
    t.match(help, f);
  }
});

t.test('port in use: exit 1 with a message', async (t) => {
  const { startEngine } = await import('../../src/sim/index.js');
  const e = await startEngine({ timeScale: 0 });
  t.teardown(() => e.close());
  const errors: string[] = [];
  const err = console.error;
  console.error = (m: string) => errors.push(m);
  try {
    t.equal(await runSimCli(['--port', String(e.port)]), 1);
  } finally {
    console.error = err;
  }
  t.match(errors.join('\n'), /cannot listen/);
});

t.test('the switchyard binary runs a fleet and stops on SIGTERM (needs dist/: npm run build:ts)', async (t) => {
  const { existsSync } = await import('node:fs');
  const { spawn } = await import('node:child_process');
  const bin = new URL('../../bin/switchyard.js', import.meta.url);
  if (!existsSync(new URL('../../dist/src/sim/cli.js', import.meta.url))) {
    t.skip('dist/ is not built');
    return;
  }
  const child = spawn(process.execPath, [bin.pathname, 'sim', '--port', '0', '--fleet', '2', '--time-scale', '0', '--model', 'm'], { stdio: ['ignore', 'pipe', 'inherit'] });
  const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
  const urls = await new Promise<string[]>((resolve, reject) => {
    let out = '';
    child.stdout!.on('data', (c: Buffer) => {
      out += c.toString();
      const found = [...out.matchAll(/on (http:\/\/127\.0\.0\.1:\d+)/g)].map((m) => m[1]!);
      if (found.length === 2) resolve(found);
    });
    setTimeout(() => reject(new Error(`no listening lines: ${out}`)), 10_000);
  });
  t.equal(new Set(urls).size, 2);
  for (const u of urls) {
    const r = await fetch(u + '/v1/completions', { method: 'POST', body: JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 2 }) });
    t.equal(r.status, 200);
    t.equal((await r.json()).usage.completion_tokens, 2);
  }
  child.kill('SIGTERM');
  t.equal(await exited, 0, 'exit 0 after SIGTERM');
});
