/**
 * Completion signal for the benchmark: wraps `world.events.create` so that when the World has
 * acknowledged a run's terminal event (run_completed, run_failed, run_cancelled), a waiter for
 * that runId resolves with the acknowledgement time. No extra RPC is made; the timing is that of
 * the write the workflow runtime itself performs (workflow 4.6.0 records run completion through
 * `world.events.create`).
 */

type Outcome = { status: string; atMs: number };

let markReady: () => void = () => {};
/** Resolves once the plugin has started the World (the health route waits on it). */
export const worldReady = new Promise<void>((resolve) => {
  markReady = resolve;
});
export function setWorldReady(): void {
  markReady();
}

const TERMINAL = new Set(['run_completed', 'run_failed', 'run_cancelled']);
const done = new Map<string, Outcome>();
const waiters = new Map<string, (o: Outcome) => void>();

export function watchTerminalEvents(world: any): void {
  const events = world.events;
  if (events.__benchWatched) return;
  const original = events.create.bind(events);
  events.create = async (runId: string, data: any, ...rest: unknown[]) => {
    const result = await original(runId, data, ...rest);
    const type = data?.eventType;
    if (TERMINAL.has(type)) {
      const outcome = { status: type.slice(4), atMs: Date.now() };
      const waiter = waiters.get(runId);
      if (waiter) {
        waiters.delete(runId);
        waiter(outcome);
      } else {
        done.set(runId, outcome);
      }
    }
    return result;
  };
  events.__benchWatched = true;
}

/** Resolves with the run's terminal outcome, or `{status: 'timeout'}` after `timeoutMs`. */
export function waitForTerminal(runId: string, timeoutMs: number): Promise<Outcome> {
  const early = done.get(runId);
  if (early) {
    done.delete(runId);
    return Promise.resolve(early);
  }
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      waiters.delete(runId);
      resolve({ status: 'timeout', atMs: Date.now() });
    }, timeoutMs);
    waiters.set(runId, (o) => {
      clearTimeout(timer);
      resolve(o);
    });
  });
}
