#!/usr/bin/env python3
"""Hugging Face transformers as the reference for fsdpp's model folders (test-only; run by the python that
tests/reference/ensure-transformers prints). Every check loads the folder with transformers' own
from_pretrained, in float32 on the CPU, with one thread.

  hf_reference.py logits FOLDER IDS FSDPP_LOGITS TOL   the next-token logits after the prompt IDS (1,2,3) against
                                                       fsdpp generate --logits' file; prints the max difference
  hf_reference.py generate FOLDER IDS N FSDPP_IDS      greedy model.generate of N new tokens against fsdpp's ids;
                                                       prints the smallest top-1/top-2 logit gap on the way
  hf_reference.py shard FOLDER OUT MAX_SHARD_SIZE      load FOLDER and save_pretrained(OUT, max_shard_size=...)
  hf_reference.py parameters FOLDER [FSDPP_COUNT]      the model's parameter count (with FSDPP_COUNT: checked
                                                       against it)
  hf_reference.py tokenizer TEXT OUT                   a byte-level BPE tokenizer.json of 320 tokens trained on TEXT
  hf_reference.py tokenize FOLDER TOKENIZER_JSON TEXT  AutoTokenizer.from_pretrained(FOLDER) encodes TEXT as the
                                                       tokenizers library does with TOKENIZER_JSON
  hf_reference.py packed OUT.u32 VOCAB LENGTHS       documents of LENGTHS (5,9,...) ids each, every one ended by
                                                       the end-of-text id VOCAB-1, as a raw uint32 token file
  hf_reference.py masked_loss FOLDER TOKENS EOT RESET FSDPP_LOSS TOL
                                                       the mean next-token loss of the packed TOKENS with an
                                                       explicit block-diagonal causal 4D mask (and position_ids
                                                       restarting per document when RESET is 1), in float64,
                                                       against fsdpp eval --all's loss with data.document_mask
  hf_reference.py bench FOLDER PROMPT_LEN NEW BATCH    transformers' greedy generate: prefill and decode tokens/s
                                                       (one JSON line)
  hf_reference.py corpus OUT.u32 VOCAB N               N ids of a seeded Markov chain (something to learn), raw uint32
  hf_reference.py batch FILE                          every check of FILE in one process (torch and transformers
                                                       are imported once: seconds per check saved), one a line:
                                                       TAG, the command, its arguments, tab-separated. TAG "-":
                                                       the check must pass; "!": it must fail (its output is
                                                       hidden; passing fails the batch); other text: the check must
                                                       pass, its lines prefixed by TAG. Every line runs; the batch
                                                       exits 1 when any line went otherwise than its TAG says
  hf_reference.py train FOLDER TOKENS T GLOBAL MICRO LR CLIP METRICS TOL
                                                       training from FOLDER's weights in float64, AdamW (fsdpp's
                                                       defaults, no weight decay) at a constant LR, global-norm
                                                       clipping, the batches of data.order: sequential (sequence i
                                                       of the stream starts at (i mod W) T), each micro-batch's loss
                                                       the mean cross-entropy plus router_aux_loss_coef x transformers'
                                                       aux_loss for mixture-of-experts models; its per-step losses
                                                       against fsdpp's METRICS (metrics.jsonl), relative TOL
"""
import json
import sys
import time
import warnings

warnings.filterwarnings("ignore")


def torch_and_transformers():
    import torch
    import transformers
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return torch, transformers


def load(folder):
    torch, transformers = torch_and_transformers()
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    return torch, model


def ids_of(text):
    return [int(x) for x in text.split(",") if x]


def logits(folder, ids, fsdpp_file, tol):
    import numpy as np
    torch, model = load(folder)
    with torch.no_grad():
        ref = model(torch.tensor([ids_of(ids)])).logits[0, -1].double().numpy()
    ours = np.fromfile(fsdpp_file, dtype="<f4").astype(np.float64)
    if ours.shape != ref.shape:
        sys.exit(f"FAIL: {fsdpp_file} holds {ours.size} logits, transformers gives {ref.size}")
    diff = float(np.max(np.abs(ours - ref)))
    print(f"{folder}: max |logit difference| {diff:.3g} over {ref.size} logits (largest |logit| "
          f"{float(np.max(np.abs(ref))):.3g}); tolerance {tol}")
    if not diff <= float(tol):
        sys.exit(f"FAIL: {folder}: fsdpp's logits differ from transformers' by {diff:.3g} > {tol}")


def generate(folder, ids, n, fsdpp_ids):
    torch, model = load(folder)
    prompt = torch.tensor([ids_of(ids)])
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=int(n), min_new_tokens=int(n), do_sample=False,
                             output_scores=True, return_dict_in_generate=True, pad_token_id=0)
    new = out.sequences[0, prompt.shape[1]:].tolist()
    gaps = [float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in out.scores]
    theirs = ids_of(fsdpp_ids)
    print(f"{folder}: transformers' greedy {len(new)} tokens {'equal' if new == theirs else 'DIFFER from'} fsdpp's; "
          f"smallest top-1/top-2 logit gap {min(gaps):.3g}")
    if new != theirs:
        first = next((i for i, (a, b) in enumerate(zip(new, theirs)) if a != b), min(len(new), len(theirs)))
        sys.exit(f"FAIL: {folder}: token {first} differs (transformers {new}, fsdpp {theirs})")
    if min(gaps) < 1e-3:
        sys.exit(f"FAIL: {folder}: a top-1/top-2 gap of {min(gaps):.3g} is too small for the comparison to mean "
                 "anything (a float32 rounding could flip it); train the model so its choices are clear")


def shard(folder, out, size):
    torch, model = load(folder)
    model.save_pretrained(out, max_shard_size=size)
    index = json.load(open(f"{out}/model.safetensors.index.json"))
    print(f"{out}: {len(set(index['weight_map'].values()))} shards written by transformers' save_pretrained")


def parameters(folder, fsdpp_count=None):
    torch, model = load(folder)
    count = model.num_parameters()
    if fsdpp_count is None:
        print(count)
        return
    print(f"{folder}: fsdpp ckpt deck's model has {fsdpp_count} parameters, transformers counts {count}")
    if str(count) != fsdpp_count:
        sys.exit(f"FAIL: {folder}: ckpt deck's model has {fsdpp_count} parameters, transformers counts {count}")


def tokenizer(text, out):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([open(text, encoding="utf-8").read()], trainer)
    tok.save(out)


def tokenize(folder, tokenizer_json, text):
    from tokenizers import Tokenizer
    _, transformers = torch_and_transformers()
    auto = transformers.AutoTokenizer.from_pretrained(folder)
    ours = auto(text, add_special_tokens=False)["input_ids"]
    ref = Tokenizer.from_file(tokenizer_json).encode(text, add_special_tokens=False).ids
    print(f"{folder}: AutoTokenizer ({type(auto).__name__}) gives {len(ours)} ids, "
          f"{'equal to' if ours == ref else 'NOT'} the tokenizers library's")
    if ours != ref:
        sys.exit(f"FAIL: AutoTokenizer {ours} vs tokenizers {ref}")


def bench(folder, prompt_len, new, batch):
    torch, model = load(folder)
    prompt_len, new, batch = int(prompt_len), int(new), int(batch)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, model.config.vocab_size, (batch, prompt_len), generator=gen)
    kwargs = dict(do_sample=False, pad_token_id=0)
    with torch.no_grad():
        model.generate(prompts, max_new_tokens=2, min_new_tokens=2, **kwargs)  # warm-up
        t0 = time.perf_counter()
        model.generate(prompts, max_new_tokens=1, min_new_tokens=1, **kwargs)
        prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        model.generate(prompts, max_new_tokens=new, min_new_tokens=new, **kwargs)
        total = time.perf_counter() - t0
    decode = max(total - prefill, 1e-9)
    print(json.dumps({"prefill_tok_s": batch * prompt_len / prefill, "decode_tok_s": batch * (new - 1) / decode,
                      "batch": batch, "prompt": prompt_len, "new": new, "torch": torch.__version__}))


def packed(out, vocab, lengths):
    import numpy as np
    rng = np.random.default_rng(7)
    eot = int(vocab) - 1
    ids = []
    for n in ids_of(lengths):
        ids += list(rng.integers(0, eot, size=n)) + [eot]
    np.asarray(ids, dtype="<u4").tofile(out)
    print(f"{out}: {len(ids)} ids in {len(ids_of(lengths))} documents ended by {eot}")


def corpus(out, vocab, n):
    import numpy as np
    rng = np.random.default_rng(11)
    vocab, n = int(vocab), int(n)
    nxt = rng.integers(0, vocab, size=(vocab, 3))  # each id is followed by one of 3 ids
    ids = [0]
    for _ in range(n - 1):
        ids.append(int(nxt[ids[-1], rng.integers(0, 3)]))
    np.asarray(ids, dtype="<u4").tofile(out)
    print(f"{out}: {n} ids of a Markov chain over {vocab}")


def train(folder, tokens, T, global_batch, micro, lr, clip, metrics, tol):
    """Trains the folder's model in float64 and holds the losses of every metrics.jsonl in `metrics` (comma-separated:
    fsdpp runs of the same batches on other meshes) to its losses."""
    import numpy as np
    torch, transformers = torch_and_transformers()
    # The experts' loop (eager): transformers' grouped_mm kernel takes no float64.
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64,
                                                              experts_implementation="eager")
    model.train()
    T, G, M, lr, clip, tol = int(T), int(global_batch), int(micro), float(lr), float(clip), float(tol)
    ids = np.fromfile(tokens, dtype="<u4").astype(np.int64)
    windows = max(1, (len(ids) - 1) // T)  # data.val_fraction 0: every window before the end
    moe = getattr(model.config, "num_experts", None) or getattr(model.config, "num_local_experts", None)
    coef = model.config.router_aux_loss_coef if moe else 0.0
    runs = {}
    for path in metrics.split(","):
        records = [json.loads(line) for line in open(path)]
        runs[path] = {r["step"]: r["loss"] for r in records if "loss" in r}
    steps = max(len(losses) for losses in runs.values())
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    worst = {path: 0.0 for path in runs}
    for step in range(1, steps + 1):
        opt.zero_grad()
        total = 0.0
        for first in range(0, G, M):
            seqs = [((step - 1) * G + first + b) % windows * T for b in range(M)]
            x = torch.tensor(np.stack([ids[o:o + T] for o in seqs]))
            y = torch.tensor(np.stack([ids[o + 1:o + T + 1] for o in seqs]))
            out = model(x, output_router_logits=bool(moe))
            loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), y.reshape(-1))
            if moe:
                loss = loss + coef * out.aux_loss
            (loss * (M / G)).backward()
            total += loss.item() * M / G
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        for path, losses in runs.items():
            if step not in losses:
                sys.exit(f"FAIL: {path} has no loss for step {step}")
            rel = abs(losses[step] - total) / abs(total)
            worst[path] = max(worst[path], rel)
            print(f"step {step}: {path}: fsdpp {losses[step]:.10f} transformers (float64) {total:.10f} "
                  f"relative {rel:.2e}")
    for path in runs:
        print(f"{path}: {steps} training steps within {worst[path]:.2e} relative of transformers in float64 "
              f"(tolerance {tol})")
    failed = [path for path in runs if worst[path] > tol]
    if failed:
        sys.exit(f"FAIL: {', '.join(failed)}: fsdpp's training losses differ from transformers' by more than {tol}")


def masked_loss(folder, tokens, eot, reset, fsdpp_loss, tol):
    import numpy as np
    torch, model = load(folder)
    model.to(torch.float64)
    ids = np.fromfile(tokens, dtype="<u4").astype(np.int64)
    inputs, targets = ids[:-1], ids[1:]
    T = inputs.size
    # Token t starts a document when token t-1 is the end-of-text id; query i sees keys start[i] .. i.
    start = np.zeros(T, dtype=np.int64)
    for t in range(1, T):
        start[t] = t if inputs[t - 1] == int(eot) else start[t - 1]
    i, j = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
    allowed = torch.from_numpy((j >= start[:, None]) & (j <= i))
    mask = torch.zeros(1, 1, T, T, dtype=torch.float64).masked_fill(~allowed, torch.finfo(torch.float64).min)
    positions = np.arange(T) - start if reset == "1" else np.arange(T)
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(inputs)[None], attention_mask=mask,
                       position_ids=torch.from_numpy(positions)[None]).logits[0]
        ref = float(torch.nn.functional.cross_entropy(logits, torch.from_numpy(targets)))
    ours = float(fsdpp_loss)
    rel = abs(ours - ref) / abs(ref)
    print(f"{folder}: packed documents, reset_positions {reset}: transformers (explicit 4D mask, float64) loss "
          f"{ref:.10f}, fsdpp {ours:.10f}, relative difference {rel:.3g}; tolerance {tol}")
    if not rel <= float(tol):
        sys.exit(f"FAIL: {folder}: fsdpp's document-masked loss differs from transformers' by {rel:.3g} > {tol}")


def batch(path):
    import contextlib
    import io
    failed = []
    for number, line in enumerate(open(path).read().splitlines(), 1):
        if not line.strip():
            continue
        tag, name, *args = line.split("\t")
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                COMMANDS[name](*args)
            error = None
        except SystemExit as e:
            error = str(e.code) if e.code not in (None, 0) else None
        except Exception as e:  # noqa: BLE001 -- a crash of one check is that check's failure
            error = f"FAIL: {name} raised {type(e).__name__}: {e}"
        what = f"{path}:{number} ({name} {' '.join(args)})"
        if tag == "!":
            if error is None:
                failed.append(what)
                print(f"FAIL: {what} passed; it must fail")
            continue
        prefix = "" if tag == "-" else tag
        for text in out.getvalue().splitlines():
            print(prefix + text)
        if error is not None:
            failed.append(what)
            print(prefix + error)
        sys.stdout.flush()
    if failed:
        sys.exit(f"FAIL: {len(failed)} of the checks in {path} went otherwise than expected: " + "; ".join(failed))


COMMANDS = {"logits": logits, "generate": generate, "shard": shard, "parameters": parameters,
            "tokenizer": tokenizer, "tokenize": tokenize, "bench": bench, "packed": packed,
            "masked_loss": masked_loss, "corpus": corpus, "train": train, "batch": batch}

if __name__ == "__main__":
    commands = COMMANDS
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    commands[sys.argv[1]](*sys.argv[2:])
