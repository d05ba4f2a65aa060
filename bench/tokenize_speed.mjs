#!/usr/bin/env node
// The reference encoders' speed on a text, for bench/tokenize_speed.sh: prints
// "<name> <MiB/s> <tokens>" for @huggingface/tokenizers (the JavaScript port of Hugging Face's
// tokenizers) on GPT-2's, Llama 3's and Llama 2's tokenizer.json, and for the packages that
// ship Llama 3's and Llama 2's vocabularies with encoders of their own (llama3-tokenizer-js,
// llama-tokenizer-js). gpt-3-encoder, the GPT-2 reference of the golden ids, is left out: it
// takes minutes on a 1 MiB document.
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

const { Llama3Tokenizer } = await import(
  path.join(tools, 'node_modules/llama3-tokenizer-js/bundle/llama3-tokenizer-with-baked-data.js'));
const llama2 = (await import(path.join(tools, 'node_modules/llama-tokenizer-js/llama-tokenizer.js'))).default;
const { Tokenizer } = require(path.join(tools, 'node_modules/@huggingface/tokenizers/dist/tokenizers.cjs'));
const llama3 = new Llama3Tokenizer();
const readJson = (f) => JSON.parse(fs.readFileSync(f, 'utf8'));
const hf = (name) => new Tokenizer(readJson(path.join(tokDir, name, 'tokenizer.json')),
                                   readJson(path.join(tokDir, name, 'tokenizer_config.json')));
// GPT-2's files as a tokenizer.json, as the Hub's gpt2 folder has it.
const gpt2Dir = path.join(tools, '..', 'data', 'gpt2');
const merges = fs.readFileSync(path.join(gpt2Dir, 'vocab.bpe'), 'utf8').split('\n')
                 .filter((l) => l && !l.startsWith('#'));
const gpt2 = new Tokenizer({
  added_tokens: [{ id: 50256, content: '<|endoftext|>', special: true }],
  normalizer: null,
  pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
  post_processor: { type: 'ByteLevel', trim_offsets: true },
  decoder: { type: 'ByteLevel' },
  model: { type: 'BPE', vocab: readJson(path.join(gpt2Dir, 'encoder.json')), merges },
}, { eos_token: '<|endoftext|>' });

const runs = {
  gpt2: () => gpt2.encode(text, { add_special_tokens: false }).ids,
  llama3: () => hf('llama3').encode(text, { add_special_tokens: false }).ids,
  llama2: () => hf('llama2').encode(text, { add_special_tokens: false }).ids,
  'llama3-tokenizer-js': () => llama3.encode(text, { bos: false, eos: false }),
  'llama-tokenizer-js': () => llama2.encode(text, false, true),
};
for (const [name, run] of Object.entries(runs)) {
  const t0 = performance.now();
  const ids = run();
  const s = (performance.now() - t0) / 1000;
  console.log(`${name} ${(mib / s).toFixed(3)} ${ids.length}`);
}
