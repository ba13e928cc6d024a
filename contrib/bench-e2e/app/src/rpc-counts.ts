/**
 * Counts the fleet RPCs the world-celld client makes (`POST <fleet>/v1/rpc/{binding}/{name}/
 * {method}`, docs/protocol.md §2.1) by wrapping the global fetch the client calls; every other
 * request passes through uncounted. Read with `rpcCounts()`; the benchmark route serves it so the
 * driver can report RPCs per run by method.
 */
const RPC_PATH = /\/v1\/rpc\/([^/]+)\/[^/]+\/([^/?]+)/;
const counts = new Map<string, number>();
let failed = 0;

export function countFleetRpcs(): void {
  const original = globalThis.fetch;
  if ((original as any).__benchCounting) return;
  const counting = async (input: any, init?: any) => {
    const url = typeof input === 'string' ? input : input instanceof URL ? input.href : input?.url;
    const match = typeof url === 'string' ? RPC_PATH.exec(url) : null;
    if (!match) return original(input, init);
    const key = `${match[1]}.${match[2]}`;
    counts.set(key, (counts.get(key) ?? 0) + 1);
    const response = await original(input, init);
    if (!response.ok) failed += 1;
    return response;
  };
  (counting as any).__benchCounting = true;
  globalThis.fetch = counting as typeof fetch;
}

/** `{"rpcs": {"runs.applyEvent": n, ...}, "failed": n}` since the process started. */
export function rpcCounts(): { rpcs: Record<string, number>; failed: number } {
  return { rpcs: Object.fromEntries(counts), failed };
}
