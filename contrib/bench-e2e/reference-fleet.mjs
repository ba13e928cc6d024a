/**
 * Starts world-celld's in-memory reference fleet (`startDevFleet` from the installed
 * `@ewhauser/world-celld/testing` entry: the real router and cell classes over Map-backed state,
 * alarms pumped every 25 ms) on a fixed 127.0.0.1 port.
 *
 *   node reference-fleet.mjs --port N --secret S
 *
 * The testing entry always listens on an ephemeral port; this wrapper makes the first
 * `listen(0, '127.0.0.1')` of the process use --port instead, so the fleet's own code is unchanged.
 * Prints one line `reference fleet listening on http://127.0.0.1:N pid=P` and runs until SIGTERM
 * or SIGINT. State is in memory only: every start is a fresh fleet.
 */
import http from 'node:http';
import { parseArgs } from 'node:util';

const { values } = parseArgs({
  options: { port: { type: 'string' }, secret: { type: 'string' } },
});
const port = Number(values.port);
if (!Number.isInteger(port) || port <= 0 || !values.secret) {
  console.error('usage: node reference-fleet.mjs --port N --secret S');
  process.exit(2);
}

const listen = http.Server.prototype.listen;
let patched = false;
http.Server.prototype.listen = function (...args) {
  if (!patched && args[0] === 0) {
    patched = true;
    args[0] = port;
  }
  return listen.apply(this, args);
};

const { startDevFleet } = await import('@ewhauser/world-celld/testing');
const fleet = await startDevFleet({ secret: values.secret });
http.Server.prototype.listen = listen;
if (!fleet.url.endsWith(`:${port}`)) {
  console.error(`reference fleet came up on ${fleet.url}, not port ${port}`);
  process.exit(1);
}
console.log(`reference fleet listening on ${fleet.url} pid=${process.pid}`);

const stop = async () => {
  // the harness's close() waits for open keep-alive connections: give it a second at most
  setTimeout(() => process.exit(0), 1000).unref();
  await fleet.stop().catch(() => {});
  process.exit(0);
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
setInterval(() => {}, 1 << 30);
