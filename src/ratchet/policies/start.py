"""A run's starting candidate for each policy kind (driver side: nothing here executes policy code or
unpickles anything)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ratchet.errors import PolicyError
from ratchet.ledger.artifacts import digest
from ratchet.npz import NpzError, check_zip
from ratchet.policy import FOLDER_KINDS, Candidate, PolicyProgram

__all__ = ["MAX_MODEL_BYTES", "read_mlp_weights", "read_sb3_zip", "read_vecnormalize", "start_candidate"]

#: Largest model file accepted as a starting policy, bytes.
MAX_MODEL_BYTES = 256 << 20


def _read_capped(p: Path, what: str, hint: str) -> bytes:
    """The bytes of ``p`` (at most :data:`MAX_MODEL_BYTES`); raises PolicyError naming ``what`` and ``hint``."""
    try:
        if p.stat().st_size > MAX_MODEL_BYTES:
            raise PolicyError(f"{p}: {p.stat().st_size:,} bytes is larger than {MAX_MODEL_BYTES:,}")
        with p.open("rb") as f:  # a bounded read: a device (/dev/zero) or a pipe has no size to check first
            data = f.read(MAX_MODEL_BYTES + 1)
        if len(data) > MAX_MODEL_BYTES:
            raise PolicyError(f"{p} is larger than {MAX_MODEL_BYTES:,} bytes")
        return data
    except OSError as exc:
        raise PolicyError(f"cannot read {what} {p}: {exc.strerror or exc}; {hint}") from None


def read_sb3_zip(path: str | Path) -> bytes:
    """The bytes of a Stable-Baselines3 ``.zip``, checked only as a zip archive with SB3's members
    (``data`` and ``policy.pth``); nothing in it is unpickled here.

    Raises:
        PolicyError: missing, too large, or not an SB3 model archive.
    """
    p = Path(path)
    data = _read_capped(p, "the model", "[policy] path names a Stable-Baselines3 .zip (model.save(...))")
    try:
        names = set(check_zip(data))  # any damage (a bad header, an unknown method or version) is an NpzError
    except NpzError as exc:
        raise PolicyError(f"{p}: {exc}; [policy] kind = \"sb3\" needs a file written by Stable-Baselines3's "
                          "model.save()") from None
    if not {"data", "policy.pth"} <= names:
        raise PolicyError(f"{p} is a zip archive but not a Stable-Baselines3 model (no 'data' and 'policy.pth')")
    return data


def read_vecnormalize(path: str | Path) -> bytes:
    """The bytes of a ``VecNormalize`` statistics file (``VecNormalize.save``: a pickle), checked only by its
    pickle protocol header; it is unpickled only in sandboxed workers and training jobs.

    Raises:
        PolicyError: missing, too large, or not a pickle.
    """
    p = Path(path)
    data = _read_capped(p, "the VecNormalize statistics", "[policy] normalization names the file "
                                                          "VecNormalize.save(...) wrote")
    if data[:1] != b"\x80":
        raise PolicyError(f"{p} is not a VecNormalize statistics file (a pickle written by VecNormalize.save)")
    return data


def read_mlp_weights(path: str | Path, spaces: tuple[Any, Any]) -> bytes:
    """The bytes of an ``mlp`` weights file (``.npz``, as ``ratchet export`` writes it), checked against the
    task's spaces: read with ``allow_pickle=False`` (:func:`ratchet.policies.mlp.load_weights`).

    Raises:
        PolicyError: missing, too large, not a weights file, or made for other spaces.
    """
    from ratchet.policies import mlp

    p = Path(path)
    data = _read_capped(p, "the weights", "[policy] path names an mlp .npz (`ratchet export` writes one)")
    try:
        net = mlp.load_weights(data)
    except PolicyError as exc:  # name the file and the way to get a good one, not a library's advice
        reason = str(exc).removeprefix("not an mlp weights artifact: ").split(". ")[0].splitlines()[0][:160]
        raise PolicyError(f"{p}: not an mlp .npz written by `ratchet export` ({reason}); export one with "
                          "`ratchet export RUN`") from None
    fresh = mlp.init_weights(*spaces, hidden=(1,))
    n_in, n_out = net.weights[0][0].shape[0], net.weights[-1][0].shape[1]
    want_in, want_out = fresh.weights[0][0].shape[0], fresh.weights[-1][0].shape[1]
    if (n_in, n_out, net.action) != (want_in, want_out, fresh.action):
        raise PolicyError(f"{p}: a network for {n_in} observation and {n_out} {net.action} action numbers; the task "
                          f"has {want_in} and {want_out} ({fresh.action})")
    return data


def _check_layers(policy: Any, net: Any) -> None:
    """Refuse ``hidden``/``activation`` set in ``[policy]`` that differ from the weights file's network (the
    file's network is what runs; settings it would silently override are a mistake)."""
    given: set[str] = getattr(policy, "model_fields_set", set())  # only what the spec set: the defaults are no claim
    wrong = []
    if "hidden" in given and [int(h) for h in policy.hidden] != list(net.hidden):
        wrong.append(f"hidden = {[int(h) for h in policy.hidden]}")
    if "activation" in given and policy.activation != net.activation:
        wrong.append(f"activation = {policy.activation!r}")
    if wrong:
        sizes = [net.weights[0][0].shape[0], *net.hidden, net.weights[-1][0].shape[1]]
        raise PolicyError(f"[policy] {', '.join(wrong)} does not match the network in {policy.path} "
                          f"({'-'.join(map(str, sizes))} layers, {net.activation}); the file's network is used as "
                          f"it is: remove hidden/activation from [policy] or make them match")


def start_candidate(policy: Any, base_dir: str | Path, spaces: tuple[Any, Any] | None, seed: int,
                    program: PolicyProgram | None) -> tuple[PolicyProgram, Candidate, dict[str, bytes]]:
    """The starting candidate for ``[policy]``.

    Args:
        policy: The spec's :class:`~ratchet.spec.PolicySpec`.
        base_dir: Folder the spec's paths are relative to.
        spaces: The task's (observation, action) spaces (needed for network kinds).
        seed: Seeds a fresh network's initial weights (the run seed).
        program: The loaded program (program and residual kinds; the folder of a source policy), else None.

    Returns:
        ``(program, candidate, artifacts)``: the program (an empty one for network kinds), the candidate,
        and its artifacts' bytes by digest (to put in the run's artifact store).

    Raises:
        PolicyError: the model or settings are unusable.
    """
    from ratchet.policies import mlp

    kind = policy.kind
    if kind == "program":
        assert program is not None
        return program, program.candidate(), {}
    if kind in FOLDER_KINDS:  # a folder: no artifacts, its document is the source
        assert program is not None
        return program, Candidate.create(program.source, program.defaults, kind=kind), {}
    if kind == "sb3":
        blobs = {"model": read_sb3_zip(Path(base_dir) / policy.path)}
        if getattr(policy, "normalization", None):
            blobs["vecnormalize"] = read_vecnormalize(Path(base_dir) / policy.normalization)
        cand = Candidate.create("", {}, kind="sb3", artifacts={role: digest(b) for role, b in blobs.items()})
        return PolicyProgram("", ()), cand, {digest(b): b for b in blobs.values()}
    assert spaces is not None
    if kind == "mlp" and str(policy.path).endswith(".npz"):
        data = read_mlp_weights(Path(base_dir) / policy.path, spaces)
        _check_layers(policy, mlp.load_weights(data))
        return PolicyProgram("", ()), Candidate.create("", {}, kind="mlp", artifacts={"weights": digest(data)}), \
            {digest(data): data}
    net = mlp.init_weights(*spaces, hidden=policy.hidden, activation=policy.activation, normalize=policy.normalize,
                           seed=seed, zero_output=kind == "residual").to_bytes()
    if kind == "mlp":
        return PolicyProgram("", ()), Candidate.create("", {}, kind="mlp", artifacts={"weights": digest(net)}), \
            {digest(net): net}
    assert program is not None
    cand = Candidate.create(program.source, program.defaults, kind="residual", artifacts={"correction": digest(net)})
    return program, cand, {digest(net): net}
