"""Object-storage file_mounts, fetched by the server: against a local S3-compatible server (moto's, over
real HTTP, reached through AWS_ENDPOINT_URL as any S3-compatible store is), listing, fetching once per
version, refusing what would land outside the mount, and the errors a user sees."""

from __future__ import annotations

import pytest

from corral.buckets import BucketError, check_source, fetch, list_source, transfer_bytes
from corral.task import parse_task


@pytest.fixture
def s3(s3_server, monkeypatch, tmp_path):
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CORRAL_HOME", str(tmp_path / "home"))
    return s3_server.client(), s3_server.bucket_with_data(tmp_path.name)


def test_a_prefix_is_a_folder_and_a_key_a_file_fetched_once_per_version(s3):
    client, bucket = s3
    folder = fetch(f"s3://{bucket}/imagenet/train")
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) == ["a.txt", "sub/b.txt"]
    assert (folder / "sub" / "b.txt").read_bytes() == b"beta beta\n"
    single = fetch(f"s3://{bucket}/model.bin")
    assert single.name == "model.bin" and single.stat().st_size == 1000
    assert fetch(f"s3://{bucket}/imagenet/train/") == folder  # the same version: not fetched again
    client.put_object(Bucket=bucket, Key="imagenet/train/a.txt", Body=b"alpha 2\n")
    changed = fetch(f"s3://{bucket}/imagenet/train")
    assert changed != folder and (changed / "a.txt").read_bytes() == b"alpha 2\n"  # a new version
    assert list_source(f"s3://{bucket}/imagenet").size == len(b"alpha 2\n") + len(b"beta beta\n")


def test_what_a_dry_run_weighs_without_fetching(s3, tmp_path):
    _, bucket = s3
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "train.py").write_text("x" * 100)
    task = parse_task({"workdir": str(tmp_path / "work"), "file_mounts": {"/data": f"s3://{bucket}/imagenet/train",
                                                                          "/m": f"s3://{bucket}/model.bin"}}, "t")
    assert transfer_bytes(task) == 100 + 6 + 10 + 1000
    assert not list((tmp_path / "home").glob("uploads/bucket-*"))  # listed, not downloaded


def test_errors_say_which_mount_and_what_to_do(s3, monkeypatch):
    _, bucket = s3
    with pytest.raises(BucketError, match="no such object, and no objects under it"):
        fetch(f"s3://{bucket}/nothing/here")
    with pytest.raises(BucketError, match="no such bucket"):
        fetch("s3://no-such-bucket-corral/x")
    client, _ = s3
    client.put_object(Bucket=bucket, Key="evil/../../escape.txt", Body=b"x")
    with pytest.raises(BucketError, match="would land outside the mount point"):
        fetch(f"s3://{bucket}/evil")
    with pytest.raises(ValueError, match="gs:// object storage .SkyPilot's; not through this client. is not supported"):
        check_source("gs://bucket/x")
    check_source("s3://bucket/x")
    check_source("./local/path")
    with pytest.raises(Exception, match="r2:// object storage"):
        parse_task({"file_mounts": {"/d": "r2://b/k"}}, "t")
    # SkyPilot's mapping form naming an existing bucket
    assert parse_task({"file_mounts": {"/d": {"name": bucket, "store": "s3", "mode": "MOUNT"}}}, "t").file_mounts == \
        {"/d": f"s3://{bucket}"}
