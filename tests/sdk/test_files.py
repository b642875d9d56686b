"""The client reads a task's local files where the user runs the command and packs them for the server;
the server unpacks only what is safe (`corral.uploads`). No cluster needed."""

from __future__ import annotations

import asyncio
import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from corral.errors import ConfigError, TaskError
from corral.sdk.files import pack, task_files
from corral import uploads


@pytest.fixture(autouse=True)
def own_temporary_folder(tmp_path, monkeypatch):
    """pack's archives (which these tests keep to read) go under the test's folder, not the machine's /tmp."""
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))


def members(archive: Path) -> list[str]:
    with tarfile.open(archive) as tar:
        return sorted(m.name for m in tar.getmembers() if m.isfile())


def workdir_with_ignores(root: Path) -> Path:
    src = root / "work"
    for folder in ("build", "sub", "data"):
        (src / folder).mkdir(parents=True)
    (src / ".gitignore").write_text("*.ckpt\nbuild/\n")
    (src / "sub" / ".gitignore").write_text("local.txt\n")
    for name in ("a.py", "model.ckpt", "build/x", "sub/local.txt", "sub/keep.py", "data/big.bin"):
        (src / name).write_text(name)
    return src


def test_relative_paths_are_taken_from_where_the_command_runs(tmp_path, monkeypatch):
    (tmp_path / "proj" / "code").mkdir(parents=True)
    (tmp_path / "proj" / "data.csv").write_text("1,2\n")
    home = tmp_path / "home"
    (home / "shared").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    found = task_files({"workdir": "code", "file_mounts": {"/data/x.csv": "data.csv", "s": "~/shared"}},
                       tmp_path / "proj")
    assert found.workdir == tmp_path / "proj" / "code"
    assert found.mounts == {"/data/x.csv": tmp_path / "proj" / "data.csv", "s": home / "shared"}


def test_a_missing_local_path_is_named_before_anything_is_sent(tmp_path):
    with pytest.raises(TaskError, match=r"workdir 'nope' is not a directory \(relative to "):
        task_files({"workdir": "nope"}, tmp_path)
    with pytest.raises(TaskError, match=r"file_mounts\['/d'\]: local path 'gone.txt' does not exist"):
        task_files({"file_mounts": {"/d": "gone.txt"}}, tmp_path)
    # values of the wrong type are the server's to report (it names the field), not a crash here
    assert not task_files({"workdir": 3, "file_mounts": ["x"]}, tmp_path)
    assert not task_files(["not", "a", "mapping"], tmp_path)


def test_a_workdir_leaves_out_what_gitignore_or_corralignore_says(tmp_path):
    """As SkyPilot does with .gitignore and .skyignore: every .gitignore, each for its own folder; or
    `.corralignore` at the root instead."""
    src = workdir_with_ignores(tmp_path)
    packed = pack(src, workdir=True)
    assert members(packed.archive) == ["tree/.gitignore", "tree/a.py", "tree/data/big.bin", "tree/sub/.gitignore",
                                       "tree/sub/keep.py"]
    (src / ".corralignore").write_text("data/\n*.ckpt\n")  # takes over from .gitignore
    assert members(pack(src, workdir=True).archive) == [
        "tree/.corralignore", "tree/.gitignore", "tree/a.py", "tree/build/x", "tree/sub/.gitignore",
        "tree/sub/keep.py", "tree/sub/local.txt"]


def test_the_same_content_packs_to_the_same_digest_and_a_change_to_another(tmp_path):
    src = workdir_with_ignores(tmp_path)
    first, again = pack(src, workdir=True), pack(src, workdir=True)
    assert first.digest == again.digest == hashlib.sha256(first.archive.read_bytes()).hexdigest()
    (src / "model.ckpt").write_text("ignored: no change")
    assert pack(src, workdir=True).digest == first.digest
    (src / "a.py").write_text("changed")
    assert pack(src, workdir=True).digest != first.digest


def test_a_file_mount_is_sent_whole_under_its_own_name(tmp_path):
    (tmp_path / ".gitignore").write_text("*.csv\n")  # ignore rules are for workdirs only
    data = tmp_path / "data.csv"
    data.write_text("1,2\n")
    assert members(pack(data, workdir=False).archive) == ["file/data.csv"]


# ---- the server's side ------------------------------------------------------------------------------

def receive(archive: bytes, digest: str | None = None) -> Path:
    async def body():
        yield archive[: len(archive) // 2]
        yield archive[len(archive) // 2:]

    return asyncio.run(uploads.receive(digest or hashlib.sha256(archive).hexdigest(), body()))


def tar_of(entries: list[tarfile.TarInfo], data: bytes = b"x") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for info in entries:
            if info.isfile():
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return out.getvalue()


def entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


def test_the_server_unpacks_an_upload_once_and_resolves_it(corral_home):
    src = workdir_with_ignores(corral_home.parent)
    packed = pack(src, workdir=True)
    archive = packed.archive.read_bytes()
    held = receive(archive)
    assert held == uploads.upload_path(packed.digest) and (held / "tree" / "sub" / "keep.py").read_text() == "sub/keep.py"
    assert not (held / "tree" / "model.ckpt").exists()
    assert receive(archive) == held  # idempotent: the same content again is found, not unpacked again
    assert uploads.resolve(packed.digest, "workdir") == held / "tree"


@pytest.mark.parametrize("entries, why", [
    ([entry("tree/../../escape")], "outside"),
    ([entry("/etc/evil")], "outside|absolute|tree/ or one file"),
    ([entry("tree/link", tarfile.SYMTYPE, "/etc/passwd")], "absolute|outside"),
    ([entry("tree/dev", tarfile.CHRTYPE)], "special|device"),
    ([entry("tree/a"), entry("file/b")], "one folder as tree/ or one file as file/"),
])
def test_the_server_refuses_an_upload_that_would_write_outside_its_folder(corral_home, entries, why):
    with pytest.raises(uploads.UploadError, match=why):
        receive(tar_of(entries))
    assert not any(p.name != ".incoming" for p in uploads.uploads_dir().iterdir() if not p.name.startswith("."))
    assert not (corral_home.parent / "escape").exists()


def test_the_server_refuses_content_that_does_not_match_its_digest(corral_home):
    archive = tar_of([entry("tree/a")])
    with pytest.raises(uploads.UploadError, match="does not match its digest"):
        receive(archive, "0" * 64)
    assert list(uploads.uploads_dir().iterdir()) == []


def test_the_server_refuses_an_upload_over_its_limit_and_keeps_nothing_of_it(corral_home, monkeypatch):
    archive = tar_of([entry("tree/a")], b"x" * 4096)
    monkeypatch.setenv("CORRAL_MAX_UPLOAD_BYTES", str(len(archive) - 1))
    with pytest.raises(uploads.UploadError, match=f"larger than {len(archive) - 1:,} bytes"):
        receive(archive)
    assert list(uploads.uploads_dir().iterdir()) == []
    monkeypatch.setenv("CORRAL_MAX_UPLOAD_BYTES", str(len(archive)))
    assert receive(archive).is_dir()


def test_a_declared_size_over_the_limit_is_refused_before_anything_is_read(corral_home, monkeypatch):
    monkeypatch.setenv("CORRAL_MAX_UPLOAD_BYTES", "1000")

    async def never():
        raise AssertionError("read")
        yield b""

    with pytest.raises(uploads.UploadError, match="larger than 1,000 bytes"):
        asyncio.run(uploads.receive("0" * 64, never(), declared=1001))
    assert list(uploads.uploads_dir().iterdir()) == []


def test_a_server_that_takes_less_than_its_client_is_named_before_anything_is_sent(refusing_clusters,
                                                                                  monkeypatch):
    """Its refusal mid-stream came to the client, still sending, as a reset connection: "the local Corral
    server did not answer: Connection reset by peer", three times out of three."""
    from corral.sdk import Client
    from corral.sdk.files import LocalFiles

    monkeypatch.setenv("CORRAL_MAX_UPLOAD_BYTES", "100000")
    client = Client()
    client.endpoint  # the server starts with the lower limit
    monkeypatch.delenv("CORRAL_MAX_UPLOAD_BYTES")  # the client's own: the default
    data = refusing_clusters / "data"
    data.mkdir()
    (data / "part").write_bytes(bytes(300_000))
    with pytest.raises(TaskError, match=r"data: 30\d\.\d KiB to send, more than 97\.7 KiB \(the server's "
                                        r"CORRAL_MAX_UPLOAD_BYTES\)"):
        client.send_files(LocalFiles(workdir=None, mounts={"/data": data}))
    (data / "part").write_bytes(bytes(1000))
    assert client.send_files(LocalFiles(workdir=None, mounts={"/data": data}))["file_mounts"]["/data"]


def test_a_launch_naming_files_the_server_lacks_is_refused(corral_home):
    with pytest.raises(uploads.UploadNotFoundError, match="does not hold upload 000000000000"):
        uploads.resolve("0" * 64, "workdir")


def test_old_uploads_go_unless_a_live_managed_job_names_them(corral_home):
    import json
    import os
    import time

    held = {name: receive(tar_of([entry(f"tree/{name}")], name.encode())) for name in ("old", "named", "fresh")}
    month_ago = time.time() - 30 * 86400
    for name in ("old", "named"):
        os.utime(held[name], (month_ago, month_ago))
    leftover = uploads.uploads_dir() / ".unpacking-x"
    leftover.mkdir()
    os.utime(leftover, (month_ago, month_ago))
    live = [json.dumps({"workdir": str(held["named"] / "tree"), "file_mounts": {}}), "not json"]
    removed = uploads.prune(live)
    assert removed == [held["old"].name]
    assert not held["old"].exists() and held["named"].exists() and held["fresh"].exists()
    assert not leftover.exists()
    # Sending content again marks it as in use: it is kept another window.
    os.utime(held["fresh"], (month_ago, month_ago))
    receive(tar_of([entry("tree/fresh")], b"fresh"))
    assert uploads.prune(live) == [] and held["fresh"].exists()


def test_a_folder_that_holds_the_temporary_folder_is_refused_before_anything_is_packed(tmp_path, monkeypatch):
    """`--workdir /` (or /tmp) copied its own staging copy and archive into themselves until the disk was
    full: 35 GB in one CI run before it was stopped."""
    import tempfile

    scratch = tmp_path / "scratch"  # the temporary folder here (rather than the fixture's)
    scratch.mkdir()
    (tmp_path / "proj").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    (tmp_path / "data").mkdir()
    for data in ({"workdir": "."}, {"workdir": "/"}, {"workdir": "scratch"}, {"file_mounts": {"/d": str(tmp_path)}}):
        with pytest.raises(TaskError, match=r"holds this machine's temporary folder \(.*scratch\)"):
            task_files(data, tmp_path)
    found = task_files({"workdir": "proj", "file_mounts": {"/d": "data"}}, tmp_path)
    assert found.workdir == tmp_path / "proj" and found.mounts == {"/d": tmp_path / "data"}


def test_a_path_over_the_limit_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    """More to send than the server takes (CORRAL_MAX_UPLOAD_BYTES) is named at once, with what to do,
    instead of packing gigabytes first; what ignore rules leave out does not count."""
    import tempfile

    monkeypatch.setenv("CORRAL_MAX_UPLOAD_BYTES", "1000")
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    (work / "train.py").write_text("print(1)\n")
    (work / "data" / "big.bin").write_bytes(b"\0" * 5000)
    with pytest.raises(TaskError, match=r"work: 4\.9 KiB to send, more than 1000 B \(CORRAL_MAX_UPLOAD_BYTES\).*\.corralignore"):
        pack(work, workdir=True)
    with pytest.raises(TaskError, match="CORRAL_MAX_UPLOAD_BYTES"):  # a file_mounts folder, sent whole
        pack(work / "data", workdir=False)
    with pytest.raises(TaskError, match="CORRAL_MAX_UPLOAD_BYTES"):  # a single file
        pack(work / "data" / "big.bin", workdir=False)
    assert list(Path(tempfile.gettempdir()).iterdir()) == []  # nothing packed, nothing staged
    (work / ".gitignore").write_text("data/\n")
    packed = pack(work, workdir=True)
    assert members(packed.archive) == ["tree/.gitignore", "tree/train.py"]
    monkeypatch.setenv("CORRAL_MAX_UPLOAD_BYTES", "lots")
    with pytest.raises(ConfigError, match="'lots' is not a number of bytes"):
        pack(work, workdir=True)
