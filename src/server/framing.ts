// Request framing checks for the uWS front end (RFC 9112 6.1, 6.3), and the W3C trace
// headers read in the same header walk.
import type { HttpRequest } from '../uws.js';

// uWS 20.30 frames a body by the FIRST Content-Length line and decodes any
// Transfer-Encoding value as chunked; a proxy in front of the router may pick
// another line or refuse the coding, and the two then disagree where the next
// request starts (request smuggling). req.forEach walks every header line uWS
// parsed, duplicates included (req.getHeader returns the first one only).
// Module-level state and callback: no closure per request.
let scanLength: string | null = null;
let scanCodings = 0;
let scanProblem = '';
// W3C trace context, read in the same walk (no getHeader call per request): repeated
// lines joined with ',' (tracestate and baggage are lists; two traceparent lines make
// an invalid value, which the director replaces)
export let scanTraceparent = '';
export let scanTracestate = '';
export let scanBaggage = '';
function scanFramingHeader(key: string, value: string): void {
  if (key.length === 11 && key === 'traceparent') scanTraceparent = scanTraceparent === '' ? value : `${scanTraceparent},${value}`;
  else if (key.length === 10 && key === 'tracestate') scanTracestate = scanTracestate === '' ? value : `${scanTracestate},${value}`;
  else if (key.length === 7 && key === 'baggage') scanBaggage = scanBaggage === '' ? value : `${scanBaggage},${value}`;
  else if (key.length === 14 && key === 'content-length') {
    if (scanLength === null) scanLength = value;
    else if (value !== scanLength && scanProblem === '') scanProblem = `conflicting Content-Length headers (${JSON.stringify(scanLength)} and ${JSON.stringify(value)})`;
  } else if (key.length === 17 && key === 'transfer-encoding') {
    if (++scanCodings > 1) {
      if (scanProblem === '') scanProblem = 'more than one Transfer-Encoding header';
    } else if (value.length !== 7 || value.toLowerCase() !== 'chunked') {
      if (scanProblem === '') scanProblem = `Transfer-Encoding ${JSON.stringify(value)} is not supported (only "chunked")`;
    }
  }
}

/**
 * Why the request's body framing is ambiguous ('' if it is not): Content-Length
 * lines that differ, more than one Transfer-Encoding line, or a coding other
 * than exactly `chunked`. (Content-Length together with Transfer-Encoding, and
 * a Content-Length that is not a number, uWS rejects itself by closing.)
 */
export function framingProblem(req: HttpRequest): string {
  scanLength = null;
  scanCodings = 0;
  scanProblem = '';
  scanTraceparent = scanTracestate = scanBaggage = '';
  req.forEach(scanFramingHeader);
  return scanProblem;
}
