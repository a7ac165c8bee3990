"""``ratchet export``: a refined candidate written back in the form its policy came in.

One output path ``-o OUT`` names the main file; the others sit beside it with the same stem:

========== ============================================================================================
kind       files written
========== ============================================================================================
program    ``OUT`` (``.py``): the policy file, each parameter's default set to the refined value
           (:func:`ratchet.policy.export_source`; arrays one row per line, ints as integers, choices as
           their literals).
sb3        ``OUT`` (``.zip``): the Stable-Baselines3 model's bytes exactly as stored, so
           ``PPO.load(OUT)`` (or the algorithm it was saved by) opens it. The driver never unpickles it.
           A model with VecNormalize statistics also writes ``STEM_vecnormalize.pkl`` beside it (as stored;
           ``VecNormalize.load(path, venv)`` opens it).
mlp        ``STEM.npz``: the weights exactly as stored (NumPy ``.npz``, no pickles; the format of
           :mod:`ratchet.policies.mlp`), and ``STEM.py``: a standalone program that needs only NumPy:
           ``act(observation)`` gives the same deterministic action ratchet evaluated, and
           ``python STEM.py [SEED]`` flies one episode with Gymnasium. ``OUT`` may end in ``.py`` or ``.npz``.
residual   ``STEM.py``: the base program with the refined parameters (a plain ratchet policy file: the
           base alone); ``STEM_correction.npz``: the learned correction network; ``STEM_residual.py``: a
           standalone program (NumPy only) that loads both and acts as the residual policy did in ratchet.
source     ``OUT/``: the candidate's folder, every file as it came, the refined values written into the
           marked regions' literals (:func:`ratchet.policies.source.export_folder`); ``OUT`` is a folder.
========== ============================================================================================

Nothing here executes policy code or unpickles anything; the standalone programs run only when the
user runs them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ratchet.errors import PolicyError
from ratchet.policy import FOLDER_KINDS, Candidate, export_source
from ratchet.safefile import write_files

__all__ = ["export_candidate", "export_paths"]


def export_paths(candidate: Candidate, output: str | Path) -> list[Path]:
    """The files :func:`export_candidate` writes for ``candidate`` and ``-o output`` (the main one first).

    Raises:
        PolicyError: ``output``'s suffix does not fit the kind (an sb3 model must be written as ``.zip``).
    """
    out = Path(output)
    if candidate.kind == "program":
        return [out]
    if candidate.kind in FOLDER_KINDS:
        from ratchet.policies.source import Folder

        if out.exists() and not out.is_dir():
            raise PolicyError(f"a source policy is exported as a folder; {out} is a file (give -o a new folder)")
        return [out.joinpath(*rel.split("/")) for rel in sorted(Folder.from_source(candidate.source).files)]
    if candidate.kind == "sb3":
        if out.suffix.lower() != ".zip":
            raise PolicyError(f"an sb3 policy is exported as the model's .zip (PPO.load opens it); give -o "
                              f"{out.with_suffix('.zip').name}")
        if "vecnormalize" in candidate.artifacts:  # VecNormalize.load(path, venv) opens it
            return [out, out.with_name(out.stem + "_vecnormalize.pkl")]
        return [out]
    stem = out.with_suffix("") if out.suffix.lower() in (".py", ".npz") else out
    if candidate.kind == "mlp":
        return [stem.with_suffix(".py"), stem.with_suffix(".npz")]
    if candidate.kind == "residual":
        return [stem.with_suffix(".py"), stem.with_name(stem.name + "_correction.npz"),
                stem.with_name(stem.name + "_residual.py")]
    raise PolicyError(f"cannot export a policy of kind {candidate.kind!r}")


def export_candidate(candidate: Candidate, artifacts: Mapping[str, bytes], output: str | Path, *,
                     header: str | None = None, task: Mapping[str, Any] | None = None) -> list[Path]:
    """Write ``candidate`` in the form its policy came in (see the module doc for each kind).

    Args:
        candidate: The candidate to export.
        artifacts: Its artifacts' bytes by digest
            (:func:`ratchet.ledger.artifacts.candidate_artifacts`); unused for a plain program.
        output: The main file to write (its folder is made if missing).
        header: A comment for the top of each written program (e.g. the run and candidate).
        task: The run's task (:meth:`ratchet.task.GymTask.to_dict`), so a standalone program's
            ``python STEM.py`` demo makes the same environment.

    Returns:
        The files written, the main one first.

    Raises:
        PolicyError: the candidate cannot be exported (unknown kind, bad suffix, missing artifact bytes).
        OSError: a file cannot be written (a full disk); then none of them was written or changed
            (:func:`ratchet.safefile.write_files`), and no partial file is left.
    """
    paths = export_paths(candidate, output)

    def blob(role: str) -> bytes:
        name = candidate.artifacts.get(role)
        if name is None or name not in artifacts:
            raise PolicyError(f"candidate {candidate.id}: no bytes for its {role!r} artifact")
        return bytes(artifacts[name])

    files: dict[Path, bytes] = {}
    if candidate.kind == "program":
        files[paths[0]] = export_source(candidate.source, candidate.params, header=header).encode()
    elif candidate.kind in FOLDER_KINDS:  # files in any language: no header comment (its syntax is the file's)
        from ratchet.policies.source import export_folder

        return export_folder(candidate, output)
    elif candidate.kind == "sb3":
        files[paths[0]] = blob("model")
        if len(paths) > 1:
            files[paths[1]] = blob("vecnormalize")
    elif candidate.kind == "mlp":
        from ratchet.policies.mlp import describe

        py, npz = paths
        weights = blob("weights")
        files[npz] = weights
        files[py] = _mlp_program(header, describe(weights), npz.name, task).encode()
    else:  # residual
        from ratchet.policies.mlp import describe

        base, npz, runner = paths
        correction = blob("correction")
        note = (f"The base program of a residual policy; the learned correction is {npz.name} and "
                f"{runner.name} runs both.")
        files[base] = export_source(candidate.source, candidate.params,
                                    header="\n".join(h for h in (header, note) if h)).encode()
        files[npz] = correction
        files[runner] = _residual_program(header, describe(correction), base.name, npz.name, task).encode()
    write_files(files, mode=0o644)
    return paths


_NETWORK = '''
class Network:
    """A ratchet ``mlp`` weights file (.npz) evaluated with NumPy only, exactly as ratchet's workers do.

    Arrays: ``W0, b0, ..., Wk, bk`` (``W`` of shape (in, out)), ``obs_shift``/``obs_scale`` (the input is
    ``(observation - obs_shift) * obs_scale``), ``log_std`` (exploration noise of RL training; unused
    here) and ``meta`` (JSON as bytes: ``activation``, ``action``, a Box's ``low``/``high``).
    """

    def __init__(self, path):
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(arrays.pop("meta").tobytes().decode())
        n = sum(1 for k in arrays if k.startswith("W"))
        self.layers = [(arrays[f"W{i}"].astype(np.float64), arrays[f"b{i}"].astype(np.float64)) for i in range(n)]
        self.shift = arrays["obs_shift"].astype(np.float64)
        self.scale = arrays["obs_scale"].astype(np.float64)
        self.activation = meta["activation"]  # "tanh" or "relu" between hidden layers; the output is linear
        self.discrete = meta["action"] == "discrete"
        self.low = None if meta.get("low") is None else np.asarray(meta["low"], dtype=np.float64)
        self.high = None if meta.get("high") is None else np.asarray(meta["high"], dtype=np.float64)

    def output(self, observation):
        """The network's output for one observation, shape (out,)."""
        x = (np.asarray(observation, dtype=np.float64).ravel() - self.shift) * self.scale
        for i, (w, b) in enumerate(self.layers):
            x = x @ w + b
            if i < len(self.layers) - 1:
                x = np.tanh(x) if self.activation == "tanh" else np.maximum(x, 0.0)
        return x

    def act(self, observation):
        """Deterministic action: argmax (Discrete) or the output clipped to the bounds (Box, flattened)."""
        out = self.output(observation)
        if self.discrete:
            return int(np.argmax(out))
        return np.clip(out, self.low, self.high)
'''

_DEMO = '''

def _demo(seed=0):
    """One episode of the run's environment with Gymnasium; prints its return and length."""
    import random

    import gymnasium as gym

    kwargs = dict(ENV_KWARGS)
    if MAX_EPISODE_STEPS is not None:
        kwargs["max_episode_steps"] = MAX_EPISODE_STEPS
    env = gym.make(ENV_ID, **kwargs)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    policy = Policy()
    policy.reset(seed, env.observation_space, env.action_space)
    observation, _ = env.reset(seed=seed)
    total, steps, done = 0.0, 0, False
    while not done:
        action = policy.act(observation)
        if isinstance(env.action_space, gym.spaces.Box):
            action = np.asarray(action, dtype=np.float64).reshape(env.action_space.shape)
        observation, reward, terminated, truncated, _ = env.step(action)
        total, steps, done = total + float(reward), steps + 1, terminated or truncated
    env.close()
    print(f"{ENV_ID} seed {seed}: return {total!r} in {steps} steps")


if __name__ == "__main__":
    import sys

    _demo(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
'''


def _task_lines(task: Mapping[str, Any] | None) -> str:
    t = dict(task or {})
    kwargs = dict(sorted(json.loads(json.dumps(t.get("env_kwargs") or {})).items()))  # plain literals only
    return (f"ENV_ID = {t.get('env_id')!r}\nENV_KWARGS = {kwargs!r}\n"
            f"MAX_EPISODE_STEPS = {t.get('max_episode_steps')!r}\n\n")


def _doc(header: str | None, body: str) -> str:
    text = (header + "\n\n" if header else "") + body
    return '"""' + text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"') + '\n"""\n'


def _mlp_program(header: str | None, description: str, npz: str, task: Mapping[str, Any] | None) -> str:
    body = (f"A ratchet ``mlp`` policy: {description}.\nIts weights are {npz} beside this file (NumPy .npz, no "
            "pickles); this program needs\nonly NumPy (and Gymnasium for the demo):\n\n"
            f"    from {Path(npz).stem} import Policy\n"
            "    policy = Policy()\n"
            "    action = policy.act(observation)   # deterministic, as ratchet evaluated it\n\n"
            f"`python {Path(npz).stem}.py SEED` flies one episode and prints its return. To evaluate it with ratchet,\n"
            "use `ratchet evaluate --run RUN --candidate ID` (the ledger keeps the same weights).")
    return _doc(header, body) + f'''
import json
from pathlib import Path

import numpy as np

WEIGHTS = Path(__file__).with_name({npz!r})
{_task_lines(task)}{_NETWORK}

class Policy:
    """The exported policy: ``reset(seed, observation_space, action_space)`` (optional; the network is
    stateless) and ``act(observation)``."""

    def __init__(self, weights=WEIGHTS):
        self.network = Network(weights)

    def reset(self, seed=None, observation_space=None, action_space=None):
        pass

    def act(self, observation):
        return self.network.act(observation)
{_DEMO}'''


def _residual_program(header: str | None, description: str, base: str, npz: str,
                      task: Mapping[str, Any] | None) -> str:
    body = (f"A ratchet ``residual`` policy: the base program {base} (its PARAMETERS' defaults are the refined\n"
            f"values) plus a learned correction r in {npz}:\n{description}.\n"
            "For a Box action space the action is clip(base(o) + r(o), low, high); for a Discrete one the\n"
            "base's action scores 1, the others 0,\n"
            "r(o) is added and the best score wins; where r(o) is exactly zero the base's action is returned\n"
            "unchanged. This program needs only NumPy (and Gymnasium for the demo):\n\n"
            f"    from {Path(base).stem}_residual import Policy\n"
            "    policy = Policy()\n"
            "    policy.reset(seed, env.observation_space, env.action_space)   # before each episode\n"
            "    action = policy.act(observation)\n\n"
            f"`python {Path(base).stem}_residual.py SEED` flies one episode and prints its return. "
            f"`ratchet evaluate {base}`\nevaluates the base alone; `ratchet evaluate --run RUN --candidate ID` the "
            "residual policy.")
    return _doc(header, body) + f'''
import importlib.util
import json
from pathlib import Path

import numpy as np

BASE = Path(__file__).with_name({base!r})
CORRECTION = Path(__file__).with_name({npz!r})
{_task_lines(task)}{_NETWORK}

def _defaults(parameters):
    """The base program's parameter values, as ratchet passes them: floats, float64 arrays, ints and choices."""
    out = {{}}
    for name, spec in parameters.items():
        value = spec["default"] if isinstance(spec, dict) else spec[0]
        if isinstance(spec, dict) and spec.get("type") in ("int", "categorical"):
            out[name] = value
        else:
            out[name] = np.array(value, dtype=np.float64) if isinstance(value, (list, tuple)) else float(value)
    return out


class Policy:
    """The exported residual policy. Like ratchet, it runs the base program afresh for each episode
    (unless the base defines its own ``reset``) and gives it the spaces as ``OBSERVATION_SPACE`` and
    ``ACTION_SPACE``."""

    def __init__(self, base=BASE, correction=CORRECTION):
        self.base_path, self.correction, self.base = Path(base), Network(correction), None

    def _load_base(self):
        spec = importlib.util.spec_from_file_location("ratchet_exported_base", self.base_path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    def reset(self, seed=None, observation_space=None, action_space=None):
        if self.base is None or not hasattr(self.base, "reset"):
            self.base = self._load_base()
        self.params = _defaults(self.base.PARAMETERS)
        self.base.OBSERVATION_SPACE, self.base.ACTION_SPACE = observation_space, action_space
        if hasattr(self.base, "reset"):
            self.base.reset(self.params, seed)

    def act(self, observation):
        if self.base is None:
            self.reset()
        action = self.base.act(observation, self.params)
        r = self.correction.output(observation)
        if not r.any():
            return action
        if self.correction.discrete:
            scores = r.copy()
            scores[int(action)] += 1.0
            return int(np.argmax(scores))
        return np.clip(np.asarray(action, dtype=np.float64).ravel() + r, self.correction.low, self.correction.high)
{_DEMO}'''
