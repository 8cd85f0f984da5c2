// Runs the JS SDK's own live integration tests (its vitest config excludes them), from a copy
// of the SDK under target/ (see server/tests/sdks.sh); `--root` points at that copy. A plain
// object, so this file needs no packages of its own.
export default {
  test: {
    include: ['tests/integration/**/*.test.ts'],
    testTimeout: 30000,
    hookTimeout: 30000,
  },
};
