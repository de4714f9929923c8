"""Pushes of the exported pipeline (and optionally the training checkpoints) to the Hugging Face Hub.

One `HubUploader` per run, on the main process only. `open_repo()` runs before training: it checks the token
(`whoami`) and creates the repo (`create_repo(..., private=..., exist_ok=True)`), so a missing login, a bad token or a
repo the token cannot write is a one-line `ConfigError` before the first step. `push(output_dir, message)` returns at
once; a single daemon worker thread commits the files `commit_files` selects (`HfApi.create_commit`, one commit per
push; JSON files that hold local paths go up as redacted copies). Requests made while an upload is running are
coalesced: only the newest one is kept. Failures are logged and retried with backoff; nothing is ever raised into the
training loop. `close(timeout)` waits a bounded time; `not_uploaded()` then says what did not reach the Hub. A run
gets its uploader from `connect_hub` (before setup) and waits for it with `finish_uploads` (at the end).

Timeouts and retries: huggingface_hub retries transient HTTP errors and timeouts of the preupload call and of LFS/Xet
transfers itself (`http_backoff`: up to 5 retries, 1-8 s apart), but not the commit POST of `create_commit` (a lost
answer could duplicate the commit) nor create_repo; the retry loop here covers those and errors that outlast the
library's backoff. The library has no timeout for its upload calls, so the uploader gives its shared client one
(`hub_wait.use_request_timeout`: REQUEST_TIMEOUT_S per request).

The token is never written anywhere: it is only handed to `HfApi`, and every message this module logs is scrubbed
of it (and of anything that looks like a Hub token or a bearer credential).
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from .config import ConfigError, TrainConfig
from .hub_wait import REQUEST_TIMEOUT_S, use_request_timeout
from .secrets import scrub_text
from .rundir import hub_patterns, public_bytes, rerun_command

__all__ = ["EXIT_UPLOAD_FAILED", "find_token", "resolve_token", "upload_patterns", "commit_files", "HubUploader",
           "connect_hub", "finish_uploads"]

# Exit status of a run that trained and saved everything locally but whose final upload did not reach the Hub.
EXIT_UPLOAD_FAILED = 3

_CHECKPOINT_PATTERN = "checkpoint-*/**"
# Never published. huggingface_hub matches with fnmatch, where `*` also crosses `/`, so "*.tmp" covers every level
# and ".checkpoint-*" covers the staging folders of checkpoints being written (".checkpoint-<step>.tmp/...").
_NEVER_PATTERNS = [
    "*/logs/*",
    "stats.jsonl",
    "*/stats.jsonl",
    "run_info.json",
    "*/run_info.json",
    "*.tmp",
    "*.tmp.*",
    ".checkpoint-*",
    "*/.checkpoint-*",
]

_NOISE_RE = re.compile(r"\s*For more information check: \S+")  # httpx's generic MDN link
_MAX_LINE = 400


def find_token(cli_token: Optional[str]) -> tuple[Optional[str], str]:
    """(token, where it came from) - see `resolve_token`."""
    if cli_token and cli_token.strip():
        return cli_token.strip(), "--hub_token"
    env = os.environ.get("HF_TOKEN", "").strip()
    if env:
        return env, "HF_TOKEN"
    try:
        import huggingface_hub

        return huggingface_hub.get_token() or None, "the cached login"
    except Exception:  # e.g. HF_OIDC_RESOURCE set but the exchange failed: no token rather than a crash
        return None, "the cached login"


def resolve_token(cli_token: Optional[str]) -> Optional[str]:
    """--hub_token, else $HF_TOKEN, else huggingface_hub's cached login (`huggingface_hub.get_token()`); else None."""
    return find_token(cli_token)[0]


def upload_patterns(push_checkpoints: bool, logs: Optional[str] = None) -> tuple[list[str], list[str]]:
    """(allow_patterns, ignore_patterns) in huggingface_hub's `filter_repo_objects` syntax for a run folder. `logs`:
    the tracker folder inside it (--logging_dir), pushed with the model as Diffusers' examples do (the Hub's
    training-metrics tab reads its TensorBoard files). Fresh lists on every call."""
    allow = hub_patterns()  # the DDPMPipeline export, its model card and the images it shows
    if logs:
        allow.append(f"{logs.rstrip('/')}/*")  # fnmatch: `*` crosses `/`
    ignore = list(_NEVER_PATTERNS)
    if push_checkpoints:
        allow.append(_CHECKPOINT_PATTERN)
    else:
        ignore.append(_CHECKPOINT_PATTERN)
    return allow, ignore


def commit_files(folder: Path, push_checkpoints: bool, logs: Optional[str] = None) -> dict[str, object]:
    """What a push of `folder` commits: path in the repo -> local file, or the bytes of a redacted copy
    (`rundir.public_bytes`: the run's config.json files keep their local paths for resuming; the Hub gets them
    without)."""
    from huggingface_hub.utils import filter_repo_objects

    folder = Path(folder).resolve()
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder")
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    allow, ignore = upload_patterns(push_checkpoints, logs)
    out: dict[str, object] = {}
    for rel in filter_repo_objects(files, allow_patterns=allow, ignore_patterns=ignore):
        content = public_bytes(folder, rel)
        out[rel] = folder / rel if content is None else content
    return out


class _Refused(Exception):
    """An attempt that must not be retried (the repo's state contradicts what was asked)."""


def _is_permanent(exc: BaseException) -> bool:
    """Errors that another attempt cannot fix: offline mode, bad credentials/permissions, invalid input."""
    try:
        from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled
    except Exception:  # pragma: no cover - very old huggingface_hub
        return isinstance(exc, (_Refused, ValueError))
    if isinstance(exc, (_Refused, OfflineModeIsEnabled)):
        return True
    if isinstance(exc, HfHubHTTPError):
        response = getattr(exc, "response", None)
        return getattr(response, "status_code", None) in (401, 403)
    # ValueError: not a directory, invalid README.md metadata, bad arguments. (OSError such as a file vanishing
    # while a checkpoint is rotated stays retryable.)
    return isinstance(exc, ValueError)


def _status(exc: BaseException) -> Optional[int]:
    return getattr(getattr(exc, "response", None), "status_code", None)


# ------------------------------------------------------------------------------------------------ the uploader


class HubUploader:
    """Non-blocking, coalescing, retrying uploads of a run folder to a model repo on the Hub."""

    def __init__(
        self,
        repo_id: str,
        token: Optional[str],
        private: bool = False,
        push_checkpoints: bool = False,
        log: Callable[[str], None] = print,
        retries: int = 3,
        backoff_s: float = 2.0,
        endpoint: Optional[str] = None,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        token_source: str = "--hub_token",
        logs: Optional[str] = None,
    ):
        from huggingface_hub import HfApi

        self.repo_id = repo_id
        self.private = bool(private)
        self.push_checkpoints = bool(push_checkpoints)
        self.logs = logs  # the tracker folder inside the run folder, pushed with the model (None: not pushed)
        self.retries = max(1, int(retries))
        self.backoff_s = max(0.0, float(backoff_s))
        self.request_timeout_s = float(request_timeout_s)
        self._log_fn = log
        self._has_token = bool(token)
        self._token_source = token_source
        self._secrets = [token] if token else []
        self._api = HfApi(endpoint=endpoint, token=token)  # endpoint None: HF_ENDPOINT or huggingface.co
        use_request_timeout(self.request_timeout_s)

        self._cond = threading.Condition()
        self._pending: Optional[tuple[Path, str]] = None
        self._current: Optional[str] = None  # message of the upload in flight
        self._failed: Optional[str] = None  # message and error of the newest finished upload, if it failed
        self._busy = False
        self._closed = False
        self._thread: Optional[threading.Thread] = None
        self._repo_ready = False
        self._pushed = 0
        self._failures = 0

    def __repr__(self) -> str:  # never shows the token
        return (f"HubUploader(repo_id={self.repo_id!r}, private={self.private}, "
                f"push_checkpoints={self.push_checkpoints}, pushed={self._pushed}, failures={self._failures})")

    # ------------------------------------------------------------------ public API

    @property
    def pushed(self) -> int:
        with self._cond:
            return self._pushed

    @property
    def failures(self) -> int:
        with self._cond:
            return self._failures

    def open_repo(self) -> str:
        """Before training (caller's thread): check the token and create the repo now (exist_ok, private honoured).
        Returns the full repo id; raises ConfigError with one scrubbed line naming the problem."""
        what = f"--push_to_hub to {self.repo_id}"
        if not self._has_token:
            raise ConfigError(f"{what}: needs a Hub token: log in with `hf auth login`, set HF_TOKEN or pass "
                              "--hub_token")
        try:
            me = self._api.whoami()
        except Exception as exc:
            raise ConfigError(self._access_error(what, exc, "checking the token")) from None
        self._check_write_access(what, me)
        if "/" not in self.repo_id and me.get("name"):
            self.repo_id = f"{me['name']}/{self.repo_id}"
        try:
            self._create_repo()
        except Exception as exc:
            raise ConfigError(self._access_error(what, exc, "creating the repo")) from None
        return self.repo_id

    def push(self, folder, commit_message: str) -> None:
        """Queue an upload of `folder` and return at once. While an upload runs, only the newest request waits."""
        request = (Path(folder), commit_message or "Upload run folder")
        with self._cond:
            if self._closed:
                replaced, closed = False, True
            else:
                closed = False
                replaced = self._pending is not None
                self._pending = request
                if self._thread is None:
                    self._thread = threading.Thread(target=self._worker, name="hub-uploader", daemon=True)
                    self._thread.start()
                self._cond.notify_all()
        if closed:
            self._log(f"hub: uploader is closed; ignoring push of {request[0]}")
        elif replaced:
            self._log(f"hub: upload in progress; the queued push is replaced by the newer one of {request[0]}")

    def close(self, timeout: Optional[float] = None) -> bool:
        """Wait at most `timeout` s for the running and queued uploads. True when none is left (uploaded or failed:
        see `not_uploaded`), False (logged) on timeout - the daemon thread is then left behind and does not keep the
        process alive. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            done = self._cond.wait_for(lambda: self._pending is None and not self._busy, timeout)
            thread = self._thread
        if not done:
            self._log(f"hub: close() timed out after {timeout:g}s; an upload to {self.repo_id} is still running "
                      "in the background and is abandoned when the process exits")
            return False
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)  # it only has to notice `_closed` and return
        return True

    def not_uploaded(self) -> Optional[str]:
        """What the newest push did not get onto the Hub ("'<message>' (<why>)"), or None when it is there (or
        nothing was pushed)."""
        with self._cond:
            if self._pending is not None:
                return f"'{self._pending[1]}' (queued, not started)"
            if self._busy:
                return f"'{self._current}' (still uploading)"
            return self._failed

    # ------------------------------------------------------------------ worker

    def _worker(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closed)
                if self._pending is None:  # closed and nothing left
                    return
                folder, message = self._pending
                self._pending = None
                self._current = message
                self._busy = True
            failed = "internal error"
            try:
                failed = self._upload_with_retries(folder, message)
            except BaseException as exc:  # never let anything escape the thread (threading.excepthook prints it)
                failed = self._describe(exc)
                self._log(f"hub: internal error while uploading {folder}: {failed}")
            finally:
                with self._cond:
                    self._failed = None if failed is None else f"'{message}' ({failed})"
                    self._busy = False
                    self._current = None
                    self._cond.notify_all()

    def _upload_with_retries(self, folder: Path, message: str) -> Optional[str]:
        """None when pushed, else the last error (one line)."""
        n = self.retries
        line = "not attempted"
        for attempt in range(1, n + 1):
            try:
                info = self._attempt(folder, message)
            except Exception as exc:
                with self._cond:
                    self._failures += 1
                line = self._describe(exc)
                if _is_permanent(exc):
                    self._log(f"hub: upload of {folder} failed (attempt {attempt}/{n}, not retrying): {line}")
                    return f"failed, not retried: {line}"
                if attempt < n:
                    delay = self.backoff_s * 2 ** (attempt - 1)
                    self._log(f"hub: upload attempt {attempt}/{n} failed: {line}; retrying in {delay:g}s")
                    time.sleep(delay)
                else:
                    self._log(f"hub: upload of {folder} failed after {n} attempts: {line}")
            else:
                with self._cond:
                    self._pushed += 1
                ref = getattr(info, "commit_url", None) or getattr(info, "oid", None) or "no commit info"
                self._log(f"hub: pushed {folder} to {self.repo_id} ({ref})")
                return None
        return f"failed after {n} attempts: {line}"

    def _create_repo(self) -> None:
        url = self._api.create_repo(self.repo_id, private=self.private, exist_ok=True, repo_type="model")
        self.repo_id = getattr(url, "repo_id", None) or self.repo_id
        if self.private:
            # create_repo(exist_ok=True) ignores `private` for a repo that already exists: never publish a run the
            # user asked to keep private into a public repo. (repo_info's timeout=None would disable the client's.)
            info = self._api.repo_info(self.repo_id, repo_type="model", timeout=self.request_timeout_s)
            if getattr(info, "private", None) is False:
                raise _Refused(f"{self.repo_id} already exists and is public, but a private repo was requested; "
                               "make it private on the Hub or pick another repo id")
        self._repo_ready = True

    def _attempt(self, folder: Path, message: str):
        from huggingface_hub import CommitOperationAdd

        if not self._repo_ready:
            self._create_repo()
        operations = []
        for rel, content in commit_files(folder, self.push_checkpoints, self.logs).items():
            try:
                operations.append(CommitOperationAdd(path_in_repo=rel, path_or_fileobj=content))
            except ValueError:
                if isinstance(content, Path) and not content.exists():  # rotated away meanwhile: retry the push
                    raise FileNotFoundError(f"{content} disappeared while it was being uploaded") from None
                raise
        return self._api.create_commit(self.repo_id, operations, commit_message=message, repo_type="model")

    # ------------------------------------------------------------------ the check before training

    def _check_write_access(self, what: str, me: dict) -> None:
        """Refuse what whoami already shows: a read-only token, a namespace the account cannot write to."""
        access = (me.get("auth") or {}).get("accessToken") or {}
        if access.get("role") == "read":
            raise ConfigError(f"{what}: the token from {self._token_source} is read-only; use a token with write "
                              "access (https://huggingface.co/settings/tokens)")
        name, orgs = me.get("name"), me.get("orgs")
        if "/" in self.repo_id and name and isinstance(orgs, list):
            writable = {name} | {o.get("name") for o in orgs if isinstance(o, dict) and o.get("roleInOrg") != "read"}
            namespace = self.repo_id.split("/")[0]
            if namespace not in writable:
                names = ", ".join(sorted(filter(None, writable)))
                raise ConfigError(f"{what}: the token from {self._token_source} belongs to {name}, who cannot write "
                                  f"to the namespace {namespace!r} (writable: {names})")

    def _access_error(self, what: str, exc: BaseException, doing: str) -> str:
        status = _status(exc)
        if status == 401:
            why = f"the Hub rejected the token from {self._token_source} (401 Unauthorized)"
        elif status == 403:
            why = f"the token from {self._token_source} is not allowed to (403 Forbidden): {self._describe(exc)}"
        elif isinstance(exc, _Refused):
            why = str(exc)
        elif type(exc).__name__ == "OfflineModeIsEnabled":
            why = "HF_HUB_OFFLINE is set; unset it to push"
        elif status is None and not isinstance(exc, ValueError):
            why = f"no answer from {self._api.endpoint}: {self._describe(exc)}"
        else:
            why = self._describe(exc)
        return self._scrub(f"{what}: {doing} failed: {why}")

    # ------------------------------------------------------------------ logging

    def _scrub(self, text: str) -> str:
        return scrub_text(text, extra=self._secrets)

    def _describe(self, exc: BaseException) -> str:
        """One scrubbed, bounded line (scrubbed before truncation, so no partial secret survives)."""
        text = " ".join(_NOISE_RE.sub("", f"{type(exc).__name__}: {exc}").split())
        text = self._scrub(text)
        return text if len(text) <= _MAX_LINE else text[: _MAX_LINE - 3] + "..."

    def _log(self, message: str) -> None:
        try:
            self._log_fn(self._scrub(message))
        except Exception:  # a broken logger must not kill the worker
            pass


# ------------------------------------------------------------------------------------------------ a run's uploads


def logs_inside(cfg: TrainConfig) -> Optional[str]:
    """--logging_dir relative to the run folder when it lies inside it (then it is pushed), else None."""
    out = Path(cfg.output_dir).resolve()
    logs = (out / cfg.logging_dir).resolve()
    return logs.relative_to(out).as_posix() if out in logs.parents else None


def connect_hub(cfg: TrainConfig, log):
    """With --push_to_hub, on the launcher's rank 0 (before the process group exists): resolve the token, check it and
    create the repo now, so that a missing login, a bad token or a repo it cannot write is a one-line error before the
    first step. Returns (HubUploader, None), or (None, the error) - `setup` raises it on every rank - and (None, None)
    on the other ranks or without --push_to_hub."""
    if not cfg.push_to_hub or int(os.environ.get("RANK", "0")) != 0:
        return None, None
    token, source = find_token(cfg.hub_token)
    repo_id = cfg.hub_model_id or Path(cfg.output_dir).resolve().name
    try:
        uploader = HubUploader(repo_id, token, private=cfg.hub_private_repo, push_checkpoints=cfg.push_checkpoints,
                               log=log, token_source=source, logs=logs_inside(cfg))
        uploader.open_repo()
    except ConfigError as e:
        return None, str(e)
    log(f"hub: pushing to {uploader.repo_id} ({'private' if cfg.hub_private_repo else 'public'}; token from {source})")
    return uploader, None


def finish_uploads(uploader, cfg: TrainConfig, log, timeout: float) -> bool:
    """Wait at most `timeout` s for the uploads. True when the newest export is on the Hub (or nothing is uploaded);
    otherwise say what was not uploaded, that the run is complete locally, and the command that retries the upload."""
    if uploader is None:
        return True
    log(f"hub: waiting for the upload to {uploader.repo_id} (at most {timeout:g} s, --hub_upload_timeout)")
    uploader.close(timeout=timeout)
    missing = uploader.not_uploaded()
    if missing is None:
        return True
    log(f"hub: NOT uploaded to {uploader.repo_id}: {missing}. Everything is kept in {Path(cfg.output_dir).resolve()}. "
        f"To retry the upload, run: {rerun_command(sys.argv)}")
    return False
