"""A corpus named by URL (data.url, opt-in): downloaded once into data.cache_dir, checked against data.sha256 (a zip's
own), a zip's one file unzipped beside it once (data=enwik8); every write atomic. docs/configuration.md, *data*."""

import hashlib
import shutil
import urllib.request
import zipfile
from pathlib import Path

from gru_experiments.errors import UserError
from gru_experiments.files import atomic_file


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(url: str, dest: Path, sha256: str | None = None) -> Path:
    """Fetch url into dest, verified, atomically."""
    digest = hashlib.sha256()
    with atomic_file(dest) as out, urllib.request.urlopen(url, timeout=60) as response:
        while block := response.read(1 << 20):
            out.write(block)
            digest.update(block)
        if sha256 and (got := digest.hexdigest()) != sha256:
            raise ValueError(f"checksum mismatch for {url}: expected sha256 {sha256}, got {got}")
    return dest


def downloaded_corpus(url: str, sha256: str | None, cache_dir: str | Path) -> Path:
    """The corpus file of `url` in `cache_dir`, fetched unless there (and a `.zip`'s one file unzipped beside it)."""
    cached = Path(cache_dir) / Path(url.split("?")[0]).name
    unzipped = cached.with_suffix("") if cached.suffix == ".zip" else None
    if unzipped is not None and unzipped.is_file():
        return unzipped
    if not cached.exists() or (sha256 and sha256_of(cached) != sha256):
        print(f"downloading {url} -> {cached}")
        try:
            download(url, cached, sha256)
        except (OSError, ValueError) as err:  # no network, HTTP error, checksum mismatch
            raise UserError(f"could not download the corpus from {url} ({err}); "
                            "train on a local file instead: data.path=FILE") from None
    return cached if unzipped is None else unzip_one(cached, unzipped)


def unzip_one(archive: Path, dest: Path) -> Path:
    """The archive's one file (the one named as `dest`, where it holds several) written to `dest`."""
    try:
        with zipfile.ZipFile(archive) as zipped:
            files = [info for info in zipped.infolist() if not info.is_dir()]
            named = [info for info in files if Path(info.filename).name == dest.name]
            if not (named or len(files) == 1):
                raise UserError(f"{archive} holds {len(files)} files, none named {dest.name}: which one is the "
                                "corpus is unclear; unzip it yourself and give data.path=FILE")
            print(f"unzipping {archive} -> {dest}")
            with zipped.open((named or files)[0]) as member, atomic_file(dest) as out:
                shutil.copyfileobj(member, out, 1 << 20)
    except (zipfile.BadZipFile, EOFError, zipfile.LargeZipFile) as err:
        raise UserError(f"{archive} is not a readable zip ({err}): delete it to download it again, or give "
                        "data.path=FILE") from None
    return dest
