/**
 * The benchmark's workflow: five sequential steps, each a small amount of real work, so the run's
 * cost is the World's (events, queue messages, index entries), not the steps'.
 */

async function stepOne(seed: number) {
  'use step';
  return { seed, acc: seed * 31 + 7 };
}

async function stepTwo(state: { seed: number; acc: number }) {
  'use step';
  return { ...state, acc: (state.acc * 17 + 3) % 1000003 };
}

async function stepThree(state: { seed: number; acc: number }) {
  'use step';
  return { ...state, label: `run-${state.seed}-${state.acc.toString(36)}` };
}

async function stepFour(state: { seed: number; acc: number; label: string }) {
  'use step';
  return { ...state, acc: state.acc ^ 0x5a5a };
}

async function stepFive(state: { seed: number; acc: number; label: string }) {
  'use step';
  return { done: true, label: state.label, acc: state.acc };
}

export async function benchFlow(seed: number) {
  'use workflow';
  const a = await stepOne(seed);
  const b = await stepTwo(a);
  const c = await stepThree(b);
  const d = await stepFour(c);
  return await stepFive(d);
}
