"""The registry side of framework environments: which versions have a wheel that installs
here, read from a real HTTP index speaking the simple API's JSON (PEP 691)."""

from __future__ import annotations

import http.server
import json
import threading

import pytest
from packaging.tags import Tag

from shipyard.environments import registry

CP311 = [
    Tag("cp311", "cp311", "manylinux_2_17_x86_64"),
    Tag("cp311", "cp311", "manylinux2014_x86_64"),
    Tag("py3", "none", "any"),
]
FILES = [
    "tensorflow_cpu-2.4.1-cp38-cp38-manylinux2010_x86_64.whl",  # no 3.11 wheel: not offered
    "tensorflow_cpu-2.12.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    "tensorflow_cpu-2.13.1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    "tensorflow_cpu-2.13.1-cp311-cp311-win_amd64.whl",
    "tensorflow_cpu-2.15.0.post1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    "tensorflow_cpu-2.16.0rc0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    "tensorflow_cpu-2.21.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    "tensorflow-cpu-2.13.1.tar.gz",
    "not a wheel.whl",
]


def test_only_versions_with_a_wheel_for_this_python_and_platform_count():
    assert registry.installable_versions(FILES, CP311) == ["2.12.0", "2.13.1", "2.15.0"]


class _Index(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path == "/simple/tensorflow-cpu/" and "json" in self.headers.get("Accept", ""):
            body = json.dumps(
                {"meta": {"api-version": "1.1"}, "files": [{"filename": f} for f in FILES]}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", registry.ACCEPT)
        elif self.path == "/simple/html-only/":
            body = b"<html>not json</html>"
            self.send_response(200)
        else:
            body = b"not found"
            self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def index():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/simple"
    srv.shutdown()
    srv.server_close()


def test_the_index_is_asked_for_one_package(index):
    assert registry.fetch_filenames("tensorflow-cpu", index) == FILES


def test_an_unknown_package_names_the_registrys_answer(index):
    with pytest.raises(registry.RegistryError, match=r"nope: the registry at .* answered HTTP 404"):
        registry.available("nope", index)


def test_an_index_without_the_json_api_says_so(index):
    with pytest.raises(registry.RegistryError, match="simple API's JSON"):
        registry.fetch_filenames("html-only", index)


def test_an_unreachable_index_says_what_to_set(index):
    dead = "http://127.0.0.1:9/simple"  # the discard port: nothing listens
    with pytest.raises(registry.RegistryError, match="could not be reached.*UV_DEFAULT_INDEX"):
        registry.available("tensorflow-cpu", dead)


def test_the_configured_index_is_used(monkeypatch):
    for key in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
        monkeypatch.delenv(key, raising=False)
    assert registry.index_url() == registry.DEFAULT_INDEX
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror.example/simple/")
    assert registry.index_url() == "https://mirror.example/simple"
    assert registry.index_url("https://download.pytorch.org/whl/cpu") == (
        "https://download.pytorch.org/whl/cpu"
    )
