"""Rebuild the shipped code corpus, gru_experiments/data/corpora/pystdlib.txt.xz (`data=pystdlib`), from this
machine's Python 3.11 standard library, and refuse unless its text has the recorded sha256.

    python tools/build_pystdlib_corpus.py [--stdlib DIR] [--check]

The text: the 46 modules of MODULES (every third, from the second, of the standard library's top-level pure-ASCII
modules under 120,000 characters, not private, sorted by name; fixed here), each read as UTF-8 and preceded by a
separator line naming it: 1,154,220 characters, 96 symbols (Tiny Shakespeare: 1.12M, 65). It was built from CPython
3.11.7; another 3.11.x may differ in a module, and then the sha256 check refuses. The sources are under the PSF
licence, shipped beside the corpus as pystdlib.LICENSE.txt (the stdlib's LICENSE.txt). With --check it only
verifies that the shipped .xz decompresses to the recorded text.
"""

import argparse
import hashlib
import lzma
import shutil
import sys
import sysconfig
from pathlib import Path

CORPORA = Path(__file__).resolve().parent.parent / "gru_experiments" / "data" / "corpora"
OUT = CORPORA / "pystdlib.txt.xz"
LICENCE = CORPORA / "pystdlib.LICENSE.txt"
SHA256 = "0580ce98cfae237574409a8795e9ef8178eecde50b7c1c985f0ae59bb2121230"  # of the text (conf/data/pystdlib.yaml)
MODULES = [
    "aifc", "ast", "base64", "bz2", "cgi", "cmd", "codeop", "configparser", "copy", "csv", "decimal", "doctest",
    "fileinput", "getpass", "graphlib", "hmac", "imp", "keyword", "lzma", "mimetypes", "nntplib", "numbers",
    "optparse", "pdb", "pipes", "plistlib", "pprint", "pty", "pydoc", "random", "sched", "shelve", "site", "sndhdr",
    "sre_compile", "ssl", "stringprep", "sunau", "tabnanny", "tempfile", "threading", "tokenize", "tracemalloc",
    "uu", "wave", "xdrlib"]


def separator(module: str) -> str:
    return f"\n# ======== {module}.py ========\n\n"


def build_text(stdlib: Path) -> str:
    return "".join(separator(m) + (stdlib / f"{m}.py").read_text(encoding="utf-8") for m in MODULES)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]),
                        help="the Python 3.11 standard library's folder (default: this interpreter's)")
    parser.add_argument("--check", action="store_true", help="only verify the shipped corpus")
    args = parser.parse_args()
    if args.check:
        got = hashlib.sha256(lzma.decompress(OUT.read_bytes())).hexdigest()
        print(f"{OUT}: sha256 {got} ({'ok' if got == SHA256 else 'MISMATCH, expected ' + SHA256})")
        return 0 if got == SHA256 else 1
    text = build_text(args.stdlib)
    got = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if got != SHA256:
        print(f"refused: the text built from {args.stdlib} has sha256 {got}, not the recorded {SHA256} "
              f"(recorded from CPython 3.11.7; this interpreter is {sys.version.split()[0]})", file=sys.stderr)
        return 1
    OUT.write_bytes(lzma.compress(text.encode("utf-8"), preset=9 | lzma.PRESET_EXTREME))
    shutil.copyfile(args.stdlib / "LICENSE.txt", LICENCE)
    print(f"wrote {OUT} ({len(text):,} characters, {len(set(text))} symbols, sha256 {got}) and {LICENCE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
