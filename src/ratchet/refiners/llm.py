"""LLM editor (``kind = "llm"``): a language model rewrites the policy's code from what ratchet knows.

Any endpoint that speaks OpenAI's chat-completions protocol works (OpenAI and other hosted APIs,
Ollama, vLLM, llama.cpp's server, LM Studio): ``base_url`` is the API root (``.../v1``), ``model`` the
model's name, and ``api_key_env`` the *name* of an environment variable holding the key — the key
itself is read at request time and never written to the spec, the ledger, the report or a log.

Each generation the refiner sends ``proposals`` requests, in waves of ``concurrency`` sent at once (each wave's
answers read in the order its requests were built, so what is proposed never depends on which answer came
first; each request in flight priced at its worst case before it is sent). The prompt (:func:`build_prompt`) holds the
task (env id, observation and action spaces, success threshold), the parent's code with its tuned
values written in as defaults, the parent's critique (failure modes with example seeds, worst seeds),
the edits already tried with what happened to each (failed checks, not gated, rejected by the gate,
promoted — so the model does not propose the same failed idea twice), and the user's ``hints``; it is
cut to ``max_prompt_chars`` (oldest history first, then the critique). The answer is parsed as
SEARCH/REPLACE blocks (:func:`parse_answer`, :func:`apply_edits`; a SEARCH text that differs from the
file only in trailing whitespace or indentation still applies), with a fallback to a whole file in a
```` ```python ```` block. A malformed answer, an edit that does not apply and an edit whose program
fails :func:`~ratchet.refiners.structural.check_source` are recorded failed proposals; a program that
passes is proposed with ``variants`` parameter settings (its values, then perturbations; new
parameters drawn across their bounds), as the ``mutate`` refiner does and for the same reason.

The program a request edits is the incumbent (with probability ``incumbent_share``) or an elite of the
refiner's archive of diverse good programs (:mod:`ratchet.refiners.archive`, as FunSearch's programs
database and MAP-Elites keep), to which every edited program is offered once its training episodes ran.
Either way the prompt holds the critique of the program it edits, from that program's own latest
training episodes (the run's :class:`~ratchet.refiners.registry.RefinerContext` ``critique`` service),
with the last ``trace_steps`` steps of its ``trace_episodes`` worst episodes, replayed on the trusted
side (:mod:`ratchet.trace`). The gate still compares every contender with the incumbent.

The system message is :data:`SYSTEM_PROMPT` unless ``system_prompt`` (text) or ``system_prompt_file``
(a file relative to the spec, stored in the ledger when the run starts) replaces it; ``hints`` are added
to every user message either way. Text quoted in the prompt (the policy, past edits) sits in code fences
longer than any run of backticks inside it (CommonMark), so quoted code cannot break the layout.

Every request and response is stored in the run's ledger (content-addressed artifacts and an
``llm_call`` event with token counts and cost), keyed by a digest of the request, which includes a
per-request ``seed`` drawn from the run's random stream. A resumed or replayed run rebuilds the same
requests and reads the recorded responses instead of calling the endpoint: resume never pays twice,
and a finished run replays without the endpoint. Requests time out after ``timeout_s`` and are retried
with exponential backoff on 429, 5xx, timeouts and refused connections (``retries`` times; a
``Retry-After`` header is honoured up to 60 s). Once ``budget_tokens``, ``budget_requests``,
``budget_cost`` or the run's ``[budget] money`` (:class:`~ratchet.refiners.registry.Purse`; money in ``currency``)
is spent the refiner makes no further request and says so as its idle reason: a run whose only refiner it is
stops there, like any budget; beside other refiners it sits out.

Instead of ``base_url`` and ``model``, ``models`` names a pool (:class:`ModelSettings`: endpoint, key, prices and
concurrency each); each request goes to the model :class:`ModelBandit` picks on training gain per unit of money.
An answer whose edit does not apply is asked about once more (``on_unusable``: the failure quoted, or the whole
file asked for), and with ``repair`` a program that raised at a line of its own code is sent back with the error
quoted (:func:`repair_note`).

A ``source`` policy (a folder of files in any language, :mod:`ratchet.policies.source`) is shown file by file
(:func:`folder_prompt_text`, with :data:`FOLDER_SYSTEM_PROMPT`), its values written into its marked regions; the
answer gives whole files or SEARCH/REPLACE blocks per path (:func:`parse_folder_answer`), applied to the folder's
existing files only (:func:`apply_folder_answer`: no new file, nothing outside the folder), and the edited folder's
regions are read again (:func:`ratchet.policies.source.program_of`; regions that cannot be read make the answer
unusable, so it is asked about again). The new candidate's parameters are those regions' numbers.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import http.client
import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ratchet.critic import Critique, Evaluation
from ratchet.errors import ApiKeyNotSetError, EndpointError, PolicyError
from ratchet.policies.source import Folder, baked, files_text, program_of
from ratchet.policy import FOLDER_KINDS, Candidate
from ratchet.proposals import ALLOWED_IMPORTS, MAX_SOURCE_CHARS
from ratchet.refiners.archive import ArchiveSettings, draw_parent, offer_generation
from ratchet.refiners.base import GenerationCost, Refiner, Turn
from ratchet.refiners.registry import Purse, Reply, Sent, as_they_finish
from ratchet.refiners.structural import Rejection, baked_source, check_source, param_variants, source_diff

__all__ = [
    "MAX_RESPONSE_BYTES",
    "EditError",
    "LLMRefiner",
    "LLMSettings",
    "apply_edits",
    "apply_folder_answer",
    "build_prompt",
    "chat_completions_url",
    "check_endpoint",
    "models_url",
    "parameter_types",
    "parse_answer",
    "parse_folder_answer",
    "redact_url",
    "url_secret",
]


#: Largest reply ``max_response_bytes`` may allow (bytes), whatever ``max_tokens`` says.
MAX_RESPONSE_BYTES = 16 * 2**20
#: The most tokens a reply's ``usage`` may count for one request; a larger count is no count (it is estimated).
_MAX_REPLY_TOKENS = 10**9


def _checked_url(v: str) -> str:
    if not re.match(r"^https?://[^\s/]+", v):
        raise ValueError(f"expected an http(s) URL such as http://localhost:11434/v1, got {redact_url(v)[:80]!r}")
    secret = url_secret(v)
    if secret:
        raise ValueError(f"base_url holds {secret}, which would be written to the run's ledger; put the key in "
                         "an environment variable and name that variable in api_key_env")
    return v


def _checked_env_name(v: str | None) -> str | None:
    if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", v):
        raise ValueError("give the NAME of an environment variable (e.g. OPENAI_API_KEY), not the key itself")
    return v


class ModelSettings(BaseModel):
    """One model of an ``llm`` refiner's pool (an entry of ``models``): where it is served, its name, key and
    prices (per million tokens, in the refiner's ``currency``; unset: the refiner's), and the most of a wave's
    requests it takes (``concurrency``; unset: no limit of its own)."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    base_url: str = Field(description="API root of the model's OpenAI-compatible endpoint.")
    model: str = Field(min_length=1, max_length=200, description="Model name as the endpoint knows it.")
    api_key_env: str | None = Field(None, description="Name of the environment variable holding its key.")
    price_prompt: float | None = Field(None, ge=0, description="Price per million prompt tokens.")
    price_completion: float | None = Field(None, ge=0, description="Price per million answer tokens.")
    concurrency: int | None = Field(None, ge=1, le=64, description="Most of a wave's requests sent to it.")

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        return _checked_url(v)

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        return _checked_env_name(v)

    def price(self, prompt_tokens: int, completion_tokens: int) -> float:
        """The price of a request's tokens (money, in the refiner's currency)."""
        return (prompt_tokens * (self.price_prompt or 0.0) + completion_tokens * (self.price_completion or 0.0)) / 1e6


class LLMSettings(ArchiveSettings):
    """Settings of an ``llm`` refiner (a ``[[refiners]]`` table with ``kind = "llm"``).

    ``base_url`` is written to the run's ledger with the spec, so a URL carrying a credential (user info,
    a query parameter such as ``key=`` or ``access_token=``) is refused (:func:`url_secret`): the key goes in
    the environment variable ``api_key_env`` names. Validation errors never echo the values given.
    """

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    @property
    def response_cap(self) -> int:
        """Largest reply read (bytes): ``max_response_bytes``, or 65,536 + 32 per ``max_tokens`` (a token
        takes a few characters, and JSON escapes some of them), never above :data:`MAX_RESPONSE_BYTES`."""
        return min(MAX_RESPONSE_BYTES, self.max_response_bytes or 65_536 + 32 * self.max_tokens)

    base_url: str | None = Field(None, description="API root of an OpenAI-compatible endpoint, e.g. "
                                                   "http://localhost:11434/v1 (Ollama); /chat/completions is appended "
                                                   "unless given. Give base_url and model, or models (a pool).")
    model: str | None = Field(None, min_length=1, max_length=200, description="Model name as the endpoint knows it.")
    models: list[ModelSettings] | None = Field(None, min_length=1, max_length=16,
                                               description="A pool of models instead of base_url and model: each "
                                                           "request goes to the one a bandit picks on its training "
                                                           "gain per unit of money (see pick_model).")
    explore: float = Field(1.0, ge=0, le=10, description="With models: the bandit's exploration coefficient (UCB1's "
                                                         "c; 0: always the best so far).")
    currency: str = Field("USD", pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,15}$",
                          description="Unit of price_prompt, price_completion and budget_cost (and of [budget] "
                                      "money, which must name the same).")
    repair: bool = Field(True, description="An edited program whose every variant failed in its episodes on an error "
                                           "raised at a line of its code is sent back once, in the next generation, "
                                           "with the error and that line quoted, to be fixed.")
    on_unusable: Literal["retry", "rewrite", "skip"] = Field(
        "retry", description="An answer whose edit does not apply (or has no edit): \"retry\" asks once more with "
                             "the failure quoted, \"rewrite\" asks for the whole file, \"skip\" records it and goes "
                             "on. The second request counts in the budgets.")
    api_key_env: str | None = Field(None, description="Name of the environment variable holding the API key "
                                                      "(sent as a Bearer token); none for local servers.")
    hints: str = Field("", max_length=20_000, description="Extra guidance for the model, added to every prompt.")
    system_prompt: str | None = Field(None, min_length=1, max_length=20_000,
                                      description="The system message, replacing ratchet's own (which says how "
                                                  "policy files look and how to answer).")
    system_prompt_file: str | None = Field(None, min_length=1, description="A UTF-8 file holding the system "
                                                                          "message, relative to the spec file.")
    trace_episodes: int = Field(2, ge=0, le=10, description="Worst training episodes of the edited program "
                                                            "replayed for the prompt's traces (0: none); the "
                                                            "replays count in the env-step budget.",
                                json_schema_extra={"unit": "episodes"})
    trace_steps: int = Field(10, ge=1, le=50, description="Last env steps each trace shows (observation, action, "
                                                          "reward).",
                             json_schema_extra={"unit": "env steps"})

    @field_validator("lag", mode="before")
    @classmethod
    def _lag(cls, v: Any) -> Any:
        if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 64):
            return v
        raise ValueError("lag is a number of generations (0 to 64) or \"auto\"")

    @model_validator(mode="after")
    def _one_system_prompt(self) -> LLMSettings:
        if self.system_prompt is not None and self.system_prompt_file is not None:
            raise ValueError("give system_prompt or system_prompt_file, not both")
        if self.models is not None and (self.base_url is not None or self.model is not None):
            raise ValueError("give base_url and model (one model) or models (a pool), not both")
        if self.models is None and (self.base_url is None or self.model is None):
            raise ValueError("give base_url and model (one model), or models (a pool of them)")
        if self.lag and not self.ahead:
            raise ValueError("lag needs ahead = 1 or more (it says which generation takes a wave sent ahead)")
        return self

    @property
    def pool(self) -> list[ModelSettings]:
        """The models requests may go to: ``models``, or the one ``base_url`` and ``model`` name; each with its
        ``api_key_env`` and prices (a pool's model without them takes the refiner's)."""
        if self.models is None:
            return [ModelSettings(base_url=self.base_url or "", model=self.model or "", api_key_env=self.api_key_env,
                                  price_prompt=self.price_prompt, price_completion=self.price_completion)]
        return [m.model_copy(update={"api_key_env": m.api_key_env or self.api_key_env,
                                     "price_prompt": self.price_prompt if m.price_prompt is None else m.price_prompt,
                                     "price_completion": (self.price_completion if m.price_completion is None
                                                          else m.price_completion)})
                for m in self.models]
    proposals: int = Field(2, ge=1, le=50, description="Requests (edited programs) per generation.",
                           json_schema_extra={"unit": "requests"})
    concurrency: int = Field(4, ge=1, le=64, description="Requests in flight at once: a generation's requests go "
                                                         "out in waves of this many, each wave's answers read in "
                                                         "the order its requests were built (1: one after "
                                                         "another, each prompt seeing the edits before it).",
                             json_schema_extra={"unit": "requests"})
    ahead: int = Field(0, ge=0, le=4, description="Waves of requests sent ahead: right after each generation's "
                                                  "proposals, one more wave (up to concurrency requests, less those "
                                                  "still out) goes out "
                                                  "while that generation's episodes run, if fewer than this many are "
                                                  "out; the next generation takes their answers first. Their prompts "
                                                  "see the history one generation stale (0: every request is sent "
                                                  "and answered within its generation).",
                       json_schema_extra={"unit": "waves"})
    lag: int | Literal["auto"] = Field(0, description="With ahead and several refiners: the generations (any "
                                                      "refiner's) from a wave sent ahead to the generation that "
                                                      "takes its answers, which is then this refiner's (the "
                                                      "allocator gives it); until then this refiner sits out while "
                                                      "another can take generations, so the model answers beside "
                                                      "their episodes. Set it near the model's answer time over a "
                                                      "generation's (0 to 64), or \"auto\": the first generation "
                                                      "that starts once all the wave's answers are in (timing's "
                                                      "choice, recorded in the ledger and replayed on resume). 0: a "
                                                      "wave waits for this refiner's next generation, whenever the "
                                                      "allocator gives it one.",
                                       json_schema_extra={"unit": "generations"})
    variants: int = Field(2, ge=1, le=50, description="Parameter settings each edited program is proposed with.",
                          json_schema_extra={"unit": "candidates"})
    sigma: float = Field(0.1, gt=0, le=1, description="Perturbation of the parameters in the variants (fraction "
                                                      "of each range).")
    temperature: float = Field(0.7, ge=0, le=2, description="Sampling temperature.")
    max_tokens: int = Field(4096, ge=16, le=1_000_000, description="Most tokens of one answer.",
                            json_schema_extra={"unit": "tokens"})
    timeout_s: float = Field(120.0, gt=0, le=3600, description="Seconds one request may take in all: a deadline "
                                                                "for its attempts, their waits and every byte of the "
                                                                "reply (never past the run's [budget] wall_clock_s).",
                             json_schema_extra={"unit": "seconds"})
    retries: int = Field(3, ge=0, le=20, description="Retries on 429, 5xx, timeouts and refused connections (within "
                                                     "timeout_s).")
    backoff_s: float = Field(2.0, ge=0, le=600, description="First retry's wait; doubles each retry.",
                             json_schema_extra={"unit": "seconds"})
    history: int = Field(12, ge=0, le=1000, description="Most past edits (with their verdicts) in the prompt.",
                         json_schema_extra={"unit": "edits"})
    max_prompt_chars: int = Field(40_000, ge=2_000, le=2_000_000,
                                  description="Prompt size limit (characters): oldest history, then the critique, "
                                              "are cut to fit.",
                                  json_schema_extra={"unit": "characters"})
    budget_tokens: int | None = Field(None, gt=0, description="Most tokens (prompt + answer) of all requests.",
                                      json_schema_extra={"unit": "tokens"})
    budget_requests: int | None = Field(200, gt=0, description="Most HTTP requests, retries included (as the "
                                                              "endpoint bills them).",
                                        json_schema_extra={"unit": "requests (HTTP attempts)"})
    budget_cost: float | None = Field(None, gt=0, description="Most money, priced by price_prompt/price_completion.",
                                      json_schema_extra={"unit": "money (currency)"})
    price_prompt: float = Field(0.0, ge=0, description="Price per million prompt tokens (in currency).",
                                json_schema_extra={"unit": "money per 1M tokens"})
    price_completion: float = Field(0.0, ge=0, description="Price per million answer tokens.",
                                    json_schema_extra={"unit": "money per 1M tokens"})
    max_response_bytes: int | None = Field(None, ge=1024, le=MAX_RESPONSE_BYTES,
                                           description="Largest reply (bytes) read from the endpoint; default "
                                                       "65,536 + 32 per max_tokens. A longer reply is refused.",
                                           json_schema_extra={"unit": "bytes"})
    max_failures: int = Field(3, ge=1, le=100, description="Consecutive failed requests after which the refiner "
                                                           "stops (a refused key or unknown model stops it at once).",
                              json_schema_extra={"unit": "requests"})
    check_endpoint: bool = Field(True, description="At the start of a new run, GET base_url/models: an unreachable "
                                                   "endpoint, a refused key or a model it does not list stop the "
                                                   "run before any episode; false skips it.")

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return None if v is None else _checked_url(v)

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        return _checked_env_name(v)


#: Query parameter names taken for credentials in a URL (lower case; ``api-key``, ``access_token``, ``sig``, ...).
_SECRET_QUERY = re.compile(r"key|token|secret|passw|pwd|auth|sig|credential|session", re.IGNORECASE)


def url_secret(url: str) -> str | None:
    """What in ``url`` looks like a credential — user info (``user:password@``) or a query parameter
    named like one (``?key=…``, ``?api_key=…``, ``?access_token=…``, ``?sig=…``) — described without its
    value, or None. The spec (with ``base_url``) is written to the ledger, so such URLs are refused."""
    from urllib.parse import parse_qsl, urlsplit

    try:
        parts = urlsplit(url)
        has_user = parts.username is not None or parts.password is not None
    except ValueError:
        return "a malformed network location"
    if has_user:
        return "user info (user:password@)"
    for name, _ in parse_qsl(parts.query, keep_blank_values=True):
        if _SECRET_QUERY.search(name):
            return f"a query parameter {name!r}"
    if parts.fragment:
        return "a fragment (#...)"
    return None


def redact_url(url: str) -> str:
    """``url`` with its user info and every query parameter's value replaced by ``***`` (for messages)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return re.sub(r"[?#@].*", "***", url)
    netloc = ("***@" if "@" in parts.netloc else "") + parts.netloc.rsplit("@", 1)[-1]
    query = "&".join(f"{q.split('=', 1)[0]}=***" for q in parts.query.split("&") if q) if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def chat_completions_url(base_url: str) -> str:
    """``base_url`` with ``/chat/completions`` appended (unless it already ends so)."""
    u = base_url.rstrip("/")
    return u if u.endswith("/chat/completions") else u + "/chat/completions"


# -- answers: SEARCH/REPLACE blocks, or a whole file ---------------------------------------------------

class EditError(ValueError):
    """An answer that gives no usable edit (one line: what is wrong)."""


_BLOCK = re.compile(r"^[ \t]*<{5,9}[ \t]*SEARCH[ \t]*\n(.*?)"
                    r"^[ \t]*={5,9}[ \t]*\n(.*?)"
                    r"^[ \t]*>{5,9}[ \t]*REPLACE[ \t]*$", re.MULTILINE | re.DOTALL)
_FENCE = re.compile(r"^```[ \t]*(?:python|py)?[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def parse_answer(text: str, functions: Sequence[str] = ("act",)) -> list[tuple[str, str]] | str:
    """An answer's edits: a list of ``(search, replace)`` blocks, or a whole file (a str).

    Raises:
        EditError: the answer has SEARCH/REPLACE markers that do not form blocks, or neither blocks
            nor a fenced code block defining ``act`` (or the first of the task's ``functions``).
    """
    if not isinstance(text, str) or not text.strip():
        raise EditError("empty answer")
    text = text.replace("\r\n", "\n")
    blocks = [(m.group(1), m.group(2)) for m in _BLOCK.finditer(text)]
    markers = len(re.findall(r"^[ \t]*<{5,9}[ \t]*SEARCH", text, re.MULTILINE))
    if blocks:
        if markers != len(blocks):
            raise EditError(f"{markers} SEARCH markers but {len(blocks)} complete SEARCH/=======/REPLACE blocks")
        return blocks
    if markers:
        raise EditError("a SEARCH block without its ======= and >>>>>>> REPLACE lines")
    first = re.escape(next(iter(functions), "act"))
    files = [m.group(1) for m in _FENCE.finditer(text) if re.search(rf"^def {first}\(", m.group(1), re.MULTILINE)]
    if files:
        return files[-1]
    raise EditError(f"no SEARCH/REPLACE block and no ```python block with a whole policy file (def {first[:40]})")


def _reindent(lines: list[str], delta: int) -> list[str]:
    if delta >= 0:
        return [(" " * delta + ln) if ln.strip() else ln for ln in lines]
    return [ln[min(-delta, len(ln) - len(ln.lstrip(" "))):] for ln in lines]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def apply_edits(source: str, blocks: Sequence[tuple[str, str]]) -> str:
    """Apply SEARCH/REPLACE blocks in order, each to its first match.

    A SEARCH text is found exactly; failing that, line by line ignoring trailing whitespace; failing
    that, ignoring indentation (the replacement is then shifted by the indentation difference of the
    first non-blank line).

    Raises:
        EditError: a SEARCH text is empty or not found.
    """
    for k, (search, replace) in enumerate(blocks, 1):
        if not search.strip():
            raise EditError(f"SEARCH block {k} is empty; quote the lines to replace")
        if search in source:
            source = source.replace(search, replace, 1)
            continue
        src = source.splitlines(keepends=True)
        want = search.splitlines()
        rep = replace.splitlines()
        n = len(want)
        done = False
        for tolerant in (lambda a, b: a.rstrip() == b.rstrip(), lambda a, b: a.strip() == b.strip()):
            for i in range(len(src) - n + 1):
                if all(tolerant(src[i + j], want[j]) for j in range(n)):
                    first = next((j for j in range(n) if want[j].strip()), 0)
                    delta = _indent(src[i + first]) - _indent(want[first])
                    new = _reindent(rep, delta)
                    end = "\n" if src[i + n - 1].endswith("\n") else ""
                    src[i:i + n] = ["\n".join(new) + end] if new else []
                    source = "".join(src)
                    done = True
                    break
            if done:
                break
        if not done:
            head = next((ln for ln in want if ln.strip()), "")
            raise EditError(f"SEARCH block {k} does not match the policy (first line {head.strip()[:80]!r})")
    return source



_HEADER = re.compile(r"^[ \t]*={3}[ \t]*(\S[^\n]*?)[ \t]*={3}[ \t]*$", re.MULTILINE)
_PATH_FENCE = re.compile(r"^(`{3,})[ \t]*[\w+#.-]*[ \t]+path=(\S+)[ \t]*\n(.*?)^\1[ \t]*$", re.MULTILINE | re.DOTALL)
_ANY_FENCE = re.compile(r"^(`{3,})[^\n]*\n(.*?)^\1[ \t]*$", re.MULTILINE | re.DOTALL)


def _path_line(line: str) -> str:
    """A path written on a line of its own before a SEARCH block: ``main.c``, ``=== main.c ===``, ```main.c```,
    ``File: main.c``, ``### src/x.rs:``."""
    m = _HEADER.match(line)
    text = m.group(1) if m else line.strip()
    text = re.sub(r"^(?:#+\s*|(?:file|path)\s*:\s*)", "", text, flags=re.IGNORECASE).strip().strip("`*\"'").strip()
    return text.removesuffix(":")


def parse_folder_answer(text: str) -> list[tuple[str, str | list[tuple[str, str]]]]:
    """A source folder's edits in an answer: ``(path, whole new text)`` for each whole file (a fenced block whose info
    string names it, ```` ```cpp path=main.cpp ````, or a ``=== path ===`` header followed by the file, fenced or
    not, up to the next header) and ``(path, [(search, replace), …])`` for the SEARCH/REPLACE blocks under each path
    line (the path on the last line before the block that is not a code fence), in the answer's order. The paths are
    as written (checked by :func:`apply_folder_answer`).

    Raises:
        EditError: SEARCH markers that do not form blocks, a block with no path line before it, or no edit at all.
    """
    if not isinstance(text, str) or not text.strip():
        raise EditError("empty answer")
    text = text.replace("\r\n", "\n")
    blocks = list(_BLOCK.finditer(text))
    markers = len(re.findall(r"^[ \t]*<{5,9}[ \t]*SEARCH", text, re.MULTILINE))
    if markers != len(blocks):
        raise EditError(f"{markers} SEARCH markers but {len(blocks)} complete SEARCH/=======/REPLACE blocks")
    out: list[tuple[str, str | list[tuple[str, str]]]] = []
    if blocks:
        for k, m in enumerate(blocks, 1):
            before = [ln for ln in text[:m.start()].split("\n") if ln.strip() and not ln.strip().startswith("```")]
            path = _path_line(before[-1]) if before else ""
            if not path or re.search(r"[>=]{5}", path):  # the end of the block before: no path of its own
                if out and not isinstance(out[-1][1], str):
                    path = out[-1][0]
                else:
                    raise EditError(f"SEARCH block {k} has no path line before it; write the file's path (as in "
                                    "its === path === header) on the line before each SEARCH block")
            if out and out[-1][0] == path and not isinstance(out[-1][1], str):
                out[-1][1].append((m.group(1), m.group(2)))
            else:
                out.append((path, [(m.group(1), m.group(2))]))
        return out
    out = [(m.group(2), m.group(3)) for m in _PATH_FENCE.finditer(text)]
    if out:
        return out
    heads = list(_HEADER.finditer(text))
    for i, h in enumerate(heads):
        body = text[h.end() + 1:heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        fence = _ANY_FENCE.search(body)
        whole = fence.group(2) if fence else body.strip("\n") + "\n"
        out.append((h.group(1).strip(), whole))
    if out:
        return out
    raise EditError("no SEARCH/REPLACE block under a path line, no ```lang path=FILE block and no === FILE === "
                    "header with a whole file")


def apply_folder_answer(files: Mapping[str, str], edits: Sequence[tuple[str, str | list[tuple[str, str]]]]
                        ) -> dict[str, str]:
    """The folder's files (path -> text) with an answer's edits (:func:`parse_folder_answer`) applied in order. Only
    the folder's existing files may be edited (no file is added or removed: the build commands name the files).

    Raises:
        EditError: a path that is absolute, climbs out of the folder (``..``) or is not one of the folder's files,
            or a SEARCH text not found in its file.
    """
    new = dict(files)
    for path, edit in edits:
        p = path.replace("\\", "/")
        if p.startswith(("/", "~")) or re.match(r"^[A-Za-z]:", p) or ".." in p.split("/"):
            raise EditError(f"{path[:120]!r} is outside the program's folder (an absolute path or '..'); edit only "
                            f"its files: {', '.join(sorted(files))[:400]}")
        p = p.removeprefix("./")
        if p not in files:
            raise EditError(f"{path[:120]!r} is not a file of the program's folder (no file may be added); edit only "
                            f"its files: {', '.join(sorted(files))[:400]}")
        try:
            new[p] = edit if isinstance(edit, str) else apply_edits(new[p], edit)
        except EditError as exc:
            raise EditError(f"{p}: {exc}") from None
    return new


# -- prompts -------------------------------------------------------------------------------------------

#: How every answer is written (the end of both system messages).
ANSWER_FORMAT = """\
Answer with one or more edit blocks, each quoting lines of the current file exactly:
<<<<<<< SEARCH
lines copied from the current file
=======
the lines that replace them
>>>>>>> REPLACE
or, for a rewrite, the whole new file in one ```python block. Explain your idea in one or two sentences first."""

#: The imports a proposal may make, in the prompts' words: the same list its checks allow (:data:`ALLOWED_IMPORTS`).
_IMPORTS = ("Only these modules may be imported: " + ", ".join(sorted(ALLOWED_IMPORTS - {"__future__"}))
            + " (no os, sys, subprocess or other access to files, processes or the network).")

SYSTEM_PROMPT = """\
You improve control policies for reinforcement-learning environments by editing their Python code.
A policy file defines PARAMETERS, a literal dict name -> {"default": x, "low": a, "high": b} of tunable
numbers, and act(observation, params) -> action, where params maps each name to its value; an optional
reset(params, seed) runs before each episode.
""" + _IMPORTS + """
Every edit is tested on fresh seeds and kept only if it is significantly better on held-out seeds.
Put new tunable numbers in PARAMETERS with sensible bounds: an optimiser tunes them after your edit.

""" + ANSWER_FORMAT


EVALUATOR_SYSTEM_PROMPT = """\
You improve heuristic programs by editing their Python code. An evaluator scores the program on problem
instances (higher is better) by calling the functions the task names, each with params as its last
argument. A program file defines PARAMETERS, a literal dict name -> {"default": x, "low": a, "high": b} of
tunable numbers (params maps each name to its value), and those functions.
""" + _IMPORTS + """
Every edit is tested on fresh instances and kept only if it is significantly better on held-out instances.
Put new tunable numbers in PARAMETERS with sensible bounds: an optimiser tunes them after your edit.

""" + ANSWER_FORMAT


#: How an answer edits a source folder (the end of :data:`FOLDER_SYSTEM_PROMPT`).
FOLDER_ANSWER_FORMAT = """\
Answer with edit blocks, each under a line naming the file it edits (its path as in its === path === header),
each quoting lines of that file exactly:
main.cpp
<<<<<<< SEARCH
lines copied from the current file
=======
the lines that replace them
>>>>>>> REPLACE
or, for a rewrite, each new whole file in a block whose info string names it: ```cpp path=main.cpp
Only the folder's existing files may be edited (no new files, no paths outside the folder). Keep the
EVOLVE-BLOCK-START / EVOLVE-BLOCK-END markers and their annotations readable. Explain your idea in one or two
sentences first."""

FOLDER_SYSTEM_PROMPT = """\
You improve programs by editing their source files (any language). The program is a folder of files, built
and run by the commands shown; an evaluator scores it on problem instances (higher is better) by running it
on each call of the functions the task names (the arguments on its stdin, the answer on its stdout).
Numbers between EVOLVE-BLOCK-START and EVOLVE-BLOCK-END comments are tunable parameters (a comment
"ratchet: NAME LOW..HIGH" on a number's line names it and gives its bounds): an optimiser tunes them after
your edit, so put new tunable numbers in a marked region.
Every edit is tested on fresh instances and kept only if it is better on held-out instances.

""" + FOLDER_ANSWER_FORMAT


def folder_prompt_text(source: str, max_chars: int) -> str:
    """The current program of a source folder as the prompt shows it: its build and run commands, its files each
    under a ``=== path ===`` header in a code fence (files with marked regions first, then in path order; those that
    no longer fit in ``max_chars`` characters are named as left out, with their sizes), and its marked regions'
    parameters (name, file and line, value, bounds, type).

    Raises:
        PolicyError: not a folder document, or regions that cannot be read.
    """
    folder = Folder.from_source(source)
    head = [f"Build: {' && '.join(folder.build) or '(nothing to build)'}", f"Run: {' '.join(folder.run)}"]
    order = sorted(folder.files, key=lambda path: (path not in folder.literals, path))
    shown, cut, used = [], [], 0
    for path in order:
        ext = path.rsplit(".", 1)[-1] if "." in path.rsplit("/", 1)[-1] else ""
        part = f"=== {path} ===\n" + fenced(folder.files[path], ext)
        if used + len(part) > max_chars:
            cut.append(f"{path} ({len(folder.files[path]):,} characters)")
            continue
        shown.append(part)
        used += len(part)
    lines = [f"- {lit.name} ({path} line {lit.line}): {lit.text}, bounds {lit.low:g}..{lit.high:g}"
             + (", integer" if lit.is_int else "") + (", log scale" if lit.scale == "log" else "")
             for path, lits in folder.literals.items() for lit in lits]
    text = "\n".join(head) + "\n\n" + "\n\n".join(shown)
    if cut:
        text += ("\n\nFiles not shown (the prompt's size limit; they may still be edited with SEARCH/REPLACE blocks): "
                 + ", ".join(cut))
    return text + "\n\nMarked regions' parameters (their tuned values are written in):\n" + ("\n".join(lines)
                                                                                            or "(none)")


@dataclass
class Attempt:
    """One edit tried: what it changed and what became of it (shown in later prompts)."""

    summary: str
    verdict: str
    ids: tuple[str, ...] = ()
    train_mean: float | None = None
    generation: int = 0
    repair: bool = False  # the answer to a repair request (never sent back again)


def _task_text(task: Mapping[str, Any]) -> str:
    if task.get("functions"):  # an evaluator task: its description names the functions
        lines = [f"Task: {task.get('name')}", str(task.get("description") or "").strip()]
        if task.get("success_threshold") is not None:
            lines.append(f"An instance succeeds when its score is at least {task['success_threshold']:g}.")
        elif task.get("success_rule"):
            lines.append(f"An instance succeeds when: {task['success_rule']}.")
        return "\n".join(line for line in lines if line)
    lines = [f"Gymnasium environment: {task.get('env_id')}",
             f"Observation space: {task.get('observation_space')}",
             f"Action space: {task.get('action_space')}"]
    if task.get("success_threshold") is not None:
        lines.append(f"An episode succeeds when its return is at least {task['success_threshold']:g}.")
    if task.get("step_limit"):
        lines.append(f"Episodes are cut at {task['step_limit']} steps.")
    if task.get("description"):
        lines.append("Rewards and episode end:\n" + str(task["description"]).strip())
    return "\n".join(lines)


def fenced(text: str, info: str = "") -> str:
    """``text`` in a code fence of backticks longer than any run of backticks inside it (CommonMark: a fence
    closes only on at least as many), so quoted code, diffs or answers cannot close it early.

    Args:
        text: What to quote.
        info: The fence's info string (a language such as ``"python"``).
    """
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    bar = "`" * max(3, longest + 1)
    return f"{bar}{info}\n{text.rstrip()}\n{bar}"


def critique_text(critique: Critique | None, trace_steps: int = 10,
                  observation_names: Sequence[str] | None = None) -> str:
    """The critique part of a prompt: the critique's text (statistics, failure modes, worst seeds), then how
    its traced episodes ended, step by step (:meth:`ratchet.trace.Trace.text`).

    Args:
        critique: The edited program's critique, or None (no training episodes yet).
        trace_steps: Most steps shown of each trace.
        observation_names: Names of the observation's components, for the traces' header.
    """
    if critique is None:
        return "No episodes critiqued yet."
    text = critique.text.strip() or "No episodes critiqued yet."
    if critique.traces:
        text += ("\n\nHow its worst episodes ended (replayed; rewards per step, numbers rounded):\n"
                 + "\n".join(t.text(trace_steps, observation_names) for t in critique.traces))
    return text


def parameter_types(source: str) -> str:
    """What the prompt says of ``source``'s int and categorical parameters (empty when it has none, so a float-only
    program's prompt is what it always was): one line each with its values and what ``params`` holds, and that a
    default of another type is refused."""
    from ratchet.policy import typed_parameters

    lines = [f'- params["{p.name}"]: {p.describe()} (' + ("a Python int" if p.type == "int" else "the choice itself")
             + ")" for p in typed_parameters(source)]
    if not lines:
        return ""
    return ("\nParameters that are not floats (a default must keep its type: an integer within its bounds, or one of "
            "its choices written as listed; any other value is refused):\n" + "\n".join(lines))


def build_prompt(task: Mapping[str, Any], source: str, critique: Critique | None, history: Sequence[Attempt],
                 hints: str = "", max_chars: int = 40_000, max_history: int = 12, *,
                 system_prompt: str | None = None, trace_steps: int = 10,
                 failure: str | None = None, kind: str = "program") -> list[dict[str, str]]:
    """The chat messages of one request.

    Args:
        task: ``env_id``, ``observation_space``, ``action_space`` (text), ``success_threshold``, ``step_limit``
            (env steps), and optionally ``description`` (the task's rewards and episode end, in words) and
            ``observation_names``.
        source: The parent's code (its values written in as defaults).
        critique: The parent's own latest critique (training episodes, with traces of its worst episodes),
            or None when it has run none.
        history: Edits tried so far, oldest first.
        hints: The user's hints.
        max_chars: Size limit of the user message (characters): the oldest history entries go first, then
            the critique is cut.
        max_history: Most history entries shown.
        system_prompt: The system message; None uses :data:`SYSTEM_PROMPT`.
        trace_steps: Most steps shown of each trace.
        failure: For a repair request: the error the program raised in its episodes (and the line that raised it),
            quoted with a request to fix it; None for an ordinary edit.
        kind: The parent's policy kind: a source folder (:data:`~ratchet.policy.FOLDER_KINDS`; ``source`` its
            document) is shown file by file (:func:`folder_prompt_text`, its files within half of ``max_chars``),
            with :data:`FOLDER_SYSTEM_PROMPT` as the default system message.

    Returns:
        ``[{"role": "system", ...}, {"role": "user", ...}]``.
    """
    from ratchet.policy import FOLDER_KINDS

    crit = critique_text(critique, trace_steps, task.get("observation_names"))
    shown = list(history)[-max_history:] if max_history else []
    folder = kind in FOLDER_KINDS
    current = ("## Current program (a folder of files)\n" + folder_prompt_text(source, max_chars // 2) if folder else
               "## Current policy (its tuned values are written in as the defaults)\n" + fenced(source, "python")
               + parameter_types(source))
    how = ("Use SEARCH/REPLACE blocks, each under a line naming its file (or whole files in ```lang path=FILE blocks)."
           if folder else "Use SEARCH/REPLACE blocks (or a whole file in a ```python block).")

    def render(entries: Sequence[Attempt], crit_text: str) -> str:
        parts = ["## Task\n" + _task_text(task), current,
                 "## How the current policy does on recent training episodes\n" + crit_text]
        if failure:
            parts.append("## It fails\nEvery episode of this policy stopped on this error; fix it first, keeping the "
                         "idea of the policy:\n" + fenced(failure))
        if entries:
            parts.append("## Edits already tried (oldest first) and what became of them\n" + "\n\n".join(
                f"Edit {i}:\n{fenced(a.summary, 'diff')}\nResult: {' '.join(a.verdict.split())}"
                for i, a in enumerate(entries, 1)))
        if hints.strip():
            parts.append("## Hints\n" + hints.strip())
        parts.append("## Your answer\nPropose one edit that fixes the failures above and differs from the edits "
                     "already tried. " + how)
        return "\n\n".join(parts)

    text = render(shown, crit)
    while len(text) > max_chars and shown:
        shown = shown[1:]
        text = render(shown, crit)
    if len(text) > max_chars:
        keep = max(200, len(crit) - (len(text) - max_chars))
        text = render(shown, crit[:keep] + " [cut]")
    default = FOLDER_SYSTEM_PROMPT if folder else EVALUATOR_SYSTEM_PROMPT if task.get("functions") else SYSTEM_PROMPT
    return [{"role": "system", "content": default if system_prompt is None else system_prompt},
            {"role": "user", "content": text}]


# -- the HTTP call ---------------------------------------------------------------------------------------

_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
#: Statuses no retry or later request can fix: a refused key, or no such model or route.
_PERMANENT_STATUS = {401, 403, 404}
_REDIRECT_STATUS = {301, 302, 303, 307, 308}
_ERROR_BODY_BYTES = 4096  # of an error reply, only this much is read (for the server's message)


class _Failed(Exception):
    """One attempt's failure: ``error`` (one line, no key), the HTTP ``status`` (None without a reply), the
    server's ``message``, whether a retry may help and whether nothing will (``permanent``)."""

    def __init__(self, error: str, status: int | None = None, message: str | None = None, retry: bool = False,
                 permanent: bool = False, wait: float | None = None, timed_out: bool = False) -> None:
        super().__init__(error)
        self.error, self.status, self.message, self.retry = error, status, message, retry
        self.permanent, self.wait, self.timed_out = permanent, wait, timed_out


def _scrub(text: str, key: str | None) -> str:
    """``text`` with ``key`` (and its JSON-escaped form) replaced by ``***``."""
    if key:
        for form in {key, json.dumps(key)[1:-1]}:
            text = text.replace(form, "***")
    return text


def _origin(url: str) -> tuple[str, str, int]:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port or (443 if parts.scheme == "https" else 80)


def _server_message(data: bytes) -> str:
    """The message of an error reply (OpenAI's ``{"error": {"message": ...}}``, or text), one line."""
    text = data.decode("utf-8", errors="replace")
    try:
        reply = json.loads(text)
        err = reply.get("error", reply) if isinstance(reply, dict) else reply
        if isinstance(err, dict):
            err = err.get("message") or err.get("detail") or err
        text = err if isinstance(err, str) else json.dumps(err)
    except ValueError:
        pass
    return " ".join(text.split())[:300]


def _attempt(url: str, method: str, data: bytes | None, headers: Mapping[str, str], deadline: float,
             max_bytes: int) -> bytes:
    """One HTTP exchange that ends by ``deadline`` (``time.monotonic()``): connecting, sending and every byte
    of the reply (a watchdog shuts the socket at the deadline, so a server that drips its reply cannot hold
    the call). Redirects are followed only to the same origin and only when they keep the method (307,
    308), so the key never reaches another server. Returns the body of a 2xx reply (at most ``max_bytes``).

    Raises:
        _Failed: no reply in time, no connection, a redirect elsewhere, a non-2xx status or a reply over
            ``max_bytes``.
    """
    import ssl
    import threading
    from urllib.parse import urljoin, urlsplit

    origin = _origin(url)
    for _hop in range(4):
        parts = urlsplit(url)
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Failed("no reply within the request's deadline", retry=True, timed_out=True)
        host, port = parts.hostname or "", parts.port
        conn = (http.client.HTTPSConnection(host, port, timeout=left, context=ssl.create_default_context())
                if parts.scheme == "https" else http.client.HTTPConnection(host, port, timeout=left))
        fired = threading.Event()
        held: list[socket.socket] = []  # the connection's socket (http.client lets go of it for a closing reply)

        def cut(fired: threading.Event = fired, held: list[socket.socket] = held) -> None:
            fired.set()
            for sock in held:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        watchdog = threading.Timer(left, cut)
        watchdog.daemon = True
        watchdog.start()
        try:
            try:
                conn.connect()  # within the deadline (the connection's timeout is what is left of it)
                held.append(conn.sock)
                if fired.is_set():
                    cut()
                path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                conn.request(method, path, body=data, headers=dict(headers))
                resp = conn.getresponse()
                status = resp.status
                if status in _REDIRECT_STATUS:
                    target = urljoin(url, resp.getheader("Location") or "")
                    if _origin(target) != origin:
                        raise _Failed(f"the endpoint redirected (HTTP {status}) to {redact_url(target)[:200]}, "
                                      "another server; ratchet does not follow it (the key would go there): set "
                                      "base_url to the server that answers", status, permanent=True)
                    if status not in (307, 308):
                        raise _Failed(f"the endpoint redirected (HTTP {status}) to {redact_url(target)[:200]}; "
                                      "set base_url to that address", status, permanent=True)
                    url = target
                    continue
                limit = max_bytes if 200 <= status < 300 else _ERROR_BODY_BYTES
                declared = resp.getheader("Content-Length")
                if 200 <= status < 300 and declared and declared.strip().isdigit() and int(declared) > limit:
                    raise _Failed(f"the endpoint's reply is {int(declared):,} bytes, more than the {limit:,} "
                                  "bytes allowed (max_response_bytes; by default from max_tokens)", status)
                chunks, size = [], 0
                while size <= limit:
                    held[0].settimeout(max(0.001, deadline - time.monotonic()))
                    chunk = resp.read1(65_536)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    size += len(chunk)
                if fired.is_set():
                    raise _Failed("no complete reply within the request's deadline", retry=True, timed_out=True)
                body = b"".join(chunks)
                if 200 <= status < 300:
                    if size > limit:
                        raise _Failed(f"the endpoint's reply is over the {limit:,} bytes allowed "
                                      "(max_response_bytes; by default from max_tokens); refused", status)
                    return body
                message = _server_message(body[:limit])
                error = f"HTTP {status} {resp.reason}" + (f": {message}" if message else "")
                after = resp.getheader("Retry-After")
                wait = min(60.0, float(after)) if after and after.strip().replace(".", "", 1).isdigit() else None
                raise _Failed(error, status, message or None, retry=status in _RETRY_STATUS,
                              permanent=status in _PERMANENT_STATUS, wait=wait)
            except _Failed:
                raise
            except TimeoutError:
                raise _Failed("no complete reply within the request's deadline", retry=True, timed_out=True) from None
            except ConnectionRefusedError:
                raise _Failed(f"cannot reach {redact_url(url)}: connection refused (is the server running?)",
                              retry=True) from None
            except (OSError, http.client.HTTPException) as exc:
                if fired.is_set():
                    raise _Failed("no complete reply within the request's deadline", retry=True,
                                  timed_out=True) from None
                what = " ".join(str(exc).split())[:200] or type(exc).__name__
                raise _Failed(f"connection to {redact_url(url)} failed: {what}", retry=True) from None
        finally:
            watchdog.cancel()
            conn.close()
    raise _Failed("the endpoint redirected more than 3 times; set base_url to where it ends", permanent=True)


def _post(url: str, request: Mapping[str, Any], key: str | None, timeout_s: float, retries: int,
          backoff_s: float, sleep: Callable[[float], None] = time.sleep, max_bytes: int = MAX_RESPONSE_BYTES,
          max_attempts: int | None = None) -> tuple[str | None, dict[str, Any]]:
    """POST a chat-completions request, retrying on 429, 5xx, timeouts and refused connections, all within
    one deadline: ``timeout_s`` seconds from now, waits between retries included.

    Args:
        url: The chat-completions URL.
        request: The JSON body.
        key: The API key (sent as a Bearer token, to ``url``'s origin only), or None.
        timeout_s: Seconds the whole call may take.
        retries: Most retries; ``max_attempts`` caps the attempts too (a request budget's rest).
        backoff_s: The first retry's wait (seconds), doubling each retry; a ``Retry-After`` header up to
            60 s replaces it. A wait that would pass the deadline is not made.
        sleep: Waits (tests pass a fake).
        max_bytes: Largest reply body read (bytes); a longer one is refused.
        max_attempts: Most HTTP attempts.

    Returns:
        ``(body or None, info)``: ``info`` holds ``status``, ``attempts``, ``seconds``, ``error`` (one line;
        None on success), ``message`` (the server's message), ``permanent`` (no retry can fix it: a refused key,
        no such model or route, a redirect elsewhere) and ``timed_out``. Never raises for network or HTTP
        trouble; neither the body nor any message contains ``key``.
    """
    data = json.dumps(request).encode("utf-8")
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    most = retries + 1 if max_attempts is None else max(1, min(retries + 1, max_attempts))
    failure = _Failed("no attempt made")
    attempt = 0
    for attempt in range(1, most + 1):
        try:
            body = _attempt(url, "POST", data, headers, deadline, max_bytes)
            return _scrub(body.decode("utf-8", errors="replace"), key), {
                "status": 200, "attempts": attempt, "seconds": time.monotonic() - t0, "error": None,
                "message": None, "permanent": False, "timed_out": False}
        except _Failed as exc:
            failure = exc
        if not failure.retry or attempt == most:
            break
        wait = backoff_s * 2 ** (attempt - 1) if failure.wait is None else failure.wait
        if time.monotonic() + wait >= deadline:
            break
        sleep(wait)
    error = failure.error
    if failure.timed_out:
        error = f"timed out: no complete reply within timeout_s = {timeout_s:g} s"
    if attempt > 1:
        error += f" ({attempt} attempts)"
    return None, {"status": failure.status, "attempts": attempt, "seconds": time.monotonic() - t0,
                  "error": _scrub(error, key), "message": _scrub(failure.message, key) if failure.message else None,
                  "permanent": failure.permanent, "timed_out": failure.timed_out}


def models_url(base_url: str) -> str:
    """``base_url``'s model list (``.../models``; ``/chat/completions`` taken off where given)."""
    u = base_url.rstrip("/")
    return u.removesuffix("/chat/completions") + "/models"


def _api_key(settings: ModelSettings | LLMSettings, name: str, then: str = "") -> str | None:
    """The key from ``api_key_env``.

    Args:
        then: What to do once it is exported, ending the error's message (``" and run again"``); empty in a
            running run, whose loop adds the run to resume.

    Raises:
        ApiKeyNotSetError: ``api_key_env`` names a variable that is not set.
    """
    if not settings.api_key_env:
        return None
    key = os.environ.get(settings.api_key_env)
    if not key:  # a setup problem, not an outcome: nothing is recorded, the run stops and can resume
        raise ApiKeyNotSetError(f"[[refiners]] {name}: environment variable {settings.api_key_env} (api_key_env) "
                                f"is not set; export it{then}")
    return key


def check_endpoint(settings: LLMSettings, name: str = "llm") -> None:
    """Look at the endpoint before a run spends anything: ``GET base_url/models`` (within ``timeout_s``,
    at most 30 s), for each model of the pool. A server without that route (404, 405, 501) passes; so does any
    other reply but those below.

    Raises:
        ApiKeyNotSetError: ``api_key_env`` names a variable that is not set.
        EndpointError: the endpoint cannot be reached, refuses the key (401, 403), redirects to another
            server, or lists models and ``model`` is not one of them (``name:latest`` counts as ``name``).
    """
    for m in settings.pool:
        _check_model(m, min(30.0, settings.timeout_s), name)


def _check_model(settings: ModelSettings, timeout_s: float, name: str) -> None:
    """:func:`check_endpoint` for one model of the pool."""
    key = _api_key(settings, name, " and run again (`ratchet run …`): no run was started")
    headers = {"Accept": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    where = f"[[refiners]] {name}"
    try:
        body = _attempt(models_url(settings.base_url), "GET", None, headers,
                        time.monotonic() + timeout_s, 4 * 2**20)
    except _Failed as exc:
        if exc.status in (404, 405, 501) or (exc.status is not None and exc.status not in (401, 403)
                                             and not exc.permanent):
            return  # no model list here (or a passing hiccup): the run's own requests will tell
        url = redact_url(models_url(settings.base_url))
        at = "" if url in exc.error else f" (at {url})"  # "cannot reach URL: ..." names it already
        raise EndpointError(_scrub(f"{where}: {exc.error}{at}; {fix_for(exc.status, settings, exc.timed_out)}; then "
                                   "run again (`ratchet run …`): no run was started", key)) from None
    try:
        listed = [m["id"] for m in json.loads(body)["data"] if isinstance(m, dict) and isinstance(m.get("id"), str)]
    except (ValueError, KeyError, TypeError):
        return  # not OpenAI's list format: nothing to compare with
    if listed and settings.model not in listed and f"{settings.model}:latest" not in listed:
        shown = ", ".join(repr(m[:80]) for m in listed[:10]) + (f" and {len(listed) - 10} more" if len(listed) > 10
                                                               else "")
        raise EndpointError(_scrub(f"{where}: the endpoint does not list model {settings.model!r} (it lists "
                                   f"{shown}); set model to one of them, pull it (e.g. `ollama pull "
                                   f"{settings.model}`), or set check_endpoint = false if the server serves names "
                                   "it does not list", key))


def fix_for(status: int | None, settings: ModelSettings, timed_out: bool = False) -> str:
    """What to do about an endpoint failure, one clause (for messages)."""
    if status in (401, 403):
        return (f"check the key in ${settings.api_key_env} (api_key_env)" if settings.api_key_env
                else "the endpoint wants a key: put it in an environment variable and name it in api_key_env")
    if status == 404:
        return f"check model ({settings.model!r}) and base_url ({redact_url(settings.base_url)[:120]})"
    if status is not None and status in _REDIRECT_STATUS:
        return "set base_url to the server that answers"
    if timed_out:
        return "is the server overloaded? raise timeout_s, or check base_url"
    if status is None:
        return f"start the server or fix base_url ({redact_url(settings.base_url)[:120]})"
    return "see the server's message"


def _token_count(x: Any) -> int | None:
    """A reply's token count when it is one: an int (not a bool) from 0 to :data:`_MAX_REPLY_TOKENS`, else None."""
    return x if isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= _MAX_REPLY_TOKENS else None


def _content_and_usage(body: str, request: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The answer's text and token counts from a chat-completions response body.

    The counts are the reply's ``usage`` when both are counts (:func:`_token_count`; a missing
    ``completion_tokens`` counts 0); otherwise (none, a string, ``1e400``, a negative or absurd number) they are
    estimated from the characters, one token per 4, and ``tokens_estimated`` is True.

    Raises:
        EditError: the body is not a chat-completions response.
    """
    try:
        reply = json.loads(body)
        content = reply["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        raise EditError(f"the endpoint's reply is not a chat completion: {body[:200]!r}") from None
    if not isinstance(content, str):
        raise EditError("the endpoint's reply has no text content")
    usage = reply.get("usage") if isinstance(reply, dict) else None
    if isinstance(usage, dict):
        prompt, completion = _token_count(usage.get("prompt_tokens")), _token_count(usage.get("completion_tokens") or 0)
        if prompt is not None and completion is not None:
            return content, {"prompt_tokens": prompt, "completion_tokens": completion, "tokens_estimated": False}
    prompt_chars = sum(len(m.get("content", "")) for m in request.get("messages", []))
    return content, {"prompt_tokens": prompt_chars // 4 + 1, "completion_tokens": len(content) // 4 + 1,
                     "tokens_estimated": True}


# -- the refiner -----------------------------------------------------------------------------------------

def _direct(key: str, request: Mapping[str, Any], call: Callable[[], tuple[str | None, dict[str, Any]]]
            ) -> tuple[str | None, dict[str, Any]]:
    """Exchange without a ledger (a refiner used outside a run): call every time."""
    return call()


def _each_at_once(exchange: Callable[[str, Mapping[str, Any], Callable[[], Reply]], Reply],
                  items: Sequence[tuple[str, Mapping[str, Any], Callable[[], Reply]]]) -> list[Future[Reply]]:
    """``exchange_all`` from a one-at-a-time ``exchange`` (a refiner given no run's service): every item's
    ``exchange`` in its own thread at once; one done future per item, in the order given."""
    done = dict(as_they_finish([functools.partial(exchange, *item) for item in items]))
    return [done[i] for i in range(len(items))]


def _ahead_in_threads(exchange: Callable[[str, Mapping[str, Any], Callable[[], Reply]], Reply],
                      items: Sequence[tuple[str, Mapping[str, Any], Callable[[], Reply]]]) -> list[Sent]:
    """``exchange_ahead`` from a one-at-a-time ``exchange`` (a refiner given no run's service): every item's
    ``exchange`` in its own thread, not waited for; one :class:`Sent` per item, in the order given."""
    out = []
    for item in items:
        reply: Future[Reply] = Future()

        def run(item: tuple[str, Mapping[str, Any], Callable[[], Reply]] = item, reply: Future[Reply] = reply) -> None:
            try:
                reply.set_result(exchange(*item))
            except BaseException as exc:  # noqa: BLE001 - raised where the reply is taken
                reply.set_exception(exc)

        threading.Thread(target=run, daemon=True, name="ratchet-ahead").start()
        out.append(Sent(reply))
    return out


@dataclass
class _Spent:
    """What the refiner's requests used: ``requests`` counts HTTP attempts (retries included); ``failures``
    the failed requests in a row; ``down`` why the endpoint stopped the refiner (None while it works)."""

    tokens: int = 0
    requests: int = 0
    cost: float = 0.0
    calls: list[str] = field(default_factory=list)
    failures: int = 0
    failed: int = 0
    down: str | None = None
    prompt_bound: int = 0  # of the last request built: the most tokens its prompt can take
    held_requests: int = 0  # reserved for the requests in flight: one attempt each,
    held_tokens: int = 0  # their prompts' bounds and max_tokens,
    held_cost: float = 0.0  # and the price of those


@dataclass(frozen=True)
class _Request:
    """A request built for a wave: the program it edits (``parent``, its source with its values written in as
    ``base``), the JSON body, and its ledger key."""

    parent: Candidate
    base: str
    request: dict[str, Any]
    key: str
    arm: int = 0  # the model of the pool it goes to
    follow_up: bool = False  # it asks again about an unusable answer (never followed up itself)
    repair: bool = False  # it asks to fix the error its program (``parent``, a failed edit) raised


@dataclass
class _Ahead:
    """A wave sent ahead by :meth:`LLMRefiner.prepare`: its requests (in the order built) and their replies, the
    generation's ``proposals`` slots it used, and what it holds in the budgets while out (HTTP attempts: the caps
    its requests were given; tokens; money)."""

    requests: list[_Request]
    sent: list[Sent]
    slots: int
    held: tuple[int, int, float]
    due: int = 0  # with a number ``lag``: the generation that takes it (the one it was sent in, plus ``lag``)

    def arrived(self) -> bool:
        """Whether every answer of the wave is in (taking them will not wait): timing's, never recorded here."""
        return all(x.done() for x in self.sent)


class ModelBandit:
    """Which model of a pool gets the next request: UCB1 (Auer, Cesa-Bianchi and Fischer, "Finite-time Analysis of
    the Multiarmed Bandit Problem", Machine Learning 47, 2002) on each model's training gain per unit of money, the
    asymmetric form of ShinkaEvolve's ``AsymmetricUCB`` (SakanaAI/ShinkaEvolve, ``shinka/llm/prioritization.py``:
    a request's reward is its improvement over the program it edited, floored at 0, so a failed or worse edit
    counts 0 and never below).

    A request's gain is the best paired training gain of its candidates over the incumbent on the same seeds
    (:func:`~ratchet.refiners.archive.offer_generation`; return units), floored at 0; an answer that gave no
    candidate (unusable, failed checks, an endpoint failure) gains 0. A model's efficiency is its mean gain per
    request over its mean cost per answered request (money; with no price in the pool, per request), divided by
    the best model's so the best is 1. Its score is that plus ``explore`` × √(2 ln N / n), where n counts the
    requests sent to it (those in flight included, as ShinkaEvolve counts submitted ones) and N all of them; a
    model never asked comes first, in the pool's order; ties go to the earlier model. No random draw: everything
    it reads comes from answers and evaluations the ledger records, so a resumed run picks the same models.
    """

    def __init__(self, arms: int, explore: float, priced: bool) -> None:
        self.explore, self.priced = explore, priced
        self.sent = [0] * arms  # requests sent (follow-ups are part of theirs)
        self.scored = [0] * arms  # requests whose outcome is known
        self.gain = [0.0] * arms  # sum of their gains (return units, each at least 0)
        self.cost = [0.0] * arms  # money their answers cost
        self.paid = [0] * arms  # answered requests

    def scores(self) -> list[float]:
        """Each model's UCB score (``inf`` for one never asked)."""
        n = len(self.sent)
        mean = [self.gain[i] / self.scored[i] if self.scored[i] else 0.0 for i in range(n)]
        eff = [mean[i] / max(self.cost[i] / self.paid[i] if self.paid[i] else 0.0, 1e-12) if self.priced else mean[i]
               for i in range(n)]
        best = max(eff)
        total = max(2, sum(self.sent))
        return [float("inf") if not self.sent[i] else
                (eff[i] / best if best > 0 else 0.0) + self.explore * float(np.sqrt(2 * np.log(total) / self.sent[i]))
                for i in range(n)]

    def ranked(self) -> list[int]:
        """The models, best score first (ties: the pool's order)."""
        sc = self.scores()
        return sorted(range(len(sc)), key=lambda i: (-sc[i], i))

    def stand_ins(self) -> list[int]:
        """The models a request may go to, in the order tried: the best-ranked, then those after it that have gained
        at least once or have no outcome yet (a model whose edits never paid is no stand-in for one a budget or its
        ``concurrency`` leaves no room for: it would spend the rest of the money on nothing)."""
        first, *rest = self.ranked()
        return [first, *(i for i in rest if self.gain[i] > 0 or not self.scored[i])]


class _OutOfTime(Exception):
    """The run's wall-clock budget ran out before or during a request (nothing is recorded)."""


def prompt_bound(request: Mapping[str, Any]) -> int:
    """Most tokens a request's prompt can take: one per byte of its messages (a token of a byte-level
    tokenizer holds at least one byte), plus 16 per message and 16 for the chat template."""
    messages = request.get("messages", [])
    return 16 + sum(16 + len(str(m.get("content", "")).encode("utf-8")) for m in messages)


class LLMRefiner(Refiner):
    """Edits the parent's code with a language model (see the module doc).

    Args:
        settings: :class:`LLMSettings`.
        task: Task facts for the prompt (see :func:`build_prompt`).
        exchange: The run's recorded-call service (:class:`~ratchet.refiners.registry.RefinerContext`
            ``exchange``); None calls the endpoint directly every time.
        dims: The task's sizes for array shapes written as ``"obs"``/``"act"``.
        name: The arm name recorded as its candidates' ``refiner``.
        sleep: Waits between retries (tests pass a fake).
        time_left: Seconds of the run's wall-clock budget left (None: no such budget): no request's
            deadline goes past it (:class:`~ratchet.refiners.registry.RefinerContext` ``time_left``).
        exchange_all: The run's service for several requests at once (``RefinerContext.exchange_all``); None
            runs ``exchange`` for each request of a wave in a thread of its own.
        exchange_ahead: The run's service for requests sent without waiting (``RefinerContext.exchange_ahead``,
            used with ``ahead``); None runs ``exchange`` for each in a thread of its own.
    """

    def __init__(self, settings: LLMSettings, task: Mapping[str, Any], exchange: Callable[..., Any] | None = None,
                 dims: Mapping[str, int] | None = None, name: str = "llm",
                 sleep: Callable[[float], None] = time.sleep,
                 time_left: Callable[[], float | None] | None = None,
                 exchange_all: Callable[..., list[Future[Reply]]] | None = None,
                 exchange_ahead: Callable[..., list[Sent]] | None = None) -> None:
        self.settings, self.task, self.dims, self.name = settings, dict(task), dims, name
        self.exchange = exchange or _direct
        self.exchange_all = exchange_all or functools.partial(_each_at_once, self.exchange)
        self.exchange_ahead = exchange_ahead or functools.partial(_ahead_in_threads, self.exchange)
        self._ahead: list[_Ahead] = []  # waves sent ahead (``ahead``), oldest first
        self._prepared = 0  # calls of :meth:`prepare`: one per generation of the run (any refiner's)
        self.sleep = sleep
        self.time_left = time_left
        self.spent = _Spent()
        self.history: list[Attempt] = []
        self._pending: list[Attempt] = []
        self._rejections: list[Rejection] = []
        self._generation = 0
        self.archive = settings.new_archive()
        self._incumbent: Candidate | None = None
        self._proposed: list[Candidate] = []
        #: The run's critique service (RefinerContext.critique), or None: then only the incumbent has a critique.
        self.critique_of: Callable[..., Critique | None] | None = None
        #: The system message (:data:`SYSTEM_PROMPT`, ``system_prompt``, or the text of ``system_prompt_file``).
        self.system_prompt: str = settings.system_prompt or (EVALUATOR_SYSTEM_PROMPT if self.task.get("functions")
                                                             else SYSTEM_PROMPT)
        #: The functions a policy defines for the task, with their argument counts.
        self.functions: dict[str, int] = dict(self.task.get("functions") or {"act": 2})
        self._critiques: dict[str, Critique | None] = {}
        #: The models requests may go to (:attr:`LLMSettings.pool`) and the bandit choosing among them.
        self.pool = settings.pool
        self.bandit = ModelBandit(len(self.pool), settings.explore,
                                  priced=any(m.price_prompt or m.price_completion for m in self.pool))
        self._repairs: list[tuple[Candidate, str]] = []  # failed edits to send back with their error (``repair``)
        self._outcomes: list[tuple[int, tuple[str, ...]]] = []  # (model, candidate ids) of proposed edits, unscored
        #: The run's money budget (RefinerContext.money), shared with its other refiners that pay; None without one.
        self.money: Purse | None = None

    @property
    def population_size(self) -> int:
        """Candidates per generation: ``proposals × variants`` at most."""
        return self.settings.proposals * self.settings.variants

    def generation_cost(self) -> GenerationCost:
        """Up to ``proposals × variants`` candidates from ``proposals`` requests of up to ``1 + retries`` HTTP
        attempts each, each answer up to ``max_tokens`` tokens; no recommendation."""
        attempts = self.settings.proposals * (1 + self.settings.retries) * (1 if self.settings.on_unusable == "skip"
                                                                           else 2)
        return GenerationCost(proposals=self.population_size, requests=attempts,
                              tokens=attempts * self.settings.max_tokens)

    def _worst_price(self, arm: int) -> float:
        """The most the next request to model ``arm`` may cost (money): its prompt's bound and ``max_tokens``."""
        return self.pool[arm].price(self.spent.prompt_bound, self.settings.max_tokens)

    def _no_room(self, arm: int) -> str | None:
        """Why a request to model ``arm`` may not go out now (a budget has no room for its worst case beside the
        requests in flight), or None."""
        s, u = self.settings, self.spent
        flying = f", {u.held_requests} in flight" if u.held_requests else ""
        if s.budget_requests is not None and u.requests + u.held_requests >= s.budget_requests:
            return f"llm budget: {u.requests:,} of {s.budget_requests:,} requests made{flying} ({self.name})"
        most = u.prompt_bound + s.max_tokens
        if s.budget_tokens is not None and u.tokens + u.held_tokens + most > s.budget_tokens:
            return (f"llm budget: {u.tokens:,} of {s.budget_tokens:,} tokens used{flying}; the next request may take "
                    f"{most:,} (max_tokens {s.max_tokens:,} and its prompt) ({self.name})")
        price = self._worst_price(arm)
        if s.budget_cost is not None and u.cost + u.held_cost + price > s.budget_cost:
            return (f"llm budget: {u.cost:.4g} of {s.budget_cost:g} {s.currency} spent{flying}; the next request may "
                    f"cost {price:.4g} ({self.name})")
        if self.money is not None and not self.money.has_room(price):
            return (f"money budget: {self.money.text()}{flying}; the next request may cost {price:.4g} "
                    f"{self.money.currency} ({self.name})")
        return None

    def budget_spent(self) -> bool:
        """Whether a budget (not the endpoint) is why no further request may be made (:meth:`idle_reason`)."""
        return self.spent.down is None and self.idle_reason() is not None

    def idle_reason(self) -> str | None:
        """Why no further request may be made, or None: the endpoint stopped the refiner (a refused key, an
        unknown model, ``max_failures`` failed requests in a row), or a budget has no room for one more
        request's worst case (``budget_requests`` attempts; ``max_tokens`` of answer plus the most tokens
        the last prompt could take, in tokens and in money — ``budget_cost`` and the run's ``[budget] money`` —
        at the cheapest model of the pool a request may go to, :meth:`ModelBandit.stand_ins`), beside the worst case
        of the requests in flight. Waves sent ahead (``ahead``) whose answers no generation took yet make the
        refiner able to take one whatever the budgets say: those answers are already paid for."""
        if self._ahead and self.spent.down is None:
            return None
        return self._no_request()

    def _no_request(self) -> str | None:
        """Why no further request may be sent now (:meth:`idle_reason` without the waves sent ahead), or None."""
        if self.spent.down is not None:
            return self.spent.down
        cheapest = min(self.bandit.stand_ins(), key=self._worst_price)
        return self._no_room(cheapest)

    def _hold(self, r: _Request) -> None:
        """Reserve ``r``'s worst case (one attempt, its prompt's bound and ``max_tokens``, their price) while it is
        out."""
        u = self.spent
        u.prompt_bound = prompt_bound(r.request)
        _, tokens, price = self._held_by([r])
        u.held_requests += 1
        u.held_tokens += tokens
        u.held_cost += price
        if self.money is not None:
            self.money.held += price

    def _held_by(self, wave: Sequence[_Request]) -> tuple[int, int, float]:
        """What :meth:`_hold` reserves for ``wave``'s requests: (HTTP attempts, tokens, money)."""
        tokens = sum(prompt_bound(r.request) + self.settings.max_tokens for r in wave)
        price = sum(self.pool[r.arm].price(prompt_bound(r.request), self.settings.max_tokens) for r in wave)
        return len(wave), tokens, price

    def _release(self, held: tuple[int, int, float]) -> None:
        """Give back what a wave held in the budgets (its answers are in); with no wave left out, nothing is held."""
        u = self.spent
        if self.money is not None:
            self.money.held -= held[2] if self._ahead else u.held_cost
        if self._ahead:
            u.held_requests -= held[0]
            u.held_tokens -= held[1]
            u.held_cost -= held[2]
        else:
            u.held_requests, u.held_tokens, u.held_cost = 0, 0, 0.0

    def _reserved(self) -> int:
        """HTTP attempts the waves sent ahead may still use (their requests' caps)."""
        return sum(w.held[0] for w in self._ahead)

    def _call(self, request: Mapping[str, Any], attempts: int | None = None, arm: int = 0
              ) -> tuple[str | None, dict[str, Any]]:
        """One request to model ``arm`` of the pool within its deadline (``timeout_s``, cut to the run's wall clock
        left) and at most ``attempts`` HTTP attempts (None: ``1 + retries``; its share of the request budget's
        rest). Safe to run in several threads at once: it reads the settings and the clock, and writes nothing.

        Raises:
            ApiKeyNotSetError: ``api_key_env`` is not set.
            _OutOfTime: the run's wall clock ran out (the loop stops the run on it; nothing is recorded).
        """
        s, m = self.settings, self.pool[arm]
        key = _api_key(m, self.name)
        info: dict[str, Any] = {"refiner": self.name, "model": m.model}
        if len(self.pool) > 1:
            info["pool_index"] = arm
        left = self.time_left() if self.time_left is not None else None
        timeout = s.timeout_s if left is None else min(s.timeout_s, left)
        if timeout <= 0:
            raise _OutOfTime()
        body, got = _post(chat_completions_url(m.base_url), request, key, timeout, s.retries, s.backoff_s,
                          self.sleep, s.response_cap, attempts)
        if body is None and got["timed_out"] and timeout < s.timeout_s:
            raise _OutOfTime()
        info.update(got)
        if body is not None:
            try:
                reply = json.loads(body)
                reply["choices"][0]["message"]
            except (ValueError, KeyError, IndexError, TypeError):  # a proxy's page, a wrong route: not an answer
                return None, {**info, "error": f"HTTP {got['status']}, but the reply is not a chat completion: "
                                               f"{' '.join(body[:200].split())!r}"}
            try:
                _, usage = _content_and_usage(body, request)
            except EditError:
                usage = {"prompt_tokens": 0, "completion_tokens": 0, "tokens_estimated": True}
            info.update(usage, cost=m.price(usage["prompt_tokens"], usage["completion_tokens"]))
            if m.price_prompt or m.price_completion:
                info["currency"] = s.currency
        return body, info

    def _failed(self, record: Mapping[str, Any], arm: int = 0) -> None:
        """Count a failed request; stop the refiner (``spent.down``) at a permanent failure or after
        ``max_failures`` in a row."""
        s, u = self.settings, self.spent
        u.failures += 1
        u.failed += 1
        error, status = str(record.get("error") or "request failed"), record.get("status")
        permanent = bool(record.get("permanent")) or status in _PERMANENT_STATUS
        if (permanent or u.failures >= s.max_failures) and u.down is None:  # the first reason stays
            what = error if permanent else (f"{u.failures} requests in a row failed (max_failures; a request fails "
                                            f"once its retries are spent), the last: {error}")
            fix = fix_for(status, self.pool[arm], bool(record.get("timed_out")))
            u.down = f"llm endpoint ({self.name}): {what}" + ("" if fix in what else f"; {fix}")  # said once

    def propose(self, parent: Candidate, critique: Critique | None, rng: np.random.Generator) -> list[Candidate]:
        """Up to ``proposals`` edited programs of ``parent`` (fewer once a budget is spent), each with up to
        ``variants`` parameter settings; failed answers and edits are kept for :meth:`take_rejections`.

        The requests go out in waves of up to ``concurrency``, all of a wave at once (:meth:`_wave`); each wave's
        answers are read in the order its requests were built, whichever came first, so what is proposed depends
        only on the answers, never on their timing. (With ``concurrency = 1`` every request sees the edits before
        it in this generation's history; within a wave, the requests see the history as the wave starts.)

        With ``ahead``, the waves :meth:`prepare` sent come first: their answers are taken in the order their requests
        were built (waiting only for those not yet in) and used as a wave's are, as long as each wave fits in the
        generation's ``proposals``; fresh waves then go out for the proposals still missing.

        Raises:
            EndpointError: the endpoint stopped the refiner (``proposals`` holds what was proposed before).
        """
        s = self.settings
        self._generation += 1
        self._pending = []
        self._incumbent, self._proposed = parent, []
        self.archive.protect(parent.id)
        out: list[Candidate] = []
        todo = s.proposals
        while self._ahead and self._ahead[0].slots <= todo:
            w = self._ahead.pop(0)
            todo -= w.slots
            if w.requests and self._settle(w.requests, [x.take for x in w.sent], w.held, parent, rng, out):
                todo = 0  # the run's wall clock ran out
        while todo > 0:
            wave, tried, stop = self._wave(parent, critique, rng, min(s.concurrency, todo))
            todo -= tried
            if wave:
                stop = self._send(wave, parent, rng, out) or stop
            if stop:
                break
        self._proposed = list(out)
        return out

    def _wave(self, incumbent: Candidate, critique: Critique | None, rng: np.random.Generator, most: int,
              flying: Sequence[int] = ()) -> tuple[list[_Request], int, bool]:
        """Build up to ``most`` requests to send at once, each to the model the bandit ranks first among those with
        room (:class:`ModelBandit`; a model's ``concurrency`` caps its requests in one wave, beside ``flying``: the
        models of requests still out) and with its worst case
        (one HTTP attempt, its prompt's tokens and ``max_tokens``, their price at that model) reserved in the
        budgets before the next is built, so the wave never takes more than a budget has left.

        Returns:
            ``(requests, slots, stop)``: ``slots`` of the generation's ``proposals`` it used (a parent whose values
            cannot be written into its source uses one, recorded as a rejection, and sends nothing); ``stop``
            when no further request may go out this generation (the run's wall clock is spent, or a budget has no
            room even with nothing in flight).
        """
        s = self.settings
        wave: list[_Request] = []
        slots = 0
        for _ in range(most):
            left = self.time_left() if self.time_left is not None else None
            if left is not None and left <= 0:
                return wave, slots, True
            if self._no_request() is not None:
                return wave, slots, not wave
            # the program to edit: a failed edit to repair, the incumbent, or an elite of the archive; the prompt
            # holds its own critique
            failure = None
            if self._repairs:
                parent, failure = self._repairs.pop(0)
            else:
                parent = draw_parent(self.archive, incumbent, rng, s.incumbent_share)
            try:
                base = _baked(parent)
            except PolicyError as exc:  # its values cannot be written back as defaults: not a parent
                self._rejections.append(Rejection(self.name, parent.id, f"cannot write the parent's values into its "
                                                  f"source: {exc}", None, {}))
                slots += 1
                continue
            messages = build_prompt(self.task, base, self.critique_for(parent, incumbent, critique), self.history,
                                    s.hints, s.max_prompt_chars, s.history, system_prompt=self.system_prompt,
                                    trace_steps=s.trace_steps, failure=failure, kind=parent.kind)
            seed = int(rng.integers(2**31))
            self.spent.prompt_bound = prompt_bound({"messages": messages})
            in_wave = [*flying, *(r.arm for r in wave)]
            arm = next((i for i in self.bandit.stand_ins()
                        if in_wave.count(i) < (self.pool[i].concurrency or s.concurrency)
                        and self._no_room(i) is None), None)
            if arm is None:  # no model worth asking has room for this request's worst case beside those in flight
                return wave, slots, not wave
            request = {"model": self.pool[arm].model, "messages": messages, "temperature": s.temperature,
                       "max_tokens": s.max_tokens, "seed": seed}
            r = _Request(parent, base, request, self._key(request), arm, repair=failure is not None)
            wave.append(r)
            slots += 1
            self.bandit.sent[arm] += 1
            self._hold(r)
        return wave, slots, False

    def _key(self, request: Mapping[str, Any]) -> str:
        """A request's ledger key: the refiner's name and a digest of the request."""
        return self.name + "/" + hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()[:24]

    def _send(self, wave: list[_Request], incumbent: Candidate, rng: np.random.Generator, out: list[Candidate]
              ) -> bool:
        """Send a wave's requests at once (those a resumed run recorded are read back), then take their answers in
        the order the requests were built: each answer's edit is checked and proposed into ``out`` with its
        variants (drawn from ``rng``), or kept as a rejection. The wave's requests share what ``budget_requests``
        leaves for their attempts (retries included), split evenly. Unusable answers are then asked about once
        more (``on_unusable``), those follow-ups sent at once as a wave of their own where the budgets have room.

        Returns:
            Whether the run's wall clock ran out during the wave (no further request this generation).

        Raises:
            EndpointError: the endpoint stopped the refiner (every answer of the wave is taken first).
        """
        self._wait_for_room(len(wave))  # waves sent ahead and still out: never more than concurrency in flight
        replies = self.exchange_all([(r.key, r.request, functools.partial(self._call, r.request, cap, r.arm))
                                     for r, cap in zip(wave, self._caps(wave))])
        return self._settle(wave, [f.result for f in replies], self._held_by(wave), incumbent, rng, out)

    def _caps(self, wave: Sequence[_Request], most: int | None = None) -> list[int | None]:
        """Each of ``wave``'s requests' share of the HTTP attempts ``budget_requests`` leaves beside the waves sent
        ahead (split evenly; each at most ``most``); None each without that budget."""
        s, n = self.settings, len(wave)
        if s.budget_requests is None:
            return [None] * n
        rest = s.budget_requests - self.spent.requests - self._reserved()
        caps: list[int | None] = [rest // n + (j < rest % n) if most is None else min(rest // n + (j < rest % n), most)
                                  for j in range(n)]
        return caps

    def _settle(self, wave: list[_Request], replies: Sequence[Callable[[], Reply]], held: tuple[int, int, float],
                incumbent: Candidate, rng: np.random.Generator, out: list[Candidate]) -> bool:
        """A sent wave's answers (``replies``: each waits for its request's, in the order the requests were built),
        with what the wave held in the budgets (:meth:`_held_by`) given back first: see :meth:`_send`.

        Raises:
            EndpointError: the endpoint stopped the refiner (every answer of the wave is taken first).
        """
        u = self.spent
        self._release(held)
        out_of_time = False
        again: list[_Request] = []
        for r, reply in zip(wave, replies):
            try:
                body, record = reply()
            except _OutOfTime:
                out_of_time = True
                continue
            cost = float(record.get("cost") or 0.0)
            u.requests += max(1, int(record.get("attempts") or 1))
            u.tokens += int(record.get("prompt_tokens") or 0) + int(record.get("completion_tokens") or 0)
            u.cost += cost
            if self.money is not None:
                self.money.spent += cost
            u.calls.append(r.key)
            self.bandit.cost[r.arm] += cost
            if body is None:  # an endpoint failure: its llm_call event records it (no proposal was made)
                self.bandit.scored[r.arm] += 1
                self._failed(record, r.arm)
                continue
            self.bandit.paid[r.arm] += 1
            u.failures = 0
            follow = self._take(r, body, incumbent, rng, out)
            if follow is not None:
                again.append(follow)
        if u.down is not None:
            self._proposed = list(out)
            for r in again:
                self.bandit.scored[r.arm] += 1
            raise EndpointError(u.down, out)
        if again and not out_of_time:
            sent: list[_Request] = []
            for r in again:  # each follow-up only where the budgets have room for its worst case
                u.prompt_bound = prompt_bound(r.request)
                if self._no_room(r.arm) is None:
                    sent.append(r)
                    self._hold(r)
                else:
                    self.bandit.scored[r.arm] += 1
            if sent:
                out_of_time = self._send(sent, incumbent, rng, out)
        else:
            for r in again:
                self.bandit.scored[r.arm] += 1
        return out_of_time

    def prepare(self, parent: Candidate, critique: Critique | None, rng: np.random.Generator) -> None:
        """With ``ahead``: send one wave (up to ``concurrency`` requests, at most ``proposals``) without waiting, built
        as :meth:`propose` builds one from ``parent`` (the incumbent) and ``critique``, when fewer than ``ahead`` waves
        are out and a request may go out; the next :meth:`propose` takes its answers. Its requests hold their worst
        case in the budgets while out, their HTTP attempts capped at their share of what ``budget_requests`` leaves.
        Its prompts see the history as it stands now: this generation's edits are in it, their episodes' results not
        yet (one generation stale: the price of the overlap, as in ShinkaEvolve's asynchronous evaluation)."""
        s = self.settings
        self._prepared += 1
        room = s.concurrency - self._out()  # the waves out and this one together: never more than concurrency
        if not s.ahead or len(self._ahead) >= s.ahead or room <= 0 or self._no_request() is not None:
            return
        self._critiques = {}  # the programs' latest critiques (another refiner's generations may have run since)
        wave, slots, _ = self._wave(parent, critique, rng, min(room, s.proposals),
                                    flying=[r.arm for w in self._ahead for r in w.requests])
        if not slots:
            return
        caps = self._caps(wave, 1 + s.retries)
        held = self._held_by(wave)
        if s.budget_requests is not None:  # held: the attempts its requests may make, not one each
            self.spent.held_requests += sum(c or 0 for c in caps) - len(wave)
            held = (sum(c or 0 for c in caps), *held[1:])
        sent = self.exchange_ahead([(r.key, r.request, functools.partial(self._call, r.request, cap, r.arm))
                                    for r, cap in zip(wave, caps)]) if wave else []
        self._ahead.append(_Ahead(wave, sent, slots, held, self._prepared + s.lag if isinstance(s.lag, int) else 0))

    def _out(self) -> int:
        """Requests of the waves sent ahead that no generation took yet (answered or not)."""
        return sum(len(w.requests) for w in self._ahead)

    def _wait_for_room(self, n: int) -> None:
        """Wait until ``n`` more requests fit in ``concurrency`` beside the unanswered ones of the waves sent ahead
        (oldest first). Only when requests go out waits on this: what is sent never depends on it."""
        flying = [x for w in self._ahead for x in w.sent if not x.done()]
        for x in flying[:max(0, len(flying) + n - self.settings.concurrency)]:
            x.wait()

    def turn(self, generation: int) -> Turn:
        """With ``lag``: :attr:`~Turn.DUE` from the generation the oldest wave sent ahead is due at (the one it was sent
        in plus ``lag``), :attr:`~Turn.WAIT` before it, and :attr:`~Turn.WAIT` too with no wave out while a request may
        go out (this generation's :meth:`prepare` sends one, instead of the workers waiting for a fresh wave, as at
        the first generation); else :attr:`~Turn.FREE` (without ``lag``, once the endpoint stopped the refiner, or
        with no wave out and no request possible). With a number ``lag`` only generation numbers and the budgets
        decide, never the answers' timing; with ``lag = "auto"`` the oldest wave is :attr:`~Turn.DUE` once all its
        answers are in and :attr:`~Turn.WAIT` until then: timing's word, which the loop records with the generation's
        plan and replays on resume (:meth:`Refiner.turn`)."""
        lag = self.settings.lag
        if not lag or self.spent.down is not None:
            return Turn.FREE
        if not self._ahead:
            return Turn.WAIT if self._no_request() is None else Turn.FREE
        due = self._ahead[0].arrived() if lag == "auto" else generation >= self._ahead[0].due
        return Turn.DUE if due else Turn.WAIT

    def finish(self) -> dict[str, Any]:
        """The run ends: the answers of the waves sent ahead that no generation took are awaited and recorded (their
        requests were made and are paid for; they make no candidates) and counted in the budgets' spending.

        Returns:
            ``{"unused_requests": n, "note": ...}`` when there were any, else ``{}``.
        """
        u, n = self.spent, 0
        while self._ahead:
            w = self._ahead.pop(0)
            self._release(w.held)
            for r, x in zip(w.requests, w.sent):
                try:
                    _, record = x.take()
                except Exception:  # noqa: BLE001, S112 - out of time, or no key: nothing was recorded
                    continue
                n += 1
                cost = float(record.get("cost") or 0.0)
                u.requests += max(1, int(record.get("attempts") or 1))
                u.tokens += int(record.get("prompt_tokens") or 0) + int(record.get("completion_tokens") or 0)
                u.cost += cost
                if self.money is not None:
                    self.money.spent += cost
                u.calls.append(r.key)
        if not n:
            return {}
        return {"unused_requests": n, "note": f"{n} requests sent ahead (ahead) were answered after the last "
                                              "generation took its proposals: recorded and paid for, no candidates"}

    def _follow_up(self, r: _Request, content: str, error: str) -> _Request:
        """The request that asks ``r``'s model once more about its unusable answer ``content``: the same messages,
        the answer, and a user message quoting why it could not be used and asking for the edit again
        (``on_unusable = "retry"``) or for the whole file (``"rewrite"``)."""
        if r.parent.kind in FOLDER_KINDS:
            ask = ("Answer with each file you change whole, in a block whose info string names it (```cpp "
                   "path=main.cpp; no SEARCH/REPLACE blocks), keeping the idea of your edit."
                   if self.settings.on_unusable == "rewrite" else
                   "Answer again: put the file's path on the line before each SEARCH block and copy each SEARCH text "
                   "exactly from that file as quoted above (or give whole files in ```lang path=FILE blocks).")
        elif self.settings.on_unusable == "rewrite":
            ask = ("Answer with the whole new policy file in one ```python block (no SEARCH/REPLACE blocks), "
                   "keeping the idea of your edit.")
        else:
            ask = ("Answer again: copy each SEARCH text exactly from the current policy quoted above (or give the "
                   "whole new file in one ```python block).")
        messages = [*r.request["messages"], {"role": "assistant", "content": content[:8_000]},
                    {"role": "user", "content": f"Your answer could not be used: {error}\n{ask}"}]
        request = {**r.request, "messages": messages}
        return _Request(r.parent, r.base, request, self._key(request), r.arm, follow_up=True, repair=r.repair)

    def _take(self, r: _Request, body: str, incumbent: Candidate, rng: np.random.Generator,
              out: list[Candidate]) -> _Request | None:
        """One answer: its edit applied to ``r``'s program and checked, then proposed with ``variants`` parameter
        settings (new ones appended to ``out``; the same edit twice runs once), or recorded as a rejection; the
        history notes it either way.

        Returns:
            The follow-up request to send when the answer is unusable (no edit, or one that does not apply) and
            ``on_unusable`` asks again (a follow-up's own answer is final); else None.
        """
        s, parent, base = self.settings, r.parent, r.base
        detail = {"llm_call": f"llm/{r.key}"}
        new = None
        content = ""
        try:
            content, _ = _content_and_usage(body, r.request)
            if parent.kind in FOLDER_KINDS:
                new = _edit_folder(base, content)
                if new == base:
                    raise EditError("the edit leaves the program unchanged")
                try:
                    program = program_of(new)
                except PolicyError as exc:  # an answer whose regions cannot be read is unusable: asked again
                    raise EditError(f"the edited folder's marked regions cannot be read: {exc}") from None
            else:
                edits = parse_answer(content, tuple(self.functions))
                new = edits if isinstance(edits, str) else apply_edits(base, edits)
                if new == base:
                    raise EditError("the edit leaves the policy unchanged")
                program = check_source(new, dims=self.dims, functions=self.functions)
        except (EditError, PolicyError) as exc:
            what = "failed checks" if isinstance(exc, PolicyError) else "unusable answer"
            again = isinstance(exc, EditError) and content and not r.follow_up and s.on_unusable != "skip"
            self._rejections.append(Rejection(self.name, parent.id, f"{what}: {exc}"
                                              + (f" (asked again: {s.on_unusable})" if again else ""), new, detail))
            summary = (f"(a {len(new):,}-character program)" if new and len(new) > MAX_SOURCE_CHARS
                       else _diff(parent, base, new) if new else f"(answer) {content_head(body)}")
            self.history.append(Attempt(summary, f"{what}: {exc}", generation=self._generation))
            if again:
                return self._follow_up(r, content, str(exc))
            self.bandit.scored[r.arm] += 1
            return None
        fresh = [p.name for p in program.parameters if p.name not in parent.params]
        ids = []
        for values in param_variants(program, rng, s.variants, fresh, s.sigma):
            cand = Candidate.create(new, values, parent_id=parent.id, refiner=self.name, kind=parent.kind)
            if cand.id not in ids:
                ids.append(cand.id)
                if all(c.id != cand.id for c in out) and cand.id != incumbent.id:  # the same edit twice runs once
                    out.append(cand)
        attempt = Attempt(_diff(parent, base, new), "proposed", tuple(ids), generation=self._generation,
                          repair=r.repair)
        self.history.append(attempt)
        self._pending.append(attempt)
        self._outcomes.append((r.arm, tuple(ids)))
        return None

    def critique_for(self, parent: Candidate, incumbent: Candidate, critique: Critique | None) -> Critique | None:
        """The critique of the program a request edits: its own, from the run's critique service (its latest
        training episodes, with traces of its worst ones; once per generation and parent), else the loop's
        ``critique`` when it is the incumbent, else None."""
        if self.critique_of is not None:
            key = f"{self._generation}/{parent.id}"
            if key not in self._critiques:
                self._critiques = {k: v for k, v in self._critiques.items() if k.startswith(f"{self._generation}/")}
                self._critiques[key] = self.critique_of(parent.id, traces=self.settings.trace_episodes,
                                                        last_steps=self.settings.trace_steps)
            if self._critiques[key] is not None:
                return self._critiques[key]
        return critique if parent.id == incumbent.id else None

    def take_rejections(self) -> list[Rejection]:
        """Failed proposals since the last call (the loop records them)."""
        out, self._rejections = self._rejections, []
        return out

    def observe(self, evaluations: Sequence[Evaluation]) -> None:
        """Note each pending edit's best training mean (over its variants; errored ones count as failures), offer
        the edited programs to the archive, scored against the incumbent on the same seeds
        (:func:`~ratchet.refiners.archive.offer_generation`), and give each edit's gain over the incumbent to the
        bandit that picks the models (:class:`ModelBandit`). With ``repair``, an edited program (not itself a
        repair) whose every variant failed on an error raised at a line of its code (:func:`repair_note`) is queued
        to be sent back, with that error, in the next generation's first requests."""
        gains: dict[str, float] = {}
        if self._incumbent is not None:
            gains = offer_generation(self.archive, self._incumbent, self._proposed, evaluations, self._generation,
                                     self.task.get("step_limit"))
        for arm, ids in self._outcomes:  # each edit's gain for the bandit: its best variant's, at least 0
            self.bandit.scored[arm] += 1
            self.bandit.gain[arm] += max([0.0, *(gains[i] for i in ids if i in gains)])
        self._outcomes = []
        by_id = {e.candidate_id: e for e in evaluations}
        repairs: list[tuple[Candidate, str]] = []
        for a in self._pending:
            evs = [by_id[i] for i in a.ids if i in by_id]
            clean = [e.mean for e in evs if not e.n_errors and np.isfinite(e.mean)]
            a.train_mean = max(clean) if clean else None
            if evs and not clean:
                errs = [ep.error for e in evs for ep in e.episodes if ep.error]
                a.verdict = f"every variant failed in its episodes (e.g. {errs[0][:120] if errs else 'error'})"
                failed = next((c for c in self._proposed if c.id == a.ids[0]), None)
                if self.settings.repair and not a.repair and failed is not None and errs:
                    failure = repair_note(failed.source, errs[0])
                    if failure is not None and len(repairs) < self.settings.proposals:
                        repairs.append((failed, failure))
        self._repairs = repairs

    def refused(self, reasons: Mapping[str, str]) -> None:
        """An edit whose every variant the loop refused before any episode (a duplicate of a candidate the run has
        already scored, say) keeps the first reason as its history entry's result: later prompts show it."""
        for a in self._pending:
            if a.ids and all(i in reasons for i in a.ids):
                a.verdict = f"refused before any episode ran: {reasons[a.ids[0]]}"

    def dropped(self, reasons: Mapping[str, str]) -> None:
        """An edit whose every variant the cascade dropped after its first training episodes keeps the first reason
        as its history entry's result: later prompts show it."""
        for a in self._pending:
            if a.ids and all(i in reasons for i in a.ids):
                a.verdict = f"dropped after its first training episodes: {reasons[a.ids[0]]}"

    def verdict(self, candidate_id: str | None, promoted: bool, note: str) -> None:
        """The gate's verdict on the generation's contender: each pending edit's history entry says what
        became of it."""
        for a in self._pending:
            if a.verdict != "proposed":
                continue
            train = f"training mean {a.train_mean:.2f}; " if a.train_mean is not None else ""
            if candidate_id in a.ids:
                a.verdict = train + ("PROMOTED: " if promoted else "not promoted: ") + note
            else:
                a.verdict = train + "not sent to the gate (another contender scored higher)"
        self._pending = []

    def recommend(self) -> Candidate | None:
        """None: an editor has no distribution mean to recommend."""
        return None


def _baked(parent: Candidate) -> str:
    """What an edit of ``parent`` starts from: its source with its values written in (a program's as its defaults,
    :func:`baked_source`; a source folder's into its marked regions, :func:`ratchet.policies.source.baked`)."""
    return baked(parent) if parent.kind in FOLDER_KINDS else baked_source(parent)


def _edit_folder(base: str, answer: str) -> str:
    """A source folder's document (``base``, its values written in) with an answer's edits applied to its files
    (:func:`parse_folder_answer`, :func:`apply_folder_answer`); the commands and limits as they were.

    Raises:
        EditError: an unusable answer (see those functions).
    """
    folder = Folder.from_source(base)
    files = apply_folder_answer(folder.files, parse_folder_answer(answer))
    return dataclasses.replace(folder, files=files).to_source()


def _diff(parent: Candidate, base: str, new: str) -> str:
    """What an edit changed, for the history: a diff of the files (``=== path ===`` headers) for a source folder,
    of the program's text otherwise."""
    if parent.kind in FOLDER_KINDS:
        return source_diff(files_text(Folder.from_source(base).files), files_text(Folder.from_source(new).files),
                           max_lines=30)
    return source_diff(base, new, max_lines=30)


def repair_note(source: str, error: str) -> str | None:
    """What a repair request quotes: an episode's ``error`` when it names the line of the program's code that raised it
    (``"policy raised ZeroDivisionError: division by zero (policy line 12)"``), followed by that line of ``source``;
    None for an error that names no line of the program (a timeout, a crash, the env's own)."""
    m = re.search(r"\(policy line (\d+)\)", error)
    lines = source.splitlines()
    if m is None or not 1 <= int(m.group(1)) <= len(lines):
        return None
    return f"{error[:400]}\nline {m.group(1)}: {lines[int(m.group(1)) - 1].strip()[:200]}"


def content_head(body: str, n: int = 200) -> str:
    """The start of an answer's text (or of the raw body), one line."""
    try:
        text = json.loads(body)["choices"][0]["message"]["content"]
    except Exception:  # noqa: BLE001 - an endpoint's body of any shape falls back to its raw text
        text = body
    return " ".join(str(text).split())[:n]


def task_facts(task: Any) -> tuple[dict[str, Any], dict[str, int]]:
    """What the prompt says about a task (env id, spaces, success threshold, time limit, its rewards and
    episode end in words, the observation's component names) and its sizes, from one environment made in
    the driver (no policy code runs)."""
    from ratchet.policy import space_dims

    if "act" not in task.functions:  # an evaluator task: no environment; its description names the functions
        return {"name": task.name, "description": task.describe(), "functions": dict(task.functions),
                "success_threshold": task.success_threshold, "success_rule": task.success_rule(),
                "step_limit": None}, {}
    env = task.make_env()
    try:
        facts = {"env_id": task.env_id, "observation_space": str(env.observation_space),
                 "action_space": str(env.action_space), "success_threshold": getattr(task, "success_threshold", None),
                 "step_limit": getattr(task, "step_limit", None)}
        dims = space_dims(env.observation_space, env.action_space)
        describe = getattr(task, "describe", None)
        if callable(describe) and describe(env):
            facts["description"] = describe(env)
        names = getattr(task, "observation_names", None)
        if callable(names) and dims.get("obs"):
            got = list(names(dims["obs"]))
            if got and not all(n == f"obs[{i}]" for i, n in enumerate(got)):  # only names that say something
                facts["observation_names"] = got
        return facts, dims
    finally:
        env.close()


def _build(settings: LLMSettings, name: str, ctx: Any) -> list[LLMRefiner]:
    from ratchet.errors import SpecError

    facts, dims = task_facts(ctx.task)
    refiner = LLMRefiner(settings, facts, getattr(ctx, "exchange", None), dims, name,
                         time_left=getattr(ctx, "time_left", None), exchange_all=getattr(ctx, "exchange_all", None),
                         exchange_ahead=getattr(ctx, "exchange_ahead", None))
    if ctx.start.kind in FOLDER_KINDS and settings.system_prompt is None:  # a folder of files in any language
        refiner.system_prompt = FOLDER_SYSTEM_PROMPT
    refiner.critique_of = getattr(ctx, "critique", None)
    refiner.money = getattr(ctx, "money", None)
    if refiner.money is not None and refiner.bandit.priced and refiner.money.currency != settings.currency:
        raise SpecError(f"[[refiners]] {name}: prices are in {settings.currency} (currency) but [budget] money is in "
                        f"{refiner.money.currency}; set currency = \"{refiner.money.currency}\" with prices in it")
    if settings.system_prompt_file is not None:
        read = getattr(ctx, "read_input", None)
        if read is None:
            raise SpecError(f"[[refiners]] {name}: this loop cannot read system_prompt_file "
                            f"{settings.system_prompt_file}")
        try:
            text = read(settings.system_prompt_file).decode("utf-8")
        except UnicodeDecodeError:
            raise SpecError(f"[[refiners]] {name}: system_prompt_file {settings.system_prompt_file} is not UTF-8 "
                            "text") from None
        if not text.strip() or len(text) > 20_000:
            raise SpecError(f"[[refiners]] {name}: system_prompt_file {settings.system_prompt_file} holds "
                            f"{len(text):,} characters; give 1 to 20,000")
        refiner.system_prompt = text
    return [refiner]


def _check(settings: LLMSettings, name: str) -> None:
    if settings.check_endpoint:
        check_endpoint(settings, name)


def _files(settings: LLMSettings) -> list[str]:
    return [settings.system_prompt_file] if settings.system_prompt_file else []


def _pays(settings: LLMSettings) -> bool:
    return any(m.price_prompt or m.price_completion for m in settings.pool)


def _kinds() -> dict[str, Any]:
    from ratchet.refiners.registry import RefinerKind

    return {"llm": RefinerKind(LLMSettings, ("program", "source"), _build,
                               hint="llm edits a program policy's source (or a source folder's files)", files=_files,
                               check=_check, changes_code=True, pays=_pays,
                               generation_size=lambda s: s.proposals * s.variants,
                               recorded_defaults={"concurrency": 1, "on_unusable": "skip", "repair": False})}  # before it, one request at a time


KINDS = _kinds()
