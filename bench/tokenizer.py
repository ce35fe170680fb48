"""A small tokenizer for the peer tools, built offline (no model hub, no download).

The peers (AIPerf, guidellm, inference-perf) need a Hugging Face tokenizer to size their synthetic
prompts and to count the tokens of the answers. This builds one with the `tokenizers` library: a
WordPiece model of about 8,000 entries trained on the words the bench server emits
(`bench.server.TOKEN_TEXT`, so each of its token chunks counts as exactly one token), a few hundred
plain English words and the text files given with `--corpus` (bench/peers.py passes the
Shakespeare text that AIPerf and inference-perf ship and draw their prompts from), plus every
printable ASCII and Latin-1 character alone and as a continuation piece, so any word splits into
known pieces and nothing becomes [UNK] (the peers cut prompts to an exact token count by decoding
and encoding again, which must give the same count). Lower-cased, split at whitespace and
punctuation; on that Shakespeare text a token is about 4.7 bytes, near a real model's. Saved as a
tokenizer folder (tokenizer.json, tokenizer_config.json, special_tokens_map.json) that
`AutoTokenizer.from_pretrained(folder)` loads as a fast tokenizer.

    python -m bench.tokenizer --out DIR [--corpus FILE ...]     # needs `tokenizers` in that interpreter

bench/peers.py runs this with the Python of a peer's own environment (each of them installs
`tokenizers`), so the project's environment does not need it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from bench.server import TOKEN_TEXT

SPECIAL = ["[UNK]", "[PAD]", "<s>", "</s>"]

# Common English words, always whole tokens (with or without a corpus to train on).
_ENGLISH = """
the of and to a in is it you that he was for on are with as i his they be at one have this from or
had by not word but what some we can out other were all there when up use your how said an each she
which do their time if will way about many then them write would like so these her long make thing
see him two has look more day could go come did number sound no most people my over know water than
call first who may down side been now find any new work part take get place made live where after
back little only round man year came show every good me give our under name very through just form
sentence great think say help low line differ turn cause much mean before move right boy old too same
tell does set three want air well also play small end put home read hand port large spell add even
land here must big high such follow act why ask men change went light kind off need house picture try
us again animal point mother world near build self earth father head stand own page should country
found answer school grow study still learn plant cover food sun four between state keep eye never last
let thought city tree cross farm hard start might story saw far sea draw left late run while press
close night real life few north open seem together next white children begin got walk example ease
paper group always music those both mark often letter until mile river car feet care second book carry
took science eat room friend began idea fish mountain stop once base hear horse cut sure watch color
face wood main enough plain girl usual young ready above ever red list though feel talk bird soon body
dog family direct pose leave song measure door product black short numeral class wind question happen
complete ship area half rock order fire south problem piece told knew pass since top whole king space
heard best hour better true during hundred five remember step early hold west ground interest reach
fast verb sing listen six table travel less morning ten simple several vowel toward war lay against
pattern slow center love person money serve appear road map rain rule govern pull cold notice voice
unit power town fine certain fly fall lead cry dark machine note wait plan figure star box noun field
rest correct able pound done beauty drive stood contain front teach week final gave green oh quick
develop ocean warm free minute strong special mind behind clear tail produce fact street inch multiply
nothing course stay wheel full force blue object decide surface deep moon island foot system busy test
record boat common gold possible plane stead dry wonder laugh thousand ago ran check game shape equate
hot miss brought heat snow tire bring yes distant fill east paint language among
"""


# Every printable ASCII and Latin-1 character, alone and as a word-piece continuation: any word
# made of them splits into known pieces, so no text the peers draw prompts from becomes [UNK]
_CHARS = [chr(c) for c in range(33, 127)] + [chr(c) for c in range(161, 256)]


def words() -> list[str]:
    """The vocabulary after the special tokens: the server's words first, then English words, then
    single characters and their continuations ("##x")."""
    out: list[str] = []
    seen = set(SPECIAL)
    for w in TOKEN_TEXT.split() + _ENGLISH.split() + _CHARS + ["##" + c for c in _CHARS]:
        w = w.lower()
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


def fingerprint(corpus: list[Path] | tuple[Path, ...] = ()) -> str:
    """Changes whenever the vocabulary, the training text or the layout of the folder does (the
    cache key)."""
    h = hashlib.sha256(json.dumps([3, SPECIAL, VOCAB_SIZE, words()]).encode())
    for path in sorted(corpus):
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:12]


VOCAB_SIZE = 8000


def _training_text(corpus: list[Path]) -> list[str]:
    # the server's words often enough to be whole tokens, the English words, then the corpus
    lines = [" ".join(TOKEN_TEXT.split() * 50)] * 20 + [" ".join(words())] * 5
    for path in corpus:
        lines += path.read_text(encoding="utf-8", errors="replace").splitlines()
    return lines


def build(out: Path, corpus: list[Path] | tuple[Path, ...] = ()) -> Path:
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )

    corpus = sorted(corpus)
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##", max_input_chars_per_word=100))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins pieces, words with spaces, none before punctuation
    trainer = trainers.WordPieceTrainer(vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=SPECIAL,
                                        initial_alphabet=_CHARS, continuing_subword_prefix="##",
                                        show_progress=False)
    tok.train_from_iterator(_training_text(corpus), trainer=trainer)
    # every character alone and as a continuation, and every listed word, whatever the training
    # text had (appended to the vocabulary: added tokens would match inside words)
    missing = [w for w in words() if tok.token_to_id(w) is None]
    if missing:
        model = json.loads(tok.to_str())
        vocab = model["model"]["vocab"]
        for w in missing:
            vocab[w] = len(vocab)
        tok = Tokenizer.from_str(json.dumps(model))
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "[UNK]", "pad_token": "[PAD]", "bos_token": "<s>", "eos_token": "</s>",
        "model_max_length": 1_000_000_000, "clean_up_tokenization_spaces": False,
        "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant:{% endif %}",
        "bench_tokenizer": fingerprint(corpus),
        "bench_tokenizer_corpus": [str(p) for p in corpus],
    }, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps({
        "unk_token": "[UNK]", "pad_token": "[PAD]", "bos_token": "<s>", "eos_token": "</s>"}, indent=2) + "\n")
    # checks that it does what the peers need: each token chunk of the server is one token, and a
    # text decoded from tokens encodes to as many tokens again (the peers size prompts that way)
    n = len(tok.encode(TOKEN_TEXT * 32).ids)
    if n != 32:
        raise SystemExit(f"bench tokenizer: {TOKEN_TEXT!r} x 32 is {n} tokens, not 32")
    sample = "Whether 'tis nobler in the mind to suffer the slings and arrows of outrageous fortune -- 1603!"
    ids = tok.encode(sample).ids
    if tok.token_to_id("[UNK]") in ids or len(tok.encode(tok.decode(ids)).ids) != len(ids):
        raise SystemExit("bench tokenizer: a text does not survive encode, decode, encode")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.tokenizer", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the tokenizer folder to write")
    ap.add_argument("--corpus", type=Path, action="append", default=[],
                    help="a text file to train the vocabulary on as well (repeatable)")
    a = ap.parse_args(argv)
    print(build(a.out, a.corpus))
    return 0


if __name__ == "__main__":
    sys.exit(main())
