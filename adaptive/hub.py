"""Background pushes of the exported pipeline (and optionally the training checkpoints) to the Hugging Face Hub.

One `HubUploader` per run, on the main process only. `push(output_dir, message)` returns at once; a single
daemon worker thread creates the repo (once, honouring `private`) and calls `HfApi.upload_folder` with the
patterns of `upload_patterns`. Requests made while an upload is running are coalesced: only the newest one is
kept. Failures are logged and retried with exponential backoff; nothing is ever raised into the training loop.

The token is never written anywhere: it is only handed to `HfApi`, and every message this module logs is scrubbed
of it (and of anything that looks like a Hub token or a bearer credential).

Note: huggingface_hub itself retries transient HTTP errors (429/5xx, timeouts) of the preupload and commit calls
(`http_backoff`, up to 5 retries, 1-8 s apart) before an attempt counts as failed here.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import Callable, Optional

__all__ = ["resolve_token", "upload_patterns", "HubUploader"]

_CHECKPOINT_PATTERN = "checkpoint-*/**"
# Never published. huggingface_hub matches with fnmatch, where `*` also crosses `/`, so "*.tmp" covers every level
# and ".checkpoint-*" covers the staging folders of checkpoints being written (".checkpoint-<step>.tmp/...").
_NEVER_PATTERNS = [
    "logs/*",
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

_HF_TOKEN_RE = re.compile(r"hf_[A-Za-z0-9]{20,}")
_BEARER_RE = re.compile(r"(?i)\b(bearer\s+)(?!\*\*\*)[A-Za-z0-9._~+/=-]+")
_NOISE_RE = re.compile(r"\s*For more information check: \S+")  # httpx's generic MDN link
_MAX_LINE = 400


def resolve_token(cli_token: Optional[str]) -> Optional[str]:
    """--hub_token, else $HF_TOKEN, else huggingface_hub's cached login (`huggingface_hub.get_token()`); else None."""
    if cli_token and cli_token.strip():
        return cli_token.strip()
    env = os.environ.get("HF_TOKEN", "").strip()
    if env:
        return env
    try:
        import huggingface_hub

        return huggingface_hub.get_token() or None
    except Exception:  # e.g. HF_OIDC_RESOURCE set but the exchange failed: no token rather than a crash
        return None


def upload_patterns(push_checkpoints: bool) -> tuple[list[str], list[str]]:
    """(allow_patterns, ignore_patterns) for `HfApi.upload_folder` on a run folder. Fresh lists on every call
    (upload_folder extends the ignore list it is given)."""
    from .rundir import hub_patterns

    allow = hub_patterns()  # the DDPMPipeline export, its model card and the images it shows
    ignore = list(_NEVER_PATTERNS)
    if push_checkpoints:
        allow.append(_CHECKPOINT_PATTERN)
    else:
        ignore.append(_CHECKPOINT_PATTERN)
    return allow, ignore


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
    ):
        from huggingface_hub import HfApi

        self.repo_id = repo_id
        self.private = bool(private)
        self.push_checkpoints = bool(push_checkpoints)
        self.retries = max(1, int(retries))
        self.backoff_s = max(0.0, float(backoff_s))
        self._log_fn = log
        self._secrets = [token] if token else []
        self._api = HfApi(endpoint=endpoint, token=token)  # endpoint None: HF_ENDPOINT or huggingface.co

        self._cond = threading.Condition()
        self._pending: Optional[tuple[Path, str]] = None
        self._busy = False
        self._closed = False
        self._thread: Optional[threading.Thread] = None
        self._repo_ready = False  # worker thread only
        self._pushed = 0
        self._failures = 0

    def __repr__(self) -> str:  # never shows the token
        return (f"HubUploader(repo_id={self.repo_id!r}, private={self.private}, "
                f"push_checkpoints={self.push_checkpoints}, pushed={self._pushed}, failures={self._failures})")

    # ------------------------------------------------------------------ public API (any thread)

    @property
    def pushed(self) -> int:
        with self._cond:
            return self._pushed

    @property
    def failures(self) -> int:
        with self._cond:
            return self._failures

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
        """Wait for the running and queued uploads. True when all are done, False (logged) on timeout. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            done = self._cond.wait_for(lambda: self._pending is None and not self._busy, timeout)
            thread = self._thread
        if not done:
            self._log(f"hub: close() timed out after {timeout:g}s; an upload to {self.repo_id} is still running "
                      "in the background and may not finish")
            return False
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)  # it only has to notice `_closed` and return
        return True

    # ------------------------------------------------------------------ worker

    def _worker(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closed)
                if self._pending is None:  # closed and nothing left
                    return
                folder, message = self._pending
                self._pending = None
                self._busy = True
            try:
                self._upload_with_retries(folder, message)
            except BaseException as exc:  # never let anything escape the thread (threading.excepthook prints it)
                self._log(f"hub: internal error while uploading {folder}: {self._describe(exc)}")
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _upload_with_retries(self, folder: Path, message: str) -> None:
        n = self.retries
        for attempt in range(1, n + 1):
            try:
                info = self._attempt(folder, message)
            except Exception as exc:
                with self._cond:
                    self._failures += 1
                line = self._describe(exc)
                if _is_permanent(exc):
                    self._log(f"hub: upload of {folder} failed (attempt {attempt}/{n}, not retrying): {line}")
                    return
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
                return

    def _attempt(self, folder: Path, message: str):
        if not self._repo_ready:
            self._api.create_repo(self.repo_id, private=self.private, exist_ok=True, repo_type="model")
            if self.private:
                # create_repo(exist_ok=True) ignores `private` for a repo that already exists: never publish a
                # run the user asked to keep private into a public repo.
                info = self._api.repo_info(self.repo_id, repo_type="model")
                if getattr(info, "private", None) is False:
                    raise _Refused(f"{self.repo_id} already exists and is public, but a private repo was requested; "
                                   "make it private on the Hub or pick another repo id")
            self._repo_ready = True
        allow, ignore = upload_patterns(self.push_checkpoints)
        return self._api.upload_folder(
            folder_path=str(folder),
            repo_id=self.repo_id,
            repo_type="model",
            commit_message=message,
            allow_patterns=allow,
            ignore_patterns=ignore,
        )

    # ------------------------------------------------------------------ logging

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        text = _BEARER_RE.sub(r"\1***", text)
        return _HF_TOKEN_RE.sub("***", text)

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
