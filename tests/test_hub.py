"""adaptive.hub against a local stand-in of the Hub's HTTP API (real huggingface_hub client, real HTTP, no internet).

The stand-in implements what huggingface_hub 2.4.0 calls for `create_repo` + `upload_folder`:
  POST /api/repos/create                         create_repo
  GET  /api/models/<ns>/<name>                   repo_info (the uploader checks visibility when private=True)
  POST /api/validate-yaml                        upload_folder validates README.md metadata first
  POST /api/models/<ns>/<name>/preupload/<rev>   upload modes; "regular" for every file, so no LFS / xet transfer
  POST /api/models/<ns>/<name>/commit/<rev>      ndjson commit; regular files arrive base64-encoded in it

huggingface_hub retries 5xx answers of preupload/commit itself (http_backoff: 5 retries, 1-8 s apart). Tests that
exercise the uploader's own retry loop turn that off (`no_library_retries`) so a 500 reaches it at once.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

from adaptive.hub import HubUploader, resolve_token, upload_patterns

TOKEN = "hf_TestTokenAbcdefghijklmnopqrstuvwxyz012345"
REPO = "someone/ddpm-run"

PIPELINE_FILES = {
    "model_index.json": b'{"_class_name": "DDPMPipeline"}',
    "unet/config.json": b'{"sample_size": 32}',
    "unet/diffusion_pytorch_model.safetensors": bytes(range(256)) * 8,
    "scheduler/scheduler_config.json": b'{"num_train_timesteps": 1000}',
    "README.md": b"---\nlicense: apache-2.0\ntags:\n- ddpm\n---\n# run\n![samples](samples/grid_0000010.png)\n",
    "config.json": b'{"resolution": 32}',
    "samples/grid_0000010.png": b"\x89PNG\r\n\x1a\nfake-grid",
    "timestep_p.png": b"\x89PNG\r\n\x1a\nfake-heatmap",
}
CHECKPOINT_FILES = {
    "checkpoint-10/model.safetensors": b"weights",
    "checkpoint-10/optimizer.bin": b"optimizer",
    "checkpoint-10/random_states_0.pkl": b"rng",
    "checkpoint-10/manifest.json": b'{"step": 10}',
    "checkpoint-10/config.json": b'{"resolution": 32}',
}
PRIVATE_FILES = {  # never published
    "logs/ddpm/events.out.tfevents.1.host": b"tensorboard",
    "stats.jsonl": b'{"step": 1}\n',
    "run_info.json": b'{"host": "secret-box"}',
    "samples/grid.png.tmp": b"partial",
    ".checkpoint-20.tmp/model.safetensors": b"half-written",
}


# ---------------------------------------------------------------------------------------------- the stand-in


class FakeHub:
    """Just enough of the Hub: routes are (method, path regex) -> handler(match, body, headers) -> (status, json)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.repos: dict[str, dict] = {}  # repo_id -> {"private": bool, "authorization": str | None}
        self.commits: list[dict] = []  # {"repo_id", "summary", "files": {path: bytes}}
        self.requests: list[tuple[str, str]] = []
        self.fail_commits = 0  # answer the next N commit requests with HTTP fail_status
        self.fail_status = 500
        self.commit_delay = 0.0  # seconds each commit request sleeps before answering
        self.commit_started = threading.Event()
        repo = r"/api/models/(?P<repo>[^/]+/[^/]+)"
        self.routes = {
            ("POST", r"/api/repos/create"): self.create_repo,
            ("GET", repo): self.repo_info,
            ("POST", r"/api/validate-yaml"): self.validate_yaml,
            ("POST", repo + r"/preupload/(?P<rev>[^/]+)"): self.preupload,
            ("POST", repo + r"/commit/(?P<rev>[^/]+)"): self.commit,
        }

    # -- handlers
    def create_repo(self, m, body, headers):
        payload = json.loads(body)
        repo_id = f"{payload['organization']}/{payload['name']}" if payload.get("organization") else payload["name"]
        private = payload.get("visibility") == "private" or payload.get("private") is True
        with self.lock:
            if repo_id in self.repos:
                return 409, {"error": "You already created this model repo", "url": self.url(repo_id)}
            self.repos[repo_id] = {"private": private, "authorization": headers.get("Authorization")}
        return 200, {"url": self.url(repo_id), "name": repo_id}

    def repo_info(self, m, body, headers):
        repo = self.repos.get(m["repo"])
        if repo is None:
            return 404, {"error": "Repository not found"}
        return 200, {"id": m["repo"], "private": repo["private"], "sha": "0" * 40}

    def validate_yaml(self, m, body, headers):
        return 200, {"errors": [], "warnings": []}

    def preupload(self, m, body, headers):
        files = json.loads(body)["files"]
        return 200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None}
                               for f in files]}

    def commit(self, m, body, headers):
        self.commit_started.set()
        time.sleep(self.commit_delay)
        with self.lock:
            if self.fail_commits > 0:
                self.fail_commits -= 1
                # Echo the credential the way a careless server might: the uploader must scrub it from its logs.
                token = (headers.get("Authorization") or "").removeprefix("Bearer ")
                return self.fail_status, {"error": f"storage backend unavailable (request token: {token})"}
        summary, files = None, {}
        for line in body.splitlines():
            item = json.loads(line)
            if item["key"] == "header":
                summary = item["value"]["summary"]
            elif item["key"] == "file":
                assert item["value"]["encoding"] == "base64"
                files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
            else:  # lfsFile / deletedFile / ... : not expected with "regular" upload modes
                return 400, {"error": f"unexpected commit operation {item['key']}"}
        with self.lock:
            self.commits.append({"repo_id": m["repo"], "summary": summary, "files": files})
            oid = f"{len(self.commits):040x}"
        return 200, {"commitUrl": f"{self.url(m['repo'])}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None}

    # -- plumbing
    def url(self, repo_id: str) -> str:
        return f"{self.endpoint}/{repo_id}"

    def handle(self, method: str, path: str, body: bytes, headers) -> tuple[int, dict]:
        with self.lock:
            self.requests.append((method, path))
        for (route_method, pattern), handler in self.routes.items():
            m = re.fullmatch(pattern, path)
            if m and route_method == method:
                return handler(m, body, headers)
        return 404, {"error": f"stand-in has no route for {method} {path}"}

    def start(self) -> "FakeHub":
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, payload = hub.handle(self.command, urlsplit(self.path).path, body, self.headers)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _serve

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    @property
    def routes_hit(self) -> set[str]:
        return {f"{method} {re.sub(r'/api/models/[^/]+/[^/]+', '/api/models/<repo>', path)}"
                for method, path in self.requests}


# ---------------------------------------------------------------------------------------------- fixtures


@pytest.fixture
def hub(monkeypatch):
    import huggingface_hub.constants as constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # read at import time; conftest runs may set it
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    fake = FakeHub().start()
    monkeypatch.setenv("HF_ENDPOINT", fake.endpoint)  # belt and braces; the uploader gets endpoint= explicitly
    yield fake
    fake.stop()


@pytest.fixture
def no_library_retries(monkeypatch):
    """Let a 500 from preupload/commit reach the uploader at once instead of after huggingface_hub's own backoff."""
    from huggingface_hub.utils import _http

    monkeypatch.setitem(_http.http_backoff.__kwdefaults__, "max_retries", 0)


@pytest.fixture
def run_folder(tmp_path):
    folder = tmp_path / "run"
    for rel, data in {**PIPELINE_FILES, **CHECKPOINT_FILES, **PRIVATE_FILES}.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder


def make_uploader(hub, **kw):
    lines: list[str] = []
    kw.setdefault("token", TOKEN)
    kw.setdefault("backoff_s", 0.01)
    uploader = HubUploader(kw.pop("repo_id", REPO), log=lines.append, endpoint=hub.endpoint, **kw)
    return uploader, lines


# ---------------------------------------------------------------------------------------------- tests


def test_upload_patterns_select_the_pipeline_and_card():
    from huggingface_hub.utils import filter_repo_objects

    paths = [*PIPELINE_FILES, *CHECKPOINT_FILES, *PRIVATE_FILES, "checkpoint-10/logs/x", "unet/weights.safetensors.tmp"]
    for push_checkpoints, expected in [(False, set(PIPELINE_FILES)), (True, set(PIPELINE_FILES) | set(CHECKPOINT_FILES))]:
        allow, ignore = upload_patterns(push_checkpoints)
        assert set(filter_repo_objects(paths, allow_patterns=allow, ignore_patterns=ignore)) == expected
    assert upload_patterns(False)[1] is not upload_patterns(False)[1]  # fresh lists: upload_folder extends them


def test_push_delivers_exactly_the_pipeline_private_and_authenticated(hub, run_folder):
    uploader, lines = make_uploader(hub, private=True)
    uploader.push(run_folder, "step 10")
    assert uploader.close(timeout=20)
    assert (uploader.pushed, uploader.failures) == (1, 0), lines
    assert hub.repos[REPO] == {"private": True, "authorization": f"Bearer {TOKEN}"}
    [commit] = hub.commits
    assert commit["repo_id"] == REPO and commit["summary"] == "step 10"
    assert commit["files"] == PIPELINE_FILES  # exact set and bytes: no checkpoint-*, logs, stats, run_info, tmp
    assert any(line.startswith(f"hub: pushed {run_folder} to {REPO} (") for line in lines), lines
    assert {"POST /api/repos/create", "GET /api/models/<repo>", "POST /api/validate-yaml",
            "POST /api/models/<repo>/preupload/main", "POST /api/models/<repo>/commit/main"} == hub.routes_hit

    # push_checkpoints=True: the checkpoint files come along (public repo this time: no visibility check).
    uploader, lines = make_uploader(hub, repo_id="someone/with-ckpt", push_checkpoints=True)
    uploader.push(run_folder, "step 10 + checkpoints")
    assert uploader.close(timeout=20) and uploader.pushed == 1, lines
    assert hub.repos["someone/with-ckpt"]["private"] is False
    assert hub.commits[-1]["files"] == {**PIPELINE_FILES, **CHECKPOINT_FILES}


def test_failed_commit_is_retried(hub, run_folder, no_library_retries):
    hub.fail_commits = 1
    uploader, lines = make_uploader(hub)
    uploader.push(run_folder, "step 10")
    assert uploader.close(timeout=20)
    assert (uploader.pushed, uploader.failures) == (1, 1), lines
    assert len(hub.commits) == 1 and hub.commits[0]["files"] == PIPELINE_FILES
    assert any(line.startswith("hub: upload attempt 1/3 failed:") and "retrying in 0.01s" in line for line in lines)
    assert list(hub.repos) == [REPO]  # the repo is created once, not once per attempt
    assert sum(1 for method, path in hub.requests if path == "/api/repos/create") == 1


def test_single_500_is_absorbed_by_huggingface_hub_itself(hub, run_folder):
    """Documents the library's behaviour: with its default http_backoff, one 500 never reaches the uploader."""
    hub.fail_commits = 1
    uploader, lines = make_uploader(hub)
    uploader.push(run_folder, "step 10")
    assert uploader.close(timeout=20)
    assert (uploader.pushed, uploader.failures) == (1, 0), lines


@pytest.mark.parametrize("token", [TOKEN, "Opaque.Secret-Value_42"])  # Hub-shaped, and not (explicit scrub only)
def test_always_failing_hub_never_raises_nor_leaks_the_token(hub, run_folder, no_library_retries, caplog, capsys,
                                                             token):
    hub.fail_commits = 10**6
    uploader, lines = make_uploader(hub, retries=3, token=token)
    with caplog.at_level(logging.DEBUG):
        uploader.push(run_folder, "step 10")
        assert uploader.close(timeout=20) is True
    assert (uploader.pushed, uploader.failures) == (0, 3)
    assert hub.commits == []
    assert sum("retrying" in line for line in lines) == 2
    assert lines[-1].startswith(f"hub: upload of {run_folder} failed after 3 attempts: ")
    assert "***" in lines[-1]  # the server echoed the credential; it was scrubbed
    captured = capsys.readouterr()
    for text in [*lines, caplog.text, captured.out, captured.err, repr(uploader)]:
        assert token not in text and token[:12] not in text


def test_private_request_refuses_an_existing_public_repo(hub, run_folder):
    hub.repos[REPO] = {"private": False, "authorization": None}
    uploader, lines = make_uploader(hub, private=True)
    uploader.push(run_folder, "step 10")
    assert uploader.close(timeout=20)
    assert (uploader.pushed, uploader.failures) == (0, 1)
    assert hub.commits == []
    assert "not retrying" in lines[-1] and "is public" in lines[-1], lines


def test_resolve_token_precedence(monkeypatch, tmp_path):
    import huggingface_hub.constants as constants

    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(var, raising=False)
    token_file = tmp_path / "token"
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(token_file))  # huggingface_hub's cached login
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "stored_tokens"))

    assert resolve_token(None) is None
    token_file.write_text("hf_cached_login_token\n")
    assert resolve_token(None) == "hf_cached_login_token"
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    assert resolve_token(None) == "hf_from_env"
    assert resolve_token("") == "hf_from_env"
    assert resolve_token("hf_from_cli") == "hf_from_cli"


def test_push_is_non_blocking_and_coalesces(hub, run_folder):
    hub.commit_delay = 1.0
    uploader, lines = make_uploader(hub)
    t0 = time.perf_counter()
    uploader.push(run_folder, "push 1")
    assert time.perf_counter() - t0 < 0.2
    assert hub.commit_started.wait(10)  # the first upload is now in flight (its commit sleeps 1 s)
    for i in (2, 3, 4):
        t0 = time.perf_counter()
        uploader.push(run_folder, f"push {i}")
        assert time.perf_counter() - t0 < 0.2
    assert uploader.close(timeout=0.05) is False  # still uploading: times out, logged
    assert "timed out" in lines[-1]
    assert uploader.close(timeout=20) is True
    assert uploader.close() is True  # idempotent
    assert [c["summary"] for c in hub.commits] == ["push 1", "push 4"]  # at most two uploads, newest wins
    assert (uploader.pushed, uploader.failures) == (2, 0)
    uploader.push(run_folder, "after close")
    assert "closed" in lines[-1] and len(hub.commits) == 2
