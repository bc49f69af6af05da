"""Byte-level BPE tokenizer read from the GGUF file (SmolLM2: `tokenizer.ggml.pre = smollm`).

Pre-tokenization as llama.cpp / HF do for this model: split off every digit, then the GPT-2
byte-level regex, no prefix space. Python's `re` has no \\p{L} / \\p{N}; we use
`[^\\W\\d_]` for letters and `\\d` for numbers, which agree on everything but exotic numerals.
Special tokens (token type 3, e.g. `<|im_start|>`) are matched literally before BPE.
"""
import re

import numpy as np

TOKEN_TYPE_CONTROL = 3  # llama.cpp / gguf: "special" tokens

_DIGIT_SPLIT = re.compile(r"\d|\D+")
_GPT2_SPLIT = re.compile(
    r"'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+"
)


def _bytes_to_unicode():
    """GPT-2's reversible byte -> printable unicode character table."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _field_strings(field):
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


class Tokenizer:
    def __init__(self, reader):
        """`reader`: a gguf.GGUFReader of the model file."""
        f = reader.fields
        self.tokens = _field_strings(f["tokenizer.ggml.tokens"])
        merges = _field_strings(f["tokenizer.ggml.merges"])
        types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
        self.token_type = np.array(types)
        self.id_of = {t: i for i, t in enumerate(self.tokens)}
        self.ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
        self.special = {t: i for i, t in enumerate(self.tokens) if types[i] == TOKEN_TYPE_CONTROL}
        self.eos_id = int(f["tokenizer.ggml.eos_token_id"].parts[-1][0])
        self.byte_enc = _bytes_to_unicode()
        self.byte_dec = {c: b for b, c in self.byte_enc.items()}
        if self.special:
            alts = sorted(self.special, key=len, reverse=True)
            self._special_split = re.compile("(" + "|".join(re.escape(s) for s in alts) + ")")
        else:
            self._special_split = None
        self._bpe_cache = {}

    def _bpe(self, word):
        """Merge the byte-mapped characters of one pre-token by rank; returns symbol strings."""
        cached = self._bpe_cache.get(word)
        if cached is not None:
            return cached
        syms = list(word)
        while len(syms) > 1:
            best, best_rank = None, None
            for i in range(len(syms) - 1):
                r = self.ranks.get((syms[i], syms[i + 1]))
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = i, r
            if best is None:
                break
            pair = (syms[best], syms[best + 1])
            merged, i = [], 0
            while i < len(syms):  # merge every occurrence of the best pair, left to right
                if i < len(syms) - 1 and (syms[i], syms[i + 1]) == pair:
                    merged.append(syms[i] + syms[i + 1])
                    i += 2
                else:
                    merged.append(syms[i])
                    i += 1
            syms = merged
        self._bpe_cache[word] = syms
        return syms

    def _encode_plain(self, text, out):
        for chunk in _DIGIT_SPLIT.findall(text):
            for piece in _GPT2_SPLIT.findall(chunk):
                mapped = "".join(self.byte_enc[b] for b in piece.encode("utf-8"))
                for sym in self._bpe(mapped):
                    out.append(self.id_of[sym])

    def encode(self, text):
        """Text -> list of token ids. No BOS is added (the model's `add_bos_token` is false)."""
        out = []
        parts = self._special_split.split(text) if self._special_split else [text]
        for part in parts:
            if not part:
                continue
            if part in self.special:
                out.append(self.special[part])
            else:
                self._encode_plain(part, out)
        return out

    def decode(self, ids):
        """Token ids -> text (special tokens written as their text; bad UTF-8 replaced)."""
        pieces, buf = [], bytearray()
        for i in ids:
            i = int(i)
            if self.token_type[i] == TOKEN_TYPE_CONTROL:
                pieces.append(buf.decode("utf-8", errors="replace"))
                buf = bytearray()
                pieces.append(self.tokens[i])
            else:
                buf.extend(self.byte_dec[c] for c in self.tokens[i])
        pieces.append(buf.decode("utf-8", errors="replace"))
        return "".join(pieces)
