"""The source digest behind the plan cache's and the ops library's keys: it follows the files'
content, and a repeat in a new process reads its memo instead of every source byte."""

from __future__ import annotations

import hashlib
import os

from ortfuse.foundation import source_digest


def _tree(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub" / "__pycache__").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    (pkg / "sub" / "__pycache__" / "c.py").write_text("ignored\n")
    (pkg / "notes.txt").write_text("not a source\n")
    return pkg


def test_digest_is_sha256_of_relative_names_and_bytes(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    pkg = _tree(tmp_path)
    want = hashlib.sha256(b"a.py" + b"x = 1\n" + os.path.join("sub", "b.py").encode() + b"y = 2\n").hexdigest()
    assert source_digest.tree_digest([pkg]) == want
    assert source_digest.tree_digest([pkg]) == want  # from the memo this time
    assert len(list((tmp_path / "cache" / "sources").iterdir())) == 1


def test_an_edited_file_gives_a_new_digest(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    pkg = _tree(tmp_path)
    before = source_digest.tree_digest([pkg])
    (pkg / "a.py").write_text("x = 3\n")  # same size: only the content and the mtime differ
    st = os.stat(pkg / "a.py")
    os.utime(pkg / "a.py", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    after = source_digest.tree_digest([pkg])
    assert after != before
    assert after == source_digest._content_digest([(pkg, source_digest._python_files(pkg))])
    (pkg / "new.py").write_text("")
    assert source_digest.tree_digest([pkg]) not in (before, after)


def test_the_memo_is_read_not_the_sources(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    pkg = _tree(tmp_path)
    first = source_digest.tree_digest([pkg])

    def no_reading(trees):
        raise AssertionError("the memo should have answered")

    monkeypatch.setattr(source_digest, "_content_digest", no_reading)
    assert source_digest.tree_digest([pkg]) == first


def test_a_read_only_cache_still_gives_the_digest(tmp_path, monkeypatch):
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(blocker))
    pkg = _tree(tmp_path)
    assert source_digest.tree_digest([pkg]) == source_digest._content_digest(
        [(pkg, source_digest._python_files(pkg))])


def test_the_memo_folder_keeps_the_newest(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(source_digest, "KEEP", 3)
    pkg = _tree(tmp_path)
    digests = []
    for i in range(5):  # five states of the sources, five memos written
        (pkg / "a.py").write_text(f"x = {i}\n")
        os.utime(pkg / "a.py", ns=(i * 10**9, (i + 1) * 10**9))
        digests.append(source_digest.tree_digest([pkg]))
    memos = list((tmp_path / "cache" / "sources").iterdir())
    assert len(memos) == 3 and len(set(digests)) == 5
    assert digests[-1] in {m.read_text() for m in memos}
