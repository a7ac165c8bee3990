"""ratchet.spec: ratchet.toml validation and its one-line error messages."""

from __future__ import annotations

import shutil

import pytest
from conftest import DATA, make_spec_dir
from pydantic import ValidationError

from ratchet.errors import SpecError
from ratchet.spec import RunSpec, load_spec, spec_from_dict


def write(tmp_path, text: str, policy: bool = True):
    (tmp_path / "ratchet.toml").write_text(text, encoding="utf-8")
    if policy:
        shutil.copy(DATA / "cartpole_linear.py", tmp_path / "policy.py")
    return tmp_path / "ratchet.toml"


def spec_error(tmp_path, text: str, *fragments: str, policy: bool = True) -> str:
    path = write(tmp_path, text, policy)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    msg = str(info.value)
    assert "\n" not in msg, msg
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"
    return msg


MINIMAL = '[task]\nenv_id = "CartPole-v1"\n'


def test_load_spec_happy_path(tmp_path):
    make_spec_dir(tmp_path)
    spec = load_spec(tmp_path)  # a folder works, as does the file itself
    assert spec == load_spec(tmp_path / "ratchet.toml")
    assert spec.name == "cp" and spec.seed == 0
    assert spec.task.env_id == "CartPole-v1" and spec.task.action == "error"
    assert spec.budget.env_steps == 20000 and spec.budget.target is None
    assert spec.gate.validation_episodes == 10 and spec.gate.alpha == 0.05 and spec.gate.test == "t"
    assert spec.refiner.train_episodes == 3 and spec.refiner.kind == "cmaes"
    assert spec.test.episodes == 20
    assert spec.execution.workers == 2 and spec.execution.episode_timeout_s == 30
    assert spec.policy_path == (tmp_path / "policy.py").resolve()


def test_minimal_spec_defaults(tmp_path):
    spec = load_spec(write(tmp_path, MINIMAL))
    assert spec.name == "run" and spec.seed == 0
    assert spec.budget.env_steps == 100_000  # a run is always bounded
    assert spec.gate.validation_episodes == 50 and spec.test.episodes == 100
    assert spec.policy.path == "policy.py"


def test_policy_path_is_relative_to_the_spec(tmp_path):
    (tmp_path / "sub").mkdir()
    shutil.copy(DATA / "cartpole_linear.py", tmp_path / "sub" / "mine.py")
    spec = load_spec(write(tmp_path, MINIMAL + '[policy]\npath = "sub/mine.py"\n', policy=False))
    assert spec.policy_path == (tmp_path / "sub" / "mine.py").resolve()


def test_to_dict_roundtrip(tmp_path):
    spec = load_spec(make_spec_dir(tmp_path))
    d = spec.to_dict()
    assert "base_dir" not in d
    again = spec_from_dict(d, base_dir=tmp_path)
    assert again == spec


def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match="spec not found"):
        load_spec(tmp_path / "nope.toml")
    with pytest.raises(SpecError, match=r"spec not found: .*ratchet\.toml"):
        load_spec(tmp_path)  # a folder without ratchet.toml


def test_invalid_toml_names_the_line(tmp_path):
    msg = spec_error(tmp_path, '[task]\nenv_id = "CartPole-v1"\nseed = = 3\n', "invalid TOML")
    assert "line 3" in msg


def test_unknown_top_level_key(tmp_path):
    spec_error(tmp_path, 'sede = 1\n' + MINIMAL, "unknown key sede", "seed")


def test_unknown_key_in_section_lists_allowed_keys(tmp_path):
    msg = spec_error(tmp_path, MINIMAL + "[budget]\nenv_step = 1000\n", "unknown key [budget] env_step")
    assert "env_steps" in msg and "patience" in msg


def test_unknown_section(tmp_path):
    spec_error(tmp_path, MINIMAL + "[optimizer]\nlr = 1\n", "unknown key optimizer")


@pytest.mark.parametrize("text, fragments", [
    ('[budget]\nenv_steps = "lots"\n', ("[budget] env_steps", "integer", "'lots'")),
    ("[budget]\nenv_steps = -5\n", ("[budget] env_steps", "must be > 0", "(got -5)")),
    ("[gate]\nalpha = 1.5\n", ("[gate] alpha",)),
    ("[gate]\nvalidation_episodes = 1\n", ("[gate] validation_episodes",)),
    ('[gate]\ntest = "z"\n', ("[gate] test",)),
    ('[task]\nenv_id = "CartPole-v1"\naction = "ignore"\n', ("[task] action",)),
    ("seed = -1\n", ("seed: ", "must be ≥ 0")),
    ('seed = "zero"\n', ("seed", "integer")),
    ("[execution]\nworkers = 1.5\n", ("[execution] workers",)),
])
def test_wrong_types_and_values(tmp_path, text, fragments):
    if "[task]" not in text:
        text = MINIMAL + text if text.startswith("[") else text + MINIMAL
    spec_error(tmp_path, text, *fragments)


def test_a_screen_without_transitions_to_learn_from_gets_a_note_saying_why(tmp_path):
    """new-user pass: `[model] screen = true` where nothing records transitions ran as without it and said nothing.
    `ratchet run` now notes at the start that it has no effect and why; nothing where the screen can learn."""
    notes: list[str] = []
    load_spec(write(tmp_path, MINIMAL + "[model]\nscreen = true\n[execution]\ntrusted_rollouts = false\n"),
              notes=notes)
    assert len(notes) == 1 and "\n" not in notes[0], notes
    assert notes[0].startswith("note: [model] screen has no effect in this run: [execution] trusted_rollouts = false")
    notes = []
    load_spec(write(tmp_path, MINIMAL + "[model]\nscreen = true\n"), notes=notes)
    assert notes == []


def test_an_overlap_gate_the_spec_rules_out_gets_a_note_saying_why(tmp_path):
    """new-user pass: `overlap_gate = true` in the cartpole example (it has a [budget] target) ran exactly as without
    it and said nothing. `ratchet run` now notes at the start which settings rule it out; none without them."""
    on = '[planner]\noverlap_gate = true\n'
    notes: list[str] = []
    load_spec(write(tmp_path, MINIMAL + on + "[budget]\nenv_steps = 100_000\ntarget = 500\nwall_clock_s = 600\n"),
              notes=notes)
    assert len(notes) == 1 and "\n" not in notes[0], notes
    assert "overlap_gate has no effect" in notes[0] and "[budget] target" in notes[0] and "wall_clock_s" in notes[0]
    notes = []
    load_spec(write(tmp_path, MINIMAL + on + "[refiner]\nfollow = \"own\"\n"), notes=notes)
    assert notes == []
    load_spec(write(tmp_path, MINIMAL + "[budget]\ntarget = 500\n"), notes=notes)  # off: nothing to say
    assert notes == []


LLM_TABLE = '[[refiners]]\nkind = "llm"\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n'


@pytest.mark.parametrize("text, fragments", [
    (LLM_TABLE + "ahead = true\n", ("the first [[refiners]] table (refiners.0, llm): ahead", "integer")),
    (LLM_TABLE + 'ahead = "1"\n', ("the first [[refiners]] table (refiners.0, llm): ahead", "integer")),
    (LLM_TABLE + "proposals = 1979-05-27\n", ("the first [[refiners]] table (refiners.0, llm): proposals", "integer")),
    ('[[refiners]]\nkind = "cmaes"\npopsize = "8"\n', ("the first [[refiners]] table (refiners.0, cmaes): popsize", "integer")),
    (LLM_TABLE + 'ahead = 1\nlag = "soon"\n', ("the first [[refiners]] table (refiners.0, llm): lag", '0 to 64) or "auto"')),
    (LLM_TABLE + "ahead = 1\nlag = 65\n", ("the first [[refiners]] table (refiners.0, llm): lag", '0 to 64) or "auto"')),
    (LLM_TABLE + "ahead = 1\nlag = true\n", ("the first [[refiners]] table (refiners.0, llm): lag", '0 to 64) or "auto"')),
    (LLM_TABLE + 'lag = "auto"\n', ("lag needs ahead",)),
])
def test_a_refiner_tables_wrong_types_are_refused_as_a_sections_are(tmp_path, text, fragments):
    """new-user pass: `ahead = true` ran with one wave ahead and `popsize = "8"` with 8 (pydantic's lax coercion),
    though [planner] train_episodes = true or "2" is refused: a [[refiners]] table is as strict as a [section]."""
    spec_error(tmp_path, MINIMAL + text, *fragments)


def test_a_refiner_tables_errors_count_tables_as_set_does_and_name_unknown_keys(tmp_path):
    """new-user pass: `--set refiners.0.sigma0=0.3` on an llm table said "[[refiners]] table 1 (llm): sigma0: Extra
    inputs are not permitted": --set counts from 0, the error from 1, and the unknown key got pydantic's wording.
    Now the error names the table as --set does and lists the keys allowed there, as a [section]'s unknown key does."""
    path = write(tmp_path, MINIMAL + LLM_TABLE + '[[refiners]]\nkind = "cmaes"\n')
    with pytest.raises(SpecError) as info:
        load_spec(path, overrides=["refiners.0.sigma0=0.3"])
    msg = str(info.value)
    assert "the first [[refiners]] table (refiners.0, llm): unknown key sigma0; allowed keys here: kind, name, " in msg
    assert msg.startswith("--set 'refiners.0.sigma0=0.3': the first [[refiners]] table"), msg
    assert "base_url" in msg and "Extra inputs" not in msg and "table 1" not in msg, msg
    msg = spec_error(tmp_path, MINIMAL + LLM_TABLE + '[[refiners]]\nkind = "cmaes"\nbogus = 1\n',
                     "the second [[refiners]] table (refiners.1, cmaes): unknown key bogus; allowed keys here: ")
    assert "sigma0" in msg and "Extra inputs" not in msg, msg


def test_a_refiner_tables_numbers_still_pass(tmp_path):
    """Strict, not stricter: an integer for a float setting and a list of tables (a pool of models) still pass."""
    pool = ('[[refiners]]\nkind = "llm"\nbudget_cost = 2\n[[refiners.models]]\nbase_url = "http://127.0.0.1:9/v1"\n'
            'model = "a"\nprice_prompt = 1\n[[refiners.models]]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "b"\n')
    spec = load_spec(write(tmp_path, MINIMAL + '[[refiners]]\nkind = "cmaes"\nsigma0 = 1\npopsize = 8\n' + pool))
    assert spec.refiners[0]["sigma0"] == 1.0 and spec.refiners[0]["popsize"] == 8
    assert [m["model"] for m in spec.refiners[1]["models"]] == ["a", "b"] and spec.refiners[1]["budget_cost"] == 2.0
    for lag in ('"auto"', "3"):  # an llm's lag: a number of generations, or "auto"
        spec = load_spec(write(tmp_path, MINIMAL + LLM_TABLE + f"ahead = 1\nlag = {lag}\n"))
        assert spec.refiners[0]["lag"] == (3 if lag == "3" else "auto")


def test_missing_task_section(tmp_path):
    spec_error(tmp_path, 'name = "x"\n', "missing [task] section", "env_id")


def test_missing_env_id(tmp_path):
    spec_error(tmp_path, "[task]\nsuccess_threshold = 1.0\n", "missing [task] env_id", "CartPole-v1")


def test_unknown_env_id_suggests_close_match(tmp_path):
    spec_error(tmp_path, '[task]\nenv_id = "CartPoel-v1"\n', "[task] env_id", "unknown Gymnasium env id",
               "did you mean", "CartPole-v1")


def test_missing_policy_file(tmp_path):
    msg = spec_error(tmp_path, MINIMAL + '[policy]\npath = "nope.py"\n', "[policy] path", "file not found", policy=False)
    assert "nope.py" in msg


def test_spec_from_dict_rejects_non_tables():
    with pytest.raises(SpecError, match="expected a table"):
        spec_from_dict([1, 2])  # type: ignore[arg-type]


def test_specs_are_frozen(tmp_path):
    spec = load_spec(make_spec_dir(tmp_path))
    with pytest.raises(ValidationError, match="frozen"):
        spec.seed = 3  # type: ignore[misc]
    assert isinstance(spec, RunSpec)


# -- every number is bounded, and a budget is a hard cap (issue 8) -----------------------------------

# regression (was a bug): these values passed validation, then hung at start-up (seed lists of 2e9 / 1e9 seeds),
# overflowed (a 1e7 s timeout) or failed the run after 50 generations (pycma's assertion on sigma0 = 1e-300)
@pytest.mark.parametrize("text, fragments", [
    ("[execution]\nepisode_timeout_s = 1e7\n", ("[execution] episode_timeout_s", "≤ 86400", "(got 10000000.0)")),
    ("[gate]\nvalidation_episodes = 2000000000\n", ("[gate] validation_episodes", "≥ 2 and ≤ 100000")),
    ("[test]\nepisodes = 1000000000\n", ("[test] episodes", "≤ 100000", "(got 1000000000)")),
    ("[refiner]\nsigma0 = 1e-300\n", ("[refiner] sigma0", "≥ 1e-06 and ≤ 1", "(got 1e-300)")),
    ("[refiner]\nsigma0_variants = [1e-300, 0.2]\n", ("[refiner] sigma0_variants", "[1e-06, 1]")),
    ("[refiner]\ntrain_episodes = 1000000\n", ("[refiner] train_episodes", "≤ 100000")),
    ("[execution]\nworkers = 100000\n", ("[execution] workers", "≤ 1024")),
    ("[budget]\nenv_steps = 10000000000000\n", ("[budget] env_steps", "≤ 1000000000000")),
    ("seed = 18446744073709551615\n", ("seed: ", "≤ 9223372036854775807")),
])
def test_numbers_are_bounded(tmp_path, text, fragments):
    text = MINIMAL + text if text.startswith("[") else text + MINIMAL
    spec_error(tmp_path, text, *fragments)


# regression (was a bug): a Wilcoxon gate on 6 validation episodes cannot reach p < alpha/4 = 0.0125 (its smallest
# p is 1/2^6 = 0.0156), so the run could never promote anything; it was accepted
@pytest.mark.parametrize("gate, need", [
    ('test = "wilcoxon"\nvalidation_episodes = 6\n', 7),  # harmonic: first level alpha/4 = 0.0125
    ('test = "wilcoxon"\nvalidation_episodes = 4\nspending = "none"\n', 5),  # 1/2^4 = 0.0625 >= 0.05
    ('test = "wilcoxon"\nvalidation_episodes = 8\nalpha = 0.01\n', 9),  # 1/2^8 = 0.0039 >= alpha/4 = 0.0025
])
def test_a_gate_that_can_never_promote_is_refused(tmp_path, gate, need):
    spec_error(tmp_path, MINIMAL + "[gate]\n" + gate, "[gate] validation_episodes", "can never promote",
               f"at least {need}")
    spec = load_spec(write(tmp_path, MINIMAL + "[gate]\n" + gate.replace(
        f"validation_episodes = {need - 1}", f"validation_episodes = {need}")))
    assert spec.gate.validation_episodes == need


def test_the_t_test_can_promote_with_two_episodes(tmp_path):
    # the one-sided t-test on 2 pairs (1 degree of freedom) reaches any level for a large enough t
    assert load_spec(write(tmp_path, MINIMAL + "[gate]\nvalidation_episodes = 2\n")).gate.validation_episodes == 2


# regression (was a bug): [budget] episodes = 5 ran the starting policy's 30 validation episodes anyway
def test_a_budget_too_small_for_the_first_validation_is_refused(tmp_path):
    spec_error(tmp_path, MINIMAL + "[gate]\nvalidation_episodes = 30\n[budget]\nepisodes = 5\n",
               "[budget] episodes = 5", "first validation", "validation_episodes = 30", "raise [budget] episodes")
    spec_error(tmp_path, MINIMAL + "[gate]\nvalidation_episodes = 30\n[budget]\nenv_steps = 14999\n",
               "[budget] env_steps = 14,999", "30 episodes × 500 env steps", "= 15,000", "raise [budget] env_steps")
    assert load_spec(write(tmp_path, MINIMAL + "[gate]\nvalidation_episodes = 30\n[budget]\nenv_steps = 15000\n"))
    assert load_spec(write(tmp_path, MINIMAL + "max_episode_steps = 100\n[gate]\nvalidation_episodes = 30\n"
                                     "[budget]\nenv_steps = 3000\n"))  # 30 × 100 fits


# regression (issue 18 §6): [budget] episodes = 10 paid for the first validation but not one generation; the run
# spent its 100 test episodes and exited 0 with "no room for a single generation"
def test_a_budget_too_small_for_one_generation_is_refused_in_numbers(tmp_path):
    # sized to 10 episodes: validation_episodes 8, train_episodes 2, popsize 4 (+ the mean and the incumbent)
    spec_error(tmp_path, MINIMAL + "[budget]\nepisodes = 10\n", "[budget] episodes = 10 cannot pay for a single "
               "generation: 8 for the starting policy's first validation + 12 for a generation (6 candidates × 2 "
               "training episodes) + 8 for its gate = 28", "raise [budget] episodes to at least 28")
    assert load_spec(write(tmp_path, MINIMAL + "[budget]\nepisodes = 28\n")).budget.episodes == 28
    spec_error(tmp_path, MINIMAL + "[refiner]\npopsize = 10\ntrain_episodes = 3\n[gate]\nvalidation_episodes = 20\n"
               "[budget]\nepisodes = 75\n", "20 for the starting policy's first validation + 36 for a generation "
               "(12 candidates × 3 training episodes) + 20 for its gate = 76")
    # a sequential gate validates the start on one batch and prices a decision at twice what it reads first
    spec_error(tmp_path, MINIMAL + '[gate]\ntest = "betting"\nvalidation_episodes = 200\n[refiner]\npopsize = 4\n'
               "train_episodes = 2\n[budget]\nepisodes = 71\n", "20 for the starting policy's first validation + "
               "12 for a generation", "40 for its gate = 72")
    assert load_spec(write(tmp_path, MINIMAL + "[budget]\nenv_steps = 30000\n")).budget.episodes is None


# new-user pass: mutate (and llm) were counted as one proposal, so a budget too small for their programs × variants was
# found only after the first validation ("no room for a single generation"); cmaes was refused up front
def test_a_budget_too_small_for_one_mutate_or_llm_generation_is_refused_up_front(tmp_path):
    mutate = '[[refiners]]\nkind = "mutate"\nprograms = 3\nvariants = 2\n'
    spec_error(tmp_path, MINIMAL + mutate + "[budget]\nepisodes = 29\n", "8 for the starting policy's first "
               "validation + 14 for a generation (7 candidates × 2 training episodes) + 8 for its gate = 30")
    assert load_spec(write(tmp_path, MINIMAL + mutate + "[budget]\nepisodes = 30\n")).budget.episodes == 30
    llm = ('[[refiners]]\nkind = "llm"\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\nproposals = 2\n'
           "variants = 2\n")
    spec_error(tmp_path, MINIMAL + llm + "[budget]\nepisodes = 25\n", "(5 candidates × 2 training episodes)")


# regression (was a bug): on CliffWalking-v1 (no time limit) a run spent 91 s in episodes nobody bounded
def test_an_env_without_a_time_limit_needs_max_episode_steps(tmp_path):
    spec_error(tmp_path, '[task]\nenv_id = "CliffWalking-v1"\n', "[task] max_episode_steps",
               "CliffWalking-v1 has no time limit", "set [task] max_episode_steps")
    spec = load_spec(write(tmp_path, '[task]\nenv_id = "CliffWalking-v1"\nmax_episode_steps = 200\n'))
    assert spec.task.max_episode_steps == 200


# regression (was a bug): env_kwargs = {max_episode_steps = 20000} on CartPole-v1 ran episodes of up to 20,000 steps
# while the budget's worst case assumed the registered 500 (20,619 env steps used of 20,000)
def test_the_time_limit_in_env_kwargs_is_refused(tmp_path):
    spec_error(tmp_path, MINIMAL + "env_kwargs = { max_episode_steps = 20000 }\n", "[task] env_kwargs",
               "max_episode_steps = 20000", "move it to [task] max_episode_steps")


def test_spec_text_values_are_quoted_in_errors(tmp_path):
    spec_error(tmp_path, MINIMAL + '[gate]\nalpha = "0.05"\n', "[gate] alpha", "(got '0.05')")


def test_defaults_are_sized_to_a_small_episode_budget(tmp_path):
    """With [budget] episodes = 128 and nothing else set, validation, training seeds and population shrink so
    that several gated generations fit; settings the spec gives are kept; large budgets keep the defaults."""
    from ratchet.spec import spec_from_dict

    small = spec_from_dict({"task": {"env_id": "CartPole-v1"}, "budget": {"episodes": 128}}, tmp_path)
    assert (small.gate.validation_episodes, small.gate.max_share) == (10, 0.5)
    assert (small.refiner.train_episodes, small.refiner.popsize) == (2, 4)
    kept = spec_from_dict({"task": {"env_id": "CartPole-v1"}, "budget": {"episodes": 128},
                           "gate": {"validation_episodes": 20}, "refiner": {"popsize": 6}}, tmp_path)
    assert (kept.gate.validation_episodes, kept.refiner.popsize, kept.refiner.train_episodes) == (20, 6, 2)
    assert spec_from_dict(small.to_dict(), tmp_path) == small  # what the ledger records reads back the same
    large = spec_from_dict({"task": {"env_id": "CartPole-v1"}, "budget": {"episodes": 5000}}, tmp_path)
    assert (large.gate.validation_episodes, large.refiner.popsize) == (50, None)


def test_set_changes_a_refiners_table_by_its_index(tmp_path):
    p = write(tmp_path, '[task]\nenv_id = "CartPole-v1"\n[[refiners]]\nkind = "cmaes"\npopsize = 4\n'
                        '[[refiners]]\nkind = "mutate"\n')
    spec = load_spec(p, ["refiners.0.popsize=6", "refiners[1].name=m2"])
    assert spec.refiners[0]["popsize"] == 6 and spec.refiners[1]["name"] == "m2"
    assert load_spec(p).refiners[0]["popsize"] == 4  # the file is not changed
    for item, fragment in [("refiners.2.popsize=5", "the spec has 2 [[refiners]] tables, indexed 0 to 1"),
                           ("refiners.popsize=5", "name one by its index from 0"),
                           ("refiners.0=1", "set one key in it: --set refiners.0.KEY=VALUE")]:
        with pytest.raises(SpecError, match=fragment.replace("[", r"\[").replace(".", r"\.")) as info:
            load_spec(p, [item])
        assert str(info.value).startswith(f"--set {item!r}: ") and "\n" not in str(info.value)
    (tmp_path / "bare").mkdir()
    bare = write(tmp_path / "bare", '[task]\nenv_id = "CartPole-v1"\n')
    with pytest.raises(SpecError, match=r"the spec has 0 \[\[refiners\]\] tables; add one"):
        load_spec(bare, ["refiners.0.env_steps=5"])


def test_errors_from_set_name_the_set_not_the_file(tmp_path):
    p = write(tmp_path, '[task]\nenv_id = "CartPole-v1"\n[[refiners]]\nkind = "cmaes"\n')
    for item, fragment in [("refiners.0.bogus=1", "bogus"), ("refiners.0.popsize=-1", "popsize"),
                           ("gate.bogus=1", "unknown key [gate] bogus"), ("policy.path=nope.py", "file not found"),
                           # a NUL in a path: "ValueError: embedded null byte" from resolve(), as a traceback
                           ('policy.path="a\\u0000b.py"', "policy.path contains a NUL character"),
                           ('logging.tensorboard="t\\u0000b"', "logging.tensorboard contains a NUL character")]:
        with pytest.raises(SpecError) as info:
            load_spec(p, ["gate.alpha=0.1", item])
        msg = str(info.value)
        assert msg.startswith(f"--set {item!r}: ") and fragment in msg and "ratchet.toml" not in msg, msg
    (tmp_path / "bad").mkdir()
    bad = write(tmp_path / "bad", '[task]\nenv_id = "CartPole-v1"\nbogus = 1\n')
    with pytest.raises(SpecError, match=r"ratchet\.toml: unknown key \[task\] bogus"):  # the file's own mistake
        load_spec(bad, ["gate.alpha=0.1"])
    (tmp_path / "nul").mkdir()
    nul = write(tmp_path / "nul", '[task]\nenv_id = "CartPole-v1"\n[policy]\npath = "policy\\u0000.py"\n')
    with pytest.raises(SpecError, match=r"ratchet\.toml: policy\.path contains a NUL character \(\\0\); remove it"):
        load_spec(nul)


def test_a_training_refiner_whose_one_rollout_exceeds_the_whole_budget_is_refused(tmp_path):
    spec_dir = make_spec_dir(tmp_path, budget={"env_steps": 30_000})
    toml = (spec_dir / "ratchet.toml").read_text(encoding="utf-8")
    toml = toml.replace('[policy]\npath = "policy.py"', '[policy]\nkind = "mlp"\nhidden = [8]')
    (spec_dir / "ratchet.toml").write_text(toml + '\n[[refiners]]\nkind = "ppo"\nn_steps = 32768\n', encoding="utf-8")
    with pytest.raises(SpecError, match=r"table \(refiners.0, ppo\): its smallest training job \(32,768 env steps\) is more "
                                        r"than the whole \[budget\] env_steps = 30,000.*lower n_steps"):
        load_spec(spec_dir)
    (spec_dir / "ratchet.toml").write_text(toml + '\n[[refiners]]\nkind = "ppo"\nn_steps = 1024\n', encoding="utf-8")
    assert load_spec(spec_dir).refiners[0]["n_steps"] == 1024


def test_loop_settings_live_in_planner_and_old_specs_keep_working_with_a_note(tmp_path):
    from ratchet.spec import moved_settings

    new = spec_from_dict({"task": {"env_id": "CartPole-v1"}, "planner": {"train_episodes": 3, "gate_candidate": "mean"}})
    assert (new.planner.train_episodes, new.planner.gate_candidate) == (3, "mean")
    assert new.refiner.train_episodes == 3 and "train_episodes" not in new.to_dict()["refiner"]
    old_data = {"task": {"env_id": "CartPole-v1"}, "refiner": {"train_episodes": 4, "sigma0": 0.3}}
    old = spec_from_dict(old_data)
    assert (old.planner.train_episodes, old.refiner.train_episodes, old.refiner.sigma0) == (4, 4, 0.3)
    assert moved_settings(old_data) == [("note: [refiner] train_episodes is now [planner] train_episodes (read "
                                         "from [refiner] this time)")]
    assert moved_settings(old.to_dict()) == [] and spec_from_dict(old.to_dict()) == old  # the ledger: new place
    notes: list[str] = []
    load_spec(make_spec_dir(tmp_path / "s"), notes=notes)  # tests/data/cartpole.toml keeps the older spelling
    assert notes == ["note: [refiner] train_episodes is now [planner] train_episodes (read from [refiner] this time)"]
    with pytest.raises(SpecError, match="^spec: \\[planner\\] train_episodes: must be ≥ 1"):
        spec_from_dict({"task": {"env_id": "CartPole-v1"}, "planner": {"train_episodes": 0}})
    with pytest.raises(SpecError, match="keep only \\[planner\\] train_episodes"):
        spec_from_dict({"task": {"env_id": "CartPole-v1"}, "refiner": {"train_episodes": 4},
                        "planner": {"train_episodes": 5}})


# decide = "end" promotes nothing until the budget ends the search: a target or a patience would stop the run
# before its one decision, silently (a patience stop decides nothing)
@pytest.mark.parametrize("key, value", [("target", "400"), ("patience", "3")])
def test_decide_end_refuses_a_target_or_a_patience(tmp_path, key, value):
    spec_error(tmp_path, MINIMAL + f'[planner]\ndecide = "end"\n[budget]\n{key} = {value}\n',
               f"[budget] {key} cannot be used with [planner] decide = \"end\"", f"remove [budget] {key}")
    assert load_spec(write(tmp_path, MINIMAL + f"[budget]\n{key} = {value}\n"))  # decide = "every" reads both


# decide = "end" (and "powered") keeps a round of confirmation with its validation: an episode budget that cannot
# pay for it stopped before its first generation with a run directory and exit 0
def test_an_episode_budget_counts_the_confirmation_kept_by_decide_end(tmp_path):
    sized = "[refiner]\npopsize = 6\n[gate]\nvalidation_episodes = 30\n[budget]\nepisodes = 100\n"
    # 30 first validation + 8 × 2 a generation + 30 its gate + 5 × 6 a round of confirmation = 106
    spec_error(tmp_path, MINIMAL + '[planner]\ndecide = "end"\ntrain_episodes = 2\n' + sized,
               "[budget] episodes = 100 cannot pay for a single generation", "+ 30 for a round of confirmation = 106")
    assert load_spec(write(tmp_path, MINIMAL + "[planner]\ntrain_episodes = 2\n" + sized))  # "every" keeps none


def test_refiner_settings_beside_refiners_tables_are_refused_naming_the_key_to_set(tmp_path):
    """With [[refiners]] tables the run's refiners are those tables: a [refiner] setting would be silently ignored,
    so the file, or the --set that brings one in, is refused in one line naming refiners.N.<key>."""
    d = make_spec_dir(tmp_path / "s")  # its [refiner] table holds train_episodes only: the planner's, allowed
    with open(d / "ratchet.toml", "a", encoding="utf-8") as f:
        f.write('\n[[refiners]]\nkind = "cmaes"\nsigma0 = 0.3\n')
    assert load_spec(d, ["refiner.train_episodes=3"]).planner.train_episodes == 3
    with pytest.raises(SpecError, match=r"^--set 'refiner.popsize=4': \[refiner\] popsize has no effect: .*"
                                        r"refiners\.0\.popsize"):
        load_spec(d, ["refiner.train_episodes=3", "refiner.popsize=4"])
    text = (d / "ratchet.toml").read_text(encoding="utf-8")
    (d / "ratchet.toml").write_text(text.replace("[refiner]\n", "[refiner]\nsigma0 = 0.5\n"), encoding="utf-8")
    with pytest.raises(SpecError, match=r"ratchet\.toml: \[refiner\] sigma0 has no effect"):
        load_spec(d)
    assert load_spec(make_spec_dir(tmp_path / "plain"), ["refiner.popsize=4"]).refiner.popsize == 4


def test_spending_every_with_a_fixed_sample_test_says_which_tests_take_it(tmp_path):
    d = make_spec_dir(tmp_path / "s")
    with pytest.raises(SpecError, match=r"^--set 'gate.spending=every': \[gate\] spending = \"every\" is for the "
                                        r"sequential tests \(test = \"betting\" or \"group-t\"\)"):
        load_spec(d, ["gate.spending=every"])
    assert load_spec(d, ["gate.spending=every", "gate.test=betting"]).gate.spending == "every"


def test_a_deterministic_task_decides_exactly_and_scores_each_candidate_once_by_default(tmp_path):
    """``[task] deterministic = true``: decide and test "exact", one training and one test episode per candidate;
    a setting that asks for statistics, or "exact" on a task not declared deterministic, is refused in one line."""
    (tmp_path / "policy.py").write_text(
        'PARAMETERS = {"k": {"default": 0.0, "low": -1.0, "high": 1.0}}\ndef act(o, p):\n    return 0\n')
    task = {"env_id": "CartPole-v1", "deterministic": True}
    spec = spec_from_dict({"task": task, "budget": {"episodes": 200}}, tmp_path)
    assert (spec.planner.decide, spec.gate.test, spec.planner.train_episodes, spec.test.episodes) == \
        ("exact", "exact", 1, 1)
    assert spec.gate.tolerance == 1e-9 and spec.task.deterministic
    assert spec_from_dict(spec.to_dict(), tmp_path) == spec  # as the ledger records it
    for extra, match in [({"planner": {"decide": "powered"}}, "decide = \"powered\" does not apply"),
                         ({"gate": {"test": "t"}}, "test = \"t\" does not apply"),
                         ({"planner": {"train_episodes": 5}}, "scores each candidate once"),
                         ({"gate": {"tolerance": -1.0}}, "tolerance")]:
        with pytest.raises(SpecError, match=match):
            spec_from_dict({"task": task, **extra}, tmp_path)
    for extra in ({"planner": {"decide": "exact"}}, {"gate": {"test": "exact"}}):
        with pytest.raises(SpecError, match="needs \\[task\\] deterministic = true"):
            spec_from_dict({"task": {"env_id": "CartPole-v1"}, **extra}, tmp_path)
    with pytest.raises(SpecError, match="deterministic"):
        spec_from_dict({"task": {"kind": "game", "game": "openspiel:kuhn_poker", "deterministic": True}}, tmp_path)


def test_a_cascade_must_leave_a_second_stage_and_older_ledgers_read_as_without_one(tmp_path):
    """[planner] cascade_episodes below train_episodes (one line otherwise); a ledger spec recorded before the key
    existed resumes with no cascade (every contender on every training seed, as it ran)."""
    from ratchet.loop import recorded_spec

    spec_error(tmp_path, MINIMAL + "[planner]\ntrain_episodes = 4\ncascade_episodes = 4\n",
               "[planner] cascade_episodes = 4", "below train_episodes")
    spec_error(tmp_path, MINIMAL + "[planner]\ncascade_margin = -1\n", "cascade_margin")
    spec = load_spec(write(tmp_path, MINIMAL + "[planner]\ntrain_episodes = 4\ncascade_episodes = 1\n"))
    assert (spec.planner.cascade_episodes, spec.planner.cascade_margin) == (1, 1.0)
    data = spec.to_dict()
    assert recorded_spec(data).planner.cascade_episodes == 1
    del data["planner"]["cascade_episodes"], data["planner"]["cascade_margin"]
    assert recorded_spec(data).planner.cascade_episodes == 0


# new-user pass: [budget] money with an llm refiner that sets no price ran without a word, and the money limited nothing
def test_a_money_budget_no_refiner_draws_on_gets_a_note(tmp_path):
    from ratchet.spec import unpriced_money

    note = ("note: [budget] money = 5 EUR limits nothing: no refiner prices its requests; set price_prompt and "
            "price_completion (EUR per million tokens) in the llm refiner's table")
    notes: list[str] = []
    load_spec(make_spec_dir(tmp_path / "s", budget={"money": 5.0, "currency": "EUR"}), notes=notes)  # cmaes only
    assert note in notes
    llm = {"kind": "llm", "base_url": "http://127.0.0.1:9/v1", "model": "m", "check_endpoint": False}
    base = {"task": {"env_id": "CartPole-v1"}, "policy": {"path": str(DATA / "cartpole_linear.py")},
            "budget": {"money": 5.0, "currency": "EUR"}}
    assert unpriced_money(spec_from_dict({**base, "refiners": [llm]})) == [note]
    priced = {**llm, "price_completion": 2.0, "currency": "EUR"}
    assert unpriced_money(spec_from_dict({**base, "refiners": [{"kind": "cmaes"}, priced]})) == []
    assert unpriced_money(spec_from_dict({**base, "budget": {}, "refiners": [llm]})) == []
