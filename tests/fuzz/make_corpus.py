#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz/corpus/<target>/ and the dictionaries of tests/fuzz/dict/ (stdlib only).

Run from anywhere after changing a format; the files are committed, so CI never runs this. Seeds are small
valid inputs (and a few near misses), from which libFuzzer mutates."""
import json
import os
import re
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- deck: the real decks, plus overrides (after a "#overrides" line) ----
for deck in sorted(os.listdir(os.path.join(ROOT, "input"))):
    with open(os.path.join(ROOT, "input", deck)) as f:
        text = f.read()
    write("deck", deck, text)
tiny = open(os.path.join(ROOT, "input", "tiny.yaml")).read()
write("deck", "tiny-overrides.yaml", tiny + "#overrides\ntrain.steps=4\nrun.name=fuzz\nfsdp.param_dtype=bf16\n")
write("deck", "minimal.yaml", "train:\n  steps: 10\n")
write("deck", "overrides-only.yaml", "#overrides\ntrain.steps=3\nmodel.n_head=2\nmodel.n_embd=8\n")
write("deck", "hsdp.yaml",
      "train: {steps: 5, global_batch: 8, micro_batch: 2}\n"
      "mesh: {dp_replicate: 2, dp_shard: -1}\n"
      "fsdp:\n  strategy: hybrid_shard\n  reshard_after_forward: 2\n  param_dtype: bf16\n  reduce_dtype: f32\n"
      "  offload: cpu\n  accumulate: unsharded\n"
      "comm: {backend: mpi}\n"
      "checkpoint:\n  interval: 2\n  resume: auto\n  keep_last: 3\n  async: true\n"
      "data: {source: tokens.bin, format: gpt2, order: sequential, val_fraction: 0.1}\n"
      "optim: {name: sgd, momentum: 0.8, lr: 0.01}\n"
      "schedule: {kind: cosine, warmup_steps: 1, min_lr: 0.001}\n"
      "log: {interval: 1, header_every: 0}\n")
write("deck", "aliases.yaml", "train:\n  max_steps: 7\n  batch_size: 4\nschedule:\n  type: constant\n"
      "#overrides\ncheckpoint.resume=path\ncheckpoint.init_from=none\n")

# ---- token_file: one control byte (format: 0 .bin, 1 .u16, 2 .u32; vocab bound in bits 2-3), then the file ----
def gpt2_bin(tokens, version=1):
    header = [20240520, version, len(tokens)] + [0] * 253
    fmt = "<%dH" % len(tokens) if version == 1 else "<%dI" % len(tokens)
    return struct.pack("<256i", *header) + struct.pack(fmt, *tokens)

write("token_file", "gpt2-v1.bin", bytes([0]) + gpt2_bin([1, 2, 3, 63, 0, 5]))
write("token_file", "gpt2-v1-vocab64.bin", bytes([0 | 4]) + gpt2_bin(list(range(64))))
write("token_file", "gpt2-v2.bin", bytes([3 | 8]) + gpt2_bin([50000, 1, 2, 50256], version=2))
write("token_file", "raw.u16", bytes([1]) + struct.pack("<8H", 0, 1, 2, 3, 4, 65535, 7, 9))
write("token_file", "raw.u32", bytes([2 | 12]) + struct.pack("<4I", 0, 65535, 65536, 12))
write("token_file", "gpt2-empty.bin", bytes([0]) + gpt2_bin([]))

# ---- safetensors: 8-byte header length, JSON header, data ----
def safetensors(tensors, metadata=None, pad=True):
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data

f32 = struct.pack("<6f", 0.5, -1.0, 2.0, 3.25, 0.0, 1e-3)
write("safetensors", "f32.safetensors", safetensors([("wte.weight", "F32", [2, 3], f32)], {"format": "pt"}))
write("safetensors", "mixed.safetensors", safetensors([
    ("h.0.attn.c_attn.weight", "F16", [2, 2], struct.pack("<4H", 0x3C00, 0xC000, 0x0001, 0x7C00)),
    ("h.0.ln_1.bias", "BF16", [3], struct.pack("<3H", 0x3F80, 0xBF80, 0x7FC0)),
    ("step", "I64", [], struct.pack("<q", 42)),
    ("empty", "F32", [0, 4], b""),
    ("mask", "BOOL", [2], b"\x01\x00"),
]))
write("safetensors", "empty.safetensors", safetensors([], pad=False))
write("safetensors", "metadata-only.safetensors", safetensors([], {"a": "b", "n_layer": "2"}))
write("safetensors", "scalar-f32.safetensors", safetensors([("s", "F32", [], struct.pack("<f", 7.0))]))

# ---- ckpt_meta: the text programs of fuzz_ckpt_meta.cpp, building a checkpoint-shaped HDF5 file ----
meta = """group /meta
attr /meta format str fsdpp-checkpoint
attr /meta format_version i64 1
attr /meta fsdpp_version str 0.1.0
attr /meta world_size i64 2
attr /meta mesh str dp_shard=2 (2 ranks, mpi)
attr /meta strategy str full_shard
attr /meta param_dtype str f32
attr /meta reduce_dtype str f32
attr /meta wall_time str 2025-01-01T00:00:00Z
attr /meta deck str run:\\n  name: tiny\\ntrain:\\n  steps: 4\\n
group /train
attr /train step i64 4
attr /train tokens_seen i64 1024
attr /train lr f64 0.003
"""
def tensor(group, shape, shards):
    rows = shape[0]
    per = -(-rows // shards)
    out = [f"group {group}", f"attr {group} global_shape i64[] {','.join(map(str, shape))}",
           f"attr {group} dtype str f32", f"attr {group} shard_dim i64 0", f"attr {group} shards i64 {shards}"]
    for k in range(shards):
        off = min(k * per, rows)
        n = max(0, min(per, rows - off))
        ds = f"{group}/shard_{k}"
        out += [f"dataset {ds} {','.join(map(str, [n] + shape[1:]))}", f"attr {ds} offset i64 {off}",
                f"attr {ds} rows i64 {n}", f"checksum {ds}"]
    return "\n".join(out) + "\n"

write("ckpt_meta", "checkpoint.txt", meta + tensor("/model/wte", [4, 3], 2) + tensor("/model/ln_f.bias", [3], 2))
write("ckpt_meta", "checkpoint-optim.txt",
      meta + tensor("/model/wpe", [5, 2], 2) + "group /optim\nattr /optim kind str adamw\nattr /optim steps i64 4\n"
      + tensor("/optim/wpe/exp_avg", [5, 2], 2) + tensor("/optim/wpe/exp_avg_sq", [5, 2], 2))
write("ckpt_meta", "uneven-shards.txt", meta + tensor("/model/h.0.mlp.c_fc.weight", [3, 4], 4))
write("ckpt_meta", "vlen-strings.txt", meta.replace("attr /meta strategy str", "attr /meta strategy vstr")
      + tensor("/model/x", [2], 1))
write("ckpt_meta", "bad-metadata.txt",
      "group /meta\nattr /meta format i64 7\nattr /meta world_size str two\ngroup /train\n"
      "group /model/w\nattr /model/w shards i64 1\nattr /model/w global_shape i64[] 2,2\n"
      "dataset /model/w/shard_0 2,2\nattr /model/w/shard_0 rows i64[] 2,2\nattr /model/w/shard_0 offset i64 0\n"
      "link /model/w/again /model\n")

# ---- dictionaries: the words libFuzzer should try to splice in ----
def dict_entry(word):
    """libFuzzer's dictionary syntax: a quoted string with \\\\, \\" and \\xAB escapes only."""
    out = ""
    for ch in word:
        if ch in '"\\' or not (32 <= ord(ch) < 127):
            out += "\\x%02X" % ord(ch)
        else:
            out += ch
    return '"' + out + '"\n'

os.makedirs(os.path.join(HERE, "dict"), exist_ok=True)
schema = open(os.path.join(ROOT, "lib", "fsdpp", "config", "deck_schema.cpp")).read()
keys = sorted(set(re.findall(r'"([a-z_]+\.[a-z_]+)"', schema)))
words = set()
for k in keys:
    s, key = k.split(".")
    words.update([s + ":", key + ":", k + "="])
words.update(["#overrides\n", "auto", "true", "false", "null", "~", "-1", "bf16", "f32", "full_shard",
              "hybrid_shard", "shard_grad_op", "no_shard", "cosine", "constant", "adamw", "sgd", "1e308", "nan",
              "inf", "0x", "{", "}", "[", "]", ": ", "- ", "&a", "*a", "!!str", "---", "...", "'", '"'])
with open(os.path.join(HERE, "dict", "deck.dict"), "w") as f:
    for w in sorted(words):
        f.write(dict_entry(w))
with open(os.path.join(HERE, "dict", "safetensors.dict"), "w") as f:
    for w in ["__metadata__", "dtype", "shape", "data_offsets", "F64", "F32", "F16", "BF16", "I64", "I32", "I16",
              "I8", "U8", "BOOL", "18446744073709551615", "9223372036854775807", "-1", "[]", "{}", "null"]:
        f.write(dict_entry('"%s"' % w if w[0].isalpha() or w[0] == "_" else w))
with open(os.path.join(HERE, "dict", "ckpt_meta.dict"), "w") as f:
    for w in ["group ", "attr ", "dataset ", "checksum ", "link ", " str ", " vstr ", " i64 ", " u64 ", " f64 ",
              " i32 ", " str[] ", " i64[] ", " u64[] ", " f64[] ", "/meta", "/train", "/model", "/optim", "/full",
              "shard_", "shards", "global_shape", "rows", "offset", "format", "format_version", "world_size",
              "mesh", "deck", "step", "tokens_seen", "lr", "kind", "9223372036854775807", "-9223372036854775808",
              "18446744073709551615", "-1", "0", "\n"]:
        f.write(dict_entry(w))
print("corpus and dictionaries written under", HERE)
