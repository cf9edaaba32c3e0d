// Process limits the router may need to raise at startup (native/fd_limit.cc).
import { native } from './native.js';

export interface FdLimit {
  /** RLIMIT_NOFILE soft limit after the call (Infinity for RLIM_INFINITY). */
  soft: number;
  /** RLIMIT_NOFILE hard limit (Infinity for RLIM_INFINITY). */
  hard: number;
}

/**
 * Raises this process's open-file soft limit (RLIMIT_NOFILE) to its hard limit
 * and returns both. Throws an Error if the system refuses (the message names
 * the call and errno text).
 */
export function raiseFdLimit(...args: never[]): FdLimit {
  if (args.length !== 0) throw new TypeError('raiseFdLimit() takes no arguments');
  return native.raiseFdLimit() as FdLimit;
}

/**
 * The lowest file descriptor number not in use: the kernel hands out the
 * lowest free one, so this tells how full the table is (two system calls).
 * -1 when none is free below the soft limit; -2 when the probe itself failed
 * for another reason.
 */
export function lowestFreeFd(): number {
  return native.lowestFreeFd() as number;
}
