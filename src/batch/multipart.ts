// A multipart/form-data body (RFC 7578) as the Files API receives it: the
// openai SDKs send `purpose` as a plain field and `file` as a part with a
// filename. The whole body is already in memory (bounded by
// batch.maxFileBytes); parts are views into it, never copies.

export interface FormPart {
  data: Buffer;
  filename: string | null;
}

const CRLF = Buffer.from('\r\n');
const HEADERS_END = Buffer.from('\r\n\r\n');

/** The parts by field name (the first of a repeated name wins); a string is why the body is not multipart. */
export function parseMultipart(contentType: string, body: Buffer): Map<string, FormPart> | string {
  if (!/^multipart\/form-data\s*(;|$)/i.test(contentType)) return `content-type must be multipart/form-data (got ${JSON.stringify(contentType.slice(0, 80))})`;
  const m = /;\s*boundary=(?:"([^"]{1,70})"|([^;\s]{1,70}))/i.exec(contentType);
  if (m === null) return 'multipart/form-data without a boundary';
  const delim = Buffer.from(`--${m[1] ?? m[2]}`);
  const parts = new Map<string, FormPart>();
  let pos = body.indexOf(delim);
  if (pos < 0) return 'multipart body without its boundary';
  for (;;) {
    pos += delim.length;
    if (body[pos] === 0x2d && body[pos + 1] === 0x2d) return parts; // the closing delimiter
    // transport padding after a delimiter, then CRLF
    while (body[pos] === 0x20 || body[pos] === 0x09) pos++;
    if (body[pos] !== 0x0d || body[pos + 1] !== 0x0a) return 'malformed multipart delimiter line';
    pos += 2;
    const headEnd = body.indexOf(HEADERS_END, pos);
    if (headEnd < 0) return 'multipart part without the end of its headers';
    const head = body.toString('utf8', pos, headEnd);
    const next = body.indexOf(Buffer.concat([CRLF, delim]), headEnd + 4);
    if (next < 0) return 'multipart part without a closing boundary';
    const disp = /^content-disposition:\s*form-data\s*;(.*)$/im.exec(head);
    if (disp !== null) {
      const name = /(?:^|;)\s*name="([^"]*)"/i.exec(disp[1]);
      const file = /(?:^|;)\s*filename="([^"]*)"/i.exec(disp[1]);
      if (name !== null && !parts.has(name[1])) parts.set(name[1], { data: body.subarray(headEnd + 4, next), filename: file === null ? null : file[1] });
    }
    pos = next + 2;
  }
}
