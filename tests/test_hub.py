"""adaptive.hub against a local stand-in of the Hub's HTTP API (real huggingface_hub client, real HTTP, no internet).

The stand-in implements what huggingface_hub 2.4.0 calls for `whoami` + `create_repo` + `create_commit`:
  GET  /api/whoami-v2                            whoami (the check before training)
  POST /api/repos/create                         create_repo (403 outside the token owner's namespaces)
  GET  /api/models/<ns>/<name>                   repo_info (the uploader checks visibility when private=True)
  POST /api/validate-yaml                        create_commit validates README.md metadata first
  POST /api/models/<ns>/<name>/preupload/<rev>   upload modes; "regular" for every file, so no LFS / xet transfer
  POST /api/models/<ns>/<name>/commit/<rev>      ndjson commit; regular files arrive base64-encoded in it
Any route can be made silent (`hang`): the connection is accepted and never answered.

huggingface_hub retries 5xx answers of preupload itself (http_backoff: 5 retries, 1-8 s apart). Tests that exercise
the uploader's own retry loop turn that off (`no_library_retries`) so that a failure reaches it at once.
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

from adaptive.config import ConfigError
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
        self.fail_preuploads = 0  # answer the next N preupload requests with HTTP 500
        self.fail_status = 500
        self.commit_delay = 0.0  # seconds each commit request sleeps before answering
        self.commit_started = threading.Event()
        self.hang: set[str] = set()  # names of handlers whose requests are accepted and never answered
        self.released = threading.Event()  # set on stop(): silent handlers return
        self.hung = threading.Event()  # a request to a silent route arrived
        # token -> whoami answer; None: any token is a write token of "someone" (member of the org "team")
        self.tokens: dict[str, dict] | None = None
        repo = r"/api/models/(?P<repo>[^/]+/[^/]+)"
        self.routes = {
            ("GET", r"/api/whoami-v2"): self.whoami,
            ("POST", r"/api/repos/create"): self.create_repo,
            ("GET", repo): self.repo_info,
            ("POST", r"/api/validate-yaml"): self.validate_yaml,
            ("POST", repo + r"/preupload/(?P<rev>[^/]+)"): self.preupload,
            ("POST", repo + r"/commit/(?P<rev>[^/]+)"): self.commit,
        }

    # -- handlers
    def user(self, headers) -> dict | None:
        token = (headers.get("Authorization") or "").removeprefix("Bearer ")
        if not token:
            return None
        if self.tokens is None:
            return {"type": "user", "name": "someone", "orgs": [{"type": "org", "name": "team", "roleInOrg": "write"}],
                    "auth": {"type": "access_token", "accessToken": {"displayName": "test", "role": "write"}}}
        return self.tokens.get(token)

    def whoami(self, m, body, headers):
        me = self.user(headers)
        return (200, me) if me else (401, {"error": "Invalid credentials in Authorization header"})

    def create_repo(self, m, body, headers):
        payload = json.loads(body)
        me = self.user(headers)
        if me is None:
            return 401, {"error": "Invalid credentials in Authorization header"}
        namespace = payload.get("organization") or me["name"]
        if namespace not in {me["name"], *(o["name"] for o in me.get("orgs", []))}:
            return 403, {"error": f"You don't have the rights to create a model under the namespace \"{namespace}\""}
        repo_id = f"{namespace}/{payload['name']}"
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
        with self.lock:
            if self.fail_preuploads > 0:
                self.fail_preuploads -= 1
                return 500, {"error": "preupload backend unavailable"}
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
                if handler.__name__ in self.hang:
                    self.hung.set()
                    self.released.wait()
                    return None, None  # close the connection without an answer
                return handler(m, body, headers)
        return 404, {"error": f"stand-in has no route for {method} {path}"}

    def start(self) -> "FakeHub":
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, payload = hub.handle(self.command, urlsplit(self.path).path, body, self.headers)
                if status is None:
                    self.close_connection = True
                    return
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
        self.released.set()
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
    for push_checkpoints, expected in [(False, set(PIPELINE_FILES)),
                                       (True, set(PIPELINE_FILES) | set(CHECKPOINT_FILES))]:
        allow, ignore = upload_patterns(push_checkpoints)
        assert set(filter_repo_objects(paths, allow_patterns=allow, ignore_patterns=ignore)) == expected
    assert upload_patterns(False)[1] is not upload_patterns(False)[1]  # fresh lists: upload_folder extends them


def test_56_the_tracker_logs_go_up_with_the_model_and_never_with_local_paths(tmp_path, run_folder):
    """Issue 56: --logging_dir inside the run is pushed (as Diffusers' examples do); one outside it, logs inside a
    checkpoint, stats.jsonl and run_info.json are not. The trackers' config holds no local path."""
    from adaptive.config import PRESETS, TrainConfig, replace
    from adaptive.hub import commit_files, logs_inside
    from adaptive.trackers import tracker_config

    logs = "logs/ddpm/events.out.tfevents.1.host"
    assert logs in commit_files(run_folder, False, logs="logs") and logs not in commit_files(run_folder, False)
    pushed = set(commit_files(run_folder, False, logs="logs"))
    assert pushed == set(PIPELINE_FILES) | {logs}  # nothing else of the private files
    cfg = TrainConfig(**{**PRESETS["cpu-tiny16"], "output_dir": str(run_folder),
                         "train_data_dir": str(tmp_path / "data" / "train.zip")})
    assert logs_inside(cfg) == "logs" and logs_inside(replace(cfg, logging_dir=str(tmp_path / "tb"))) is None
    assert logs_inside(replace(cfg, logging_dir="tb/run1")) == "tb/run1"
    hparams = tracker_config(cfg)
    assert str(tmp_path) not in json.dumps(hparams)
    assert hparams["train_data_dir"] == "train.zip" and hparams["output_dir"] == "."


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


def test_library_retries_preupload_and_the_uploader_retries_the_commit(hub, run_folder):
    """Documents the split: huggingface_hub's http_backoff absorbs a 500 on preupload; create_commit does not retry its
    commit POST (a lost answer could duplicate the commit), so a 500 there reaches the uploader's own loop."""
    hub.fail_preuploads = 1
    uploader, lines = make_uploader(hub)
    uploader.push(run_folder, "step 10")
    assert uploader.close(timeout=20)
    assert (uploader.pushed, uploader.failures) == (1, 0), lines
    hub.fail_commits = 1
    uploader.push(run_folder, "step 20")  # closed: ignored
    uploader, lines = make_uploader(hub)
    uploader.push(run_folder, "step 20")
    assert uploader.close(timeout=20)
    assert (uploader.pushed, uploader.failures) == (1, 1), lines
    assert [c["summary"] for c in hub.commits] == ["step 10", "step 20"]


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


# ---------------------------------------------------------------------------------------------- timeouts (issue 15.6)


def test_a_silent_hub_times_out_every_request_and_close_is_bounded(hub, run_folder, no_library_retries):
    """Connections accepted, never answered: each request fails after the request timeout, and close() returns after
    its own timeout whatever the worker is doing, saying what is not uploaded."""
    hub.hang = {"commit"}
    uploader, lines = make_uploader(hub, request_timeout_s=0.5, retries=2)
    uploader.push(run_folder, "final pipeline at step 10")
    assert hub.hung.wait(20)
    t0 = time.perf_counter()
    assert uploader.close(timeout=0.3) is False  # still in the first attempt
    assert time.perf_counter() - t0 < 2.0
    assert uploader.not_uploaded() == "'final pipeline at step 10' (still uploading)"
    t0 = time.perf_counter()
    assert uploader.close(timeout=20) is True  # two attempts, each ending in a read timeout
    assert time.perf_counter() - t0 < 10.0
    assert (uploader.pushed, uploader.failures) == (0, 2), lines
    assert "Timeout" in lines[-1] and uploader.not_uploaded().startswith(
        "'final pipeline at step 10' (failed after 2 attempts: ")
    assert hub.commits == []


def test_the_request_timeout_reaches_huggingface_hubs_client(hub):
    import huggingface_hub

    make_uploader(hub, request_timeout_s=7.0)
    timeout = huggingface_hub.get_session().timeout
    assert (timeout.read, timeout.write, timeout.connect) == (7.0, 7.0, 7.0)
    make_uploader(hub)
    assert huggingface_hub.get_session().timeout.read == 60.0


def test_30_7_a_request_sent_without_a_timeout_gets_the_clients(hub):
    """model_info(timeout=None) - DDPMPipeline.from_pretrained's first call - waited forever against a silent Hub."""
    from huggingface_hub import HfApi

    from adaptive.hub_wait import use_request_timeout

    hub.repos[REPO] = {"private": False, "authorization": None}
    hub.hang = {"repo_info"}
    assert use_request_timeout(0.5)
    t0 = time.perf_counter()
    with pytest.raises(Exception) as e:
        HfApi(endpoint=hub.endpoint).model_info(REPO, timeout=None)
    assert time.perf_counter() - t0 < 5 and "Timeout" in type(e.value).__name__, e.value


# --------------------------------------------------------------------------------------------- early check (issue 16.7)


READ_ONLY = {"type": "user", "name": "someone", "orgs": [],
             "auth": {"type": "access_token", "accessToken": {"role": "read"}}}
WRITER = {"type": "user", "name": "someone", "orgs": [{"name": "team", "roleInOrg": "read"}],
          "auth": {"type": "access_token", "accessToken": {"role": "write"}}}


@pytest.mark.parametrize("case, expected", [
    ("no token", "needs a Hub token: log in with `hf auth login`, set HF_TOKEN or pass --hub_token"),
    ("bad token", "the Hub rejected the token from --hub_token (401 Unauthorized)"),
    ("read-only token", "the token from --hub_token is read-only"),
    ("foreign namespace", "belongs to someone, who cannot write to the namespace 'stranger'"),
    ("org with read role", "who cannot write to the namespace 'team'"),
    ("public repo, private asked", "already exists and is public, but a private repo was requested"),
    ("silent hub", "no answer from http://127.0.0.1:"),
])
def test_open_repo_refuses_before_training_in_one_line(hub, case, expected):
    kw = {"token": TOKEN, "request_timeout_s": 0.5}
    hub.tokens = {TOKEN: WRITER}
    if case == "no token":
        kw["token"] = None
    elif case == "bad token":
        kw["token"] = "hf_WrongTokenAbcdefghijklmnopqrstuvwxyz0"
    elif case == "read-only token":
        hub.tokens = {TOKEN: READ_ONLY}
    elif case == "foreign namespace":
        kw["repo_id"] = "stranger/ddpm"
    elif case == "org with read role":
        kw["repo_id"] = "team/ddpm"
    elif case == "public repo, private asked":
        hub.repos[REPO] = {"private": False, "authorization": None}
        kw["private"] = True
    elif case == "silent hub":
        hub.hang = {"whoami"}
    uploader, lines = make_uploader(hub, **kw)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as e:
        uploader.open_repo()
    assert time.perf_counter() - t0 < 5.0
    message = str(e.value)
    assert expected in message and "\n" not in message and len(message) < 500, message
    assert message.startswith(f"--push_to_hub to {kw.get('repo_id', REPO)}: ")
    assert TOKEN not in message and "hf_WrongToken" not in message
    assert hub.commits == [] and (case == "public repo, private asked" or REPO not in hub.repos)


def test_open_repo_creates_the_repo_and_completes_a_bare_name(hub, run_folder):
    uploader, lines = make_uploader(hub, repo_id="ddpm-bare", private=True)
    assert uploader.open_repo() == "someone/ddpm-bare"
    assert hub.repos["someone/ddpm-bare"]["private"] is True
    uploader.push(run_folder, "step 10")
    assert uploader.close(timeout=20) and uploader.not_uploaded() is None
    assert sum(1 for _, path in hub.requests if path == "/api/repos/create") == 1  # not again by the worker
    assert hub.commits[0]["repo_id"] == "someone/ddpm-bare"


# ---------------------------------------------------------------------------------------------- model card (issue 16.9)


def card_inputs(tmp_path, **overrides):
    from adaptive.checkpoint import Progress
    from adaptive.config import PRESETS, TrainConfig

    out = tmp_path / "my-local-run"
    out.mkdir()
    (out / "samples").mkdir()
    cfg = TrainConfig(**{**PRESETS["cpu-tiny16"], "preset": "cpu-tiny16", "output_dir": str(out),
                         "train_data_dir": str(tmp_path / "data" / "images.zip"),
                         "eval_feature_extractor": str(tmp_path / "feat.pt"), "hub_token": TOKEN, **overrides})
    progress = Progress(step=1200, images_seen=153_600, train_seconds=5400.0)
    info = {"world_size": 1, "device": "cpu", "device_name": "x86_64", "num_parameters": 1_100_000,
            "grid": str(out / "samples" / "grid_0001200.png")}
    return out, cfg, progress, info


def test_model_card_round_trips_with_hub_metadata_and_the_repo_id(tmp_path):
    from huggingface_hub import ModelCard

    from adaptive.model_card import write_model_card

    out, cfg, progress, info = card_inputs(tmp_path)
    info.update(global_batch=128, mixed_precision="bf16")
    metrics = {"step": 1200, "proxy_fd": 2.345, "eval_images": 1000, "eval_inference_steps": 50}
    path = write_model_card(out, cfg, progress, info, metrics, repo_id="someone/ddpm-run")
    card = ModelCard.load(path)
    assert card.data.library_name == "diffusers"
    assert card.data.pipeline_tag == "unconditional-image-generation"
    assert {"diffusers", "ddpm", "unconditional-image-generation", "timestep-sampler-uniform"} <= set(card.data.tags)
    assert 'DDPMPipeline.from_pretrained("someone/ddpm-run")' in card.text
    assert "my-local-run" not in card.text  # neither the folder name in the snippet nor the path in the config
    rows = [line for line in card.text.splitlines() if line.startswith("|")]
    assert rows == [
        "| | |", "|---|---|",
        "| training data | local images: images.zip |",  # named once, though the preset also names cifar10
        "| optimizer steps | 1,200 x batch 128 = 153,600 images |",
        "| training wall-clock | 1.50 h on 1 x CPU |",
        "| resolution, parameters | 16 px, 1,100,000 |",
        "| timestep sampler, loss weighting | uniform, none |",
        "| optimizer | AdamW lr 0.002 (constant_with_warmup, 200 warm-up steps), betas 0.9/0.999 |",
        "| precision | bf16 autocast |",
        "| EMA | on, max decay 0.995 (the exported U-Net is the EMA) |",
        "| proxy FD (not FID) | 2.345 (1000 images, ddpm 50 steps at step 1,200) |",
    ]
    assert "![samples](samples/grid_0001200.png)" in card.text
    assert "TODO" not in card.text  # diffusers' card template's placeholders are not what a user gets (issue 56)
    details = card.text[card.text.index("<details>"):card.text.index("</details>")]  # the full config, folded
    assert "<summary>" in details and '"learning_rate": 0.002' in details and '"output_dir": "."' in details
    text = path.read_text()
    assert str(tmp_path) not in text and TOKEN not in text
    assert ModelCard(text).content == card.content  # what was written is what loads

    info.update(world_size=8, device="cuda:0", device_name="NVIDIA H100 80GB HBM3")
    card = ModelCard.load(write_model_card(out, cfg, progress, info))
    assert "| training wall-clock | 1.50 h on 8 x NVIDIA H100 80GB HBM3 |" in card.text
    assert "| EMA | off |" not in card.text


def test_a_local_cards_snippet_loads_its_folder_and_short_runs_show_seconds_or_minutes(tmp_path):
    from adaptive.checkpoint import Progress
    from adaptive.model_card import build_model_card, fmt_duration

    out, cfg, _, info = card_inputs(tmp_path)
    card = build_model_card(out, cfg, Progress(step=300, images_seen=38_400, train_seconds=42.4), info)
    assert f"DDPMPipeline.from_pretrained({json.dumps(str(out))})" in card.text  # no Hub repo: the folder's path
    assert "| training wall-clock | 42 s on 1 x CPU |" in card.text
    assert "num_inference_steps=50).images  # DDPM ancestral, 50 of 1000 steps, as the sample grids" in card.text
    assert [fmt_duration(s) for s in (0.4, 59.4, 60, 754, 3599, 3600, 5400)] == \
        ["0 s", "59 s", "1.0 min", "12.6 min", "60.0 min", "1.00 h", "1.50 h"]


def test_a_cards_snippet_loads_from_any_folder_and_it_names_its_data_and_license(tmp_path, monkeypatch):
    """Issue 56: a run trained with a relative --output_dir gets the absolute path in its snippet; a Hub dataset is
    named in one row and in the `datasets:` metadata; --license goes to the metadata."""
    from adaptive.checkpoint import Progress
    from adaptive.config import replace
    from adaptive.model_card import CIFAR10_HUB, build_model_card

    out, cfg, progress, info = card_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    card = build_model_card(out.relative_to(tmp_path), cfg, progress, info)
    assert f"DDPMPipeline.from_pretrained({json.dumps(str(out.resolve()))})" in card.text
    assert not card.data.to_dict().get("datasets") and "license" not in card.data.to_dict()
    for dataset, row, meta in (("cifar10", f"CIFAR-10, train split (torchvision; on the Hub: {CIFAR10_HUB})",
                                CIFAR10_HUB), ("someone/faces", "someone/faces (Hub dataset)", "someone/faces")):
        card = build_model_card(out, replace(cfg, train_data_dir=None, dataset_name=dataset, license="mit"),
                                Progress(step=3), info)
        assert f"| training data | {row} |" in card.text and card.data.datasets == [meta]
        assert card.data.license == "mit"


def test_local_paths_are_redacted(tmp_path):
    from adaptive.model_card import redact_paths

    root = tmp_path / "run"
    config = {"output_dir": str(root), "resume_from_checkpoint": str(root / "checkpoint-10"),
              "train_data_dir": str(tmp_path / "data" / "train.zip"), "cache_dir": "~/.cache/x",
              "eval_ref_dir": "../shared/ref", "dataset_name": "user/dataset", "logging_dir": "logs",
              "eval_feature_extractor": "C:\\models\\feat.pt", "block_out_channels": [32, 64], "use_ema": True,
              "resolution": 16, "eval_ref_stats": None, "list": [str(tmp_path / "a.npz"), "plain"]}
    assert redact_paths(config, root) == {
        "output_dir": ".", "resume_from_checkpoint": "checkpoint-10", "train_data_dir": "train.zip",
        "cache_dir": "x", "eval_ref_dir": "ref", "dataset_name": "user/dataset", "logging_dir": "logs",
        "eval_feature_extractor": "feat.pt", "block_out_channels": [32, 64], "use_ema": True, "resolution": 16,
        "eval_ref_stats": None, "list": ["a.npz", "plain"]}


# ---------------------------------------------------------------------------------------------- redaction (issue 15.10)


def test_uploaded_configs_carry_no_local_path_and_the_local_ones_keep_theirs(hub, run_folder, tmp_path):
    config = {"output_dir": str(run_folder), "train_data_dir": str(tmp_path / "data" / "images.zip"),
              "eval_feature_extractor": str(tmp_path / "feat.pt"), "resolution": 32}
    for rel in ("config.json", "checkpoint-10/config.json"):
        (run_folder / rel).write_text(json.dumps(config, indent=2))
    local = {p: p.read_bytes() for p in run_folder.rglob("*") if p.is_file()}
    uploader, lines = make_uploader(hub, push_checkpoints=True)
    uploader.push(run_folder, "step 10")
    assert uploader.close(timeout=20) and uploader.not_uploaded() is None, lines
    files = hub.commits[-1]["files"]
    assert set(files) == set(PIPELINE_FILES) | set(CHECKPOINT_FILES)
    for rel in ("config.json", "checkpoint-10/config.json"):
        assert json.loads(files[rel]) == {"output_dir": ".", "train_data_dir": "images.zip",
                                          "eval_feature_extractor": "feat.pt", "resolution": 32}
    for rel, data in files.items():
        assert str(tmp_path).encode() not in data, rel
    assert {p: p.read_bytes() for p in run_folder.rglob("*") if p.is_file()} == local  # resume reads these


# ---------------------------------------------------------------------------------------------- the end (issue 16.8)


def test_rerun_command_resumes_latest_keeps_the_flags_and_hides_the_token(monkeypatch):
    from adaptive.rundir import rerun_command

    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    argv = ["train_accelerate.py", "--output_dir", "runs/my run", "--overwrite_output_dir", "--hub_token", TOKEN,
            "--resume_from_checkpoint", "runs/x/checkpoint-5", "--push_to_hub"]
    assert rerun_command(argv) == ("python train_accelerate.py --output_dir 'runs/my run' --hub_token '***' "
                                   "--push_to_hub --resume_from_checkpoint latest")
    assert rerun_command(["t.py", f"--hub_token={TOKEN}", "--resume_from_checkpoint=latest"]) == (
        "python t.py '--hub_token=***' --resume_from_checkpoint latest")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    assert rerun_command(["t.py"]).startswith("accelerate launch <the same launch options> t.py ")


def test_finish_uploads_says_what_is_missing_and_how_to_retry(hub, run_folder, no_library_retries, monkeypatch):
    from types import SimpleNamespace

    from adaptive.hub import finish_uploads

    monkeypatch.setattr("sys.argv", ["train_accelerate.py", "--output_dir", str(run_folder), "--push_to_hub"])
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    cfg = SimpleNamespace(output_dir=str(run_folder))
    log: list[str] = []
    assert finish_uploads(None, cfg, log.append, 1.0) is True and log == []

    hub.fail_commits, hub.fail_status = 10**6, 409
    uploader, lines = make_uploader(hub, retries=2)
    uploader.push(run_folder, "final pipeline at step 10")
    assert finish_uploads(uploader, cfg, log.append, 20.0) is False
    assert log[-1].startswith(f"hub: NOT uploaded to {REPO}: 'final pipeline at step 10' (failed after 2 attempts: ")
    assert f"Everything is kept in {run_folder}. To retry the upload, run: python train_accelerate.py --output_dir " \
           f"{run_folder} --push_to_hub --resume_from_checkpoint latest" in log[-1]

    hub.fail_commits = 0
    uploader, lines = make_uploader(hub)
    uploader.push(run_folder, "final pipeline at step 10")
    assert finish_uploads(uploader, cfg, log.append, 20.0) is True and "NOT" not in log[-1]
