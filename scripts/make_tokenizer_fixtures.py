#!/usr/bin/env python3
"""Re-make the tokenizer fixtures of tests/test_tokenizer.c (tests/data/tokenizer/).

Trains three small byte-level BPE tokenizers with the Hugging Face `tokenizers` library, in
the shapes of the published ones, and records the ids `tokenizers` itself gives for the two
test texts, which fp8train's C tokenizer must reproduce exactly:

  gpt2.json    GPT-2 style: ByteLevel pre-tokenizer with its built-in regex, <|endoftext|>,
               merges written in the legacy "a b" string form (as in GPT-2's own file)
  llama3.json  Llama-3 style: Split(Llama-3 regex, Isolated) + ByteLevel(use_regex=false),
               ignore_merges, <|begin_of_text|> ... special tokens appended after the vocab,
               merges in the [a, b] pair form newer `tokenizers` writes
  qwen2.json   Qwen2 style: NFC normalizer, Split(Qwen2 regex: single digits) + ByteLevel,
               <|endoftext|> <|im_start|> <|im_end|>

nfc.bin holds 300 short strings that NFC changes (combining marks in any order, Hangul jamo,
singletons, excluded composites) and qwen2.nfc.ids their ids under Qwen2's NFC normalizer.
random.bin holds 400 short random strings over a pool of hard cases (NUL after each) and
NAME.random.ids their ids, one line per string.

For every tokenizer and text, NAME.TEXT.ids holds the ids of
tokenizer.encode(text, add_special_tokens=False) (special tokens inside the text are matched,
as `tokenizers` does by default), space separated. The texts are shakespeare.txt (a slice of
tinyshakespeare) and multilingual.txt (scripts, emoji, odd whitespace, inline special tokens).

usage: pip install tokenizers && python3 scripts/make_tokenizer_fixtures.py [TINYSHAKESPEARE]
(the training corpus: tinyshakespeare, default /work/shared/data/tinyshakespeare.txt, plus
the multilingual sample). Deterministic for one `tokenizers` version.
"""
import json
import os
import random
import sys
import unicodedata

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers import processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "data", "tokenizer")

LLAMA3_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def train(tok, vocab_size, corpus):
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    return tok


def gpt2(corpus):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    train(tok, 1000, corpus)
    tok.add_special_tokens(["<|endoftext|>"])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def llama3(corpus):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PAT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    train(tok, 1200, corpus)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok.add_special_tokens(specials)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    return tok


def qwen2(corpus):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PAT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    train(tok, 1100, corpus)
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def random_strings(n=400, seed=17):
    """Short random strings over a pool of hard cases: scripts, emoji sequences, odd spaces,
    contractions in both cases, special tokens and fragments of them, control bytes."""
    rng = random.Random(seed)
    pool = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789     ")
            + list("\t\n\r\n.,;:!?'\"-_()[]{}<>|/\\@#$%^&*+=~`")
            + list("éèêëñçåøßÄÖÜЖжщЫΩλ中文字日本語한국어ابتשלוםहिन्दीไทย")
            + ["😀", "👍🏽", "👩\u200d👩\u200d👧", "🇫🇷", "❤️", "\u00a0", "\u0085", "\u2028",
               "\u2009", "\u3000", "\u200b", "\x01", "\x7f", "١٢٣", "½", "²"]
            + ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "<|endoftext|>",
               "<|begin_of_text|>", "<|im_start|>", "<|eot_id|>", "<|end", "of", "the", " the",
               " and", "  ", "\n\n", "123456"])
    return ["".join(rng.choice(pool) for _ in range(rng.randint(0, 40))) for _ in range(n)]


def nfc_strings(n=300, seed=23):
    """Short strings that NFC changes: bases followed by combining marks in any order, Hangul
    jamo, singletons (U+212B, U+2126), excluded composites (U+0958), marks that compose
    (U+3099), and precomposed text NFC keeps."""
    rng = random.Random(seed)
    marks = ([chr(c) for c in range(0x300, 0x370)]
             + ["\u0323", "\u0327", "\u05b0", "\u05bc", "\u0651", "\u093c", "\u094d", "\u09be",
                "\u0bbe", "\u3099", "\u309a", "\u1161", "\u1162", "\u11a8"])
    bases = (list("aeiouAEIOUcnsyzC ") + ["\u1100", "\uac00", "\uac01", "\u0915", "\u09c7",
             "\u0bc6", "\u304b", "\u30cf", "\u212b", "\u2126", "\u0958", "\u0344", "\u00e9",
             "\u1e9b", "\u0f73", "\u03b1", "\u0435", "\xff"])
    return ["".join(rng.choice(marks if rng.random() < 0.5 else bases)
                    for _ in range(rng.randint(1, 12))) for _ in range(n)]


def main():
    shakespeare = sys.argv[1] if len(sys.argv) > 1 else "/work/shared/data/tinyshakespeare.txt"
    with open(shakespeare, encoding="utf-8") as f:
        big = f.read()
    texts = {}
    for name in ("shakespeare", "multilingual"):
        with open(os.path.join(OUT, name + ".txt"), encoding="utf-8", newline="") as f:
            texts[name] = f.read()
    nfc = nfc_strings()
    with open(os.path.join(OUT, "nfc.bin"), "wb") as f:
        f.write(b"".join(r.encode("utf-8") + b"\0" for r in nfc))
    rnd = random_strings()
    with open(os.path.join(OUT, "random.bin"), "wb") as f:
        f.write(b"".join(r.encode("utf-8") + b"\0" for r in rnd))
    # tinyshakespeare's first 300 KB in 2 KB documents, and the multilingual sample
    corpus = [big[i:i + 2000] for i in range(0, 300000, 2000)] + [texts["multilingual"]] * 3
    for name, make in (("gpt2", gpt2), ("llama3", llama3), ("qwen2", qwen2)):
        tok = make(corpus)
        path = os.path.join(OUT, name + ".json")
        tok.save(path)
        if name == "gpt2":  # the legacy merges form: "a b" strings
            with open(path, encoding="utf-8") as f:
                j = json.load(f)
            j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m
                                    for m in j["model"]["merges"]]
            with open(path, "w", encoding="utf-8") as f:
                json.dump(j, f, ensure_ascii=False, indent=1)
            tok = Tokenizer.from_file(path)  # the ids below come from the file as written
        for tname, text in texts.items():
            enc = tok.encode(text, add_special_tokens=False)
            assert tok.decode(enc.ids, skip_special_tokens=False) == text, (name, tname)
            with open(os.path.join(OUT, "%s.%s.ids" % (name, tname)), "w") as f:
                f.write(" ".join(str(i) for i in enc.ids) + "\n")
            print("%s %s: %d bytes -> %d tokens" % (name, tname, len(text.encode()),
                                                      len(enc.ids)))
        # random.bin: the strings NUL-separated; NAME.random.ids: one line of ids per string
        with open(os.path.join(OUT, "%s.random.ids" % name), "w") as f:
            for r in rnd:
                f.write(" ".join(str(i) for i in tok.encode(r, add_special_tokens=False).ids) + "\n")
        if name == "qwen2":  # nfc.bin: the NFC normalizer at work (Qwen2's)
            with open(os.path.join(OUT, "qwen2.nfc.ids"), "w") as f:
                for r in nfc:
                    ids = tok.encode(r, add_special_tokens=False).ids
                    # tokenizers' NFC (Rust) and Python's agree on every string here
                    assert tok.decode(ids) == unicodedata.normalize("NFC", r), repr(r)
                    f.write(" ".join(str(i) for i in ids) + "\n")


if __name__ == "__main__":
    main()
