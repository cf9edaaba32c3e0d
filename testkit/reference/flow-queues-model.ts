// Plain-array reference model of the native FlowQueues (single thread):
// one bounded FIFO per flow, capacity rounded up to a power of two (>= 2).
export interface ModelRecord {
  id: number;
  bytes: number;
  time: number;
}

export class FlowQueuesModel {
  readonly capacity: number;
  readonly queues: ModelRecord[][];

  constructor(flows: number, capacity: number) {
    let cap = 2;
    while (cap < capacity) cap *= 2;
    this.capacity = cap;
    this.queues = Array.from({ length: flows }, () => []);
  }

  enqueue(flow: number, r: ModelRecord): boolean {
    const q = this.queues[flow]!;
    if (q.length >= this.capacity) return false;
    q.push({ ...r });
    return true;
  }

  enqueueBatch(flow: number, rs: ModelRecord[]): number {
    let n = 0;
    for (const r of rs) {
      if (!this.enqueue(flow, r)) break;
      n++;
    }
    return n;
  }

  dequeueBatch(flow: number, max: number): ModelRecord[] {
    return this.queues[flow]!.splice(0, max);
  }

  peek(flow: number): ModelRecord | undefined {
    return this.queues[flow]![0];
  }

  size(flow: number): number {
    return this.queues[flow]!.length;
  }
}
