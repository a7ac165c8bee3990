"""The README's snippets are the real example files (docs must not drift from code)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.DOTALL)


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


def test_readme_ppo_block_lists_every_ppo_setting():
    from ratchet.refiners.ppo import PPOSettings, ResidualSettings

    block = next(b for b in _blocks("toml") if 'kind = "ppo"' in b)
    keys = set(re.findall(r"^#? ?(\w+) =", block.split("[[refiners]]", 1)[1], re.MULTILINE)) - {"kind"}
    assert keys == set(PPOSettings.model_fields), keys ^ set(PPOSettings.model_fields)
    assert set(ResidualSettings.model_fields) == set(PPOSettings.model_fields)
    assert ResidualSettings().log_std_init == -1.0 and "default -1.0" in block
    assert PPOSettings(env_steps=1000, n_steps=1024, checkpoints=2).job_env_steps == 2048 and "trains 2,048" in " ".join(README.split())


def test_readme_names_the_examples_that_turn_the_guarantee_off():
    off = sorted(p.parent.name for p in (ROOT / "examples").glob("*/ratchet.toml")
                 if tomllib.loads(p.read_text()).get("gate", {}).get("spending") == "none")
    assert "no example turns the guarantee off" not in README
    sentence = README[README.index("## Examples"):][:1200]
    for name in off:
        assert f"[{name}](examples/{name})" in sentence, name


def test_readme_artifact_line_is_what_describe_prints():
    import gymnasium as gym

    from ratchet.policies import describe_artifact
    from ratchet.policies.mlp import init_weights

    env = gym.make("CartPole-v1")
    line = describe_artifact("weights", init_weights(env.observation_space, env.action_space).to_bytes())
    assert line.startswith("weights: mlp 4-64-64-2 (tanh, discrete): 4,610 weights, norm ")
    assert "`weights: mlp 4-64-64-2 (tanh, discrete): 4,610 weights, norm" in README.replace("\n", " ")
    assert describe_artifact("model", b"x" * 10).startswith("model: Stable-Baselines3 .zip, 10 bytes")
