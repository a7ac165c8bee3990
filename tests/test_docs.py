"""The README's snippets are the real example files (docs must not drift from code)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.S)


def test_readme_policy_snippet_is_the_cartpole_example():
    policy = (ROOT / "examples/cartpole/policy.py").read_text()
    snippet = next(b for b in _blocks("python") if '"w_position"' in b)
    assert snippet.strip() in policy


def test_readme_spec_snippet_is_the_cartpole_example():
    spec = tomllib.loads((ROOT / "examples/cartpole/ratchet.toml").read_text())
    snippet = next(b for b in _blocks("toml") if 'name = "cartpole"' in b)
    assert tomllib.loads(snippet) == spec


def test_readme_spec_reference_is_a_valid_spec():
    from ratchet.spec import spec_from_dict

    snippet = next(b for b in _blocks("toml") if 'name = "lunar_lander"' in b)
    spec = spec_from_dict(tomllib.loads(snippet), ROOT / "examples/lunar_lander")
    assert spec.task.env_id == "LunarLander-v3"


def test_every_example_spec_loads():
    from ratchet.spec import load_spec

    names = [p.parent.name for p in (ROOT / "examples").glob("*/ratchet.toml")]
    assert {"cartpole", "lunar_lander", "pendulum", "mountain_car_continuous"} <= set(names)
    for name in names:
        spec = load_spec(ROOT / "examples" / name)
        assert spec.policy.kind == "mlp" or spec.policy_path.is_file()  # an mlp starts from no file
        assert (ROOT / "examples" / name / "README.md").is_file(), f"examples/{name} needs a README.md"
