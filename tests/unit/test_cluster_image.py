"""The worker image recipe (squall/cluster/image.py), without Docker: the Debian mirror and the torch index
chosen from the settings, never from the host's apt sources; a mirror and an index asked over real sockets
(a local HTTP server); real ``pip download`` runs against a local index whose tiny wheels stand for a CPU
and a CUDA resolution; the input hashing.

The debootstrap base built on a host whose apt sources are Ubuntu's: tests/integration/test_image_base.py.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import socket
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from squall.cluster import image
from squall.cluster.errors import ImageError

# -- the Debian mirror -----------------------------------------------------------------------------


def test_the_mirror_is_squalls_default_or_the_setting() -> None:
    assert image.debian_mirror({}) == image.DEFAULT_DEBIAN_MIRROR == "http://deb.debian.org/debian"
    assert image.debian_mirror({"SQUALL_DEBIAN_MIRROR": " http://mirror.example/debian/ "}) == (
        "http://mirror.example/debian")
    assert image.debian_mirror({"SQUALL_DEBIAN_MIRROR": ""}) == image.DEFAULT_DEBIAN_MIRROR


@pytest.mark.parametrize("bad", ["mirror.example/debian", "ftp://mirror.example/debian", "http://"])
def test_a_mirror_that_is_not_a_url_is_refused_naming_the_setting(bad: str) -> None:
    with pytest.raises(ImageError, match=r"SQUALL_DEBIAN_MIRROR=.* is not a Debian mirror URL"):
        image.debian_mirror({"SQUALL_DEBIAN_MIRROR": bad})


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """No request lines on stderr."""


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A local HTTP server over a temporary folder: (its URL, the folder)."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()
    server.server_close()


def test_a_mirror_that_serves_the_suite_passes(served: tuple[str, Path]) -> None:
    url, root = served
    release = root / "debian" / "dists" / "bookworm" / "Release"
    release.parent.mkdir(parents=True)
    release.write_text("Origin: Debian\nSuite: oldstable\nCodename: bookworm\n")
    image.check_mirror(f"{url}/debian", "bookworm")
    with pytest.raises(ImageError, match="does not serve trixie"):
        image.check_mirror(f"{url}/debian", "trixie")  # 404
    (root / "other" / "dists" / "bookworm").mkdir(parents=True)
    (root / "other" / "dists" / "bookworm" / "Release").write_text("Origin: Ubuntu\nCodename: noble\n")
    with pytest.raises(ImageError, match="is not the Release file of Debian bookworm"):
        image.check_mirror(f"{url}/other", "bookworm")


def test_a_mirror_that_does_not_answer_says_what_to_set() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ImageError) as caught:
        image.check_mirror(f"http://127.0.0.1:{port}/debian", "bookworm", timeout=5)
    message = str(caught.value)
    assert "does not serve bookworm" in message and "SQUALL_DEBIAN_MIRROR" in message
    assert "docker pull python:3.11-slim" in message and "SQUALL_BASE_IMAGE" in message


# -- the torch index -------------------------------------------------------------------------------


def test_an_index_setting_is_used_as_it_is_and_none_turns_it_off() -> None:
    def never(_url: str) -> str:
        raise AssertionError("an explicit setting is not probed")

    assert image.torch_index({"SQUALL_TORCH_INDEX": "https://mirror.example/whl/cpu"}, probe=never) == (
        "https://mirror.example/whl/cpu")
    assert image.torch_index({"SQUALL_TORCH_INDEX": "none"}, probe=never) is None
    assert image.torch_index({"SQUALL_TORCH_INDEX": ""}, probe=never) is None
    with pytest.raises(ImageError, match=r"SQUALL_TORCH_INDEX='download\.pytorch\.org/whl/cpu' is not an index URL"):
        image.torch_index({"SQUALL_TORCH_INDEX": "download.pytorch.org/whl/cpu"}, probe=never)


def test_unset_the_cpu_index_is_added_where_it_answers() -> None:
    asked: list[str] = []

    def probe(url: str) -> str:
        asked.append(url)
        return ""

    assert image.torch_index({}, probe=probe) == image.DEFAULT_TORCH_INDEX == "https://download.pytorch.org/whl/cpu"
    assert asked == ["https://download.pytorch.org/whl/cpu/torch/"]
    assert image.torch_index({}, probe=lambda _url: "timed out") is None  # pip's configuration alone


def test_answers_asks_over_a_real_socket(served: tuple[str, Path]) -> None:
    url, root = served
    (root / "torch").mkdir()
    (root / "torch" / "index.html").write_text("<a href='x'>x</a>")
    assert image.answers(f"{url}/torch/") == ""
    assert image.answers(f"{url}/absent/") == ""  # a 404 is an answer: the index is there
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert image.answers(f"http://127.0.0.1:{port}/", timeout=5) != ""


# -- CUDA in the image -----------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "cuda"), [
    ("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", False),
    ("torch-2.13.0+cu121-cp311-cp311-linux_x86_64.whl", True),
    ("nvidia_cublas_cu12-12.4.5.8-py3-none-manylinux2014_x86_64.whl", True),
    ("nvidia-nccl-cu12-2.20.5-py3-none-manylinux2014_x86_64.whl", True),
    ("triton-3.1.0-cp311-cp311-manylinux_2_17_x86_64.whl", True),
    ("numpy-2.4.6-cp311-cp311-manylinux_2_17_x86_64.whl", False),
    ("scikit_learn-1.9.1-cp311-cp311-manylinux_2_17_x86_64.whl", False),
])
def test_cuda_wheels_are_named(name: str, cuda: bool) -> None:
    assert image.cuda_wheels([name]) == ([name] if cuda else [])


def _wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A real, tiny wheel (metadata only) of ``name``, for a local index."""
    stem = f"{name.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    files = {f"{info}/METADATA": metadata,
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{k},sha256={base64.urlsafe_b64encode(hashlib.sha256(v.encode()).digest()).rstrip(b'=').decode()},"
              f"{len(v.encode())}" for k, v in files.items()]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    path = folder / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for k, v in files.items():
            zf.writestr(k, v)
    return path


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A local simple index (file://) with a CPU-only package and one that needs NVIDIA's runtime; pip
    reads no configuration file and no other index (so nothing here depends on the network)."""
    root = tmp_path / "index"
    files = tmp_path / "files"
    files.mkdir()
    wheels = [_wheel(files, "cpuonly", "1.0"), _wheel(files, "gputhing", "1.0", ("nvidia-cublas-cu12==12.4.5.8",)),
              _wheel(files, "nvidia-cublas-cu12", "12.4.5.8")]
    for wheel in wheels:
        project = wheel.name.split("-", 1)[0].replace("_", "-")
        (root / project).mkdir(parents=True)
        (root / project / "index.html").write_text(f'<a href="{wheel.as_uri()}">{wheel.name}</a>\n')
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "empty").as_uri())
    (tmp_path / "empty").mkdir()
    for name in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS"):
        monkeypatch.delenv(name, raising=False)
    return root.as_uri()


def test_the_index_setting_reaches_pip_and_the_resolved_wheels_come_back(tmp_path: Path, index: str) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("cpuonly==1.0\n")
    with pytest.raises(ImageError, match=r"from pip's own configuration \(no extra index\) failed"):
        image.download_wheels(tmp_path / "none", requirements=requirements, index=None)
    wheels = image.download_wheels(tmp_path / "dest", requirements=requirements, index=index)
    assert [w.name for w in wheels] == ["cpuonly-1.0-py3-none-any.whl"] and wheels[0].is_file()
    again = image.download_wheels(tmp_path / "dest", requirements=requirements, index=index)  # already there
    assert [w.name for w in again] == ["cpuonly-1.0-py3-none-any.whl"]


def test_a_resolution_that_brings_nvidia_wheels_stops_with_their_names(tmp_path: Path, index: str) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("gputhing==1.0\n")
    with pytest.raises(ImageError) as caught:
        image.download_wheels(tmp_path / "dest", requirements=requirements, index=index)
    message = str(caught.value)
    assert "would get CUDA: nvidia_cublas_cu12-12.4.5.8-py3-none-any.whl" in message
    assert "torch==X+cpu" in message and "SQUALL_TORCH_INDEX" in message


def test_the_download_command_adds_the_index_only_when_there_is_one(tmp_path: Path) -> None:
    with_index = image.download_command(tmp_path / "r.txt", tmp_path, "https://download.pytorch.org/whl/cpu")
    assert with_index[with_index.index("--extra-index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    assert "--extra-index-url" not in image.download_command(tmp_path / "r.txt", tmp_path, None)


def test_the_image_pins_torchs_cpu_build() -> None:
    pins = [line for line in image.REQUIREMENTS.read_text().splitlines() if line.startswith("torch==")]
    assert len(pins) == 1 and pins[0].endswith("+cpu"), pins


# -- hashing ---------------------------------------------------------------------------------------


def test_worker_tag_is_a_hash_of_its_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dockerfile, reqs = tmp_path / "Dockerfile", tmp_path / "requirements.txt"
    dockerfile.write_text("FROM x\n")
    reqs.write_text("numpy==1\n")
    monkeypatch.setattr(image, "DOCKERFILE", dockerfile)
    monkeypatch.setattr(image, "REQUIREMENTS", reqs)
    first = image.worker_tag("base-a")
    assert first == image.worker_tag("base-a")
    assert first.startswith("squall-worker:")
    assert image.worker_tag("base-b") != first
    reqs.write_text("numpy==2\n")
    assert image.worker_tag("base-a") != first


def test_no_mirror_address_is_written_in_the_recipe() -> None:
    """The mirror is chosen in one place (image.py's default, or the setting): not in the recipe files."""
    for path in [image.DOCKERFILE, image.REQUIREMENTS, image.DEBOOTSTRAP_SCRIPT]:
        assert "deb.debian.org" not in path.read_text()
        assert "http://" not in path.read_text()
