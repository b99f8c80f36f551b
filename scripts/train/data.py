"""Corpus and tokenizer for the default model pair.

Corpus: the reStructuredText sources of the Python 3.11 documentation as Debian's python3.11-doc
package ships them (/usr/share/doc/python3.11/html/_sources/**/*.rst.txt; PSF License Version 2,
code examples Zero-Clause BSD; see the package's copyright file). English prose and Python code.

Split: categories are the top folder of a document (tutorial, library, howto, reference, c-api,
whatsnew, faq, ...). In every category of at least 4 documents, the documents with the smallest
sha256(relative path) are held out, 1 in 20 rounded up (at least one per category); held-out
documents are never seen by the tokenizer or the models.

Tokenizer: byte-level BPE in the Hugging Face `tokenizers` layout of Qwen2/Qwen3 (NFC, the Qwen
split regex then ByteLevel, ByteLevel decoder), trained on the training split. Every id decodes to
bytes; the special tokens are <|endoftext|> (document separator, bos and eos), <|im_start|>,
<|im_end|> and <|mask|> (the DFlash/DSpark mask token).

    python3 scripts/train/data.py --out work/   ->  work/{train.txt, heldout.jsonl, tokenizer/}
"""
import argparse
import hashlib
import json
import os
import pathlib
import re

SOURCES = "/usr/share/doc/python3.11/html/_sources"
SEP = "<|endoftext|>"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def documents(root=SOURCES):
    """(relative path, category, text) of every source file, sorted by path."""
    root = pathlib.Path(root)
    files = sorted(root.rglob("*.rst.txt"))
    if not files:
        raise SystemExit(f"no *.rst.txt under {root}: install the Debian package python3.11-doc")
    for f in files:
        rel = f.relative_to(root).as_posix()
        cat = rel.split("/")[0] if "/" in rel else "general"
        text = f.read_text(encoding="utf-8")
        # collapse runs of blank lines; keep the markup (it is part of what the model learns)
        text = re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"
        yield rel, cat, text


def held_out_set(docs):
    by_cat = {}
    for rel, cat, _ in docs:
        by_cat.setdefault(cat, []).append(rel)
    out = set()
    for cat, rels in by_cat.items():
        if len(rels) < 4:
            continue
        rels.sort(key=lambda r: hashlib.sha256(r.encode()).hexdigest())
        out.update(rels[: (len(rels) + 19) // 20])
    return out


def paragraphs(text, lo=200, hi=700):
    """Paragraph-aligned chunks of lo..hi characters (prompt material)."""
    out, cur = [], ""
    for p in text.split("\n\n"):
        cur = (cur + "\n\n" + p) if cur else p
        if len(cur) >= lo:
            out.append(cur[:hi])
            cur = ""
    return out


def heldout_prompts(docs, per_category=8):
    """Bundled eval prompts: for each held-out category with enough text, up to per_category
    prompts, each the first part of a held-out paragraph chunk (the model continues it)."""
    by_cat = {}
    for rel, cat, text in docs:
        for ch in paragraphs(text):
            cut = ch[: max(120, len(ch) // 2)]
            cut = cut[: cut.rfind(" ")] if " " in cut[60:] else cut
            by_cat.setdefault(cat, []).append({"category": cat, "prompt": cut, "source": rel})
    out = []
    for cat in sorted(by_cat):
        items = by_cat[cat]
        if cat == "general" or len(items) < per_category:
            continue
        step = max(1, len(items) // per_category)
        out.extend(items[::step][:per_category])
    return out


def train_tokenizer(texts, vocab, out_dir):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2)
    tok.train_from_iterator(texts, trainer=trainer)
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    # ChatML template as Qwen ships it (the model is a base model: chat works, answers continue text)
    tmpl = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
            " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
            "{% endif %}")
    cfg = {"tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": SEP, "pad_token": SEP,
           "unk_token": None, "add_bos_token": False, "add_eos_token": False, "model_max_length": 2048,
           "clean_up_tokenization_spaces": False, "chat_template": tmpl,
           "additional_special_tokens": SPECIALS[1:]}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return tok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--sources", default=SOURCES)
    a = ap.parse_args()
    docs = list(documents(a.sources))
    hs = held_out_set(docs)
    train = [d for d in docs if d[0] not in hs]
    held = [d for d in docs if d[0] in hs]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "train.txt"), "w") as f:
        f.write(SEP.join(t for _, _, t in train))
    with open(os.path.join(a.out, "heldout.txt"), "w") as f:
        f.write(SEP.join(t for _, _, t in held))
    with open(os.path.join(a.out, "heldout.jsonl"), "w") as f:
        for p in heldout_prompts(held):
            f.write(json.dumps(p) + "\n")
    tok = train_tokenizer((t for _, _, t in train), a.vocab, os.path.join(a.out, "tokenizer"))
    # every id must decode (byte-level BPE: no holes); report the compression
    ids = tok.encode(train[0][2][:2000]).ids
    print(f"docs {len(docs)}: train {len(train)} ({sum(len(t) for _, _, t in train)} chars), "
          f"held out {len(held)} ({sum(len(t) for _, _, t in held)} chars); vocab {tok.get_vocab_size()}; "
          f"{2000 / max(1, len(ids)):.2f} chars/token on a sample")


if __name__ == "__main__":
    main()
