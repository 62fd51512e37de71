"""Character-level, byte-level and SentencePiece tokenizers behind one interface (`token_char_lengths`: the bpc)."""

import base64
import hashlib
import io
import json
import re
import sys
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import sentencepiece as spm
import torch
from filelock import FileLock

from gru_experiments.errors import UserError
from gru_experiments.files import atomic_write

_FORMAT_VERSION = 1  # bumped when what changes the trained model's bytes changes: stale cache entries never reused
_SPACE_SYMBOL = "\u2581"  # SentencePiece's own whitespace symbol: spaces become this inside pieces
KINDS = ("char", "spm", "byte")  # conf/tokenizer/<kind>.yaml

# SentencePiece lossless and reproducible: the defaults (NFKC, runs of spaces collapsed, a "▁" prepended) change the
# text; no bos/eos, so the vocabulary is `vocab_size` pieces, <unk> included; runs of spaces (indentation) may be
# pieces; num_threads fixed, as the trained model depends on it.
_TRAINER_OPTIONS = dict(normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=False,
                        allow_whitespace_only_pieces=True, unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1, num_threads=8,
                        minloglevel=2)


class CharTokenizer:
    """Every character a token. `extra`: the recall probe's characters, never in plain text (`plain_tokens`)."""

    kind = "char"

    def __init__(self, chars: Iterable[str], extra: Iterable[str] = ()):
        self.chars = list(chars)
        self._index = {c: i for i, c in enumerate(self.chars)}
        if len(self._index) != len(self.chars) or any(len(c) != 1 for c in self.chars):
            raise ValueError("chars must be distinct single characters")
        self.extra = tuple(extra)
        if any(c not in self._index for c in self.extra):
            raise ValueError("extra characters must be in the vocabulary")
        self.token_char_lengths = torch.ones(len(self.chars), dtype=torch.long)

    @classmethod
    def from_text(cls, text: str, extra: Iterable[str] = ()) -> "CharTokenizer":
        extra = tuple(extra)
        return cls(sorted(set(text) | set(extra)), extra)

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        # No <unk>: an unknown character would silently distort per-character metrics.
        if unknown := self.unknown_characters(text):
            raise ValueError(f"characters not in the vocabulary: {unknown!r}")
        return [self._index[c] for c in text]

    def decode(self, ids: Iterable[int] | torch.Tensor) -> str:
        if isinstance(ids, torch.Tensor):  # a split's ids: one lookup, not a Python step per character
            code_points = np.array([ord(c) for c in self.chars], dtype="<u4")
            return code_points[ids.cpu().numpy()].tobytes().decode("utf-32-le")
        return "".join(self.chars[int(i)] for i in ids)

    def unknown_characters(self, text: str) -> list[str]:
        return sorted(set(text) - self._index.keys())

    def state_dict(self) -> dict:
        return {"kind": self.kind, "chars": list(self.chars)} | ({"extra": list(self.extra)} if self.extra else {})


class ByteTokenizer:
    """Every byte of the UTF-8 text a token, 256 whatever the corpus: its figures per byte, as enwik8's are published;
    a byte that starts no valid UTF-8 sequence decodes as U+FFFD."""

    kind = "byte"
    vocab_size = 256

    def __init__(self):
        self.token_char_lengths = torch.ones(self.vocab_size, dtype=torch.long)

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int] | torch.Tensor) -> str:
        if isinstance(ids, torch.Tensor):
            return ids.cpu().numpy().astype(np.uint8).tobytes().decode("utf-8", errors="replace")
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def unknown_characters(self, text: str) -> list[str]:
        return sorted({c for c in text if 0xD800 <= ord(c) <= 0xDFFF})  # a lone surrogate has no UTF-8

    def state_dict(self) -> dict:
        return {"kind": self.kind}


def _private_use_chars(text: str, count: int) -> list[str]:
    """The first `count` private-use characters that do not occur in `text`."""
    present = set(text)
    found = [c for c in map(chr, range(0xE000, 0xF900)) if c not in present]
    if len(found) < count:
        raise ValueError("text uses the whole private-use area; no stand-in characters left")
    return found[:count]


class SentencePieceTokenizer:
    """SentencePiece wrapped so that decode(encode(text)) == text: "\\n" (else no piece spans a line end) and
    "▁" (decoded as a space) are swapped for private-use stand-ins."""

    kind = "spm"

    def __init__(self, model_proto: bytes, newline_standin: str, space_standin: str):
        self.model_proto = bytes(model_proto)
        self.newline_standin = newline_standin
        self.space_standin = space_standin
        self._sp = sp = spm.SentencePieceProcessor(model_proto=self.model_proto)
        self._to_sp = str.maketrans({"\n": newline_standin, _SPACE_SYMBOL: space_standin})
        self._from_sp = str.maketrans({_SPACE_SYMBOL: " ", newline_standin: "\n", space_standin: _SPACE_SYMBOL})
        # Decoding is a lookup per id, so token_char_lengths is exact; <unk> decodes to one replacement character.
        self._surfaces = ["\ufffd" if sp.is_unknown(i) else sp.id_to_piece(i).translate(self._from_sp)
                          for i in range(sp.get_piece_size())]
        self.token_char_lengths = torch.tensor([len(s) for s in self._surfaces], dtype=torch.long)
        # Unigram and BPE keep every covered character as a piece: text of these never produces <unk>.
        self._covered = {s for i, s in enumerate(self._surfaces)
                         if len(s) == 1 and not (sp.is_unknown(i) or sp.is_control(i) or sp.is_unused(i))}

    @classmethod
    def train(cls, text: str, vocab_size: int, cache_dir: str | Path, model_type: str = "unigram",
              character_coverage: float = 1.0) -> "SentencePieceTokenizer":
        """Train on `text`, or load the model cached for the same text and settings."""
        # Derived from the text alone, so a cached model needs no side file.
        newline_standin, space_standin = _private_use_chars(text, 2)
        options = dict(_TRAINER_OPTIONS, vocab_size=vocab_size, model_type=model_type,
                       character_coverage=character_coverage)
        key_source = json.dumps({"version": _FORMAT_VERSION, "options": options}, sort_keys=True)
        key = hashlib.sha256(key_source.encode() + b"\0" + text.encode("utf-8")).hexdigest()

        cache_dir = Path(cache_dir)
        cache_dir.mkdir(parents=True, exist_ok=True)
        path = cache_dir / f"spm-{key[:32]}.model"
        with FileLock(str(path) + ".lock"):
            if not path.exists():
                proto = cls._run_trainer(text, newline_standin, space_standin, options)
                atomic_write(path, proto)  # a reader never sees a half-written model
            proto = path.read_bytes()
        return cls(proto, newline_standin, space_standin)

    @staticmethod
    def _run_trainer(text: str, newline_standin: str, space_standin: str, options: dict) -> bytes:
        # One sentence per line with its stand-in kept, so pieces can span line ends.
        lines = text.replace(_SPACE_SYMBOL, space_standin).split("\n")
        sentences = [line + newline_standin for line in lines[:-1]]
        if lines[-1]:
            sentences.append(lines[-1])
        # The trainer silently skips sentences longer than max_sentence_length bytes: no line may be.
        longest = max((len(s.encode("utf-8")) for s in sentences), default=0)
        buffer = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=buffer,
                                           max_sentence_length=max(4192, longest + 1), **options)
        except RuntimeError as err:
            raise _vocab_size_error(err) from None
        return buffer.getvalue()

    @property
    def vocab_size(self) -> int:
        return len(self._surfaces)

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text.translate(self._to_sp))

    def decode(self, ids: Iterable[int] | torch.Tensor) -> str:
        if isinstance(ids, torch.Tensor):  # a split's ids: one lookup, then one join
            return "".join(np.array(self._surfaces, dtype=object)[ids.cpu().numpy()])
        return "".join(self._surfaces[int(i)] for i in ids)

    def unknown_characters(self, text: str) -> list[str]:
        return sorted(set(text) - self._covered)

    def state_dict(self) -> dict:
        # The proto as a uint8 tensor, not bytes: tensors load with weights_only=True on every torch supported.
        return {"kind": self.kind, "format_version": _FORMAT_VERSION,
                "model_proto": torch.frombuffer(bytearray(self.model_proto), dtype=torch.uint8),
                "newline_standin": self.newline_standin, "space_standin": self.space_standin}


def _vocab_size_error(err: RuntimeError) -> UserError:
    """SentencePiece's error as a message that says which setting to change (any other: in its own words)."""
    message = str(err)
    neither = "where no size fits both bounds, the text is too small for SentencePiece: use tokenizer=char"
    if match := re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", message):
        return UserError(f"tokenizer.vocab_size={match[1]} is too large for this corpus: SentencePiece can make at "
                         f"most {match[2]} pieces from its training split; "
                         f"set tokenizer.vocab_size={match[2]} or lower ({neither})")
    if match := re.search(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)", message):
        # required_chars counts SentencePiece's own pieces (<unk>, ...) with the characters: that many works
        return UserError(f"tokenizer.vocab_size={match[1]} is too small for this corpus: SentencePiece needs "
                         f"{match[2]} pieces, one for each distinct character of its training split and its own; "
                         f"set tokenizer.vocab_size={match[2]} or more ({neither})")
    last = message.strip().splitlines()[-1] if message.strip() else type(err).__name__
    return UserError(f"SentencePiece could not train on this corpus (tokenizer.vocab_size and the text): {last}; "
                     "try another tokenizer.vocab_size, or tokenizer=char")


def describe_characters(chars: Iterable[str]) -> str:
    return ", ".join(f"{c!r} (U+{ord(c):04X})" for c in chars)


def encode_prompt(tokenizer, text: str, drop_unknown: bool = False,
                  option: str = "drop_unknown=true") -> list[int]:
    """A user's prompt encoded; characters the tokenizer cannot represent (never a silent <unk>) raise a
    UserError naming them (and `option`, the caller's drop switch), or with drop_unknown are dropped."""
    unknown = tokenizer.unknown_characters(text)
    if unknown and not drop_unknown:
        raise UserError(f"the prompt has characters this model's {tokenizer.kind} vocabulary lacks: "
                        f"{describe_characters(unknown)}; remove them, or drop them with {option}")
    if unknown:
        print(f"dropped from the prompt (not in the vocabulary): {describe_characters(unknown)}", file=sys.stderr)
        text = "".join(c for c in text if c not in set(unknown))
    if not text:
        raise UserError("the prompt is empty" + (" once the unknown characters are dropped" if unknown else "")
                        + "; a prompt needs at least one character the model knows")
    return tokenizer.encode(text)


def build_tokenizer(kind: str, text: str, cache_dir: str | Path, extra: Iterable[str] = (),
                    **settings) -> CharTokenizer | SentencePieceTokenizer | ByteTokenizer:
    """The tokenizer of `kind` fitted on `text` (and, for "char", `extra`: the recall probe's symbols)."""
    if kind == "char":
        if settings:
            raise TypeError(f"char tokenizer takes no settings, got {sorted(settings)}")
        return CharTokenizer.from_text(text, extra)
    if extra:
        raise ValueError("only the char tokenizer takes extra symbols")
    if kind == "spm":
        return SentencePieceTokenizer.train(text, cache_dir=cache_dir, **settings)
    if kind == "byte":
        return ByteTokenizer()
    raise ValueError(f"unknown tokenizer kind {kind!r}; valid kinds: {', '.join(map(repr, KINDS))}")


def decoded_pieces(tokenizer, ids: torch.Tensor, piece_tokens: int = 1 << 24) -> Iterator[str]:
    """`ids` decoded `piece_tokens` at a time (one lookup each): a split's text without all of it in memory."""
    for start in range(0, ids.numel(), piece_tokens):
        yield tokenizer.decode(ids[start:start + piece_tokens])


def plain_tokens(tokenizer) -> torch.Tensor | None:
    """(V,) bool: the token ids plain text can hold (not `extra`); None when that is every token."""
    extra = getattr(tokenizer, "extra", ())
    if not extra:
        return None
    plain = torch.ones(tokenizer.vocab_size, dtype=torch.bool)
    plain[tokenizer.encode("".join(extra))] = False
    return plain


def tokenizer_to_json(tokenizer) -> dict:
    """state_dict as JSON holds it (SentencePiece's model in base64), for the prepared ids' record."""
    state = tokenizer.state_dict()
    if "model_proto" in state:
        state["model_proto"] = base64.b64encode(tokenizer.model_proto).decode()
    return state


def tokenizer_from_json(state: dict) -> CharTokenizer | SentencePieceTokenizer | ByteTokenizer:
    if isinstance(state.get("model_proto"), str):
        state = state | {"model_proto": base64.b64decode(state["model_proto"])}
    return tokenizer_from_state(state)


def tokenizer_from_state(state: dict) -> CharTokenizer | SentencePieceTokenizer | ByteTokenizer:
    kind = state.get("kind")
    if kind == "char":
        return CharTokenizer(state["chars"], state.get("extra", ()))
    if kind == "spm":
        if state.get("format_version") != _FORMAT_VERSION:
            raise ValueError(f"unsupported spm tokenizer format {state.get('format_version')!r}")
        proto = state["model_proto"]
        proto = proto.cpu().numpy().tobytes() if isinstance(proto, torch.Tensor) else bytes(proto)  # a GPU load
        return SentencePieceTokenizer(proto, state["newline_standin"], state["space_standin"])
    if kind == "byte":
        return ByteTokenizer()
    raise ValueError(f"unknown tokenizer kind {kind!r}; valid kinds: {', '.join(map(repr, KINDS))}")
