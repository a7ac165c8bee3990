"""A refiner kind of your own, outside ratchet: each generation nudges one parameter up and down.

Register it in the process that runs (and resumes) the run, then name it in a [[refiners]] table:

    from ratchet.refiners.registry import register_kind
    register_kind("nudge", "nudge")          # the module's import name (this file on sys.path)

or, from an installed package, in its pyproject.toml: [project.entry-points."ratchet.refiners"] nudge = "pkg.nudge".
See examples/own_refiner/run.py.
"""
from pydantic import BaseModel, ConfigDict

from ratchet.policy import Candidate
from ratchet.refiners.base import GenerationCost, Refiner
from ratchet.refiners.registry import RefinerKind


class NudgeSettings(BaseModel):
    """The [[refiners]] table's keys other than kind and name (unknown keys are refused)."""

    model_config = ConfigDict(extra="forbid")
    step: float = 0.25  # how far to nudge, in the parameter's own units


class NudgeRefiner(Refiner):
    """The contract: propose() and generation_cost(); the other hooks have defaults (see ratchet.refiners.base)."""

    def __init__(self, settings, name, ctx):
        self.settings, self.name, self.program = settings, name, ctx.program
        self.rounds = 0

    def generation_cost(self):
        return GenerationCost(proposals=2)  # two candidates a generation; no recommendation, no training

    def idle_reason(self):
        return "nudge: 3 rounds done" if self.rounds >= 3 else None

    def propose(self, parent, critique, rng):
        self.rounds += 1
        p = self.program.parameters[self.rounds % len(self.program.parameters)]
        out = []
        for sign in (1, -1):
            values = dict(parent.params)
            values[p.name] = min(p.high, max(p.low, values[p.name] + sign * self.settings.step))
            out.append(Candidate.create(parent.source, values, parent_id=parent.id, refiner=self.name))
        return out


#: kind -> (settings model, policy kinds it refines, build(settings, name, context) -> [Refiner instances])
KINDS = {"nudge": RefinerKind(NudgeSettings, ("program",), lambda s, name, ctx: [NudgeRefiner(s, name, ctx)])}
