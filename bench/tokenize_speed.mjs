#!/usr/bin/env node
// The reference encoders' speed on a text, for bench/tokenize_speed.sh: prints
// "<name> <MiB/s> <tokens>" for gpt2 (gpt-3-encoder), llama3 (llama3-tokenizer-js), llama2
// (llama-tokenizer-js) and hf-llama3 (@huggingface/tokenizers on the written tokenizer.json).
// Usage: node bench/tokenize_speed.mjs TEXT TOKENIZERS_DIR   (after `cd tools && npm ci`)
import fs from 'fs';
import path from 'path';
import { createRequire } from 'module';
import { fileURLToPath } from 'url';

const tools = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'tools');
const require = createRequire(import.meta.url);
const [textPath, tokDir] = process.argv.slice(2);
// As `tessera tokenize` reads a text file: one document, its edge line breaks trimmed.
const text = fs.readFileSync(textPath, 'utf8').replace(/^[\r\n]+|[\r\n]+$/g, '');
const mib = Buffer.byteLength(text) / (1 << 20);

const gpt2 = require(path.join(tools, 'node_modules/gpt-3-encoder'));
const { Llama3Tokenizer } = await import(
  path.join(tools, 'node_modules/llama3-tokenizer-js/bundle/llama3-tokenizer-with-baked-data.js'));
const llama2 = (await import(path.join(tools, 'node_modules/llama-tokenizer-js/llama-tokenizer.js'))).default;
const { Tokenizer } = require(path.join(tools, 'node_modules/@huggingface/tokenizers/dist/tokenizers.cjs'));
const llama3 = new Llama3Tokenizer();
const hf = new Tokenizer(JSON.parse(fs.readFileSync(path.join(tokDir, 'llama3/tokenizer.json'), 'utf8')),
                         JSON.parse(fs.readFileSync(path.join(tokDir, 'llama3/tokenizer_config.json'), 'utf8')));

const runs = {
  gpt2: () => gpt2.encode(text),
  llama3: () => llama3.encode(text, { bos: false, eos: false }),
  llama2: () => llama2.encode(text, false, true),
  'hf-llama3': () => hf.encode(text, { add_special_tokens: false }).ids,
};
for (const [name, run] of Object.entries(runs)) {
  const t0 = performance.now();
  const ids = run();
  const s = (performance.now() - t0) / 1000;
  console.log(`${name} ${(mib / s).toFixed(3)} ${ids.length}`);
}
