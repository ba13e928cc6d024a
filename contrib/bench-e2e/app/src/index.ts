/**
 * The benchmark app's routes.
 *
 *   GET  /bench/health        -> {"world": "<WORKFLOW_TARGET_WORLD>"} once the World has started
 *   GET  /bench/stats         -> {"rpcs": {"<binding>.<method>": count}, "failed": count}: the
 *                                world-celld client's fleet RPCs since start (empty for the
 *                                Worlds that make none)
 *   POST /bench/run?seed=N    -> starts benchFlow(N) and answers when the World has acknowledged
 *                                the run's terminal event:
 *                                {"runId", "status": "completed"|"failed"|"cancelled"|"timeout",
 *                                 "startMs": ms spent in start(), "latencyMs": start() call ->
 *                                 terminal event acknowledged}
 */
import { Hono } from 'hono';
import { start } from 'workflow/api';
import { benchFlow } from '../workflows/bench.js';
import { waitForTerminal, worldReady } from './completions.js';
import { rpcCounts } from './rpc-counts.js';

const RUN_TIMEOUT_MS = Number(process.env.BENCH_RUN_TIMEOUT_MS ?? 180_000);

const app = new Hono()
  .get('/bench/health', async (c) => {
    await worldReady;
    return c.json({ world: process.env.WORKFLOW_TARGET_WORLD ?? 'local' });
  })
  .get('/bench/stats', (c) => c.json(rpcCounts()))
  .post('/bench/run', async (c) => {
    const seed = Number(c.req.query('seed') ?? 0);
    const t0 = Date.now();
    let runId: string;
    try {
      const run = await start(benchFlow, [seed]);
      runId = run.runId;
    } catch (error) {
      return c.json({ status: 'start_error', error: String(error) }, 500);
    }
    const startMs = Date.now() - t0;
    const outcome = await waitForTerminal(runId, RUN_TIMEOUT_MS);
    return c.json({ runId, status: outcome.status, startMs, latencyMs: outcome.atMs - t0 });
  });

export default app;
