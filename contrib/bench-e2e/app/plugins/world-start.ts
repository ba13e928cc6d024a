/**
 * Nitro plugin: picks up the World named by WORKFLOW_TARGET_WORLD, starts it (world-postgres's
 * graphile worker needs `world.start()`; the other Worlds' start is a no-op or absent), and
 * watches its terminal event writes so the benchmark route can answer the moment a run's
 * `run_completed` / `run_failed` write has been acknowledged by the World. /bench/health answers
 * only after the World has started.
 */
import { definePlugin } from 'nitro';
import { getWorld } from 'workflow/runtime';
import { setWorldReady, watchTerminalEvents } from '../src/completions.js';

export default definePlugin(async () => {
  const world = getWorld();
  watchTerminalEvents(world);
  await world.start?.();
  setWorldReady();
  console.log(`[bench-app] world ${process.env.WORKFLOW_TARGET_WORLD ?? 'local'} started`);
});
