#!/usr/bin/env python3
"""Reference tokenizers for tests/cli/tokenizers.sh and tests/bench/tokenize.sh (test-only tools).

  tokenizer_reference.py build DIR TEXT     train small tokenizers on TEXT into DIR (no downloads):
      gpt2.json         byte-level BPE, ByteLevel pre-tokenizer (GPT-2's regex), merges as [a, b] pairs
      gpt2_strings.json the same file with merges in the older "a b" string form
      llama3.json       Sequence[Split(Llama 3's regex, Isolated), ByteLevel(use_regex=False)], ignore_merges,
                        special tokens at ids 128000.. (so the token file needs uint32)
      qwen.json         NFC normalizer, Sequence[Split(Qwen 2's regex), ByteLevel(use_regex=False)]
      llama2.model      SentencePiece BPE with byte fallback, identity normalization (Llama 2's settings)
      unigram.model     SentencePiece unigram with its default normalization (nmt_nfkc)
  tokenizer_reference.py encode TOKENIZER TEXT     print the reference ids' count and a checksum
  tokenizer_reference.py compare TOKENIZER TEXT BIN check that BIN (an llm.c .bin) holds exactly the reference ids
  tokenizer_reference.py bigtext TEXT MB OUT       a deterministic OUT of about MB megabytes built from TEXT
  tokenizer_reference.py bench TOKENIZER TEXT [BIN] Python `tokenizers` throughput, MB/s, of encode_batch (64-line
      pieces) and encode (the whole text), and whether BIN holds the same ids (one JSON line)

Reference ids: HF `tokenizers` Tokenizer.encode(text, add_special_tokens=False) on the whole text; SentencePiece
encodes each line with its '\\n' (what fsdpp documents), concatenated.
"""
import json
import os
import random
import struct
import sys
import time

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_suffix|>"]


def train_bpe(text, split_regex, path):
    from tokenizers import Tokenizer, Regex, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    if split_regex is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split_regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer)
    tok.save(path)


def edit_json(src, dst, edit):
    with open(src, encoding="utf-8") as f:
        j = json.load(f)
    edit(j)
    with open(dst, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)


def llama3_edit(j):
    # Llama 3's shape: ignore_merges, 128000 vocabulary entries, special tokens after them (so uint32 token files).
    # Fillers contain a plain space, which no byte-level piece does, so no text ever maps to them.
    j["model"]["ignore_merges"] = True
    vocab = j["model"]["vocab"]
    for t in j["added_tokens"]:
        del vocab[t["content"]]
    used = set(vocab.values())
    for i in (k for k in range(128000) if k not in used):
        vocab["filler %d" % i] = i
    j["added_tokens"].append({"id": 0, "content": "<|eot_id|>", "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": True})
    for i, t in enumerate(j["added_tokens"]):
        t["id"] = 128000 + i


def build(out_dir, text_path):
    import sentencepiece as spm
    text = open(text_path, encoding="utf-8").read()
    os.makedirs(out_dir, exist_ok=True)
    gpt2 = os.path.join(out_dir, "gpt2.json")
    train_bpe(text, None, gpt2)
    edit_json(gpt2, os.path.join(out_dir, "gpt2_strings.json"),
              lambda j: j["model"].update(merges=[" ".join(m) for m in j["model"]["merges"]]))
    train_bpe(text, LLAMA3_REGEX, os.path.join(out_dir, "llama3_trained.json"))
    edit_json(os.path.join(out_dir, "llama3_trained.json"), os.path.join(out_dir, "llama3.json"), llama3_edit)
    train_bpe(text, QWEN_REGEX, os.path.join(out_dir, "qwen_trained.json"))
    edit_json(os.path.join(out_dir, "qwen_trained.json"), os.path.join(out_dir, "qwen.json"),
              lambda j: j.update(normalizer={"type": "NFC"}))
    lines = text.split("\n")
    common = dict(sentence_iterator=iter(lines), vocab_size=1000, character_coverage=1.0,
                  hard_vocab_limit=False, num_threads=1, minloglevel=2)
    spm.SentencePieceTrainer.train(model_prefix=os.path.join(out_dir, "llama2"), model_type="bpe",
                                   byte_fallback=True, normalization_rule_name="identity",
                                   remove_extra_whitespaces=False, split_digits=True, **common)
    common["sentence_iterator"] = iter(lines)
    spm.SentencePieceTrainer.train(model_prefix=os.path.join(out_dir, "unigram"), model_type="unigram", **common)


def reference_ids(tokenizer_path, text):
    if tokenizer_path.endswith(".model"):
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=tokenizer_path)
        lines = [line + "\n" for line in text.split("\n")]
        lines[-1] = lines[-1][:-1]
        ids = []
        for line in lines:
            if line:
                ids.extend(sp.encode(line))
        return ids, sp.get_piece_size()
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer_path)
    return tok.encode(text, add_special_tokens=False).ids, max(tok.get_vocab(with_added_tokens=True).values()) + 1


def read_bin(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, count = struct.unpack("<3i", data[:12])
    width = {(20240520, 1): "H", (20240801, 7): "I"}[(magic, version)]
    ids = list(struct.unpack("<%d%s" % (count, width), data[1024:]))
    return ids, width


def compare(tokenizer_path, text_path, bin_path):
    text = open(text_path, encoding="utf-8", newline="").read()
    want, vocab = reference_ids(tokenizer_path, text)
    got, width = read_bin(bin_path)
    name = os.path.basename(tokenizer_path)
    expected_width = "I" if vocab > 65536 else "H"
    if width != expected_width:
        sys.exit(f"{name}: token width {width}, expected {expected_width} for vocab {vocab}")
    if got == want:
        print(f"{name}: {len(got)} ids identical to the Python reference (vocab {vocab}, uint{16 if width == 'H' else 32})")
        return
    i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
    sys.exit(f"{name}: ids differ from the Python reference at position {i} of {len(want)} (fsdpp {len(got)} ids): "
             f"fsdpp {got[max(0, i - 3):i + 5]} vs python {want[max(0, i - 3):i + 5]}")


def bigtext(text_path, megabytes, out_path):
    base = open(text_path, encoding="utf-8").read().split("\n")
    rng = random.Random(20240520)
    target = int(float(megabytes) * 1e6)
    size = 0
    with open(out_path, "w", encoding="utf-8") as f:
        while size < target:
            para = "\n".join(rng.sample(base, k=min(12, len(base)))) + f"\nParagraph {rng.randrange(10**6)}.\n"
            f.write(para)
            size += len(para.encode("utf-8"))


def bench(tokenizer_path, text_path, bin_path=None):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer_path)
    data = open(text_path, encoding="utf-8", newline="").read()
    nbytes = len(data.encode("utf-8"))
    lines = data.split("\n")
    batch = ["\n".join(lines[i:i + 64]) + "\n" for i in range(0, len(lines), 64)]
    t0 = time.perf_counter()
    tok.encode_batch(batch, add_special_tokens=False)
    batch_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ids = tok.encode(data, add_special_tokens=False).ids
    single_s = time.perf_counter() - t0
    result = {"bytes": nbytes, "tokens": len(ids), "batch_mb_per_s": nbytes / 1e6 / batch_s,
              "encode_mb_per_s": nbytes / 1e6 / single_s}
    if bin_path:
        result["fsdpp_ids_identical"] = read_bin(bin_path)[0] == ids
    print(json.dumps(result))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "build":
        build(*args)
    elif cmd == "encode":
        ids, vocab = reference_ids(args[0], open(args[1], encoding="utf-8", newline="").read())
        print(len(ids), vocab, hash(tuple(ids)))
    elif cmd == "compare":
        compare(*args)
    elif cmd == "bigtext":
        bigtext(*args)
    elif cmd == "bench":
        bench(*args)
    else:
        sys.exit(__doc__)
