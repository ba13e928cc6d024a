/**
 * Nitro plugin: picks up the World named by WORKFLOW_TARGET_WORLD, starts it (world-postgres's
 * graphile worker needs `world.start()`; the other Worlds' start is a no-op or absent), and
 * watches its terminal event writes so the benchmark route can answer the moment a run's
 * `run_completed` / `run_failed` write has been acknowledged by the World. /bench/health answers
 * only after the World has started. Fleet RPCs of the world-celld client are counted by method
 * (src/rpc-counts.ts).
 */
import { definePlugin } from 'nitro';
import { getWorld } from 'workflow/runtime';
import { setWorldReady, watchTerminalEvents } from '../src/completions.js';
import { countFleetRpcs } from '../src/rpc-counts.js';

export default definePlugin(async () => {
  countFleetRpcs();
  const world = getWorld();
  watchTerminalEvents(world);
  const name = process.env.WORKFLOW_TARGET_WORLD ?? 'local';
  try {
    await world.start?.();
    console.log(`[bench-app] world ${name} started`);
  } catch (error) {
    // world-local 4.2.1 inside a Nitro bundle fails its data-dir version check ("bundled") in
    // start(); it serves runs without it, as it does when nothing calls start().
    console.error(`[bench-app] world ${name}: start() failed, continuing without it:`, error);
  }
  setWorldReady();
});
