#!/usr/bin/python3
# tokenizer_ref.py: the independent references for ./train prepare's tokenizers (test/run.sh's t_token_*
# and t_bpe_* tests; scripts/bench_tokenizer.sh).
#   stress OUT                       writes the stress text (valid UTF-8 part and invalid part)
#   gpt2 ENC MERGES DIR INPUT...     DIR's shards (train.bin + val.bin, or NAME_*.bin in order) equal
#                                    [<|endoftext|>] + ids(INPUT) for each INPUT, by tiktoken and HF tokenizers
#   roundtrip DIR INPUT...           the tokens of DIR decode (DIR/tokenizer.bin) back to the inputs' bytes
#   merges DIR CORPUS N              DIR/vocab.bpe equals HF BpeTrainer's merges and this file's own trainer's
#   hfload DIR INPUT                 HF tokenizers loads DIR/encoder.json + vocab.bpe and gives DIR's ids
# Exit 77 with the reason when neither reference is installed (scripts/deps.sh installs them).
import glob, json, os, sys

PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

try:
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
except ImportError:
    tiktoken = None
try:
    import tokenizers
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
except ImportError:
    tokenizers = None


def need_refs():
    if tiktoken is None and tokenizers is None:
        print("neither tiktoken nor tokenizers is installed for /usr/bin/python3 (scripts/deps.sh installs them from PyPI)")
        sys.exit(77)


def shards(d):
    import numpy as np
    names = sorted(glob.glob(os.path.join(d, "*_[0-9][0-9][0-9][0-9][0-9][0-9].bin")), key=lambda n: n[-10:])  # token order
    if not names:  # train.bin and val.bin: which came first in the token stream is in the order file
        order = open(os.path.join(d, "order")).read().split() if os.path.exists(os.path.join(d, "order")) else ["train.bin", "val.bin"]
        names = [os.path.join(d, n) for n in order]
    out = []
    for n in names:
        b = open(n, "rb").read()
        h = np.frombuffer(b[:1024], dtype=np.int32)
        assert h[0] == 20240520 and h[1] == 1, (n, h[:3])
        t = np.frombuffer(b[1024:], dtype=np.uint16)
        assert len(t) == h[2], (n, len(t), h[2])
        out.append(t)
    return np.concatenate(out).tolist()


def tiktoken_enc(encf, mergesf):
    ranks = data_gym_to_mergeable_bpe_ranks(mergesf, encf)
    eot = json.load(open(encf))["<|endoftext|>"]
    return tiktoken.Encoding("llm4d-ref", pat_str=PAT, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": eot}), eot


def hf_tok(encf, mergesf):
    t = Tokenizer(models.BPE.from_file(encf, mergesf))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    t.decoder = decoders.ByteLevel()
    return t


def gpt2_reference(enc, data):
    """GPT-2's encoder.py on bytes: the pattern (Python's regex module, as GPT-2 used) over the text
    decoded with errors='surrogateescape', each piece back to its bytes and merged by rank (tiktoken's
    single-piece BPE). On valid UTF-8 it is encode_ordinary; an invalid byte is a character of its own,
    neither letter, number nor space."""
    import regex
    s = data.decode("utf-8", "surrogateescape")
    out = []
    for p in regex.findall(PAT, s):
        out += enc._encode_single_piece(p.encode("utf-8", "surrogateescape"))
    return out


def stress(path):
    valid = (
        "Plain ASCII: Hello, World! It's 2024; we're here, they've gone, I'm fine, you'll see, he'd go.\n"
        "CAPITALS: DON'T I'M YOU'RE WE'LL SHE'S THEY'VE HE'D IT'S.  Mixed: dOn'T 'tis 'S 'Re ''s\n"
        "CJK: 漢字仮名交じり文、ひらがな カタカナ 中文字符 한국어 텍스트。\n"
        "Emoji: 😀😃 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ✨🎉 a😀b\n"
        "Combining: e\u0301 a\u0308 n\u0303 Z\u0351\u0352\u0353 cafe\u0301 o\u0302\u0323\n"
        "RTL: שָׁלוֹם עוֹלָם مرحبا بالعالم ‏سلام‎ فارسی\n"
        "Digits: 0123456789 ٠١٢٣٤٥٦٧٨٩ ۰۱۲۳۴۵۶۷۸۹ ०१२३४५६७८९ ০১২৩৪৫৬৭৮৯ ๐๑๒๓๔๕๖๗๘๙ ０１２３ ①②③ ⅫⅣ ½¾ 12.5e-3 1,000,000\n"
        "Greek Cyrillic: αβγ ΔΕΖ Привет мир ÀÉÎÕÜ ß ǅ\n"
        "Spaces:  two   three    four\t\ttabs\t \t mixed  \n\n\n  \n   lead\n \n\t\n\r\n\r\r\n end   \n"
        "Unicode spaces: a\u00a0b\u2003c\u3000d\u2028e\u2029f\u0085g\u1680h\u202fi \u00a0 \u3000  j\n"
        "Symbols: !!! ??? ... --- ___ *** @#$%^&*() []{}<> /\\| ~` «» “quoted” ‘single’ — – … §¶†‡•\n"
        "Controls: a\x00b\x00\x00c \x01\x1f\x7f\x1b[0m zero\u200bwidth\u200d join \ufeffbom\n"
        "Words: tokenization antidisestablishmentarianism supercalifragilisticexpialidocious 'quoted'\n"
        "Code: def f(x):\n    return x**2  # comment\n\tif (a && b) { c++; }\n"
        "Long runs: a" + " " * 300 + "é" + "é" * 200 + " " + "\t" * 300 + "\u3000y" + "a" * 300 + "\n" * 100 + "ü" + " " * 50 + "\n"
    )
    invalid = (
        b"Invalid UTF-8: \x80 \xff\xfe lone\x80continuation \xe2\x82 truncated \xc3 end\xc3\n"
        b"overlong \xc0\xaf \xe0\x80\xaf surrogate \xed\xa0\x80 beyond \xf4\x90\x80\x80 \xf8\x88\x80\x80\x80\n"
        b"mixed \xe2\x80\x9cok\xe2\x80\x9d\x80\x80's \xf0\x9f\x98 cut emoji \xf0\x9f\x98\x80 whole\n"
        b"  \x80  \n\n\xff\n\t\xfe\t 12\x8034 abc\xffdef x\x00\x80\x00y\n"
    )
    with open(path + ".valid", "wb") as f:
        f.write(valid.encode())
    with open(path, "wb") as f:
        f.write(valid.encode() + invalid)


def main():
    cmd = sys.argv[1]
    if cmd == "stress":
        stress(sys.argv[2])
        return
    need_refs()
    if cmd == "gpt2":
        encf, mergesf, d = sys.argv[2:5]
        inputs = sys.argv[5:]
        got = shards(d)
        checked = []
        datas = [open(p, "rb").read() for p in inputs]
        if tiktoken is not None:
            enc, eot = tiktoken_enc(encf, mergesf)
            want = []
            for p, data in zip(inputs, datas):
                want.append(eot)
                try:
                    text = data.decode("utf-8")
                    ids = enc.encode_ordinary(text)
                    assert ids == gpt2_reference(enc, data), f"{p}: tiktoken and the regex-module reference differ"
                except UnicodeDecodeError:
                    ids = gpt2_reference(enc, data)
                want += ids
            compare("tiktoken", want, got, enc.decode_single_token_bytes)
            checked.append("tiktoken")
        if tokenizers is not None:  # HF takes str only: the documents that are valid UTF-8
            t = hf_tok(encf, mergesf)
            eot = t.token_to_id("<|endoftext|>")
            docs, cur = [], None
            for i in got:
                if i == eot:
                    cur = []
                    docs.append(cur)
                else:
                    cur.append(i)
            assert len(docs) == len(inputs), f"{len(docs)} documents in the shards for {len(inputs)} inputs"
            n = 0
            for p, data, doc in zip(inputs, datas, docs):
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError:
                    continue
                compare(f"HF tokenizers on {p}", t.encode(text).ids, doc, lambda i: t.id_to_token(i).encode())
                n += 1
            checked.append(f"HF tokenizers ({n} valid UTF-8 document(s))")
        print(f"ids equal {' and '.join(checked)}: {len(got)} tokens of {len(inputs)} document(s)")
    elif cmd == "roundtrip":
        import numpy as np
        d = sys.argv[2]
        tok = open(os.path.join(d, "tokenizer.bin"), "rb").read()
        h = np.frombuffer(tok[:1024], dtype=np.int32)
        assert h[0] == 20240328 and h[1] == 2, h[:4]
        V, eot = int(h[2]), int(h[3])
        pieces, at = [], 1024
        for _ in range(V):
            n = tok[at]
            pieces.append(tok[at + 1:at + 1 + n])
            at += 1 + n
        assert at == len(tok), "tokenizer.bin has bytes after its last token"
        assert pieces[eot] == b"<|endoftext|>", pieces[eot]
        got = shards(d)
        want = b"".join(b"<|endoftext|>" + open(p, "rb").read() for p in sys.argv[3:])
        back = b"".join(pieces[i] for i in got)
        assert back == want, f"decode(encode(x)) != x: first difference at byte {next(i for i, (a, b) in enumerate(zip(back, want)) if a != b) if len(back) == len(want) else min(len(back), len(want))}"
        print(f"decode(encode(x)) == x: {len(want)} bytes, {len(got)} tokens, V = {V}")
    elif cmd == "merges":
        d, corpus, N = sys.argv[2], sys.argv[3], int(sys.argv[4])
        lines = open(os.path.join(d, "vocab.bpe"), encoding="utf-8").read().split("\n")
        assert lines[0].startswith("#version"), lines[0]
        mine = [tuple(l.split(" ")) for l in lines[1:] if l]
        text = open(corpus, "rb").read().decode("utf-8")
        ref = own_trainer(text, N)
        assert mine == ref, f"merges differ from the reference trainer's at {first_diff(mine, ref)}"
        checked = ["this file's trainer"]
        if tokenizers is not None:
            t = Tokenizer(models.BPE())
            t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
            tr = trainers.BpeTrainer(vocab_size=N, special_tokens=["<|endoftext|>"], show_progress=False,
                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
            t.train_from_iterator([text], tr)
            hm = json.loads(t.to_str())["model"]["merges"]
            hm = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in hm]
            assert mine == hm, f"merges differ from HF BpeTrainer's at {first_diff(mine, hm)}"
            checked.append("HF BpeTrainer's")
        print(f"{len(mine)} merges equal {' and '.join(checked)}")
    elif cmd == "hfload":
        if tokenizers is None:
            print("HF tokenizers is not installed: its reading of the files is not checked")
            return
        d, inp = sys.argv[2], sys.argv[3]
        t = hf_tok(os.path.join(d, "encoder.json"), os.path.join(d, "vocab.bpe"))
        want = [t.token_to_id("<|endoftext|>")] + t.encode(open(inp, encoding="utf-8").read()).ids
        compare("HF tokenizers reading DIR/encoder.json + vocab.bpe", want, shards(d), lambda i: t.id_to_token(i).encode())
        print(f"HF tokenizers reads the learned files and gives the same {len(want)} ids")
    else:
        sys.exit(f"unknown command {cmd}")


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"merge {i}: {x} vs {y}"
    return f"length {len(a)} vs {len(b)}"


def compare(name, want, got, show):
    if want == got:
        return
    i = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    lo = max(0, i - 3)
    sys.exit(f"ids differ from {name} at token {i} (lengths {len(want)} vs {len(got)}): want {[show(x) for x in want[lo:i + 4]]} "
             f"got {[show(x) for x in got[lo:i + 4]]}")


# A reference BPE trainer, written from the rule tokenizer.h states: the words are the pre-tokens of
# GPT-2's pattern with their counts, symbols start as bytes with GPT-2's byte ids, and each step merges
# the pair with the highest count, ties to the smallest (left id, right id), all its occurrences left to
# right in every word. Counts are recomputed from scratch each step (slow and plain).
def own_trainer(text, N):
    import regex
    from collections import Counter
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    order = bs + [b for b in range(256) if b not in bs]
    cp = {b: (b if b in bs else 256 + [x for x in range(256) if x not in bs].index(b)) for b in range(256)}
    byte_id = {b: i for i, b in enumerate(order)}
    tokens = [bytes([b]) for b in order]
    words = Counter(p.encode("utf-8", "surrogateescape") for p in regex.findall(PAT, text))
    ws = [([byte_id[c] for c in w], n) for w, n in sorted(words.items())]
    merges = []
    while len(tokens) + 1 < N:
        pc = Counter()
        for s, n in ws:
            for a, b in zip(s, s[1:]):
                pc[(a, b)] += n
        if not pc:
            break
        best = min(pc.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        new = len(tokens)
        tokens.append(tokens[best[0]] + tokens[best[1]])
        merges.append(best)
        for k, (s, n) in enumerate(ws):
            o, j = [], 0
            while j < len(s):
                if j + 1 < len(s) and (s[j], s[j + 1]) == best:
                    o.append(new)
                    j += 2
                else:
                    o.append(s[j])
                    j += 1
            ws[k] = (o, n)
    show = lambda t: "".join(chr(cp[b]) for b in t)
    return [(show(tokens[a]), show(tokens[b])) for a, b in merges]


if __name__ == "__main__":
    main()
