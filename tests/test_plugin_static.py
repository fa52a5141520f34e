"""Static files: the frontend served with explicit MIME types, nothing outside its directory."""

import os
import shutil
import subprocess
import sys

import pytest
from werkzeug import test as werkzeug_test

from tb_numerics_plugin.plugin import static
from test_plugin_helpers import PREFIX, make_client

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    return make_client(str(tmp_path_factory.mktemp("empty_logdir")))


@pytest.fixture
def own_root(tmp_path):
    """A frontend directory of our own, with a secret file next to it."""
    root = tmp_path / "frontend"
    (root / "views").mkdir(parents=True)
    (root / "index.js").write_text("export function render() {}\n")
    (root / "views" / "pane.js").write_text("export const x = 1;\n")
    (root / "style.css").write_text("body {}\n")
    (root / "icon.svg").write_text("<svg/>")
    (root / "notes.py").write_text("secret = 1\n")
    (tmp_path / "secret.js").write_text("secret\n")
    os.symlink(tmp_path / "secret.js", root / "link.js")
    return str(root)


def _own_client(root):
    return werkzeug_test.Client(static.StaticFiles("/s/", os.path.realpath(root)))


@pytest.mark.skipif(bool(os.environ.get("TB_NUMERICS_INSTALLED")),
                    reason="the package under test is an installed wheel, not this checkout")
def test_frontend_dir_is_found_in_the_source_checkout():
    assert static.find_frontend_dir() == os.path.realpath(os.path.join(_REPO, "frontend"))


def test_frontend_dir_is_found_in_a_wheel_layout(tmp_path):
    # A wheel puts frontend/ inside the package (setup.py's package_dir mapping).
    site = tmp_path / "site"
    shutil.copytree(os.path.join(_REPO, "tb_numerics_plugin"), site / "tb_numerics_plugin",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copytree(os.path.join(_REPO, "frontend"), site / "tb_numerics_plugin" / "frontend")
    probe = "from tb_numerics_plugin.plugin import static; print(static.find_frontend_dir())"
    out = subprocess.run([sys.executable, "-c", probe], cwd=str(tmp_path), check=True,
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(site)))
    assert out.stdout.strip() == os.path.realpath(site / "tb_numerics_plugin" / "frontend")


def test_every_frontend_module_is_served_as_text_javascript(client):
    root = static.find_frontend_dir()
    modules = [
        os.path.relpath(os.path.join(d, f), root)
        for d, _, files in os.walk(root)
        for f in files
        if f.endswith(".js") and not f.startswith(".")
    ]
    assert modules
    for module in modules:
        response = client.get(PREFIX + "static/" + module)
        assert response.status_code == 200, module
        assert response.mimetype == "text/javascript"
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        with open(os.path.join(root, module), "rb") as f:
            assert response.get_data() == f.read()


def test_entry_module_path_is_under_the_static_route(client):
    listing = client.get("/data/plugins_listing").get_json()
    mechanism = listing["numerics"]["loading_mechanism"]
    assert mechanism == {"type": "IFRAME", "module_path": PREFIX + "static/index.js"}
    assert listing["numerics"]["tab_name"] == "Numerics Debugger"


@pytest.mark.parametrize(
    "name,mime",
    [("index.js", "text/javascript"), ("views/pane.js", "text/javascript"),
     ("style.css", "text/css"), ("icon.svg", "image/svg+xml")],
)
def test_files_in_subdirectories_are_served_with_explicit_types(own_root, name, mime):
    response = _own_client(own_root).get("/s/" + name)
    assert response.status_code == 200 and response.mimetype == mime


@pytest.mark.parametrize(
    "path",
    [
        "../secret.js",
        "%2e%2e/secret.js",
        "views/../../secret.js",
        "views/%2e%2e/%2e%2e/secret.js",
        "..%2fsecret.js",
        "/etc/passwd",
        "%2fetc%2fpasswd",
        "..\\secret.js",
        "link.js",
        "notes.py",
        "views",
        "missing.js",
        "",
        ".hidden.js",
        "index.js%00.css",
    ],
)
def test_traversal_symlinks_unknown_types_and_directories_are_404(own_root, path):
    response = _own_client(own_root).get("/s/" + path)
    assert response.status_code == 404


@pytest.mark.parametrize(
    "path", ["../plugin/plugin.py", "%2e%2e/%2e%2e/setup.py", "..%2f..%2fsetup.py", "/etc/passwd"]
)
def test_traversal_through_tensorboard_is_404(client, path):
    assert client.get(PREFIX + "static/" + path).status_code == 404


def test_files_and_routes_are_served_under_a_path_prefix(tmp_path):
    client = make_client(str(tmp_path), path_prefix="/tb")
    response = client.get("/tb" + PREFIX + "static/index.js")
    assert response.status_code == 200 and response.mimetype == "text/javascript"
    assert client.get("/tb" + PREFIX + "runs").get_json() == {"runs": []}
