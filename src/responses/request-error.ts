// ResponsesError: a request the Responses layer answers itself, in OpenAI's
// error shape (a leaf: request.ts, tools.ts and items.ts all raise it).
import { SwitchyardError } from '../errors.js';

/** A request the Responses layer answers itself, in OpenAI's error shape: `status`, `param` and `code` (the OpenAI error code, undefined: the status's default). */
export class ResponsesError extends SwitchyardError<string | undefined> {
  constructor(
    readonly status: number,
    message: string,
    readonly param: string | null = null,
    override readonly code: string | undefined = undefined,
  ) {
    super(message);
  }

  override get swyCode(): string {
    return 'SWY_ERR_RESPONSES_REQUEST';
  }
}
