// Progress for long-running commands (benchmarks, rollouts): one status line
// redrawn in place on a terminal, nothing at all when the output is not a TTY
// or CI is set (logs and CI output stay clean). Shared by every command that
// runs long; a command's results still go to stdout as usual.
//
//   const p = progress('router A/B', rounds * steps);
//   p.tick('round 1, 64 connections');   // …
//   p.done();

export interface Progress {
  /** One step done; `note` says what runs now. */
  tick(note?: string): void;
  /** Sets the note without counting a step. */
  note(note: string): void;
  /** Clears the line (call before printing results, and at the end). */
  done(): void;
}

const SILENT: Progress = { tick() {}, note() {}, done() {} };

/** True when progress may be drawn on `stream`: a TTY, and neither CI nor SWITCHYARD_NO_PROGRESS set. */
export function progressEnabled(stream: NodeJS.WriteStream = process.stderr, env: NodeJS.ProcessEnv = process.env): boolean {
  if (!stream.isTTY) return false;
  const ci = env.CI;
  if (ci !== undefined && ci !== '' && ci !== '0' && ci.toLowerCase() !== 'false') return false;
  return !env.SWITCHYARD_NO_PROGRESS && env.TERM !== 'dumb';
}

/** A progress line for `total` steps on stderr (or `stream`); silent where progressEnabled() is false. */
export function progress(label: string, total: number, stream: NodeJS.WriteStream = process.stderr): Progress {
  if (!progressEnabled(stream)) return SILENT;
  const started = Date.now();
  let done = 0;
  let note = '';
  let last = 0;
  const draw = (force: boolean) => {
    const now = Date.now();
    if (!force && now - last < 100) return; // at most 10 redraws a second
    last = now;
    const frac = total > 0 ? Math.min(1, done / total) : 0;
    const width = 20;
    const filled = Math.round(frac * width);
    const elapsed = (now - started) / 1000;
    const eta = done > 0 && done < total ? ` eta ${Math.ceil((elapsed / done) * (total - done))}s` : '';
    let line = `${label} [${'#'.repeat(filled)}${'.'.repeat(width - filled)}] ${done}/${total}${eta}${note ? ` ${note}` : ''}`;
    const cols = stream.columns ?? 80;
    if (line.length > cols - 1) line = line.slice(0, cols - 1);
    stream.write(`\r\x1b[2K${line}`);
  };
  draw(true);
  return {
    tick(n?: string) {
      done++;
      if (n !== undefined) note = n;
      draw(done >= total);
    },
    note(n: string) {
      note = n;
      draw(false);
    },
    done() {
      stream.write('\r\x1b[2K');
    },
  };
}
