// Shared allocation-free filtering: returns the input when every endpoint
// passes, else the passing ones in a scratch array owned by the filter.
import type { Endpoint } from '../../endpoints/endpoint.js';

export function keepIf(
  eps: readonly Endpoint[],
  scratch: Endpoint[],
  pass: (ep: Endpoint) => boolean,
): readonly Endpoint[] {
  let firstFail = -1;
  for (let i = 0; i < eps.length; i++) {
    if (!pass(eps[i])) {
      firstFail = i;
      break;
    }
  }
  if (firstFail < 0) return eps;
  scratch.length = 0;
  for (let i = 0; i < firstFail; i++) scratch.push(eps[i]);
  for (let i = firstFail + 1; i < eps.length; i++) if (pass(eps[i])) scratch.push(eps[i]);
  return scratch;
}
