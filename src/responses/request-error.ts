// ResponsesError: a request the Responses layer answers itself, in OpenAI's
// error shape (a leaf: request.ts, tools.ts and items.ts all raise it).

export class ResponsesError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly param: string | null = null,
    readonly code?: string,
  ) {
    super(message);
  }
}
