// Builds the survey page's script: src/page.js with the client and its
// libraries in one minified file, written into the Python package so that
// `pip install -e .` alone serves a working page. CI rebuilds it and fails if
// the committed file differs (.ci/run).

import { build } from 'esbuild';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const outfile = resolve(here, '..', '..', 'src', 'veil', 'web', 'static', 'veil-survey.js');

await build({
  entryPoints: [resolve(here, '..', 'src', 'page.js')],
  bundle: true,
  minify: true,
  format: 'iife',
  // BigInt literals and optional chaining: every browser with WebCrypto X25519 has them.
  target: ['es2022'],
  platform: 'browser',
  legalComments: 'none',
  banner: {
    js: '/* veil survey client: built by js/scripts/build.mjs from js/src (Apache-2.0); bundles @noble/hashes (MIT) and @hpke/core (MIT) */',
  },
  outfile,
  logLevel: 'warning',
});
console.log(outfile);
