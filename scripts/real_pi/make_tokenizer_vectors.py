#!/usr/bin/env python3
"""Tokenizer parity vectors for Vela's PaliGemma tokenizer (server/models/tokenizer.ts).

PaliGemma's tokenizer is a SentencePiece BPE model with byte fallback, Gemma's options (digits
split one per piece, no dummy prefix, whitespace kept as is, identity normalisation; FACTS.md
section 3). Its files are gated, so for the committed test this script trains a small model of the
same kind on generated text (robot-task sentences, numbers, several scripts, newlines; nothing
copied from anywhere), converts it to `tokenizer.json` with transformers' own GemmaConverter (the
converter that made the Hub's PaliGemma `tokenizer.json`), and writes, for 200+ strings, the ids
that Python's `tokenizers` (reading that tokenizer.json) and `sentencepiece` (reading the .model)
give. It checks that the two agree and fails if they do not.

Usage:
  python3 scripts/real_pi/make_tokenizer_vectors.py [--out test/vectors/real-pi/tokenizer]
      trains, converts, writes tokenizer.model, tokenizer.json, tokenizer_config.json, cases.json.
  python3 scripts/real_pi/make_tokenizer_vectors.py --encode TOKENIZER_JSON [--spm TOKENIZER_MODEL]
      reads strings (a JSON list) on stdin and prints {"tokenizers": [[ids]...], "sentencepiece": ...}
      (ids without BOS); the test uses this on the real PaliGemma files when they are on the machine.

Needs: sentencepiece, tokenizers, protobuf, transformers (only for training/conversion); no torch.
Deterministic: fixed seed, one training thread.
"""
import argparse
import json
import os
import random
import sys
import tempfile


def corpus(rng: random.Random) -> list[str]:
    """Generated training text: task sentences, numbers, prompts, several scripts."""
    verbs = ["pick up", "put", "place", "move", "push", "open", "close", "turn on", "turn off", "stack", "lift", "slide", "grasp", "rotate", "fold"]
    objs = ["the red block", "the blue cup", "a green bowl", "the black mug", "the drawer", "the top drawer", "the stove", "the microwave",
            "the alphabet soup", "the cream cheese", "the ketchup", "the tomato sauce", "the butter", "the milk", "the orange juice",
            "the wine bottle", "the plate", "the basket", "the towel", "the T-shirt", "the cabinet door", "the light switch"]
    places = ["on the plate", "in the basket", "into the bowl", "on top of the cabinet", "to the left", "to the right of the sink",
              "next to the cup", "inside the drawer", "onto the shelf", "behind the box"]
    words_other = ["über", "Straße", "garçon", "crème brûlée", "niño", "año", "façade", "naïve", "Ελληνικά", "λόγος", "Москва", "привет",
                   "東京", "日本語", "机器人", "抓取", "杯子", "한국어", "로봇", "שלום", "مرحبا", "हिन्दी", "ไทย", "😀", "🤖", "→", "°C", "½", "™"]
    lines = []
    for _ in range(6000):
        k = rng.random()
        if k < 0.45:
            s = f"{rng.choice(verbs)} {rng.choice(objs)} {rng.choice(places)}"
            if rng.random() < 0.3:
                s += f" and {rng.choice(verbs)} {rng.choice(objs)}"
            s = s.capitalize() if rng.random() < 0.5 else s
            s += rng.choice(["", ".", "!", "?", ". ", ".\n", "\n", ";", ","])
        elif k < 0.65:
            n = rng.randint(1, 32)
            bins = " ".join(str(rng.randint(-1, 255)) for _ in range(n))
            s = f"Task: {rng.choice(verbs)} {rng.choice(objs)}, State: {bins};\nAction: "
        elif k < 0.8:
            s = " ".join(str(rng.choice([rng.randint(0, 9999), round(rng.uniform(-100, 100), 3), rng.randint(-50, 50)])) for _ in range(rng.randint(1, 8)))
        elif k < 0.92:
            s = " ".join(rng.choice(words_other + [o.split()[-1] for o in objs]) for _ in range(rng.randint(1, 6)))
        else:
            s = rng.choice(["  indented line", "tab\tseparated\tvalues", "two\n\nnewlines", "trailing space ", "snake_case_name", "CamelCase",
                            "<loc0012><loc0345> box", "x = y + 1", "(a, b) [c] {d}", "e-mail: robot@example.com", "https://example.com/a?b=c",
                            "i'm can't won't", "ALL CAPS TEXT", "mixed123numbers456"])
        lines.append(s)
    return lines


def test_strings(rng: random.Random) -> list[str]:
    """The strings whose ids are compared: fixed edge cases, then generated ones, 240 in all."""
    fixed = [
        "", " ", "  ", "\n", "\n\n", "\t", "a", "A", "0", "7", "42", "12345", "3.14159", "-1", "-0.5", "1e-8", "255 -1 0 128",
        "pick up the red block", "Pick up the red block.", "pick_up_the_red_block", "pick up the red block\n", "put it on the plate.\n",
        " leading space", "trailing space ", "double  space", "triple   space", "line one\nline two", "ends with dot.", "ends.\n",
        "Task: pick up the cup, State: 128 0 255 -1 34;\nAction: ", "Task: , State: ;\nAction: ",
        "Task: open the drawer, State: 0 1 2 3 4 5 6 7 8 9 10 100 200 255;\nAction: ",
        "über Straße garçon", "crème brûlée", "東京 日本語", "机器人抓取杯子", "한국어 로봇", "Ελληνικά λόγος", "Москва привет", "שלום", "مرحبا",
        "हिन्दी", "ไทย", "😀🤖", "emoji 🤖 robot", "→ ° ½ ™", "unseen: ℵ ∮ ⊕ ☃ 𝔘𝔫𝔦", "zero\u200bwidth", "nbsp\u00a0space", "ＦＵＬＬ　ｗｉｄｔｈ",
        "café vs cafe\u0301", "<loc0012><loc0345> box", "<bos> literal", "<eos>", "<pad><unk>", "\\n escaped", "tab\tand\nnewline",
        "x" * 60, "9" * 40, "ab" * 30, "the the the the", "The The THE", "mixed123numbers456", "snake_case_name",
        "https://example.com/a?b=c&d=e", "robot@example.com", "(a, b) [c] {d} <e>", "it's 5 o'clock", "$19.99 & 50% off", "#1 @home ~tilde",
    ]
    verbs = ["pick up", "place", "move", "stack", "open", "grasp", "wipe", "pour"]
    objs = ["the red block", "the blue cup", "a sponge", "the yellow_duck", "the lid", "cup #3", "the 2nd bowl", "the café mug", "杯子"]
    out = list(fixed)
    while len(out) < 240:
        k = rng.random()
        if k < 0.35:
            n = rng.randint(0, 32)
            bins = " ".join(str(rng.randint(-1, 255)) for _ in range(n))
            task = f"{rng.choice(verbs)} {rng.choice(objs)}"
            out.append(f"Task: {task}, State: {bins};\nAction: ")
        elif k < 0.55:
            out.append(" ".join(str(rng.choice([rng.randint(-1000, 100000), round(rng.uniform(-10, 10), rng.randint(0, 6))])) for _ in range(rng.randint(1, 6))))
        elif k < 0.8:
            s = f"{rng.choice(verbs)} {rng.choice(objs)}"
            s += rng.choice(["", ".", "\n", ".\n", " and then stop", "!!", "  ", "\n\n"])
            out.append(s.upper() if rng.random() < 0.1 else s)
        else:
            alphabet = "abcXYZ019 _\n\t.,;:-éüßñ東京한Жλ😀→"
            out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24))))
    return out


def prompt_cases(spm_path: str, json_path: str) -> list[dict]:
    """openpi's prompt rules (FACTS.md 1.10), on SentencePiece as openpi runs them (and LeRobot's
    pi0 form on the HF tokenizer, as LeRobot runs it): pi0 = BOS +
    clean(task) + a separately encoded "\n"; pi0.5 = BOS + "Task: ..., State: <bins>;\nAction: "
    with numpy's digitize bins; right-padded with 0 / cut to max_len, mask 1 on real tokens."""
    import numpy as np
    import sentencepiece as spm
    from tokenizers import Tokenizer
    sp = spm.SentencePieceProcessor(model_file=spm_path)
    hf = Tokenizer.from_file(json_path)

    def clean(t: str) -> str:
        return t.strip().replace("_", " ").replace("\n", " ")

    def pad(ids: list[int], max_len: int) -> tuple[list[int], list[int]]:
        ids = ids[:max_len]
        return ids + [0] * (max_len - len(ids)), [1] * len(ids) + [0] * (max_len - len(ids))

    edge = 1 - 2 / 256
    states = [
        [], [0.0], [-1.0, 1.0], [-1.5, 1.5, -1.0000001, 1.0000001], [-1e-30, 1e-30, -0.0, 0.0],
        [edge, np.nextafter(edge, -2), 0.99999994, -0.99999994], [float("inf"), float("-inf"), 2.0, -2.0],
        [-1 + 1 / 128, np.nextafter(-1 + 1 / 128, -2), 0.5, -0.5, 0.25, 0.12345, -0.777],
        list(np.linspace(-1.2, 1.2, 32)), list(np.float32(np.random.RandomState(5).uniform(-1.1, 1.1, 14))),
    ]
    tasks = ["pick up the red block", "  put_the_cup\non the plate.  ", "\x1copen the drawer\u00a0", "\ufeffstack blocks", "",
             "move the 2nd bowl to the left_side", "a\tb\rc", "ünïcödé 東京 🤖", "x " * 60]
    out = []
    for task in tasks:
        ids = [2] + sp.encode(clean(task)) + sp.encode("\n")
        for max_len in (48, 200):
            toks, mask = pad(ids, max_len)
            out.append({"variant": "pi0", "task": task, "max_len": max_len, "tokens": toks, "mask": mask, "full_length": len(ids)})
        # LeRobot's pi0 processor: no cleaning, "\n" appended, one pass of the HF tokenizer.
        lr_ids = [2] + hf.encode(task + "\n", add_special_tokens=False).ids
        toks, mask = pad(lr_ids, 48)
        out.append({"variant": "pi0-lerobot", "task": task, "max_len": 48, "tokens": toks, "mask": mask, "full_length": len(lr_ids)})
    for i, state in enumerate(states):
        task = tasks[i % len(tasks)]
        bins = np.digitize(np.asarray(state, dtype=np.float64), bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1
        text = f"Task: {clean(task)}, State: {' '.join(map(str, bins))};\nAction: "
        ids = [2] + sp.encode(text)
        for max_len in (200, 48):
            toks, mask = pad(ids, max_len)
            out.append({"variant": "pi05", "task": task, "state": [float(x) if np.isfinite(x) else ("inf" if x > 0 else "-inf") for x in state], "bins": [int(b) for b in bins], "text": text,
                        "max_len": max_len, "tokens": toks, "mask": mask, "full_length": len(ids)})
    return out


def train(out_dir: str) -> str:
    import sentencepiece as spm
    rng = random.Random(23)
    text = corpus(rng)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "corpus.txt")
        with open(path, "w", encoding="utf-8") as f:
            # SentencePiece trains on lines, so an embedded newline just splits a sentence; "\n" is
            # a user-defined piece below (Gemma's vocabulary has a "\n" piece).
            for line in text:
                f.write(line + "\n")
        # Relative names: the trainer records its input and prefix in the .model file, and a
        # random temporary path there would change the committed file on every run.
        prefix = os.path.join(tmp, "tok")
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            spm.SentencePieceTrainer.train(
                input="corpus.txt", model_prefix="tok", model_type="bpe", vocab_size=1000,
                character_coverage=0.995,  # the rarest characters fall back to bytes, as in Gemma
                byte_fallback=True, split_digits=True, split_by_unicode_script=True, split_by_number=True,
                split_by_whitespace=True, treat_whitespace_as_suffix=False, allow_whitespace_only_pieces=True,
                add_dummy_prefix=False, remove_extra_whitespaces=False, normalization_rule_name="identity",
                pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>",
                user_defined_symbols=["\n", "\n\n", "\t", "<start_of_turn>", "<end_of_turn>", "<loc0012>", "<loc0345>", "<seg000>"],
                num_threads=1, seed_sentencepiece_size=200000, shuffle_input_sentence=False, minloglevel=2,
            )
        finally:
            os.chdir(cwd)
        model_path = os.path.join(out_dir, "tokenizer.model")
        with open(prefix + ".model", "rb") as src, open(model_path, "wb") as dst:
            dst.write(src.read())
    return model_path


def convert(model_path: str, out_dir: str) -> str:
    """tokenizer.model -> tokenizer.json with transformers' GemmaConverter (as the Hub's file was made)."""
    from types import SimpleNamespace
    import sentencepiece as spm
    from transformers.convert_slow_tokenizer import GemmaConverter, GemmaSentencePieceExtractor

    class Extractor(GemmaSentencePieceExtractor):
        # transformers 5.18's Gemma extractor reads `self.sp`, which its base class no longer
        # sets (older releases did); give it the processor it expects.
        def __init__(self, model: str):
            super().__init__(model)
            self.sp = spm.SentencePieceProcessor(model_file=model)

    class Converter(GemmaConverter):
        SpmExtractor = Extractor

    orig = SimpleNamespace(vocab_file=model_path, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>",
                           add_bos_token=True, add_eos_token=False, legacy=False, add_prefix_space=False)
    tok = Converter(orig).converted()
    json_path = os.path.join(out_dir, "tokenizer.json")
    tok.save(json_path)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
                   "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False}, f, indent=1)
    return json_path


def encode_all(json_path: str, spm_path: str | None, strings: list[str]) -> dict:
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(json_path)
    res = {"tokenizers": [tok.encode(s, add_special_tokens=False).ids for s in strings]}
    if spm_path:
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=spm_path)
        res["sentencepiece"] = [sp.encode(s) for s in strings]
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="test/vectors/real-pi/tokenizer")
    ap.add_argument("--encode", help="tokenizer.json to encode stdin's JSON list of strings with")
    ap.add_argument("--spm", help="with --encode: also the SentencePiece .model")
    args = ap.parse_args()
    if args.encode:
        strings = json.load(sys.stdin)
        json.dump(encode_all(args.encode, args.spm, strings), sys.stdout)
        return
    os.makedirs(args.out, exist_ok=True)
    model_path = train(args.out)
    json_path = convert(model_path, args.out)
    strings = test_strings(random.Random(230))
    enc = encode_all(json_path, model_path, strings)
    # The one known difference: `tokenizers` matches the control tokens' text ("<bos>", "<eos>",
    # "<pad>") inside the input as special tokens, SentencePiece encodes it as plain text. Any
    # other difference is a conversion bug and stops the script.
    controls = ("<bos>", "<eos>", "<pad>")
    bad = [(s, a, b) for s, a, b in zip(strings, enc["tokenizers"], enc["sentencepiece"]) if a != b and not any(c in s for c in controls)]
    for s, a, b in bad:
        print(f"tokenizers and sentencepiece differ on {s!r}: {a} vs {b}", file=sys.stderr)
    if bad:
        sys.exit(f"{len(bad)} of {len(strings)} strings differ between tokenizers and sentencepiece")
    import sentencepiece, tokenizers, transformers
    cases = {
        "about": "ids without BOS from Python tokenizers (tokenizer.json); sentencepiece (tokenizer.model) gives the same except where sentencepiece_ids is given (control-token text such as '<eos>' inside the input, which tokenizers treats as the special token)",
        "made_by": "scripts/real_pi/make_tokenizer_vectors.py",
        "versions": {"sentencepiece": sentencepiece.__version__, "tokenizers": tokenizers.__version__, "transformers": transformers.__version__},
        "bos_id": 2,
        "prompts": prompt_cases(model_path, json_path),
        "cases": [
            {"text": s, "ids": a, **({} if a == b else {"sentencepiece_ids": b})}
            for s, a, b in zip(strings, enc["tokenizers"], enc["sentencepiece"])
        ],
    }
    with open(os.path.join(args.out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=0)
    print(f"wrote {len(strings)} cases, vocab {json.load(open(json_path))['model']['vocab'].__len__()} pieces, to {args.out}")


if __name__ == "__main__":
    main()
