// A request the simulator refuses: status, message and the field at fault
// (request.ts and tools.ts both raise it; a leaf of its own, so neither imports the other).
export class BadRequest {
  constructor(
    readonly status: number,
    readonly message: string,
    readonly param: string | null,
  ) {}
}
