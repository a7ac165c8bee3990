"""The docs' snippets are the real example files, and the generated references cover the code (docs must not drift
from code). The README is a landing page; the documentation site is docs/ (mkdocs.yml), built in strict mode by
`make docs-build` in CI."""

from __future__ import annotations

import importlib.util
import os
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def _blocks(lang: str, text: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.DOTALL)


def _hooks():
    """docs/hooks.py, the mkdocs hook that generates the spec, CLI and layer references."""
    spec = importlib.util.spec_from_file_location("ratchet_docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_is_a_landing_page():
    lines = README.count("\n") + 1
    assert lines <= 250, f"README.md has {lines} lines; move detail into docs/ (the landing page keeps ≤ 250)"
    for command in ("make demo", "make test", "make docs"):  # CI runs the README's test command
        assert command in README
    for link in re.findall(r"\]\(((?:docs|benchmarks|examples)/[^)#\s]*)", README):
        assert (ROOT / link).exists(), f"README links to {link}, which does not exist"


@pytest.mark.parametrize("text", [README, _page("getting-started.md")], ids=["README", "getting-started"])
def test_policy_snippet_is_the_cartpole_example(text):
    policy = (ROOT / "examples/cartpole/policy.py").read_text()
    snippet = next(b for b in _blocks("python", text) if '"w_position"' in b)
    assert snippet.strip() in policy


@pytest.mark.parametrize("text", [README, _page("getting-started.md")], ids=["README", "getting-started"])
def test_spec_snippet_is_the_cartpole_example(text):
    spec = tomllib.loads((ROOT / "examples/cartpole/ratchet.toml").read_text())
    snippet = next(b for b in _blocks("toml", text) if 'name = "cartpole"' in b)
    assert tomllib.loads(snippet) == spec


def test_annotated_spec_is_a_valid_spec():
    from ratchet.spec import spec_from_dict

    snippet = next(b for b in _blocks("toml", _page("reference/spec.md")) if 'name = "lunar_lander"' in b)
    spec = spec_from_dict(tomllib.loads(snippet), ROOT / "examples/lunar_lander")
    assert spec.task.env_id == "LunarLander-v3"


def test_every_example_spec_loads():
    from ratchet.policy import FOLDER_KINDS
    from ratchet.spec import load_spec

    names = [p.parent.name for p in (ROOT / "examples").glob("*/ratchet.toml")]
    assert {"cartpole", "lunar_lander", "pendulum", "mountain_car_continuous"} <= set(names)
    for name in names:
        spec = load_spec(ROOT / "examples" / name)
        # an mlp starts from no file, a source policy from a folder
        assert spec.policy.kind == "mlp" or spec.policy_path.is_file() or (
            spec.policy.kind in FOLDER_KINDS and spec.policy_path.is_dir())
        assert (ROOT / "examples" / name / "README.md").is_file(), f"examples/{name} needs a README.md"


def test_ppo_block_lists_every_ppo_setting():
    from ratchet.refiners.ppo import PPOSettings, ResidualSettings

    page = _page("how-to/refiners/ppo.md")
    block = next(b for b in _blocks("toml", page) if 'kind = "ppo"' in b)
    keys = set(re.findall(r"^#? ?(\w+) =", block.split("[[refiners]]", 1)[1], re.MULTILINE)) - {"kind"}
    assert keys == set(PPOSettings.model_fields), keys ^ set(PPOSettings.model_fields)
    assert set(ResidualSettings.model_fields) == set(PPOSettings.model_fields)
    assert ResidualSettings().log_std_init == -1.0 and "default -1.0" in block
    assert PPOSettings(env_steps=1000, n_steps=1024, checkpoints=2).job_env_steps == 2048 and "trains 2,048" in " ".join(page.split())


def test_examples_page_names_the_examples_that_turn_the_guarantee_off():
    off = sorted(p.parent.name for p in (ROOT / "examples").glob("*/ratchet.toml")
                 if tomllib.loads(p.read_text()).get("gate", {}).get("spending") == "none")
    page = _page("examples.md")
    assert "no example turns the guarantee off" not in page
    sentence = page[:1200]
    for name in off:
        assert f"`examples/{name}`" in sentence, name


def test_artifact_line_is_what_describe_prints():
    import gymnasium as gym

    from ratchet.policies import describe_artifact
    from ratchet.policies.mlp import init_weights

    env = gym.make("CartPole-v1")
    line = describe_artifact("weights", init_weights(env.observation_space, env.action_space).to_bytes())
    assert line.startswith("weights: mlp 4-64-64-2 (tanh, discrete): 4,610 weights, norm ")
    for page in ("how-to/commands.md", "how-to/policies/mlp.md"):
        assert "`weights: mlp 4-64-64-2 (tanh, discrete): 4,610 weights, norm" in _page(page).replace("\n", " "), page
    assert describe_artifact("model", b"x" * 10).startswith("model: Stable-Baselines3 .zip, 10 bytes")


def test_spec_reference_covers_every_key():
    """Every key of every spec section and of every registered [[refiners]] kind has a row in the generated spec
    reference, with a description: a new key without one fails here."""
    from pydantic import BaseModel

    from ratchet.refiners.registry import known_kinds, refiner_kind
    from ratchet.spec import RunSpec

    hooks = _hooks()
    reference = hooks.spec_reference()
    assert hooks.SPEC_MARKER in _page("reference/spec.md")
    expected: list[tuple[str, str, object]] = []
    for key, field in RunSpec.model_fields.items():
        model = field.annotation
        if key == "base_dir":
            continue
        if isinstance(model, type) and issubclass(model, BaseModel):
            expected += [(f"[{key}]", k, f) for k, f in model.model_fields.items()]
        else:
            expected.append(("top level", key, field))
    for kind in known_kinds():
        expected += [(f"[[refiners]] {kind}", k, f) for k, f in refiner_kind(kind).settings.model_fields.items()]
    sections = {title: fields for title, _, _, fields, _ in hooks.spec_sections()}
    assert any("[[refiners]]" in t and 'kind = "cfr"' in t for t in sections)
    undocumented = [f"{where} {key}" for where, key, field in expected if not (field.description or "").strip()]
    assert not undocumented, f"spec keys without a description (Field(..., description=...)): {undocumented}"
    for where, key, field in expected:
        assert f"| `{key}` |" in reference, f"{where} {key} is missing from the spec reference"
    rows = len(re.findall(r"^\| `[^`]+` \|", reference, re.MULTILINE))
    assert rows == sum(len(f) for f in sections.values())


def test_cli_reference_covers_every_command_and_option():
    hooks = _hooks()
    reference = hooks.cli_reference()
    assert hooks.CLI_MARKER in _page("reference/cli.md")
    for name, command in hooks.cli_commands():
        assert f"## `ratchet {name}".rstrip() in reference, name
        for param in command.params:
            if not getattr(param, "hidden", False):
                assert any(opt in reference for opt in [*param.opts, param.name]), f"ratchet {name} {param.name}"


def test_layout_page_names_every_module():
    page = _page("reference/layout.md")
    src = ROOT / "src" / "ratchet"
    missing = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src)
        if rel.name == "__init__.py" or rel.parts[0] == "dashboard":  # dashboard/: named as a package
            continue
        if rel.name not in page:
            missing.append(str(rel))
    for package in [p.name for p in src.iterdir() if (p / "__init__.py").is_file()]:
        if f"{package}/" not in page:
            missing.append(f"{package}/")
    assert not missing, f"docs/reference/layout.md does not name {missing}"
    hooks = _hooks()
    assert hooks.LAYERS_MARKER in page
    stack = hooks.layers()
    for package in ("cli", "loop", "refiners", "execution", "ledger", "errors"):
        assert re.search(rf"(^|/ ){package}( /|$)", stack, re.MULTILINE), package


def test_every_nav_page_exists_and_every_page_is_in_the_nav():
    nav = re.findall(r":\s*(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.MULTILINE)
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(nav) == pages


def test_every_example_and_benchmark_script_is_on_its_page():
    examples, benchmarks = _page("examples.md"), _page("benchmarks.md")
    missing = [f"examples/{p.name}" for p in sorted((ROOT / "examples").iterdir())
               if p.is_dir() and not p.name.startswith((".", "_"))
               and f"`examples/{p.name}`" not in examples and f"| `{p.name}` |" not in examples]  # or a table row
    missing += [f"benchmarks/{p.name}" for p in sorted((ROOT / "benchmarks").glob("*.py")) if f"`{p.name}`" not in benchmarks]
    assert not missing, f"name these on docs/examples.md or docs/benchmarks.md: {missing}"


def test_the_custom_environment_example_runs(tmp_path, monkeypatch):
    """docs/how-to/tasks/gym.md's own environment: its module registers the env, ``"module:EnvId"`` names it, and a
    worker's env host imports it through ``PYTHONPATH`` as the page says."""
    from ratchet.execution import Job
    from ratchet.execution.process import ProcessExecutor
    from ratchet.policy import parse_policy
    from ratchet.spec import spec_from_dict
    from ratchet.task import GymTask

    page = _page("how-to/tasks/gym.md")
    module = next(b for b in _blocks("python", page) if 'gym.register(id="Corridor-v0"' in b)
    table = tomllib.loads(next(b for b in _blocks("toml", page) if "my_envs:Corridor-v0" in b))
    (tmp_path / "my_envs.py").write_text(module)
    (tmp_path / "policy.py").write_text("PARAMETERS = {}\n\n\ndef act(observation, params):\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p))
    spec = spec_from_dict({**table, "policy": {"path": "policy.py"}, "budget": {"env_steps": 10_000}}, tmp_path)
    task = GymTask(spec.task.env_id)
    cand = parse_policy((tmp_path / "policy.py").read_text()).candidate()
    with ProcessExecutor(workers=1, episode_timeout_s=60) as ex:
        (ep,) = ex.run(task, [Job(cand, 0)])
    assert ep.error is None and ep.length == 9 and round(ep.episode_return, 6) == 0.92 and ep.success is True


def test_every_test_the_guarantees_page_names_exists():
    """docs/concepts/guarantees.md lists each boundary with the tests that hold it: every test it names is a test
    function of that file (a renamed or deleted test fails here, so the page cannot claim a test that is gone)."""
    page = _page("concepts/guarantees.md")
    named = re.findall(r"`(tests/test_\w+\.py)::(test_\w+)`", page)
    assert len(named) >= 40
    missing = [f"{path}::{name}" for path, name in named
               if not re.search(rf"^def {name}\(", (ROOT / path).read_text(encoding="utf-8"), re.MULTILINE)]
    assert not missing
