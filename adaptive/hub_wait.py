"""How long anything waits on the Hugging Face Hub: the timeout of every request huggingface_hub sends (and so
diffusers and datasets, which send theirs through its shared client), and `hub_wait`, which bounds a download.

Requests: huggingface_hub's client has no timeout (created with timeout=None; HF_HUB_DOWNLOAD_TIMEOUT and
HF_HUB_ETAG_TIMEOUT cover file downloads only, and calls such as `model_info`, which `DDPMPipeline.from_pretrained`
makes first, pass timeout=None explicitly). `use_request_timeout` gives the shared client one through the library's
hook for client settings, `set_client_factory`: REQUEST_TIMEOUT_S per connect / read / write (connect at most 10 s),
also for the requests sent with timeout=None.

Downloads (`with hub_wait(flag, repo):` around `from_pretrained` / `load_dataset`, main thread): the libraries retry
a request that is not answered (5 retries per file, several files: minutes against a Hub that accepts connections and
never answers), so the wait ends when the first request has had no answer for `first_answer_s()` (huggingface_hub's
own HF_HUB_DOWNLOAD_TIMEOUT, default 10 s) - one line naming the flag, the repo and the endpoint, exit 2. A stop signal
(SIGTERM, SIGINT, SIGHUP) during the wait ends the command at once: one line, exit 128 + the signal number (143, 130,
129), nothing written. Once the Hub has answered, each request is bounded by the request timeout.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Optional

from .config import ConfigError
from .faults import Interrupted

__all__ = ["REQUEST_TIMEOUT_S", "first_answer_s", "hub_wait", "use_request_timeout"]

REQUEST_TIMEOUT_S = 60.0  # per connect / read / write of one HTTP request (not per call): a silent server fails it
_CONNECT_TIMEOUT_S = 10.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

_timeout_s: Optional[float] = None
_wait = {"active": False, "armed": False, "answered": False}  # the download wait in progress (main thread)


def first_answer_s() -> float:
    """How long a download waits for the Hub's first answer: huggingface_hub's HF_HUB_DOWNLOAD_TIMEOUT."""
    from huggingface_hub import constants

    return float(constants.HF_HUB_DOWNLOAD_TIMEOUT)


def _client_with_timeout():
    """huggingface_hub's default client, with a timeout (also for requests sent with timeout=None) and the hooks that
    time a download's first answer."""
    from huggingface_hub.utils._http import default_client_factory

    client = default_client_factory()
    client.timeout = type(client.timeout)(_timeout_s, connect=min(_CONNECT_TIMEOUT_S, _timeout_s))
    client.event_hooks = {"request": [*client.event_hooks["request"], _on_request],
                          "response": [*client.event_hooks["response"], _on_answer]}
    return client


def _on_request(request) -> None:
    """Fill the timeouts a caller left at None; start timing the first answer of a download wait."""
    limits = request.extensions.get("timeout") or {}
    if any(v is None for v in limits.values()):
        default = {"connect": min(_CONNECT_TIMEOUT_S, _timeout_s)}
        request.extensions["timeout"] = {k: default.get(k, _timeout_s) if v is None else v for k, v in limits.items()}
    if _wait["active"] and not _wait["armed"] and not _wait["answered"]:
        _wait["armed"] = True
        signal.setitimer(signal.ITIMER_REAL, first_answer_s())  # process-wide: callable from any thread


def _on_answer(response) -> None:
    """The Hub answered: the download wait is no longer timed."""
    if _wait["active"] and not _wait["answered"]:
        _wait["answered"] = True
        signal.setitimer(signal.ITIMER_REAL, 0)


def use_request_timeout(seconds: float) -> bool:
    """Give every request huggingface_hub makes in this process a timeout of `seconds` (per connect / read / write),
    through `set_client_factory`. A client factory installed by someone else is left alone (returns False)."""
    global _timeout_s
    try:
        from huggingface_hub import set_client_factory
        from huggingface_hub.utils import _http  # private module: which factory is installed now
    except ImportError:  # pragma: no cover - huggingface_hub < 1.0
        return False
    if _http._GLOBAL_CLIENT_FACTORY not in (_http.default_client_factory, _client_with_timeout):
        return False
    if _http._GLOBAL_CLIENT_FACTORY is not _client_with_timeout or _timeout_s != seconds:
        _timeout_s = float(seconds)
        set_client_factory(_client_with_timeout)  # closes the shared client; the next request builds one
    return True


class _NoAnswer(BaseException):
    """SIGALRM: the first request of a download wait went unanswered (BaseException: no library retries it)."""


class _Stopped(BaseException):
    """A stop signal during a download wait (BaseException: no library's `except Exception` swallows it)."""


def _raise(exc_type):
    def handler(signum, frame):
        raise exc_type(signum)

    return handler


@contextmanager
def hub_wait(flag: str, repo: str):
    """Bound a download from the Hub made inside the block (see the module docstring): ConfigError (exit 2) when the
    Hub does not answer, Interrupted (exit 128 + signal) on a stop signal. Outside the main thread: request
    timeouts only."""
    from huggingface_hub import constants

    timed = use_request_timeout(_timeout_s or REQUEST_TIMEOUT_S)
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _raise(_Stopped)) for s in STOP_SIGNALS}
    previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, _raise(_NoAnswer))
    _wait.update(active=timed, armed=False, answered=False)
    try:
        yield
    except _NoAnswer:
        raise ConfigError(f"{flag} {repo}: no answer from the Hub at {constants.ENDPOINT} within "
                          f"{first_answer_s():g} s (HF_HUB_DOWNLOAD_TIMEOUT); check the network or HF_ENDPOINT, or "
                          "set HF_HUB_OFFLINE=1 to use a cached copy") from None
    except _Stopped as e:
        signum = e.args[0]
        raise Interrupted(f"stopped by {signal.Signals(signum).name} while waiting for {flag} {repo} from "
                          f"{constants.ENDPOINT}; nothing was written", signum) from None
    finally:
        _wait.update(active=False)
        signal.setitimer(signal.ITIMER_REAL, 0)
        for s, handler in previous.items():
            signal.signal(s, handler)
