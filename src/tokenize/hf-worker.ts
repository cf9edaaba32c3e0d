// Worker-thread side of the Hugging Face tokenizer (hf-tokenizer.ts): loads a
// model directory's tokenizer.json (with @huggingface/tokenizers, pure JS) and
// the chat template of tokenizer_config.json (with @huggingface/jinja), once
// per worker and directory; renders chat messages with the template (with the
// generation prompt, as vLLM's chat endpoint does) and encodes. Returns the
// token ids as little-endian uint32 bytes (transferred, not copied).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Template } from '@huggingface/jinja';
import { Tokenizer } from '@huggingface/tokenizers';

export interface HfTask {
  dir: string;
  messages?: unknown;
  prompt?: string;
}

interface Loaded {
  tok: Tokenizer;
  template: Template | null;
  special: Record<string, string>;
}

const loaded = new Map<string, Loaded>();

function load(dir: string): Loaded {
  let l = loaded.get(dir);
  if (l !== undefined) return l;
  const json = JSON.parse(readFileSync(join(dir, 'tokenizer.json'), 'utf8')) as object;
  let config: Record<string, unknown> = {};
  try {
    config = JSON.parse(readFileSync(join(dir, 'tokenizer_config.json'), 'utf8')) as Record<string, unknown>;
  } catch {
    // no config: prompts only (a chat request then fails and falls back to approximate)
  }
  const tok = new Tokenizer(json, config);
  const t = config.chat_template;
  const src = typeof t === 'string' ? t : Array.isArray(t) ? ((t.find((x) => x?.name === 'default') ?? t[0])?.template as string | undefined) : undefined;
  const special: Record<string, string> = {};
  for (const k of ['bos_token', 'eos_token', 'unk_token', 'pad_token']) {
    const v = config[k];
    if (typeof v === 'string') special[k] = v;
    else if (v && typeof v === 'object' && typeof (v as { content?: unknown }).content === 'string') special[k] = (v as { content: string }).content;
  }
  l = { tok, template: src ? new Template(src) : null, special };
  loaded.set(dir, l);
  return l;
}

export default function tokenize(task: HfTask): Uint8Array {
  const l = load(task.dir);
  let ids: number[];
  if (task.messages !== undefined) {
    if (l.template === null) throw new Error(`${task.dir}: no chat_template in tokenizer_config.json`);
    const text = l.template.render({ messages: task.messages, add_generation_prompt: true, ...l.special });
    // the template already wrote the special tokens (vLLM renders chat with add_special_tokens=False)
    ids = l.tok.encode(text, { add_special_tokens: false }).ids;
  } else {
    ids = l.tok.encode(task.prompt ?? '').ids;
  }
  const out = new Uint32Array(ids.length);
  for (let i = 0; i < ids.length; i++) out[i] = ids[i]!;
  return new Uint8Array(out.buffer);
}
