import { defineConfig } from 'nitro';

export default defineConfig({
  modules: ['workflow/nitro'],
  plugins: ['./plugins/world-start.ts'],
  routes: {
    '/**': './src/index.ts',
  },
});
