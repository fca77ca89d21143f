"""Locally built container images: archives containerd and kind can import, reproducibly."""

from __future__ import annotations

import io
import json
import tarfile

from e2e.images.node_images import Entry, ImageSpec, docker_archive, layer_tar


def _spec(data: bytes = b"hello") -> ImageSpec:
    entries = (
        Entry("bin", "dir"),
        Entry("bin/tool", "file", data=data),
        Entry("bin/sh", "symlink", target="tool"),
    )
    return ImageSpec(name="localhost/x/y:1", entries=entries, entrypoint=("/bin/sh",))


def _members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {
            m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


def test_archive_is_a_docker_archive_whose_manifest_names_config_and_layer() -> None:
    files = _members(docker_archive(_spec()))
    (manifest,) = json.loads(files["manifest.json"])
    assert manifest["RepoTags"] == ["localhost/x/y:1"]
    config = json.loads(files[manifest["Config"]])
    assert config["config"]["Entrypoint"] == ["/bin/sh"]
    (layer_path,) = manifest["Layers"]
    layer = files[layer_path]
    # The config's diff_id must be the digest of the uncompressed layer, or import fails.
    import hashlib

    assert config["rootfs"]["diff_ids"] == [f"sha256:{hashlib.sha256(layer).hexdigest()}"]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        sh = tar.getmember("bin/sh")
        assert sh.issym() and sh.linkname == "tool"
        assert tar.extractfile("bin/tool").read() == b"hello"  # type: ignore[union-attr]


def test_archives_are_reproducible_and_change_with_content() -> None:
    assert docker_archive(_spec()) == docker_archive(_spec())
    assert docker_archive(_spec()) != docker_archive(_spec(b"other"))


def test_layer_entries_are_root_owned_and_sorted() -> None:
    entries = [Entry("b", "dir"), Entry("a", "file", data=b"x")]
    with tarfile.open(fileobj=io.BytesIO(layer_tar(entries))) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["a", "b"]
    assert all((m.uid, m.gid, m.mtime) == (0, 0, 0) for m in members)
